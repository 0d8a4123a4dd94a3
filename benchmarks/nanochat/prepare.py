"""Prepare a dataset once: get text, train the tokenizer, write train and validation token files.

Usage::

    # English Wikipedia shards (or any parquet / jsonl / jsonl.xz / txt files or folders)
    python -m evolve.benchmarks.nanochat.prepare --name wikipedia \\
        --train data/wikipedia/train-00.jsonl.xz data/wikipedia/train-01.jsonl.xz --val data/wikipedia/val.jsonl.xz
    # climbmix as in the original: downloads N training shards plus the pinned validation shard
    python -m evolve.benchmarks.nanochat.prepare --name climbmix --climbmix-shards 8
    # the offline CPU set, from Python's standard library (done automatically on first use)
    python -m evolve.benchmarks.nanochat.prepare --name stdlib --stdlib --vocab 4096

Layout under the data directory (``$EVOLVE_DATA_DIR`` or ``~/.cache/evolve/nanochat``)::

    NAME/tokenizer/{tokenizer.json, token_bytes.npy}   given to training and scoring
    NAME/train/{tokens.bin, offsets.npy, split.json}   streamed to training by the harness's supervisor
    NAME/val/{...}                                     read by the harness's scorer only
    NAME/dataset.json                                  sources, sizes, vocabulary, and
                                                       ``hidden_sources``: the text files hidden
                                                       from candidates like the splits
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from evolve.harness import documents, download, tokenizer

from . import sources, tokens

# The original's tokenizer rules (autoresearch/nanochat): byte-level BPE, 4 reserved specials
# of which <|reserved_0|> is BOS, the GPT-4 split pattern with numbers in groups of at most
# two digits (\p{N}{1,2} instead of GPT-4's \p{N}{1,3}).
SPECIAL_TOKENS = tuple(f"<|reserved_{i}|>" for i in range(4))
BOS_TOKEN = SPECIAL_TOKENS[0]
SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
CLIMBMIX_URL = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
CLIMBMIX_LAST_SHARD = 6542  # the pinned validation shard, never trained on
DEFAULT_DATA_DIR = Path("~/.cache/evolve/nanochat")
STDLIB_LAYOUT = "v2"  # the stdlib split's layout (v2: validation from the test package)
DOC_CAP_CHARS = (
    10_000  # each document contributes at most this much to tokenizer training (nanochat)
)
TextSource = Callable[[], Iterable[str]]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192):
    """A byte-level BPE of ``vocab_size`` tokens with the original's rules (specials first, BOS = id 0)."""
    return tokenizer.train_bpe(
        texts, vocab_size, split_pattern=SPLIT_PATTERN, specials=SPECIAL_TOKENS
    )


def climbmix_urls(shards: Iterable[int], base_url: str = CLIMBMIX_URL) -> list[str]:
    """The URLs of climbmix shards by index."""
    return [f"{base_url}/shard_{index:05d}.parquet" for index in shards]


def data_dir(override: str | Path | None = None) -> Path:
    """The data directory: ``override``, else ``$EVOLVE_DATA_DIR``, else ``~/.cache/evolve/nanochat``."""
    chosen = override or os.environ.get("EVOLVE_DATA_DIR") or DEFAULT_DATA_DIR
    return Path(chosen).expanduser().resolve()


def split_dirs(root: Path) -> dict[str, Path]:
    """The parts of a prepared dataset directory."""
    return {"tokenizer": root / "tokenizer", "train": root / "train", "val": root / "val"}


def stdlib_name(vocab_size: int) -> str:
    """The automatic stdlib dataset's folder name: per vocabulary and per layout of its split,
    so that a dataset cached with an older split (validation text a program could read) is
    never used."""
    return f"stdlib-{STDLIB_LAYOUT}-{vocab_size}"


def hidden_sources(root: Path) -> list[str]:
    """The text files a prepared dataset was made from that still exist (``hidden_sources`` in
    its dataset.json): hidden from candidates as its splits are."""
    meta = json.loads((root / "dataset.json").read_text()) if is_prepared(root) else {}
    return sorted(p for p in meta.get("hidden_sources", []) if os.path.exists(p))


def is_prepared(root: Path) -> bool:
    return (root / "dataset.json").is_file()


