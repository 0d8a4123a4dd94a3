"""The GPT-2 tokenizer without the internet, and a trained byte-level BPE as the fallback.

tiktoken's ``gpt2`` encoding downloads ``vocab.bpe`` on first use, which fails offline.
Its ranks are however identical to the first 50256 ranks of ``p50k_base`` (p50k only adds
ranks 50257-50280 for runs of spaces), and litellm (a dependency of evolve) ships
``p50k_base`` in its tiktoken cache. We read those ranks, rebuild the BPE merge list from
them (a token of rank r is the merge of the two pieces that BPE over ranks < r leaves),
and run it with Hugging Face ``tokenizers`` and GPT-2's pre-tokenization regex. The
result gives GPT-2's token ids, so a target such as 3.28 stays defined on the same
tokens. If no ranks file is found, ``GPT2RanksMissing`` says where it looked and how to
provide one; nothing falls back. ``train_bpe`` trains a byte-level BPE when one is asked for
by name: a different vocabulary, so losses are not comparable with GPT-2-token targets.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from evolve.harness import tokenizer as bpe

EOT = 50256
EOT_TEXT = "<|endoftext|>"
P50K_URL = "https://openaipublic.blob.core.windows.net/encodings/p50k_base.tiktoken"
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (used by ByteLevel BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def ranks_file_candidates() -> list[Path]:
    """Where a tiktoken cache file with GPT-2's ranks may be found, in order of preference."""
    names = [hashlib.sha1(url.encode()).hexdigest() for url in (R50K_URL, P50K_URL)]
    dirs = [os.environ.get(var) for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")]
    spec = importlib.util.find_spec("litellm")
    if spec and spec.origin:
        dirs.append(str(Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"))
    dirs.append(str(Path(os.environ.get("TMPDIR", "/tmp")) / "data-gym-cache"))
    return [Path(d) / name for d in dirs if d for name in names]


class GPT2RanksMissing(FileNotFoundError):
    """No tiktoken ranks file with GPT-2's vocabulary where one was looked for."""


def load_gpt2_ranks(path: Path | None = None) -> dict[bytes, int]:
    """GPT-2's BPE ranks (50256 byte strings) from a tiktoken ranks file.

    Raises:
        GPT2RanksMissing: no valid ranks file was found; its message names the files looked
            for and the two ways to provide one.
    """
    candidates = [path] if path else ranks_file_candidates()
    for candidate in candidates:
        if candidate and candidate.is_file():
            ranks = {}
            for line in candidate.read_text().splitlines():
                token, rank = line.split()
                if int(rank) < EOT:
                    ranks[base64.b64decode(token)] = int(rank)
            if len(ranks) != EOT or sorted(ranks.values()) != list(range(EOT)):
                continue
            return ranks
    raise GPT2RanksMissing(
        "no tiktoken ranks file with GPT-2's vocabulary (looked for "
        + ", ".join(str(c) for c in candidates)
        + "); install litellm (it ships p50k_base), or set TIKTOKEN_CACHE_DIR to a folder holding "
        f"p50k_base.tiktoken or r50k_base.tiktoken saved under the sha1 of its URL ({P50K_URL}); "
        "a BPE of another vocabulary is made only when asked for (--tokenizer bpe)"
    )


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair whose merge creates ``token``: run BPE on its bytes using only lower ranks."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, where = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < limit and (best is None or rank < best):
                best, where = rank, i
        if best is None:
            break
        parts[where : where + 2] = [parts[where] + parts[where + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} cannot be built from lower-ranked merges")
    return parts[0], parts[1]


def gpt2_tokenizer(ranks: dict[bytes, int] | None = None) -> Tokenizer:
    """A Hugging Face tokenizer giving GPT-2's ids (EOT = 50256 as a special token)."""
    ranks = ranks or load_gpt2_ranks()
    to_text = _byte_to_unicode()

    def text(piece: bytes) -> str:
        return "".join(to_text[b] for b in piece)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [
        tuple(map(text, _merge_of(token, ranks)))
        for token, _ in sorted(ranks.items(), key=lambda kv: kv[1])
        if len(token) > 1
    ]
    vocab[EOT_TEXT] = EOT
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOT_TEXT])
    return tokenizer


def train_bpe(texts: Iterable[str], *, vocab_size: int = EOT + 1) -> Tokenizer:
    """A byte-level BPE (``evolve.harness.tokenizer``) whose last id (``vocab_size - 1``) is EOT.

    Used only when asked for by name (``--tokenizer bpe``, the CPU scale's corpus). Ids differ
    from GPT-2's, so a loss target set on GPT-2 tokens does not carry over.
    """
    if not 257 <= vocab_size <= EOT + 1:
        raise ValueError(
            f"vocab_size must be in [257, {EOT + 1}] so that ids fit the shard format, got {vocab_size}"
        )
    return bpe.train_bpe(texts, vocab_size, specials=[EOT_TEXT], specials_last=True)


def eot_id(tokenizer: Tokenizer) -> int:
    """The id of the end-of-text token in ``tokenizer`` (50256 for GPT-2)."""
    return bpe.token_id(tokenizer, EOT_TEXT)


def encode_documents(tokenizer: Tokenizer, texts: Iterable[str]) -> Iterator[list[int]]:
    """Each text's ids preceded by EOT (the shard format's document start)."""
    return bpe.encode_documents(tokenizer, texts, eot_id(tokenizer))
