"""The ``command`` provider: any executable as a model (prompt on stdin, answer on stdout).

Registered with litellm through its custom-provider mechanism
(``litellm.custom_provider_map`` with a ``CustomLLM`` handler), so ``command/<name>``
goes through the same ``acompletion`` path, retries, cost and recording as any other
model. ``<name>`` is looked up in ``llm.commands``. The command's environment names the
model (EVOLVE_MODEL), the sampling parameters (EVOLVE_TEMPERATURE, EVOLVE_MAX_TOKENS)
and which sample of the prompt is asked for (EVOLVE_SAMPLE). The executable runs in its own
process group and is killed with it on timeout; a non-zero exit is a failed call whose
stderr is recorded. It runs with the user's rights: it is the user's own program (a
llama.cpp binary, an agent CLI, a script that asks a person), not candidate code.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from evolve.harness.reaper import kill_group
from evolve.llm._litellm import litellm

PROVIDER = "command"
_STDERR_TAIL = 2000


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The messages as one text: a lone message as is, several under ``## role`` headings."""
    parts = []
    for message in messages:
        content = message.get("content") or ""
        if not isinstance(content, str):  # a list of content parts
            content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        parts.append((str(message.get("role", "user")), content))
    if len(parts) == 1:
        return parts[0][1]
    return "\n\n".join(f"## {role}\n\n{content}" for role, content in parts)


def _make_handler_class() -> type:
    lit = litellm()
    from litellm.llms.custom_llm import CustomLLM, CustomLLMError

    class CommandProvider(CustomLLM):
        """litellm handler running ``llm.commands[<name>]`` for model ``command/<name>``."""

        def __init__(self) -> None:
            super().__init__()
            self.commands: dict[str, tuple[str, ...]] = {}

        def _argv(self, name: str) -> tuple[str, ...]:
            argv = self.commands.get(name)
            if argv is None:
                known = ", ".join(sorted(self.commands)) or "none"
                raise CustomLLMError(
                    status_code=404,
                    message=f"no command named {name!r} (configured: {known}); set llm.commands.{name}='<command line>'",
                )
            return argv

        @staticmethod
        def _env(
            name: str, optional_params: Mapping[str, Any], litellm_params: Mapping[str, Any] | None
        ) -> dict[str, str]:
            env = dict(os.environ)
            env["EVOLVE_MODEL"] = name
            sample = ((litellm_params or {}).get("metadata") or {}).get("evolve_sample")
            if sample is not None:
                env["EVOLVE_SAMPLE"] = str(sample)
            for key in ("temperature", "max_tokens"):
                if optional_params.get(key) is not None:
                    env[f"EVOLVE_{key.upper()}"] = str(optional_params[key])
            return env

        def _response(self, name: str, messages: list, answer: str) -> Any:
            tokens_in = lit.token_counter(model="gpt-4o", messages=messages)
            tokens_out = lit.token_counter(model="gpt-4o", text=answer) if answer else 0
            return lit.ModelResponse(
                model=f"{PROVIDER}/{name}",
                choices=[
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": answer},
                    }
                ],
                usage={
                    "prompt_tokens": tokens_in,
                    "completion_tokens": tokens_out,
                    "total_tokens": tokens_in + tokens_out,
                },
            )

        def _failed(self, name: str, argv: Sequence[str], code: int, stderr: bytes) -> Exception:
            tail = stderr.decode(errors="replace")[-_STDERR_TAIL:].strip()
            return CustomLLMError(
                status_code=422,
                message=f"command {name!r} ({' '.join(argv)}) exited with status {code}; stderr: {tail or '(empty)'}",
            )

        def _timeout(self, name: str, seconds: float) -> Exception:
            return lit.Timeout(
                message=f"command {name!r} gave no answer within {seconds:g}s (llm.timeout_s)",
                model=f"{PROVIDER}/{name}",
                llm_provider=PROVIDER,
            )

        async def acompletion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            optional_params = kwargs.get("optional_params") or {}
            seconds = float(kwargs.get("timeout") or 600.0)
            argv = self._argv(model)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=self._env(model, optional_params, kwargs.get("litellm_params")),
                    start_new_session=True,
                )
            except OSError as exc:
                raise CustomLLMError(
                    status_code=404,
                    message=f"command {model!r} cannot start ({exc}); fix llm.commands.{model}",
                ) from exc
            try:
                stdout, stderr = await asyncio.wait_for(
                    proc.communicate(prompt_text(messages).encode()), seconds
                )
            except TimeoutError:
                kill_group(proc.pid)
                await proc.wait()
                raise self._timeout(model, seconds) from None
            except asyncio.CancelledError:  # the run is ending: leave no process behind
                kill_group(proc.pid)
                raise
            if proc.returncode != 0:
                raise self._failed(model, argv, proc.returncode or 0, stderr)
            return self._response(model, messages, stdout.decode(errors="replace"))

        def completion(self, model: str, messages: list, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            optional_params = kwargs.get("optional_params") or {}
            seconds = float(kwargs.get("timeout") or 600.0)
            argv = self._argv(model)
            start = time.monotonic()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=self._env(model, optional_params, kwargs.get("litellm_params")),
                    start_new_session=True,
                )
            except OSError as exc:
                raise CustomLLMError(
                    status_code=404,
                    message=f"command {model!r} cannot start ({exc}); fix llm.commands.{model}",
                ) from exc
            try:
                stdout, stderr = proc.communicate(prompt_text(messages).encode(), timeout=seconds)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid)
                proc.wait()
                raise self._timeout(model, time.monotonic() - start) from None
            if proc.returncode != 0:
                raise self._failed(model, argv, proc.returncode, stderr)
            return self._response(model, messages, stdout.decode(errors="replace"))

    return CommandProvider


_handler: Any = None


def register_command_provider(commands: Mapping[str, Sequence[str]]) -> None:
    """Make ``command/<name>`` models available to litellm for every name in ``commands``."""
    global _handler
    lit = litellm()
    if _handler is None:
        _handler = _make_handler_class()()
    _handler.commands.update({name: tuple(argv) for name, argv in commands.items()})
    others = [entry for entry in lit.custom_provider_map if entry.get("provider") != PROVIDER]
    lit.custom_provider_map = [*others, {"provider": PROVIDER, "custom_handler": _handler}]


def configured_commands() -> dict[str, tuple[str, ...]]:
    """The command lines registered so far (for preflight)."""
    return dict(_handler.commands) if _handler is not None else {}