def _capped(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    total = 0
    for text in texts:
        piece = text[:DOC_CAP_CHARS]
        yield piece
        total += len(piece)
        if total >= max_chars:
            return


def build(
    root: Path,
    *,
    train: TextSource,
    val: TextSource,
    vocab_size: int,
    tokenizer_chars: int = 2_000_000_000,
    describe: dict | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Build a dataset into ``root`` (atomically: a temp directory renamed at the end).

    Args:
        root: target directory; must not exist yet.
        train: returns the training documents (called twice: tokenizer, then tokens).
        val: returns the validation documents.
        vocab_size: tokenizer vocabulary, specials included.
        tokenizer_chars: at most this many characters train the tokenizer.
        describe: extra facts stored in dataset.json (sources...).
        log: progress messages.
    """
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    parts = split_dirs(tmp)
    start = time.monotonic()
    tok = train_tokenizer(_capped(train(), tokenizer_chars), vocab_size)
    tokenizer.save(tok, parts["tokenizer"], SPECIAL_TOKENS)
    log(
        f"nanochat prepare: tokenizer ({vocab_size} tokens) trained in {time.monotonic() - start:.1f}s"
    )
    summary = {
        "vocab_size": vocab_size,
        "bos_id": tokenizer.token_id(tok, BOS_TOKEN),
        **(describe or {}),
    }
    for name, texts in (("train", train), ("val", val)):
        t0 = time.monotonic()
        meta = tokens.write_split(
            parts[name],
            tokenizer.encode_documents(tok, texts(), tokenizer.token_id(tok, BOS_TOKEN)),
            vocab_size,
        )
        if meta["documents"] == 0:
            raise ValueError(f"the {name} split has no documents; check the --{name} sources")
        summary[name] = meta
        log(
            f"nanochat prepare: {name}: {meta['documents']} documents, {meta['tokens']:,} tokens "
            f"({time.monotonic() - t0:.1f}s)"
        )
    (tmp / "dataset.json").write_text(json.dumps(summary, indent=2))
    tmp.replace(root)
    return summary


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_stdlib(root: Path, vocab_size: int, log: Callable[[str], None] = print) -> Path:
    """Prepare the offline stdlib dataset at ``root`` unless it exists (safe across processes)."""
    if is_prepared(root):
        return root
    with _lock(root.with_name(root.name + ".lock")):
        if not is_prepared(root):
            log(
                f"nanochat: preparing the offline dataset from Python's standard library into {root}"
            )
            train_texts, val_texts = sources.stdlib_corpus()
            build(
                root,
                train=lambda: train_texts,
                val=lambda: val_texts,
                vocab_size=vocab_size,
                describe={
                    "source": "python-stdlib",
                    "python": sys.version.split()[0],
                    "hidden_sources": [str(documents.stdlib_tests())],  # the validation text
                },
                log=log,
            )
    return root


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m evolve.benchmarks.nanochat.prepare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--name", required=True, help="dataset name (a folder under the data directory)"
    )
    parser.add_argument("--data-dir", help="default: $EVOLVE_DATA_DIR or ~/.cache/evolve/nanochat")
    parser.add_argument("--train", nargs="+", type=Path, help="training text files or folders")
    parser.add_argument("--val", nargs="+", type=Path, help="validation text files or folders")
    parser.add_argument(
        "--stdlib", action="store_true", help="use Python's standard library (offline)"
    )
    parser.add_argument(
        "--climbmix-shards", type=int, help="download this many climbmix training shards"
    )
    parser.add_argument("--climbmix-url", default=CLIMBMIX_URL)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument(
        "--max-train-chars", type=int, help="stop reading training text after this many chars"
    )
    parser.add_argument("--tokenizer-chars", type=int, default=2_000_000_000)
    parser.add_argument(
        "--chunk-chars",
        type=int,
        help="cut documents longer than this at paragraph ends (so long articles fill rows instead of "
        "being cropped by the packing); applied to train and val alike",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing dataset of this name"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = data_dir(args.data_dir) / args.name
    if is_prepared(root) and not args.overwrite:
        print(f"{root} is already prepared (pass --overwrite to rebuild)")
        return 0
    shutil.rmtree(root, ignore_errors=True)
    describe: dict = {}
    if args.stdlib:
        ensure_stdlib(root, args.vocab)
        return 0
    if args.climbmix_shards:
        raw = data_dir(args.data_dir) / "raw" / "climbmix"
        train_files = download.download_all(
            climbmix_urls(range(args.climbmix_shards), args.climbmix_url), raw
        )
        val_files = download.download_all(
            climbmix_urls([CLIMBMIX_LAST_SHARD], args.climbmix_url), raw
        )
        describe["source"] = (
            f"climbmix-400b-shuffle shards 0..{args.climbmix_shards - 1}, val {CLIMBMIX_LAST_SHARD}"
        )
    elif args.train and args.val:
        train_files, val_files = documents.expand(args.train), documents.expand(args.val)
        if set(train_files) & set(val_files):
            raise SystemExit(
                "a file is in both --train and --val; validation must be disjoint from training"
            )
        describe["source"] = {
            "train": [str(p) for p in train_files],
            "val": [str(p) for p in val_files],
        }
        describe["hidden_sources"] = [str(p.resolve()) for p in (*train_files, *val_files)]
    else:
        raise SystemExit(
            "name a source: --train FILES --val FILES, --climbmix-shards N, or --stdlib"
        )

    def chunked(texts: Iterable[str]) -> Iterator[str]:
        for text in texts:
            yield from sources.chunk_text(text, args.chunk_chars) if args.chunk_chars else (text,)

    if args.chunk_chars:
        describe["chunk_chars"] = args.chunk_chars
    build(
        root,
        train=lambda: chunked(documents.iter_texts(train_files, args.max_train_chars)),
        val=lambda: chunked(documents.iter_texts(val_files)),
        vocab_size=args.vocab,
        tokenizer_chars=args.tokenizer_chars,
        describe=describe,
    )
    print(f"prepared {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
