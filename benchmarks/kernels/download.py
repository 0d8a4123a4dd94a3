"""Download upstream's dataset (a Hugging Face dataset repository) with resume and verification.

    python -m evolve.benchmarks.kernels download --out data/sol-execbench
    python -m evolve.benchmarks.kernels problems --dataset data/sol-execbench

The file list comes from the Hub's tree API (``/api/datasets/<repo>/tree/<revision>?recursive=true``),
each file from ``/datasets/<repo>/resolve/<revision>/<path>`` through the harness layer's
transfer (``evolve.harness.download``: a partial ``<file>.part`` continues with an HTTP
``Range`` request, size and SHA-256 checked before the file takes its name). A file already
present with the right checksum is skipped; files stored in Git LFS are checked against
their SHA-256 (``lfs.oid``), the others against their Git blob SHA-1 (``oid``). A
folder the user already has needs no download: point ``--dataset`` (or
``benchmark.fitness.dataset``) at it. ``--endpoint`` points at a mirror (tests use a
local HTTP server).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.error import HTTPError, URLError

from evolve.harness.download import DownloadError as FetchError
from evolve.harness.download import download as fetch
from evolve.harness.hashing import sha256_file
from evolve.types import EvolveError

DEFAULT_REPO = "nvidia/SOL-ExecBench"
DEFAULT_ENDPOINT = "https://huggingface.co"
CHUNK = 1 << 20


class DownloadError(EvolveError):
    """The dataset could not be fetched or a file failed its checksum; the message says which."""


def _get(url: str, headers: dict[str, str] | None = None, timeout: float = 60.0) -> Any:
    try:
        return urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=timeout
        )
    except (HTTPError, URLError, TimeoutError) as exc:
        raise DownloadError(
            f"cannot fetch {url}: {exc}. Without internet access, copy the dataset from a machine that has it "
            "and pass its folder as --dataset"
        ) from exc


def listing(endpoint: str, repo: str, revision: str) -> list[dict[str, Any]]:
    """The repository's files: path, size and checksum, from the Hub's tree API."""
    with _get(f"{endpoint}/api/datasets/{repo}/tree/{revision}?recursive=true") as response:
        entries = json.loads(response.read())
    return [e for e in entries if e.get("type") == "file"]


def checksum_ok(path: Path, entry: dict[str, Any]) -> bool:
    """True when the file matches the listing: SHA-256 of LFS files, Git blob SHA-1 of others."""
    lfs = entry.get("lfs")
    if lfs:
        return sha256_file(path) == (lfs.get("oid") or lfs.get("sha256"))
    digest = hashlib.sha1()  # Git's object id: sha1(b"blob <size>\0" + content)
    digest.update(f"blob {path.stat().st_size}\0".encode())
    expected = entry.get("oid")
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest() == expected


def download(out: Path, *, repo: str = DEFAULT_REPO, revision: str = "main", endpoint: str = DEFAULT_ENDPOINT,
             include: str = "*", log: Callable[[str], None] = print, retries: int = 3) -> dict[str, int]:  # fmt: skip
    """Fetch every file of the dataset matching ``include`` into ``out``; counts of fetched and kept files.

    Raises:
        DownloadError: unreachable server, or a file whose checksum does not match after download.
    """
    out.mkdir(parents=True, exist_ok=True)
    counts = {"fetched": 0, "kept": 0}
    for entry in listing(endpoint.rstrip("/"), repo, revision):
        rel = PurePosixPath(entry["path"])
        if rel.is_absolute() or ".." in rel.parts or not fnmatch.fnmatch(str(rel), include):
            continue
        target = out / rel
        if target.is_file() and checksum_ok(target, entry):
            counts["kept"] += 1
            continue
        target.unlink(missing_ok=True)  # present but wrong: fetch it again
        url = f"{endpoint.rstrip('/')}/datasets/{repo}/resolve/{revision}/{rel}"
        lfs_sha = (entry.get("lfs") or {}).get("oid")
        try:  # the harness layer's transfer: resumes <file>.part with Range, checks size and SHA-256
            fetch(url, target, sha256=lfs_sha, retries=retries)
        except FetchError as exc:
            raise DownloadError(
                f"{rel}: {exc}; run the command again (a partial file resumes)"
            ) from exc
        if not checksum_ok(target, entry):  # files outside LFS: their Git blob id
            target.unlink()
            raise DownloadError(
                f"{rel}: checksum mismatch after download (removed); run the command again"
            )
        counts["fetched"] += 1
        log(f"fetched {rel} ({target.stat().st_size} bytes)")
    return counts
