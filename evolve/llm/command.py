"""The ``command`` provider: any executable as a model (prompt on stdin, answer on stdout).

Registered with litellm through its custom-provider mechanism
(``litellm.custom_provider_map`` with a ``CustomLLM`` handler), so ``command/<name>``
goes through the same ``acompletion`` path, retries, cost and recording as any other
model. ``<name>`` is looked up in ``llm.commands``. The command's environment names the
model (EVOLVE_MODEL), the sampling parameters (EVOLVE_TEMPERATURE, EVOLVE_MAX_TOKENS)
and which sample of the prompt is asked for (EVOLVE_SAMPLE). The executable runs in its own
session (process group) and is killed with it on timeout or cancellation; processes it
leaves behind are ended with their group when the client closes or the interpreter exits.
The answer is what the program wrote to stdout by the time it exited (processes it left in its
group, which might hold stdout open, are then ended), cut at ``max_tokens``; the program
and its group die with the run, SIGKILL of the run included (``evolve.sandbox.lifetime``).
A non-zero exit is a failed call whose stderr is recorded. It runs with the user's rights: it is the user's own program (a
llama.cpp binary, an agent CLI, a script that asks a person), not candidate code.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from evolve.harness.reaper import kill_group
from evolve.llm._litellm import litellm
from evolve.sandbox import lifetime

PROVIDER = "command"
TOKENIZER = "gpt-4o"  # whose tokenizer counts a command model's tokens (it reports none itself)
_STDERR_TAIL = 2000
_PIPE_GRACE_S = 1.0  # after the command exits, how long a pipe a leftover process holds is read


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

        def _response(self, name: str, messages: list, answer: str, cap: int | None) -> Any:
            """The answer as litellm's response, cut at ``cap`` tokens (max_tokens) if longer."""
            tokens_in = lit.token_counter(model=TOKENIZER, messages=messages)
            tokens = lit.encode(model=TOKENIZER, text=answer) if answer else []
            if cap is not None and len(tokens) > int(cap):
                tokens = tokens[: int(cap)]
                answer = lit.decode(model=TOKENIZER, tokens=list(tokens))
            tokens_out = len(tokens)
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
                    preexec_fn=_die_with_run,
                )
            except OSError as exc:
                raise CustomLLMError(
                    status_code=404,
                    message=f"command {model!r} cannot start ({exc}); fix llm.commands.{model}",
                ) from exc
            _groups.add(proc.pid)
            try:
                stdout, stderr = await asyncio.wait_for(
                    _exchange(proc, prompt_text(messages).encode()), seconds
                )
            except TimeoutError:
                kill_group(proc.pid)
                await proc.wait()
                raise self._timeout(model, seconds) from None
            except asyncio.CancelledError:  # the run is ending: leave no process behind
                kill_group(proc.pid)
                raise
            finally:
                _forget_if_empty(proc.pid)
            if proc.returncode != 0:
                raise self._failed(model, argv, proc.returncode or 0, stderr)
            answer = stdout.decode(errors="replace")
            return self._response(model, messages, answer, optional_params.get("max_tokens"))

    return CommandProvider


async def _exchange(proc: asyncio.subprocess.Process, prompt: bytes) -> tuple[bytes, bytes]:
    """Send the prompt, and read stdout and stderr until the program exits; then end the
    processes it left in its group (they may hold its pipes open) and take what was written."""
    out, err = bytearray(), bytearray()
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    readers = [
        asyncio.ensure_future(_drain(proc.stdout, out)),
        asyncio.ensure_future(_drain(proc.stderr, err)),
    ]
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it need not read it all
            proc.stdin.write(prompt)
            await proc.stdin.drain()
            proc.stdin.close()
        await _exited(proc.pid)  # not proc.wait(): that also waits for the pipes to close
        kill_group(proc.pid)
        # the pipes end once every holder is gone; one that left the group is not waited for
        await asyncio.wait(readers, timeout=_PIPE_GRACE_S)
        while proc.returncode is None:  # asyncio's child watcher reaps it
            await asyncio.sleep(0.01)
    finally:
        for reader in readers:
            reader.cancel()
    return bytes(out), bytes(err)


async def _exited(pid: int) -> None:
    """Return once process ``pid`` has exited (its pidfd turns readable), reaped or not."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already exited and reaped
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _drain(stream: asyncio.StreamReader, into: bytearray) -> None:
    while chunk := await stream.read(65536):
        into += chunk


def _die_with_run() -> None:
    """In the command's process, before it runs: killed by the kernel if the run dies."""
    lifetime.die_with_parent(signal.SIGKILL)


_groups: set[int] = set()  # process groups started here that may still have members


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _forget_if_empty(pgid: int) -> None:
    """Stop tracking a group once its command has ended and left no process behind.

    Checked as soon as the command exits, so a group id is never kept after its group is
    gone (the number could later name someone else's group).
    """
    if not _alive(pgid):
        _groups.discard(pgid)


async def end_command_processes(grace_s: float = 2.0) -> None:
    """End every process group the command provider started: SIGTERM, then SIGKILL after ``grace_s``."""
    for pgid in list(_groups):
        kill_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pgid) for pgid in _groups) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    _kill_all()


def _kill_all() -> None:
    """SIGKILL what is left of the groups (also run at interpreter exit)."""
    for pgid in list(_groups):
        kill_group(pgid)
        _groups.discard(pgid)


atexit.register(_kill_all)


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
