"""Document readers: the texts of local files (parquet ``text`` column, jsonl records, whole text files, xz or gz).

One reader for every benchmark's data preparation, and where the CPU scales' offline text lives
(``stdlib_tests``).
"""

from __future__ import annotations

import gzip
import json
import lzma
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

SUFFIXES = (".parquet", ".jsonl", ".jsonl.xz", ".jsonl.gz", ".txt", ".txt.xz", ".txt.gz")


def stdlib_tests() -> Path:
    """The running Python's test package (``Lib/test``): Python source the interpreter never
    reads to run a program, so a sandbox can hide it (the CPU scales' validation text; the
    rest of the standard library cannot be hidden from a Python program)."""
    folder = Path(sysconfig.get_paths()["stdlib"]) / "test"
    if not (folder / "__init__.py").is_file():
        raise FileNotFoundError(
            f"{folder}: this Python ({sys.version.split()[0]}) has no standard-library test "
            "package, the CPU scales' validation text; install it (Debian, Ubuntu: apt install "
            "libpython3.X-testsuite) or use a Python built from source (pyenv, python.org)"
        )
    return folder


def _open(path: Path, kind: str) -> IO[str]:
    opener = lzma.open if kind.endswith(".xz") else gzip.open
    return opener(path, "rt", encoding="utf-8", errors="replace")


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
    elif kind in (".jsonl.xz", ".jsonl.gz"):
        with _open(path, kind) as handle:
            yield from _jsonl_texts(handle, path)
    elif kind == ".txt":
        yield path.read_text(encoding="utf-8", errors="replace")
    elif kind in (".txt.xz", ".txt.gz"):
        with _open(path, kind) as handle:
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
