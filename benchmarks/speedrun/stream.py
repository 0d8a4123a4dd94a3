"""The training token stream, served by the harness: synthetic before the clock starts, real while it runs, none after.

The training shards are hidden from the candidate's processes; the only way to real training
tokens is this server, on a unix socket named by ``SPEEDRUN_DATA``. A request is 16 bytes
(little-endian int64 offset and count into the stream, the shards end to end, wrapping
around); the reply is an int64 count then that many uint16 tokens. Before ``start`` the
reply holds random tokens of the same shape (for warm-up and compilation), drawn from the
harness's own randomness; after ``stop`` the reply is the count -1: the stream has ended.
Every rank may connect; each connection is served by its own thread.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .shards import read_shard
from .timer import UnixServer

REQUEST = struct.Struct("<qq")
REPLY = struct.Struct("<q")
MAX_COUNT = 1 << 24  # tokens per request
ENDED = -1


class TokenServer(UnixServer):
    """Serves ``files`` (token shards) by ``phase()``: "before", "running" or "after" the clock.

    Use as a context manager; ``address`` goes to the candidate as ``SPEEDRUN_DATA``.
    ``served`` counts real tokens handed out, ``synthetic`` the random ones.
    """

    NAME = "data"

    def __init__(
        self, files: list[Path], *, vocab_size: int, phase: Callable[[], str], seed: int
    ) -> None:
        super().__init__()
        self.shards = [read_shard(path) for path in files]
        self.bounds = np.cumsum([0] + [len(s) for s in self.shards])
        self.vocab_size, self.phase = vocab_size, phase
        self.served = self.synthetic = 0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def tokens(self, offset: int, count: int) -> np.ndarray:
        """The real stream's tokens ``offset .. offset + count`` (wrapping around), as uint16."""
        total = int(self.bounds[-1])
        parts, offset = [], offset % total
        while count > 0:
            index = int(np.searchsorted(self.bounds, offset, side="right")) - 1
            start = offset - int(self.bounds[index])
            part = self.shards[index][start : start + count]
            parts.append(np.asarray(part))
            count -= len(part)
            offset = (offset + len(part)) % total
        return np.concatenate(parts).astype("<u2", copy=False)

    def reply(self, offset: int, count: int) -> bytes:
        """The bytes answering one request, by the clock's phase now."""
        count = max(0, min(count, MAX_COUNT))
        phase = self.phase()
        if phase == "after":
            return REPLY.pack(ENDED)
        if phase == "running":
            data = self.tokens(offset, count)
            self.served += count
        else:
            with self._lock:
                data = self._rng.integers(0, self.vocab_size, count, dtype=np.uint16)
            self.synthetic += count
        return REPLY.pack(count) + data.astype("<u2").tobytes()

    def accepted(self, conn: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            reader = conn.makefile("rb")
            while not self._closing.is_set():
                request = reader.read(REQUEST.size)
                if len(request) < REQUEST.size:
                    return
                conn.sendall(self.reply(*REQUEST.unpack(request)))
