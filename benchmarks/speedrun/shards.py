"""Read and write token shards in the modded-nanogpt / llm.c format.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, token count,
then zeros) followed by the tokens as little-endian uint16. Every document starts with
the GPT-2 end-of-text token 50256, which therefore also separates documents.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
EOT = 50256
TOKENS_PER_SHARD = 100_000_000  # what FineWeb's published shards hold


class ShardError(ValueError):
    """A file that is not a valid token shard; the message says what is wrong and how to fix it."""


def shard_bytes(n_tokens: int) -> int:
    """The exact size in bytes of a shard holding ``n_tokens`` tokens."""
    return HEADER_BYTES + 2 * n_tokens


def encode_header(n_tokens: int) -> bytes:
    """The 1024-byte header of a shard with ``n_tokens`` tokens."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, n_tokens
    return header.tobytes()


def parse_header(raw: bytes, *, path: Path | str = "<bytes>") -> int:
    """Validate a header and return its token count.

    Raises:
        ShardError: the header is short, has the wrong magic or an unknown version.
    """
    if len(raw) < HEADER_BYTES:
        raise ShardError(
            f"{path}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte shard header; "
            "the file is truncated (download it again)"
        )
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    if int(header[0]) != MAGIC:
        raise ShardError(
            f"{path}: magic number {int(header[0])}, expected {MAGIC}; this is not a token "
            "shard in the modded-nanogpt format (write it with evolve.benchmarks.speedrun.shards)"
        )
    if int(header[1]) != VERSION:
        raise ShardError(
            f"{path}: shard version {int(header[1])}, only version {VERSION} is supported"
        )
    n_tokens = int(header[2])
    if n_tokens < 0:
        raise ShardError(f"{path}: negative token count {n_tokens} in the header")
    return n_tokens


def read_header(path: Path | str) -> int:
    """Validate a shard file's header and size; return its token count.

    Raises:
        ShardError: wrong magic or version, or a file size that disagrees with the header.
    """
    path = Path(path)
    with path.open("rb") as f:
        n_tokens = parse_header(f.read(HEADER_BYTES), path=path)
    size = path.stat().st_size
    if size != shard_bytes(n_tokens):
        state = "truncated" if size < shard_bytes(n_tokens) else "longer than its header says"
        raise ShardError(
            f"{path}: {size} bytes but the header announces {n_tokens} tokens "
            f"({shard_bytes(n_tokens)} bytes); the file is {state} (download or write it again)"
        )
    return n_tokens


def read_shard(path: Path | str, *, mmap: bool = True) -> np.ndarray:
    """Return the tokens of a shard as a uint16 array (memory-mapped by default).

    Raises:
        ShardError: the file is not a valid shard (see ``read_header``).
    """
    n_tokens = read_header(path)
    if mmap:
        if n_tokens == 0:
            return np.zeros(0, dtype="<u2")
        return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n_tokens,))
    with Path(path).open("rb") as f:
        f.seek(HEADER_BYTES)
        return np.frombuffer(f.read(), dtype="<u2").copy()


def write_shard(path: Path | str, tokens: np.ndarray | Iterable[int]) -> int:
    """Write ``tokens`` as a shard (atomically: a temp file renamed into place); return the count.

    Raises:
        ShardError: a token does not fit in uint16.
    """
    array = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens))
    if array.size and (array.min() < 0 or array.max() > 0xFFFF):
        raise ShardError(
            f"token ids must be in [0, 65535] to fit uint16, got [{array.min()}, {array.max()}]; "
            "use a vocabulary of at most 65536 tokens"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(encode_header(int(array.size)))
        f.write(array.astype("<u2", copy=False).tobytes())
    os.replace(tmp, path)
    return int(array.size)


class ShardWriter:
    """Append token documents and cut them into numbered shards of a fixed size.

    The first shard is index ``first_index`` (FineWeb numbers val 0 and train from 1).
    Shards are named ``{prefix}_{split}_{index:06d}.bin`` like the published FineWeb files.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        prefix: str,
        split: str,
        first_index: int = 0,
        tokens_per_shard: int = TOKENS_PER_SHARD,
    ) -> None:
        self.directory = Path(directory)
        self.prefix, self.split = prefix, split
        self.index = first_index
        self.tokens_per_shard = tokens_per_shard
        self.buffer = np.empty(tokens_per_shard, dtype="<u2")
        self.filled = 0
        self.paths: list[Path] = []
        self.total = 0

    def add(self, tokens: np.ndarray | list[int]) -> None:
        """Append one document's tokens (which should start with EOT); spills across shards."""
        array = np.asarray(tokens, dtype=np.int64)
        while array.size:
            room = self.tokens_per_shard - self.filled
            take = array[:room]
            self.buffer[self.filled : self.filled + take.size] = take
            self.filled += take.size
            array = array[take.size :]
            if self.filled == self.tokens_per_shard:
                self._flush()

    def _flush(self) -> None:
        if self.filled == 0:
            return
        path = self.directory / f"{self.prefix}_{self.split}_{self.index:06d}.bin"
        write_shard(path, self.buffer[: self.filled])
        self.paths.append(path)
        self.total += self.filled
        self.index += 1
        self.filled = 0

    def close(self) -> list[Path]:
        """Write the last partial shard and return every shard path written."""
        self._flush()
        return self.paths
