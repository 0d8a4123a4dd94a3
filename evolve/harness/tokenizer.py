"""Byte-level BPE training (Hugging Face ``tokenizers``), token byte lengths and document encoding.

One trainer for every benchmark; a benchmark picks its split pattern and special tokens
(nanochat: the GPT-4 pattern with 1-2 digit numbers and 4 reserved specials; speedrun: GPT-2's
pattern with EOT last).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

TOKENIZER_FILE = "tokenizer.json"
TOKEN_BYTES_FILE = "token_bytes.npy"


def train_bpe(
    texts: Iterable[str],
    vocab_size: int,
    *,
    split_pattern: str | None = None,
    specials: Sequence[str] = (),
    specials_last: bool = False,
) -> Tokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens, specials included.

    Args:
        texts: training documents; iterated once. Training runs on all cores (Rust threads).
        vocab_size: total vocabulary, special tokens included.
        split_pattern: the pre-tokenizer's regex; None: GPT-2's (ByteLevel's own).
        specials: special tokens; first ids, or the last ones with ``specials_last``.
        specials_last: add the specials after training (so they take the highest ids).
    """
    if vocab_size < 256 + len(specials) + 1:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs at least "
            f"{257 + len(specials)} tokens"
        )
    tok = Tokenizer(models.BPE(byte_fallback=False, unk_token=None, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_pattern is None)
    tok.pre_tokenizer = (
        byte_level
        if split_pattern is None
        else pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split_pattern), behavior="isolated"), byte_level]
        )
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - (len(specials) if specials_last else 0),
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[] if specials_last else list(specials),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if specials_last:
        tok.add_special_tokens(list(specials))
    return tok


def token_id(tok: Tokenizer, token: str) -> int:
    """The id of ``token``; ValueError naming the fix when the tokenizer lacks it."""
    ident = tok.token_to_id(token)
    if ident is None:
        raise ValueError(f"tokenizer has no {token!r}; train it with that special token")
    return ident


def token_bytes(tok: Tokenizer, specials: Sequence[str] = ()) -> np.ndarray:
    """UTF-8 byte length of every token id; 0 for ``specials``.

    Byte-level BPE writes each byte as one printable character, so a token's byte count is
    the length of its vocabulary string, exact even for tokens holding part of a multi-byte
    character (decoding those alone would give a replacement character).
    """
    table = np.zeros(tok.get_vocab_size(), dtype=np.int32)
    skip = set(specials)
    for piece, ident in tok.get_vocab().items():
        table[ident] = 0 if piece in skip else len(piece)
    return table


def encode_documents(
    tok: Tokenizer, texts: Iterable[str], start_id: int, *, batch: int = 1024
) -> Iterator[list[int]]:
    """Each text's ids preceded by ``start_id`` (BOS/EOT), encoded ``batch`` at a time on all cores."""
    pending: list[str] = []

    def flush() -> list[list[int]]:
        found = tok.encode_batch_fast(pending, add_special_tokens=False)
        return [[start_id, *enc.ids] for enc in found]

    for text in texts:
        pending.append(text)
        if len(pending) >= batch:
            yield from flush()
            pending = []
    if pending:
        yield from flush()


def save(tok: Tokenizer, directory: Path, specials: Sequence[str] = ()) -> None:
    """Write ``tokenizer.json`` and ``token_bytes.npy`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / TOKENIZER_FILE))
    np.save(directory / TOKEN_BYTES_FILE, token_bytes(tok, specials))


def load(directory: Path, hint: str = "") -> Tokenizer:
    """Load the tokenizer saved by ``save`` (``hint``: the command that prepares it)."""
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; {hint or 'prepare the dataset first'}")
    return Tokenizer.from_file(str(path))


def load_token_bytes(directory: Path) -> np.ndarray:
    """Load the token-bytes table saved by ``save``."""
    return np.load(directory / TOKEN_BYTES_FILE)
