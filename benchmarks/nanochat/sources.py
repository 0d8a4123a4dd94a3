"""The offline CPU corpus: Python's standard library cut into documents (local files: ``evolve.harness.documents``).

The stdlib corpus is what any fresh machine has: the source (code and docstrings) of the
running Python's standard library. Training text is the library itself (less its tests and
vendored tools); validation text is drawn, by a hash of each file's path, from its test
package (``documents.stdlib_tests``), which no program needs to run, so the sandbox hides it:
a candidate can neither read the validation files nor rebuild the validation rows.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from pathlib import Path

from evolve.harness import documents

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


def validation_files() -> list[Path]:
    """The validation files: about 1 in 20 of the test package's ``.py`` files, by path hash."""
    root = Path(sysconfig.get_paths()["stdlib"])
    tests = documents.stdlib_tests()
    return sorted(p for p in tests.rglob("*.py") if is_validation(str(p.relative_to(root))))


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
    """(train documents, validation documents): the library (``stdlib_files``) and part of its
    test package (``validation_files``), each file cut into documents of at most ``max_chars``
    characters (``chunk_text``)."""

    def cut(files: list[Path]) -> list[str]:
        texts = (p.read_text(encoding="utf-8", errors="replace") for p in files)
        return [piece for text in texts for piece in chunk_text(text, max_chars)]

    return cut(stdlib_files()), cut(validation_files())
