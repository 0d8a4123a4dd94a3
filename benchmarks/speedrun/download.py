"""Download the pre-tokenized FineWeb10B shards (GPT-2 tokens) resumably, and verify them.

The files are the ones modded-nanogpt's ``data/cached_fineweb10B.py`` fetches from the
Hugging Face dataset ``kjj0/fineweb10B-gpt2``: ``fineweb_val_000000.bin`` (the validation
shard) and ``fineweb_train_000001.bin`` ... ``fineweb_train_000103.bin``, each about 10^8
tokens in the format of ``shards.py``. The transfer is ``evolve.harness.download``'s
(resumable, size and SHA-256 checked against the server's ETag or a manifest); each file
is then checked as a shard (header, size against the header).

Usage: ``python -m evolve.benchmarks.speedrun.download --out DIR --train-shards 8``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from evolve.harness.download import DownloadError
from evolve.harness.download import download as fetch

from .shards import ShardError, read_header

BASE_URL = "https://huggingface.co/datasets/kjj0/fineweb10B-gpt2/resolve/main"
MAX_TRAIN_SHARDS = 103


def shard_names(train_shards: int) -> list[str]:
    """The validation shard followed by the first ``train_shards`` training shards."""
    if not 0 <= train_shards <= MAX_TRAIN_SHARDS:
        raise ValueError(f"train_shards must be in [0, {MAX_TRAIN_SHARDS}], got {train_shards}")
    return ["fineweb_val_000000.bin"] + [
        f"fineweb_train_{i:06d}.bin" for i in range(1, train_shards + 1)
    ]


def download(
    out: Path,
    *,
    train_shards: int,
    base_url: str = BASE_URL,
    manifest: Mapping[str, str] | None = None,
    log: Callable[[str], None] = print,
    attempts: int = 5,
) -> list[Path]:
    """Fetch the validation shard and ``train_shards`` training shards into ``out``.

    Raises:
        DownloadError: a transfer failed, or a file is not a whole shard (it is removed).
    """
    paths = []
    for name in shard_names(train_shards):
        dest = fetch(
            f"{base_url.rstrip('/')}/{name}",
            out / name,
            sha256=(manifest or {}).get(name),
            retries=attempts,
        )
        try:
            read_header(dest)
        except ShardError as exc:
            dest.unlink()
            raise DownloadError(f"{exc} (file removed; run again to download it afresh)") from exc
        paths.append(dest)
        log(f"{name}: ok")
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command line: download shards into a folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the .bin shards")
    parser.add_argument(
        "--train-shards",
        type=int,
        default=8,
        help="training shards (each ~10^8 tokens; 103 in all)",
    )
    parser.add_argument(
        "--base-url", default=BASE_URL, help="where the files live (a mirror, or a local server)"
    )
    parser.add_argument(
        "--manifest",
        type=Path,
        help="optional 'sha256  name' lines (sha256sum output) to verify against",
    )
    args = parser.parse_args(argv)
    manifest = None
    if args.manifest:
        manifest = {
            parts[1].lstrip("*"): parts[0]
            for line in args.manifest.read_text().splitlines()
            if len(parts := line.split()) == 2
        }
    try:
        download(
            args.out, train_shards=args.train_shards, base_url=args.base_url, manifest=manifest
        )
    except (DownloadError, ShardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
