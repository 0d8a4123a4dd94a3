"""Pure text edits: EVOLVE-BLOCK regions, and the check that an edit stays inside them.

A file may mark editable regions with lines containing ``EVOLVE-BLOCK-START`` and
``EVOLVE-BLOCK-END`` (in any comment syntax). When a file has regions, only their bodies
may change; a file without regions is editable as a whole if the benchmark lists it.
"""

from __future__ import annotations

import hashlib
import io
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from evolve.types import Files

START = "EVOLVE-BLOCK-START"
END = "EVOLVE-BLOCK-END"
_MARKER = re.compile(rf"^.*({START}|{END}).*$\n?", re.M)


class EditError(ValueError):
    """An edit that cannot be applied or breaks the rules; the message says why."""


@dataclass(frozen=True)
class Block:
    """The body of one EVOLVE-BLOCK: ``text[start:end]``, marker lines excluded."""

    start: int
    end: int


def blocks(text: str) -> list[Block]:
    """The EVOLVE-BLOCK bodies of ``text``, in order.

    Raises:
        EditError: markers are unbalanced or nested.
    """
    found: list[Block] = []
    open_at: int | None = None
    for match in _MARKER.finditer(text):
        if match.group(1) == START:
            if open_at is not None:
                raise EditError(
                    f"nested {START} at offset {match.start()}: close the previous block first"
                )
            open_at = match.end()
        else:
            if open_at is None:
                raise EditError(f"{END} at offset {match.start()} without a matching {START}")
            found.append(Block(open_at, match.start()))
            open_at = None
    if open_at is not None:
        raise EditError(f"{START} without a matching {END}")
    return found


def outside(text: str) -> list[str]:
    """The immutable text around the blocks (len(blocks) + 1 segments)."""
    segments, cursor = [], 0
    for block in blocks(text):
        segments.append(text[cursor : block.start])
        cursor = block.end
    segments.append(text[cursor:])
    return segments


def block_bodies(text: str) -> list[str]:
    return [text[b.start : b.end] for b in blocks(text)]


def replace_blocks(text: str, bodies: list[str]) -> str:
    """``text`` with each block body replaced by the corresponding entry of ``bodies``."""
    spans = blocks(text)
    if len(bodies) != len(spans):
        raise EditError(f"expected {len(spans)} block bodies, got {len(bodies)}")
    pieces, cursor = [], 0
    for span, body in zip(spans, bodies, strict=True):
        if body and not body.endswith("\n"):
            body += "\n"
        pieces += [text[cursor : span.start], body]
        cursor = span.end
    pieces.append(text[cursor:])
    return "".join(pieces)


def check_file_edit(path: str, old: str, new: str) -> None:
    """Raise EditError when ``new`` changes ``old`` outside its EVOLVE-BLOCKs.

    A file without blocks is editable as a whole, but may not gain block markers: operators
    read a candidate's blocks, and a half-written marker would make it unreadable to them.
    """
    if not blocks(old):
        if START in new or END in new:
            raise EditError(
                f"{path}: the edit adds EVOLVE-BLOCK markers to a file that has none; edit the code only"
            )
        return
    try:
        before, after = outside(old), outside(new)
    except EditError as exc:
        raise EditError(f"{path}: the edit broke the EVOLVE-BLOCK markers ({exc})") from exc
    if len(before) != len(after):
        raise EditError(
            f"{path}: the edit added or removed EVOLVE-BLOCK markers; keep them as they are"
        )
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if was != now:
            where = "before the first block" if index == 0 else f"after block {index}"
            raise EditError(
                f"{path}: the edit changes text outside the EVOLVE-BLOCKs ({where}); only block bodies may change"
            )


def check_edit(old: Files, new: Files, is_editable: Callable[[str], bool]) -> None:
    """Raise EditError unless ``new`` differs from ``old`` only where edits are allowed.

    Allowed: changes inside EVOLVE-BLOCKs of editable files (anywhere in an editable file
    without blocks). Not allowed: touching read-only files, adding or deleting files.
    """
    if set(old) != set(new):
        added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
        raise EditError(
            f"the edit adds files {added} or removes files {removed}; only existing files may change"
        )
    for path, text in new.items():
        if text == old[path]:
            continue
        if not is_editable(path):
            raise EditError(f"{path} is read-only for this benchmark; edit only the editable files")
        check_file_edit(path, old[path], text)


def normalized_hash(files: Files) -> str:
    """A hash of the files' code with comments and whitespace removed.

    Two candidates with the same normalised hash differ only in formatting or comments;
    the search rejects the second as a near-duplicate before evaluating it.
    """
    digest = hashlib.sha256()
    for path in sorted(files):
        text = files[path]
        digest.update(path.encode())
        if path.endswith(".py"):
            try:
                text = " ".join(_code_tokens(text))
            except (tokenize.TokenError, IndentationError, SyntaxError):
                text = " ".join(text.split())
        else:
            text = " ".join(text.split())
        digest.update(text.encode())
    return digest.hexdigest()[:20]


def _code_tokens(text: str) -> Iterator[str]:
    """Python tokens without comments or line breaks; indentation kept as markers (it is code)."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
            continue
        yield {tokenize.INDENT: "<indent>", tokenize.DEDENT: "<dedent>"}.get(tok.type, tok.string)
