"""On-disk token files of one split: a flat token array plus document offsets, read by memmap.

A split directory holds ``tokens.bin`` (uint16 or uint32 ids, every document starting with
BOS) and ``offsets.npy`` (int64, n_documents + 1 entries). Training and validation splits
live in separate directories so that the training process can be given only its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

TOKENS_FILE = "tokens.bin"
OFFSETS_FILE = "offsets.npy"
META_FILE = "split.json"


def write_split(directory: Path, documents: Iterable[list[int]], vocab_size: int) -> dict:
    """Write tokenized documents into ``directory``; return its summary (documents, tokens)."""
    directory.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    offsets = [0]
    with open(directory / (TOKENS_FILE + ".tmp"), "wb") as handle:
        for doc in documents:
            handle.write(np.asarray(doc, dtype=dtype).tobytes())
            offsets.append(offsets[-1] + len(doc))
    np.save(directory / OFFSETS_FILE, np.asarray(offsets, dtype=np.int64))
    (directory / (TOKENS_FILE + ".tmp")).replace(directory / TOKENS_FILE)
    meta = {"documents": len(offsets) - 1, "tokens": offsets[-1], "dtype": np.dtype(dtype).name}
    (directory / META_FILE).write_text(json.dumps(meta))
    return meta


class Split:
    """Read access to one split: ``len(split)`` documents, ``split[i]`` the i-th as an array."""

    def __init__(self, directory: Path) -> None:
        meta_path = directory / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{directory} holds no prepared split; run `python -m evolve.benchmarks.nanochat.prepare`"
            )
        meta = json.loads(meta_path.read_text())
        self.directory = directory
        self.offsets = np.load(directory / OFFSETS_FILE)
        self.tokens = np.memmap(directory / TOKENS_FILE, dtype=meta["dtype"], mode="r")
        self.n_tokens = int(meta["tokens"])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return np.asarray(
            self.tokens[self.offsets[index] : self.offsets[index + 1]], dtype=np.int64
        )

    def documents(
        self, order: np.ndarray | None = None, *, repeat: bool = False
    ) -> Iterator[np.ndarray]:
        """Documents in file order (or ``order``); forever when ``repeat`` is set."""
        while True:
            for index in range(len(self)) if order is None else order:
                yield self[int(index)]
            if not repeat:
                return
