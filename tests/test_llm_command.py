"""The ``command`` provider: an executable as a model through litellm's custom-provider path."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from evolve.llm import LLMCallFailed, LLMClient, LLMConfigError, LLMSettings, LLMStop, prompt_text
from evolve.store.database import Store

PY = sys.executable
UPPER = [
    PY,
    "-c",
    "import os, sys; print(os.environ['EVOLVE_MODEL'], os.environ['EVOLVE_SAMPLE'], sys.stdin.read().upper(), end='')",
]
FAIL = [PY, "-c", "import sys; sys.stderr.write('the model crashed: out of memory'); sys.exit(3)"]
SLOW = [
    PY,
    "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)",
]


def client(tmp_path: Path, **overrides) -> LLMClient:
    cfg = {
        "model": "command/upper",
        "commands": {"upper": UPPER, "fail": FAIL, "slow": SLOW},
        "retries": 0,
    } | overrides
    return LLMClient(LLMSettings.from_config(cfg), store=Store(tmp_path / "archive.db"))


def test_the_prompt_goes_to_stdin_and_stdout_is_the_answer(tmp_path) -> None:
    llm = client(tmp_path)
    messages = [{"role": "user", "content": "improve this"}]
    answer = asyncio.run(llm.complete("command/upper", messages, sample=0, prompt_hash="p"))
    assert answer.text == "upper 0 IMPROVE THIS"
    assert answer.tokens_in > 0 and answer.tokens_out > 0 and answer.cost is None
    row = next(llm.ledger.store.db.query("SELECT model, response, error FROM llm_calls"))
    assert row == {"model": "command/upper", "response": "upper 0 IMPROVE THIS", "error": None}


def test_several_messages_are_joined_under_role_headings() -> None:
    text = prompt_text(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}]
    )
    assert text == "## system\n\nbe brief\n\n## user\n\ngo"


def test_a_non_zero_exit_is_a_failed_call_with_stderr_recorded(tmp_path) -> None:
    llm = client(tmp_path, model="command/fail", retries=3)
    with pytest.raises(LLMCallFailed, match="exited with status 3"):
        asyncio.run(
            llm.complete(
                "command/fail", [{"role": "user", "content": "x"}], sample=0, prompt_hash="p"
            )
        )
    (row,) = llm.ledger.store.db.query("SELECT error FROM llm_calls")
    assert "out of memory" in row["error"]
    assert llm.attempts == 1  # a crash is not retried


def test_a_command_that_hangs_is_killed_with_its_children(tmp_path) -> None:
    llm = client(tmp_path, model="command/slow", timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(LLMCallFailed, match="Timeout"):
        asyncio.run(
            llm.complete(
                "command/slow", [{"role": "user", "content": "x"}], sample=0, prompt_hash="p"
            )
        )
    assert time.monotonic() - start < 5
    (row,) = llm.ledger.store.db.query("SELECT error FROM llm_calls")
    assert "no answer within 0.5s" in row["error"]


def test_an_unknown_command_name_stops_with_the_fix(tmp_path) -> None:
    llm = client(tmp_path)
    with pytest.raises(LLMStop, match=r"set llm.commands.nobody="):
        asyncio.run(
            llm.complete(
                "command/nobody", [{"role": "user", "content": "x"}], sample=0, prompt_hash="p"
            )
        )


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_answer_is_read_when_the_command_exits_and_what_it_left_holding_stdout_is_ended(
    tmp_path,
) -> None:
    pid_file = tmp_path / "helper.pid"
    leaves_a_helper = [  # the helper inherits stdout and holds it open for 300 s
        PY,
        "-c",
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
        "stdin=subprocess.DEVNULL); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('answer', end='', flush=True)",
    ]
    llm = client(
        tmp_path, model="command/helper", commands={"helper": leaves_a_helper}, timeout_s=60
    )

    async def call() -> str:
        answer = await llm.complete(
            "command/helper", [{"role": "user", "content": "x"}], sample=0, prompt_hash="p"
        )
        return answer.text

    assert asyncio.run(call()) == "answer"  # not "gave no answer within 60s"
    helper = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _running(helper) and time.monotonic() < deadline:  # killed; reaped by its new parent
        time.sleep(0.05)
    assert not _running(helper)


def test_an_answer_past_max_tokens_is_cut_at_it(tmp_path) -> None:
    talks_on = [PY, "-c", "print('word ' * 5000)"]
    llm = client(tmp_path, model="command/talker", commands={"talker": talks_on}, max_tokens=50)
    answer = asyncio.run(
        llm.complete(
            "command/talker", [{"role": "user", "content": "x"}], sample=0, prompt_hash="p"
        )
    )
    assert answer.tokens_out == 50 and answer.text.count("word") <= 50


def test_a_bare_command_model_is_named_after_its_program() -> None:
    cfg = LLMSettings.from_config({"model": "command", "command": f"{PY} agents/coder.py --fast"})
    assert cfg.models == (("command/coder", 1.0),) and cfg.commands == {
        "coder": (PY, "agents/coder.py", "--fast")
    }
    cfg = LLMSettings.from_config({"model": "command", "command": "llama-cli -m model.gguf"})
    assert cfg.models == (("command/llama-cli", 1.0),)
    with pytest.raises(LLMConfigError, match="llm.command="):
        LLMSettings.from_config({"model": "command"})


def test_at_interpreter_exit_nothing_of_the_commands_group_survives(tmp_path) -> None:
    import subprocess

    pid_file = tmp_path / "helper.pid"
    helper = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('answer', end='')"
    )
    run_without_close = (
        "import asyncio, sys\n"
        "from evolve.llm import LLMClient, LLMSettings\n"
        "from evolve.store.database import Store\n"
        f"cfg = LLMSettings.from_config({{'model': 'command/helper', 'commands': {{'helper': [sys.executable, '-c', {helper!r}]}}}})\n"
        f"llm = LLMClient(cfg, store=Store({str(tmp_path / 'a.db')!r}))\n"
        "print(asyncio.run(llm.complete('command/helper', [{'role': 'user', 'content': 'x'}], sample=0, prompt_hash='p')).text)\n"
    )
    done = subprocess.run(
        [PY, "-c", run_without_close], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "answer", done.stderr[-2000:]
    assert not _running(int(pid_file.read_text()))
