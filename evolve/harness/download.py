"""Resumable, verified HTTP downloads: one implementation for every benchmark's data.

A download goes to ``NAME.part`` and continues from its size with an HTTP ``Range`` request
when restarted; it is renamed only after its size matches the server's and, when known, its
SHA-256 matches (given, or the ``X-Linked-ETag`` Hugging Face sends for LFS files). Parquet
files must also start and end with the ``PAR1`` magic.
"""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evolve.harness.hashing import sha256_file

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A download failed after its retries or did not verify."""


def _expected_from_headers(headers, have: int, status: int) -> tuple[int | None, str | None]:
    total = None
    if status == 206 and (
        match := re.match(r"bytes \d+-\d+/(\d+)", headers.get("Content-Range", ""))
    ):
        total = int(match.group(1))
    elif status == 200 and headers.get("Content-Length"):
        total = int(headers["Content-Length"])
    etag = (headers.get("X-Linked-ETag") or headers.get("ETag") or "").strip('W/"')
    return total, etag.lower() if re.fullmatch(r"[0-9a-fA-F]{64}", etag) else None


def _verify(path: Path, size: int | None, sha256: str | None, *, parquet: bool) -> None:
    actual = path.stat().st_size
    if size is not None and actual != size:
        raise DownloadError(f"{path.name}: got {actual} bytes, expected {size}")
    if sha256 is not None and sha256_file(path) != sha256.lower():
        raise DownloadError(
            f"{path.name}: SHA-256 mismatch (file corrupt); delete it and download again"
        )
    if parquet:
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(-4, 2)
            if head != b"PAR1" or handle.read(4) != b"PAR1":
                raise DownloadError(f"{path.name}: not a parquet file (no PAR1 magic)")


def download(
    url: str, dest: Path, *, sha256: str | None = None, retries: int = 5, timeout_s: float = 60.0
) -> Path:
    """Download ``url`` to ``dest``, resuming a previous partial download; verify; return ``dest``.

    Raises:
        DownloadError: the server kept failing, or the file did not verify.
    """
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    last_error: Exception | None = None
    for attempt in range(retries):
        have = part.stat().st_size if part.exists() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status = response.status
                total, etag_sha = _expected_from_headers(response.headers, have, status)
                mode = "ab" if status == 206 else "wb"  # 200: the server ignored Range; start over
                with open(part, mode) as handle:
                    while chunk := response.read(CHUNK):
                        handle.write(chunk)
            _verify(part, total, sha256 or etag_sha, parquet=dest.suffix == ".parquet")
            part.replace(dest)
            return dest
        except urllib.error.HTTPError as exc:
            if (
                exc.code == 416 and have
            ):  # asked past the end: the part is complete or bad; check it
                try:
                    _verify(part, None, sha256, parquet=dest.suffix == ".parquet")
                    part.replace(dest)
                    return dest
                except DownloadError:
                    part.unlink()
            last_error = exc
        except DownloadError as exc:
            part.unlink(missing_ok=True)  # bad content: never resume from it
            last_error = exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            last_error = exc  # keep the part; the next attempt resumes it
        time.sleep(min(2**attempt * 0.5, 10.0))
    raise DownloadError(f"could not download {url} after {retries} attempts: {last_error}")


def download_all(
    urls: Sequence[str],
    directory: Path,
    *,
    sha256: Callable[[str], str | None] = lambda name: None,
    workers: int = 4,
) -> list[Path]:
    """Download ``urls`` into ``directory`` under their last path part, in parallel; their paths.

    ``sha256(name)`` gives a file's expected digest when known (e.g. from a manifest).
    """

    def one(url: str) -> Path:
        name = url.rsplit("/", 1)[-1]
        return download(url, directory / name, sha256=sha256(name))

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, urls))
