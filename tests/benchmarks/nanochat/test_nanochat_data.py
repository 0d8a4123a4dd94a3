"""Data preparation: the resumable, verified downloader (against a local server) and local sources."""

import hashlib
import http.server
import json
import lzma
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from evolve.benchmarks.nanochat import prepare, sources, tokens

from evolve.harness import documents, download


class RangeServer(http.server.ThreadingHTTPServer):
    """Serves files from a dict, honouring ``Range: bytes=N-``; records the requests."""

    def __init__(self, files: dict[str, bytes], *, sha_header: dict[str, str] | None = None):
        self.files, self.sha_header, self.requests = files, sha_header or {}, []
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        server: RangeServer = self.server
        name = self.path.rsplit("/", 1)[-1]
        server.requests.append((name, self.headers.get("Range")))
        data = server.files.get(name)
        if data is None:
            self.send_error(404)
            return
        start = 0
        if (spec := self.headers.get("Range")) and spec.startswith("bytes="):
            start = int(spec[6:].split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        if name in server.sha_header:
            self.send_header("X-Linked-ETag", f'"{server.sha_header[name]}"')
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])


@pytest.fixture
def serve():
    servers = []

    def start(files, **kwargs):
        server = RangeServer(files, **kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}/data"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def parquet_bytes(texts: list[str], path: Path) -> bytes:
    pq.write_table(pa.table({"text": texts}), path)
    return path.read_bytes()


def test_download_resumes_with_range_and_verifies_sha(serve, tmp_path):
    data = parquet_bytes([f"document {i} " * 50 for i in range(200)], tmp_path / "src.parquet")
    name = f"shard_{0:05d}.parquet"
    sha = hashlib.sha256(data).hexdigest()
    server, url = serve({name: data}, sha_header={name: sha})
    dest = tmp_path / "out" / name
    dest.parent.mkdir()
    (dest.parent / (name + ".part")).write_bytes(data[:1000])  # an interrupted earlier download
    assert download.download(f"{url}/{name}", dest) == dest
    assert dest.read_bytes() == data
    assert server.requests == [(name, "bytes=1000-")]
    assert not (dest.parent / (name + ".part")).exists()
    download.download(f"{url}/{name}", dest)  # already there: no request
    assert len(server.requests) == 1


def test_download_rejects_corrupt_content(serve, tmp_path):
    data = parquet_bytes(["x" * 100], tmp_path / "src.parquet")
    name = f"shard_{1:05d}.parquet"
    server, url = serve({name: data}, sha_header={name: "0" * 64})
    with pytest.raises(download.DownloadError, match="SHA-256"):
        download.download(f"{url}/{name}", tmp_path / name, retries=2)
    assert not (tmp_path / name).exists() and not (tmp_path / (name + ".part")).exists()


def test_download_rejects_a_non_parquet_file(serve, tmp_path):
    name = f"shard_{2:05d}.parquet"
    _, url = serve({name: b"<html>not found</html>"})
    with pytest.raises(download.DownloadError, match="PAR1"):
        download.download(f"{url}/{name}", tmp_path / name, retries=1)


def test_climbmix_shards_and_prepare_cli_from_a_local_mirror(serve, tmp_path):
    files = {}
    for index in (0, 1, prepare.CLIMBMIX_LAST_SHARD):
        texts = [f"shard {index} text {i}: the cat sat on the mat {i * 7}." for i in range(300)]
        files[f"shard_{index:05d}.parquet"] = parquet_bytes(texts, tmp_path / f"s{index}.parquet")
    server, url = serve(files)
    code = prepare.main(
        [
            "--name",
            "cm",
            "--data-dir",
            str(tmp_path / "data"),
            "--climbmix-shards",
            "2",
            "--climbmix-url",
            url,
            "--vocab",
            "400",
        ]
    )
    assert code == 0
    root = tmp_path / "data" / "cm"
    meta = json.loads((root / "dataset.json").read_text())
    assert meta["train"]["documents"] == 600 and meta["val"]["documents"] == 300
    assert (
        tmp_path / "data" / "raw" / "climbmix" / f"shard_{prepare.CLIMBMIX_LAST_SHARD:05d}.parquet"
    ).is_file()
    val = tokens.Split(root / "val")
    assert len(val) == 300 and val[0][0] == meta["bos_id"]


def test_prepare_reads_jsonl_xz_txt_and_parquet_and_keeps_val_apart(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with lzma.open(src / "a.jsonl.xz", "wt") as handle:
        for i in range(50):
            handle.write(
                json.dumps({"id": i, "title": "t", "text": f"Article {i} about rivers and hills."})
                + "\n"
            )
    (src / "b.jsonl").write_text(
        "".join(json.dumps({"text": f"Line {i} of b."}) + "\n" for i in range(30))
    )
    (src / "c.txt").write_text("A whole text file is one document.\n" * 10)
    parquet_bytes([f"parquet row {i}" for i in range(20)], src / "d.parquet")
    (tmp_path / "val.jsonl").write_text(
        "".join(json.dumps({"text": f"Held out {i}."}) + "\n" for i in range(10))
    )
    assert sum(1 for _ in documents.iter_texts([src])) == 50 + 30 + 1 + 20
    code = prepare.main(
        [
            "--name",
            "local",
            "--data-dir",
            str(tmp_path / "data"),
            "--train",
            str(src),
            "--val",
            str(tmp_path / "val.jsonl"),
            "--vocab",
            "300",
        ]
    )
    assert code == 0
    dirs = prepare.split_dirs(tmp_path / "data" / "local")
    assert {p.name for p in dirs["train"].iterdir()} == {"tokens.bin", "offsets.npy", "split.json"}
    assert dirs["train"] != dirs["val"] and not dirs["val"].is_relative_to(dirs["train"])
    train, val = tokens.Split(dirs["train"]), tokens.Split(dirs["val"])
    assert (len(train), len(val)) == (101, 10)
    assert np.all(np.diff(train.offsets) > 0)
    # the text files it was made from are hidden from candidates as its splits are
    assert str((tmp_path / "val.jsonl").resolve()) in prepare.hidden_sources(
        tmp_path / "data" / "local"
    )


def test_prepare_refuses_overlapping_train_and_val(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(SystemExit, match="both"):
        prepare.main(
            [
                "--name",
                "x",
                "--data-dir",
                str(tmp_path / "d"),
                "--train",
                str(tmp_path / "a.txt"),
                "--val",
                str(tmp_path / "a.txt"),
            ]
        )


def test_stdlib_validation_text_is_the_test_package_which_training_never_sees():
    tests = documents.stdlib_tests()
    train, val = sources.stdlib_files(), sources.validation_files()
    assert val and all(p.is_relative_to(tests) for p in val)
    assert not any(p.is_relative_to(tests) for p in train)
    assert val == sources.validation_files()  # deterministic
    assert len(val) < len(list(tests.rglob("*.py"))) // 5  # about 1 in 20
    chunks = sources.chunk_text("a\n\nb\n" * 2000, max_chars=100)
    assert chunks and all(len(c) <= 100 for c in chunks)
