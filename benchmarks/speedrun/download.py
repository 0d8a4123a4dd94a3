"""Download the pre-tokenized FineWeb10B shards (GPT-2 tokens) resumably, and verify them.

The files are the ones modded-nanogpt's ``data/cached_fineweb10B.py`` fetches from the
Hugging Face dataset ``kjj0/fineweb10B-gpt2``: ``fineweb_val_000000.bin`` (the validation
shard) and ``fineweb_train_000001.bin`` ... ``fineweb_train_000103.bin``, each about 10^8
tokens in the format of ``shards.py``. Partial downloads are kept as ``NAME.part`` and
continued with an HTTP Range request; a finished file is checked (header, size against
the header and the server's length, SHA-256 when the server or a manifest gives one)
before it is renamed into place.

Usage: ``python -m evolve.benchmarks.speedrun.download --out DIR --train-shards 8``
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from evolve.benchmarks.speedrun.shards import ShardError, read_header

BASE_URL = "https://huggingface.co/datasets/kjj0/fineweb10B-gpt2/resolve/main"
MAX_TRAIN_SHARDS = 103
CHUNK = 1 << 20
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DownloadError(RuntimeError):
    """A shard could not be fetched or failed verification; the message says what to do."""


def shard_names(train_shards: int) -> list[str]:
    """The validation shard followed by the first ``train_shards`` training shards."""
    if not 0 <= train_shards <= MAX_TRAIN_SHARDS:
        raise ValueError(f"train_shards must be in [0, {MAX_TRAIN_SHARDS}], got {train_shards}")
    return ["fineweb_val_000000.bin"] + [
        f"fineweb_train_{i:06d}.bin" for i in range(1, train_shards + 1)
    ]


def _server_sha256(headers: Mapping[str, str]) -> str | None:
    """The SHA-256 a server states for the file (Hugging Face sends it as the LFS ETag)."""
    for key in ("X-Linked-Etag", "ETag"):
        value = (headers.get(key) or "").strip().strip('"').removeprefix("W/").strip('"').lower()
        if SHA256.match(value):
            return value
    return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _fetch_once(url: str, part: Path, timeout_s: float) -> tuple[int | None, str | None]:
    """Continue ``part`` from its current size; return (total size, stated SHA-256)."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)  # noqa: S310 - https/http URLs only
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to fetch: the part is already whole
            return have, None
        raise
    with response:
        if have and response.status != 206:  # the server ignored the range: start over
            have = 0
        total = None
        if response.status == 206:
            match = re.search(r"/(\d+)$", response.headers.get("Content-Range", ""))
            total = int(match.group(1)) if match else None
        elif response.headers.get("Content-Length"):
            total = int(response.headers["Content-Length"])
        with part.open("ab" if have else "wb") as f:
            while block := response.read(CHUNK):
                f.write(block)
        return total, _server_sha256(response.headers)


def fetch(
    url: str,
    dest: Path,
    *,
    expected_sha256: str | None = None,
    attempts: int = 5,
    timeout_s: float = 60.0,
    log: Callable[[str], None] = print,
) -> Path:
    """Download ``url`` to ``dest`` resumably and verify it as a shard.

    Raises:
        DownloadError: every attempt failed, or the finished file failed verification
            (the partial file is removed so the next call starts clean).
    """
    if dest.exists():
        read_header(dest)  # an existing file must still be a whole, valid shard
        if expected_sha256 and _sha256_file(dest) != expected_sha256:
            raise DownloadError(
                f"{dest}: SHA-256 differs from the manifest; delete it and download again"
            )
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    stated = None
    total = None
    for attempt in range(1, attempts + 1):
        try:
            total, stated_now = _fetch_once(url, part, timeout_s)
            stated = stated_now or stated
            if total is None or part.stat().st_size >= total:
                break
            log(f"{dest.name}: connection ended at {part.stat().st_size}/{total} bytes; resuming")
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            if attempt == attempts:
                raise DownloadError(
                    f"{url}: {exc}; {part.stat().st_size if part.exists() else 0} bytes kept in {part}, "
                    "run the command again to resume"
                ) from exc
            log(f"{dest.name}: {exc}; retrying ({attempt}/{attempts})")
            time.sleep(min(2.0**attempt, 30.0) / 10)
    else:
        raise DownloadError(
            f"{url}: still incomplete after {attempts} attempts; run again to resume"
        )
    _verify(part, total=total, sha256=expected_sha256 or stated, name=dest.name)
    part.replace(dest)
    return dest


def _verify(part: Path, *, total: int | None, sha256: str | None, name: str) -> None:
    size = part.stat().st_size
    try:
        if total is not None and size != total:
            raise DownloadError(f"{name}: got {size} bytes, the server announced {total}")
        read_header(part)
        if sha256 and _sha256_file(part) != sha256:
            raise DownloadError(f"{name}: SHA-256 of the download differs from {sha256}")
    except (ShardError, DownloadError) as exc:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{exc} (partial file removed; run again to download it afresh)"
        ) from exc


def download(
    out: Path,
    *,
    train_shards: int,
    base_url: str = BASE_URL,
    manifest: Mapping[str, str] | None = None,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Fetch the validation shard and ``train_shards`` training shards into ``out``."""
    paths = []
    for name in shard_names(train_shards):
        url = f"{base_url.rstrip('/')}/{name}"
        paths.append(fetch(url, out / name, expected_sha256=(manifest or {}).get(name), log=log))
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
