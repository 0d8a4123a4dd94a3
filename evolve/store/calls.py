"""How ``llm_calls`` stores prompts and answers: prompts compressed against a base prompt, answers
capped, embeddings packed (the notebook's versions are packed as prompts are)."""

from __future__ import annotations

import base64
import json
import sqlite3
import struct
import zlib
from collections.abc import Sequence
from typing import Any

ANSWER_HEAD_CHARS = 150_000
ANSWER_TAIL_CHARS = 50_000
_BASE_USES = 200  # prompts compressed against one base prompt before the next becomes the base
NOTE_BASE_USES = 10  # notebook versions packed against one base version (it drifts faster)


def cap_answer(text: str) -> str:
    """``text``, or its head and tail around a marker naming how much was left out."""
    if len(text) <= ANSWER_HEAD_CHARS + ANSWER_TAIL_CHARS:
        return text
    dropped = len(text) - ANSWER_HEAD_CHARS - ANSWER_TAIL_CHARS
    return (
        text[:ANSWER_HEAD_CHARS]
        + f"\n[... evolve stored {ANSWER_HEAD_CHARS} + {ANSWER_TAIL_CHARS} of {len(text)} characters; "
        f"{dropped} left out here ...]\n" + text[-ANSWER_TAIL_CHARS:]
    )


def pack_vector(vector: Sequence[float]) -> str:
    """An embedding as text: its values as little-endian float32, base64 (5.3 characters a value)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def unpack_vector(text: str) -> tuple[float, ...]:
    """The values ``pack_vector`` stored (float32 precision)."""
    raw = base64.b64decode(text)
    return struct.unpack(f"<{len(raw) // 4}f", raw)


class PromptPacker:
    """Compresses prompts (their messages' JSON) with zlib, using a recent prompt as the dictionary.

    Prompts of one run share most of their text (instructions, the task, programs close to
    each other), so each is stored as a zlib stream primed with a *base* prompt: a row stored
    self-contained, whose id the others name in ``prompt_base``. Every ``_BASE_USES`` prompts
    the next one becomes the base, so the dictionary follows the run. Any sequence of texts
    that change slowly packs the same way (``base_uses``: how many share one base), and reading
    one back costs at most two decompressions (``unpack_text``).
    """

    def __init__(self, base_uses: int = _BASE_USES) -> None:
        self._base: tuple[int, bytes] | None = None
        self._uses = 0
        self._base_uses = base_uses

    def pack(self, call_id: int, text: str) -> tuple[bytes, int | None]:
        """(blob, base id or None) for the text of row ``call_id``."""
        raw = text.encode()
        if self._base is None or self._uses >= self._base_uses:
            self._base, self._uses = (call_id, raw), 0
            return zlib.compress(raw, 6), None
        self._uses += 1
        packer = zlib.compressobj(6, zdict=self._base[1])
        return packer.compress(raw) + packer.flush(), self._base[0]


def unpack_prompt(conn: sqlite3.Connection, blob: bytes | None, base: int | None) -> str:
    """The JSON text of a prompt stored by ``PromptPacker`` (``"[]"`` when none was stored)."""
    if blob is None:
        return "[]"
    if base is None:
        return unpack_text(blob, None)
    row = conn.execute("SELECT prompt FROM llm_calls WHERE id=?", (base,)).fetchone()
    return unpack_text(blob, row[0])


def unpack_text(blob: bytes, base_blob: bytes | None) -> str:
    """A text ``PromptPacker`` packed, given the blob of its base row (None: it is a base)."""
    if base_blob is None:
        return zlib.decompress(blob).decode()
    unpacker = zlib.decompressobj(zdict=zlib.decompress(base_blob))
    return (unpacker.decompress(blob) + unpacker.flush()).decode()


def prompt_messages(conn: sqlite3.Connection, call_id: int) -> list[dict[str, Any]]:
    """The chat messages of one ``llm_calls`` row."""
    row = conn.execute(
        "SELECT prompt, prompt_base FROM llm_calls WHERE id=?", (call_id,)
    ).fetchone()
    if row is None:
        raise KeyError(call_id)
    return json.loads(unpack_prompt(conn, row[0], row[1]))
