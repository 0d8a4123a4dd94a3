"""Where training text comes from: local files (parquet, jsonl, jsonl.xz, txt) or Python's stdlib.

The stdlib corpus is what any fresh machine has: the source (code and docstrings) of the
running Python's standard library, split into train and validation by a hash of each
file's path, so the two never share a file.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import re
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

SUFFIXES = (".parquet", ".jsonl", ".jsonl.xz", ".txt", ".txt.xz")
STDLIB_SKIP = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "ensurepip",
}


def _suffix(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def expand(paths: Iterable[Path]) -> list[Path]:
    """Files named by ``paths`` (directories are searched recursively), sorted, supported types only."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p))
        elif path.is_file() and _suffix(path):
            found.append(path)
        else:
            raise FileNotFoundError(
                f"{path}: not a file of a supported type ({', '.join(SUFFIXES)}) or a directory"
            )
    return found


def _jsonl_texts(lines: Iterable[str], where: Path) -> Iterator[str]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            record = json.loads(line)
            if "text" not in record:
                raise ValueError(f"{where}:{number}: JSON record has no 'text' field")
            yield record["text"]


def read_texts(path: Path) -> Iterator[str]:
    """Documents of one file: parquet/jsonl rows (``text`` column) or a whole text file."""
    kind = _suffix(path)
    if kind == ".parquet":
        import pyarrow.parquet as pq  # optional dependency: only parquet sources need it

        table = pq.ParquetFile(path)
        for batch in table.iter_batches(columns=["text"], batch_size=1024):
            yield from (t for t in batch.column(0).to_pylist() if t)
    elif kind == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            yield from _jsonl_texts(handle, path)
    elif kind == ".jsonl.xz":
        with lzma.open(path, "rt", encoding="utf-8") as handle:
            yield from _jsonl_texts(handle, path)
    elif kind == ".txt":
        yield path.read_text(encoding="utf-8", errors="replace")
    elif kind == ".txt.xz":
        with lzma.open(path, "rt", encoding="utf-8", errors="replace") as handle:
            yield handle.read()
    else:
        raise ValueError(f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}")


def iter_texts(paths: Iterable[Path], max_chars: int | None = None) -> Iterator[str]:
    """Documents of all ``paths`` in order, stopping once ``max_chars`` characters were given."""
    total = 0
    for path in expand(paths):
        for text in read_texts(path):
            yield text
            total += len(text)
            if max_chars is not None and total >= max_chars:
                return


def stdlib_files() -> list[Path]:
    """The running Python's standard-library ``.py`` files, tests and vendored tools left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in root.rglob("*.py") if not STDLIB_SKIP.intersection(p.relative_to(root).parts)
    ]
    if not files:
        raise FileNotFoundError(
            f"no Python standard-library sources under {root}; pass text files instead"
        )
    return sorted(files)


def is_validation(relative: str, every: int = 20) -> bool:
    """Deterministic split by a hash of the file's relative path: about 1 in ``every`` is validation."""
    return int(hashlib.sha1(relative.encode()).hexdigest(), 16) % every == 0


def chunk_text(text: str, max_chars: int = 1500) -> list[str]:
    """Cut a long text into documents of at most ``max_chars`` at blank lines (else at line ends).

    Short documents keep best-fit packing from cropping away most of a long file.
    """
    pieces: list[str] = []
    current = ""
    for block in re.split(r"(?<=\n)\n+", text):
        parts = [block] if len(block) <= max_chars else re.split(r"(?<=\n)", block)
        for part in parts:
            if current and len(current) + len(part) > max_chars:
                pieces.append(current)
                current = ""
            current += part[:max_chars] if not current else part
        current += "\n" if current and not current.endswith("\n\n") else ""
    if current.strip():
        pieces.append(current)
    return [p for p in pieces if p.strip()]


def stdlib_corpus(max_chars: int = 1500) -> tuple[list[str], list[str]]:
    """(train documents, validation documents) from the standard library, disjoint by file.

    Each file is cut into documents of at most ``max_chars`` characters (``chunk_text``).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    train, val = [], []
    for path in stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        (val if is_validation(str(path.relative_to(root))) else train).extend(
            chunk_text(text, max_chars)
        )
    return train, val
