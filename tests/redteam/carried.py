"""Class 3 cheats for the training benchmarks: a program leaves a token in one evaluation and looks for it in the next.

``leave(channel, token)`` is Python that a cheating program runs at import (so in its
training run and in the harness's scoring process that imports its model); ``look(channel,
token)`` is Python the next evaluation's program runs before training: it ends the program
with "LEAKED" when the token arrived. The sandbox's own test of every channel is
tests/redteam/test_channels.py; these go through the benchmarks' real fitness.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest

from evolve.sandbox.process import Limits, run
from evolve.types import Evaluation

PRELUDE = "import ctypes as _c, os as _o, socket as _s\n_libc = _c.CDLL(None, use_errno=True)\n_libc.shmat.restype = _c.c_void_p\n"

# channel -> (code that leaves TOKEN, code that sets _found to what it read); KEY and NAME are per test
CHANNELS = {
    "sysv_shm": (
        "_sid = _libc.shmget(KEY, 64, 0o1666)\n"
        "if _sid >= 0:\n"
        "    _c.memmove(_libc.shmat(_sid, None, 0), TOKEN.encode(), len(TOKEN))",
        "_sid = _libc.shmget(KEY, 0, 0)\n"
        "_found = _c.string_at(_libc.shmat(_sid, None, 0), len(TOKEN)).decode(errors='replace') if _sid >= 0 else ''",
    ),
    "dev_shm": (
        "try:\n    open('/dev/shm/' + NAME, 'w').write(TOKEN)\nexcept OSError:\n    pass",
        "try:\n    _found = open('/dev/shm/' + NAME).read()\nexcept OSError:\n    _found = ''",
    ),
    "abstract_socket": (
        "_r, _w = _o.pipe()\n"
        "if _o.fork() == 0:  # a daemon that outlives the evaluation and serves the token\n"
        "    _o.setsid()\n"
        "    try:\n"
        "        _srv = _s.socket(_s.AF_UNIX, _s.SOCK_STREAM); _srv.bind('\\0' + NAME); _srv.listen(4)\n"
        "        _o.write(_w, b'1')\n"
        "        while True:\n"
        "            _conn, _ = _srv.accept(); _conn.sendall(TOKEN.encode()); _conn.close()\n"
        "    finally:\n"
        "        _o._exit(0)\n"
        "_o.close(_w)\n"
        "_o.read(_r, 1)  # listening (or failed)",
        "try:\n"
        "    _cl = _s.socket(_s.AF_UNIX, _s.SOCK_STREAM); _cl.settimeout(2); _cl.connect('\\0' + NAME)\n"
        "    _found = _cl.recv(64).decode(errors='replace')\n"
        "except OSError:\n"
        "    _found = ''",
    ),
}


SLOW = {"dev_shm", "abstract_socket"}  # the default run keeps SysV shared memory, the case
PARAMS = [c if c not in SLOW else pytest.param(c, marks=pytest.mark.slow) for c in CHANNELS]


def token() -> tuple[str, int, str]:
    """(token, SysV key, name) fresh for one test."""
    return (
        secrets.token_hex(8),
        secrets.randbelow(1 << 30) + 1,
        f"evolve-carry-{secrets.token_hex(6)}",
    )


def _bound(code: str, secret: tuple[str, int, str]) -> str:
    value, key, name = secret
    return f"TOKEN, KEY, NAME = {value!r}, {key}, {name!r}\n" + PRELUDE + code + "\n"


def leave(channel: str, secret: tuple[str, int, str]) -> str:
    return _bound(CHANNELS[channel][0], secret)


def look(channel: str, secret: tuple[str, int, str]) -> str:
    return _bound(
        CHANNELS[channel][1]
        + f"\nif TOKEN in _found:\n    raise SystemExit('LEAKED through {channel}')",
        secret,
    )


def checked_token(channel: str, folder: Path) -> tuple[str, int, str]:
    """A fresh token, once ``look`` is shown to find what ``leave`` left within one sandboxed run."""
    secret = token()
    (folder / "both.py").write_text(leave(channel, secret) + look(channel, secret))
    result = run([sys.executable, "both.py"], cwd=folder, limits=Limits(timeout_s=30))
    assert f"LEAKED through {channel}" in result.stdout + result.stderr, result.tail()
    return token()


def assert_not_arrived(ev: Evaluation) -> None:
    """The looking evaluation found nothing and was scored."""
    assert ev.ok, dict(ev.artifacts)
    assert "LEAKED" not in str(ev.artifacts)
