"""Preflight: unknown model strings, missing keys, unreachable servers and commands fail with the fix."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from evolve.llm import LLMSettings, PreflightError, preflight


def check(**cfg) -> list[str]:
    return asyncio.run(preflight(LLMSettings.from_config(cfg), probe_timeout_s=2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unknown_model_string_names_the_format() -> None:
    with pytest.raises(PreflightError, match="<provider>/<model>"):
        check(model="gpt-nonexistent-9")


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("openai/gpt-4o-mini", "OPENAI_API_KEY"),
        ("anthropic/claude-3-5-sonnet-20240620", "ANTHROPIC_API_KEY"),
        ("gemini/gemini-1.5-pro", "GEMINI_API_KEY"),
    ],
)
def test_a_missing_api_key_names_the_variable(monkeypatch, model, variable) -> None:
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(PreflightError, match=variable):
        check(model=model)
    monkeypatch.setenv(variable, "sk-test")
    assert isinstance(check(model=model), list)


def test_an_unreachable_server_says_to_start_it() -> None:
    with pytest.raises(PreflightError, match="does not answer.*llm.api_base"):
        check(model="openai/my-model", api_base=f"http://127.0.0.1:{free_port()}/v1")


def test_a_reachable_server_passes() -> None:
    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"data": []}')

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        warnings = check(
            model="openai/my-model",
            api_base=f"http://127.0.0.1:{server.server_port}/v1",
            max_cost_usd=1,
        )
    finally:
        server.shutdown()
    assert any("no price" in w for w in warnings)


def test_commands_must_be_configured_and_executable() -> None:
    with pytest.raises(PreflightError, match="set llm.commands.me="):
        check(model="command/me")
    with pytest.raises(PreflightError, match="not an executable"):
        check(model="command/me", commands={"me": "/no/such/binary --flag"})
    assert check(model="command/me", commands={"me": [sys.executable, "-c", "print(1)"]}) == []


def test_offline_replay_needs_no_key(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert check(model="openai/gpt-4o-mini", offline=True) == []


def test_offline_replay_needs_no_command_program() -> None:
    assert check(model="command/me", commands={"me": "/no/such/binary --flag"}, offline=True) == []
    with pytest.raises(PreflightError, match="set llm.commands.me="):
        check(model="command/me", offline=True)  # the model must still name a configured command
