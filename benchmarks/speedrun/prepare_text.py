"""Tokenize local text (txt, jsonl, jsonl.xz/gz) into speedrun shards, for machines offline.

Each ``.txt`` file is one document; each line of a ``.jsonl`` file is one document (its
``text`` field); the files are read by ``evolve.harness.documents`` (also parquet). Documents are tokenized with GPT-2's vocabulary (``gpt2_tokenizer``;
without its ranks file the command stops with one ``error:`` line naming where it looked), or
with a byte-level BPE trained on the training text when ``--tokenizer bpe`` is asked. Output: ``{prefix}_val_000000.bin`` and
``{prefix}_train_000001.bin``..., plus ``tokenizer.json`` and ``prepared.json`` (counts,
tokenizer kind, sources).

Usage: ``python -m evolve.benchmarks.speedrun.prepare_text --train data/wikipedia/train-0*.jsonl.xz
--val data/wikipedia/val.jsonl.xz --out data/speedrun/wikipedia --prefix wikipedia``
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from evolve.harness.documents import iter_texts, stdlib_tests

from .gpt2_tokenizer import (
    GPT2RanksMissing,
    encode_documents,
    eot_id,
    gpt2_tokenizer,
    train_bpe,
)
from .shards import TOKENS_PER_SHARD, ShardWriter


def stdlib_documents(
    *,
    tests: bool = False,
    every: int = 1,
    offset: int = 0,
    limit_bytes: int | None = None,
    max_chars: int | None = None,
) -> Iterator[str]:
    """Python's own standard library sources as documents: text every machine has.

    ``tests``: the files of its test package (``documents.stdlib_tests``, which the sandbox
    hides: validation text), else those of the library outside its tests. Files are taken in
    sorted order, one in ``every`` starting at ``offset``, each cut to its first ``max_chars``
    characters (so that a few large files do not make up the text), until ``limit_bytes``.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if tests:
        files = sorted(stdlib_tests().rglob("*.py"))
    else:
        files = sorted(p for p in root.rglob("*.py") if "test" not in p.relative_to(root).parts[0])
    used = 0
    for path in files[offset::every]:
        try:
            text = path.read_text(encoding="utf-8")[:max_chars]
        except (OSError, UnicodeDecodeError):
            continue
        yield text
        used += len(text)
        if limit_bytes is not None and used >= limit_bytes:
            return


def write_split(
    tokenizer: Tokenizer,
    documents: Iterator[str],
    out: Path,
    *,
    prefix: str,
    split: str,
    tokens_per_shard: int = TOKENS_PER_SHARD,
) -> tuple[list[Path], int, int]:
    """Tokenize ``documents`` into shards; return (paths, tokens, documents)."""
    writer = ShardWriter(
        out,
        prefix=prefix,
        split=split,
        first_index=0 if split == "val" else 1,
        tokens_per_shard=tokens_per_shard,
    )
    count = 0
    for ids in encode_documents(tokenizer, documents):
        writer.add(ids)
        count += 1
    paths = writer.close()
    return paths, writer.total, count


def prepare(
    *,
    train: Sequence[Path] | None,
    val: Sequence[Path] | None,
    out: Path,
    prefix: str,
    tokenizer_kind: str = "gpt2",
    bpe_vocab: int = 50257,
    tokens_per_shard: int = TOKENS_PER_SHARD,
    train_docs: Iterator[str] | None = None,
    val_docs: Iterator[str] | None = None,
) -> dict:
    """Tokenize training and validation text into shards under ``out``; return a summary.

    Documents come from files (``train``/``val``) or directly from iterators
    (``train_docs``/``val_docs``). ``tokenizer_kind`` is ``gpt2`` (exact GPT-2 ids; without
    GPT-2's ranks this raises ``GPT2RanksMissing`` rather than use another vocabulary) or
    ``bpe`` (``bpe_vocab`` ids, the last one being the end-of-text separator: 50256 for the
    default 50257), asked for by name and recorded in ``prepared.json``.
    """
    kind = tokenizer_kind
    if kind == "gpt2":
        tokenizer = gpt2_tokenizer()  # no GPT-2 ranks: GPT2RanksMissing, never another tokenizer
    out.mkdir(parents=True, exist_ok=True)
    if kind == "bpe":
        texts = list(train_docs) if train_docs is not None else list(iter_texts(train or []))
        tokenizer = train_bpe(texts, vocab_size=bpe_vocab)
        train_docs = iter(texts)
    elif kind != "gpt2":
        raise ValueError(f"tokenizer must be 'gpt2' or 'bpe', got {tokenizer_kind!r}")
    tokenizer.save(str(out / "tokenizer.json"))
    summary: dict = {
        "tokenizer": kind,
        "prefix": prefix,
        "vocab_size": tokenizer.get_vocab_size(),
        "eot": eot_id(tokenizer),
    }
    for split, files, docs in (("val", val, val_docs), ("train", train, train_docs)):
        source = docs if docs is not None else iter_texts(files or [])
        paths, tokens, count = write_split(
            tokenizer, source, out, prefix=prefix, split=split, tokens_per_shard=tokens_per_shard
        )
        summary[split] = {
            "shards": [p.name for p in paths],
            "tokens": tokens,
            "documents": count,
            "sources": [str(Path(f).resolve()) for f in files or []],
        }
    (out / "prepared.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command line: tokenize text files into shards."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=Path, nargs="+", required=True, help="training text files")
    parser.add_argument("--val", type=Path, nargs="+", required=True, help="validation text files")
    parser.add_argument("--out", type=Path, required=True, help="output folder for the shards")
    parser.add_argument("--prefix", default="text", help="shard name prefix (e.g. wikipedia)")
    parser.add_argument(
        "--tokenizer", dest="tokenizer_kind", choices=("gpt2", "bpe"), default="gpt2"
    )
    parser.add_argument(
        "--bpe-vocab", type=int, default=50257, help="vocabulary of --tokenizer bpe (EOT = last id)"
    )
    parser.add_argument("--tokens-per-shard", type=int, default=TOKENS_PER_SHARD)
    try:
        summary = prepare(**vars(parser.parse_args(argv)))  # the options are prepare's parameters
    except GPT2RanksMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
