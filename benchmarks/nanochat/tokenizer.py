"""BPE tokenizer with the original's vocabulary rules (HF ``tokenizers``) and its token-bytes table.

Rules taken from autoresearch/nanochat: byte-level BPE, 4 reserved special tokens of which
``<|reserved_0|>`` is BOS, and the GPT-4 split pattern with numbers split in groups of at
most two digits (``\\p{N}{1,2}`` instead of GPT-4's ``\\p{N}{1,3}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = tuple(f"<|reserved_{i}|>" for i in range(4))
BOS_TOKEN = SPECIAL_TOKENS[0]
SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
TOKENIZER_FILE = "tokenizer.json"
TOKEN_BYTES_FILE = "token_bytes.npy"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> Tokenizer:
    """Train a byte-level BPE tokenizer of ``vocab_size`` tokens (the 4 specials included).

    Args:
        texts: training documents; iterated once. Training runs on all cores (Rust threads).
        vocab_size: total vocabulary, special tokens included (8192 in the original).

    Returns:
        The trained tokenizer; ``bos_id(tok)`` gives the BOS id.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs at least 261 tokens"
        )
    tok = Tokenizer(models.BPE(byte_fallback=False, unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=list(SPECIAL_TOKENS),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def bos_id(tok: Tokenizer) -> int:
    """The id of the BOS token (``<|reserved_0|>``)."""
    ident = tok.token_to_id(BOS_TOKEN)
    if ident is None:
        raise ValueError(f"tokenizer has no {BOS_TOKEN}; it was not made by train_tokenizer")
    return ident


def token_bytes(tok: Tokenizer) -> np.ndarray:
    """UTF-8 byte length of every token id; 0 for special tokens.

    Byte-level BPE writes each byte as one printable character, so a token's byte count is
    the length of its vocabulary string. This is exact even for tokens that hold part of a
    multi-byte character (decoding those alone would give a replacement character).
    """
    size = tok.get_vocab_size()
    table = np.zeros(size, dtype=np.int32)
    specials = set(SPECIAL_TOKENS)
    for piece, ident in tok.get_vocab().items():
        table[ident] = 0 if piece in specials else len(piece)
    return table


def encode_documents(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each document with BOS prepended (batched: runs on all cores)."""
    bos = bos_id(tok)
    return [[bos, *enc.ids] for enc in tok.encode_batch_fast(list(texts), add_special_tokens=False)]


def iter_encoded(tok: Tokenizer, texts: Iterable[str], batch: int = 1024) -> Iterator[list[int]]:
    """Stream ``encode_documents`` over an iterable, ``batch`` documents at a time."""
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) >= batch:
            yield from encode_documents(tok, chunk)
            chunk = []
    if chunk:
        yield from encode_documents(tok, chunk)


def save(tok: Tokenizer, directory: Path) -> None:
    """Write ``tokenizer.json`` and ``token_bytes.npy`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / TOKENIZER_FILE))
    np.save(directory / TOKEN_BYTES_FILE, token_bytes(tok))


def load(directory: Path) -> Tokenizer:
    """Load the tokenizer saved by ``save``."""
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; run `python -m evolve.benchmarks.nanochat.prepare` first"
        )
    return Tokenizer.from_file(str(path))


def load_token_bytes(directory: Path) -> np.ndarray:
    """Load the token-bytes table saved by ``save``."""
    return np.load(directory / TOKEN_BYTES_FILE)
