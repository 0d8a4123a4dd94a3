"""Per-call overhead of evolve's LLM client against a local instant OpenAI-compatible server.

Prints, per setting (evolve prices the call / with a budget / litellm prices it), the median
wall and CPU milliseconds per call (CPU: of the thread running the calls, so the server's
thread and other processes on a loaded machine count less) and the Python function calls
per call (a count that does not depend on the machine's load). Usage: python scripts/llm_overhead.py [--calls 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import socket
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from evolve.llm import LLMClient, LLMSettings  # noqa: E402
from evolve.store.database import Store  # noqa: E402

PROMPT = [
    {"role": "system", "content": "You improve programs. Answer with SEARCH/REPLACE blocks. " * 10},
    {"role": "user", "content": "def f(x):\n    return x * 2  # EVOLVE-BLOCK\n" * 80},
]
SETTINGS = {
    "evolve prices (llm.pricing), no budget": {
        "pricing": {"input_per_mtok": 1, "output_per_mtok": 2}
    },
    "evolve prices, llm.max_cost_usd set": {
        "pricing": {"input_per_mtok": 1, "output_per_mtok": 2},
        "max_cost_usd": 1000,
    },
    "litellm prices (openai/gpt-4o-mini), no budget": {"model": "openai/gpt-4o-mini"},
}


class Instant(BaseHTTPRequestHandler):
    """/v1/chat/completions answering at once (TCP_NODELAY: no Nagle stall)."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": request["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "ok " * 300},
                    }
                ],
                "usage": {"prompt_tokens": 800, "completion_tokens": 300, "total_tokens": 1100},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def measure(base: str, overrides: dict, calls: int, rounds: int) -> tuple[float, float, int]:
    """(median wall ms, median CPU ms, function calls) per call for one setting."""
    model = overrides.get("model", "openai/local")
    cfg = {"model": model, "api_base": base, **overrides}
    client = LLMClient(LLMSettings.from_config(cfg), store=Store(Path(tempfile.mkdtemp()) / "a.db"))
    sample = iter(range(10**9))

    async def batch(n: int) -> tuple[float, float]:
        start, cpu = time.perf_counter(), time.thread_time()
        for _ in range(n):
            await client.complete(model, PROMPT, sample=next(sample), prompt_hash="p")
        return (time.perf_counter() - start) / n * 1e3, (time.thread_time() - cpu) / n * 1e3

    async def all_rounds() -> tuple[list[tuple[float, float]], int]:
        await batch(10)  # warm up: imports, connection pool
        times = [await batch(calls) for _ in range(rounds)]
        profile = cProfile.Profile()
        profile.enable()
        await batch(50)
        await asyncio.sleep(0.2)  # let litellm's logging tasks, if any, run inside the profile
        profile.disable()
        return times, pstats.Stats(profile).total_calls // 50

    times, functions = asyncio.run(all_rounds())
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times), functions


def main(argv: list[str] | None = None) -> int:
    """Start the server, measure every setting, print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Instant)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        for label, overrides in SETTINGS.items():
            wall, cpu, functions = measure(base, overrides, args.calls, args.rounds)
            print(
                f"{label}: {wall:.2f} ms wall, {cpu:.2f} ms CPU per call "
                f"(medians of {args.rounds} x {args.calls}), {functions} function calls per call"
            )
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
