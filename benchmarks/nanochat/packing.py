"""BOS-aligned best-fit packing of documents into rows of T+1 tokens (the original's loader rule).

Every row starts at a document boundary (documents carry their BOS). To fill a row, take
the largest buffered document that fits in the space left; when none fits, crop the
shortest buffered document to fill the row exactly (the rest of it is dropped). Rows have
no padding. Inputs are ``row[:-1]``, targets ``row[1:]``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

import numpy as np

BUFFER_SIZE = 1000  # documents held for best-fit choice, as in autoresearch


def pack_rows(
    documents: Iterable[np.ndarray], row_len: int, buffer_size: int = BUFFER_SIZE
) -> Iterator[np.ndarray]:
    """Yield rows of exactly ``row_len`` tokens packed best-fit from ``documents``.

    Args:
        documents: token arrays, each starting with BOS; consumed lazily.
        row_len: tokens per row (sequence length + 1).
        buffer_size: how many documents are kept to choose from.

    Yields:
        int64 arrays of length ``row_len``; stops when the documents run out (a last,
        partly filled row is dropped).
    """
    if row_len < 2:
        raise ValueError(f"row_len must be at least 2, got {row_len}")
    source = iter(documents)
    lengths: list[int] = []  # sorted lengths of the buffered documents
    by_length: dict[int, list[np.ndarray]] = {}
    exhausted = False

    def refill() -> None:
        nonlocal exhausted
        while not exhausted and len(lengths) < buffer_size:
            doc = next(source, None)
            if doc is None:
                exhausted = True
                return
            if len(doc) == 0:
                continue
            bisect.insort(lengths, len(doc))
            by_length.setdefault(len(doc), []).append(np.asarray(doc))

    def take(length: int) -> np.ndarray:
        lengths.pop(bisect.bisect_left(lengths, length))
        docs = by_length[length]
        doc = docs.pop(0)
        if not docs:
            del by_length[length]
        return doc

    while True:
        row = np.empty(row_len, dtype=np.int64)
        filled = 0
        while filled < row_len:
            refill()
            if not lengths:
                return
            space = row_len - filled
            fit = bisect.bisect_right(lengths, space)
            if fit:
                doc = take(lengths[fit - 1])  # the largest that fits
                row[filled : filled + len(doc)] = doc
                filled += len(doc)
            else:
                doc = take(lengths[0])  # nothing fits: crop the shortest
                row[filled:] = doc[:space]
                filled = row_len
        yield row


def pack_batches(
    documents: Iterable[np.ndarray], batch_size: int, seq_len: int, buffer_size: int = BUFFER_SIZE
) -> Iterator[np.ndarray]:
    """Yield (batch_size, seq_len + 1) arrays of packed rows; stops when the documents run out."""
    rows = pack_rows(documents, seq_len + 1, buffer_size)
    while True:
        batch = [row for _, row in zip(range(batch_size), rows, strict=False)]
        if len(batch) < batch_size:
            return
        yield np.stack(batch)
