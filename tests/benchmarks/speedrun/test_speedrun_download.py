"""The FineWeb downloader (on ``evolve.harness.download``) against a local HTTP server: resumable, shards verified."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
from evolve.benchmarks.speedrun.download import DownloadError, download, shard_names
from evolve.benchmarks.speedrun.shards import read_shard, write_shard


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves files from ``root`` with Range support; can cut the first response short."""

    root: Path
    cut_first_at: int | None = None
    etag_sha: bool = True
    requests: list[str] = []

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = self.root / self.path.lstrip("/").split("/")[-1]
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.requests.append(self.headers.get("Range") or "full")
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
            if start >= len(data):
                self.send_response(416)
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        if self.etag_sha:
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.end_headers()
        cut = type(self).cut_first_at
        if cut is not None:
            type(self).cut_first_at = None
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.connection.shutdown(2)  # drop the connection mid-file
            return
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "remote"
    root.mkdir()
    handler = type("Handler", (_Handler,), {"root": root, "requests": [], "cut_first_at": None})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/datasets/x/resolve/main", root, handler
    httpd.shutdown()


def _make_remote(root: Path, names: list[str]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    made = {}
    for name in names:
        made[name] = rng.integers(0, 50257, size=5000)
        write_shard(root / name, made[name])
    return made


def test_names_follow_fineweb():
    assert shard_names(2) == [
        "fineweb_val_000000.bin",
        "fineweb_train_000001.bin",
        "fineweb_train_000002.bin",
    ]
    with pytest.raises(ValueError, match=r"\[0, 103\]"):
        shard_names(104)


def test_download_fetches_and_verifies_every_shard(server, tmp_path):
    url, root, _ = server
    made = _make_remote(root, shard_names(2))
    paths = download(tmp_path / "local", train_shards=2, base_url=url, log=lambda _: None)
    assert [p.name for p in paths] == shard_names(2)
    for p in paths:
        assert read_shard(p).tolist() == made[p.name].tolist()
        assert not p.with_name(p.name + ".part").exists()


def test_a_partial_file_from_an_earlier_run_is_continued(server, tmp_path):
    url, root, handler = server
    made = _make_remote(root, ["fineweb_val_000000.bin"])
    local = tmp_path / "local"
    local.mkdir()
    part = local / "fineweb_val_000000.bin.part"
    part.write_bytes((root / "fineweb_val_000000.bin").read_bytes()[:4096])
    (path,) = download(local, train_shards=0, base_url=url, log=lambda _: None)
    assert handler.requests == ["bytes=4096-"]
    assert read_shard(path).tolist() == made[path.name].tolist()


def test_a_file_that_is_not_a_shard_is_refused_and_removed(server, tmp_path):
    url, root, _ = server
    (root / "fineweb_val_000000.bin").write_bytes(b"\x01" * 2048)  # not a shard
    with pytest.raises(DownloadError, match="magic number .*file removed"):
        download(tmp_path, train_shards=0, base_url=url, log=lambda _: None)
    assert not (tmp_path / "fineweb_val_000000.bin").exists()


def test_a_checksum_mismatch_with_the_manifest_is_refused(server, tmp_path):
    url, root, _ = server
    _make_remote(root, ["fineweb_val_000000.bin"])
    manifest = {"fineweb_val_000000.bin": "0" * 64}
    with pytest.raises(DownloadError, match="SHA-256"):
        download(
            tmp_path,
            train_shards=0,
            base_url=url,
            manifest=manifest,
            log=lambda _: None,
            attempts=1,
        )
    assert not (tmp_path / "fineweb_val_000000.bin").exists()
