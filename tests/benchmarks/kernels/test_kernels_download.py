"""The dataset download resumes, verifies checksums and skips what is there, against a local HTTP server."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from evolve.benchmarks.kernels.__main__ import main as cli
from evolve.benchmarks.kernels.download import DownloadError, download
from evolve.benchmarks.kernels.spec import problem_dirs

DEFINITION = json.dumps({"name": "d1", "axes": {"N": {"type": "var"}}, "inputs": {"x": {"shape": ["N"], "dtype": "float32"}},
                         "outputs": {"y": {"shape": ["N"], "dtype": "float32"}},
                         "reference": "def run(x):\n    return x\n"}).encode()  # fmt: skip
WORKLOAD = b'{"uuid": "w1", "axes": {"N": 4}, "inputs": {"x": {"type": "random"}}}\n'
BLOB = bytes(range(256)) * 40  # an "LFS" file (checked by SHA-256)


class Hub:
    """A tiny stand-in for the Hub: the tree API and resolve URLs, Range requests honoured."""

    def __init__(self) -> None:
        self.files = {"benchmark/L1/d1/definition.json": DEFINITION, "benchmark/L1/d1/workload.jsonl": WORKLOAD,
                      "blobs/data.safetensors": BLOB}  # fmt: skip
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str | None]] = []

    def tree(self) -> list[dict]:
        out = []
        for path, data in self.files.items():
            entry = {"type": "file", "path": path, "size": len(data),
                     "oid": hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()}  # fmt: skip
            if path.endswith(".safetensors"):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data)}
            out.append(entry)
        return out + [{"type": "directory", "path": "benchmark"}]


@pytest.fixture()
def hub():
    state = Hub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):  # noqa: N802 - http.server's name
            state.requests.append((self.path, self.headers.get("Range")))
            if self.path.startswith("/api/datasets/org/data/tree/main"):
                body, status = json.dumps(state.tree()).encode(), 200
            else:
                path = self.path.removeprefix("/datasets/org/data/resolve/main/")
                body = state.files[path]
                if path in state.corrupt:
                    body = b"x" * len(body)
                status = 200
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].removeprefix("bytes=").rstrip("-"))
                    body, status = body[start:], 206
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    thread.join()


def test_download_resumes_verifies_and_skips(hub, tmp_path):
    out = tmp_path / "data"
    part = out / "blobs" / "data.safetensors.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(BLOB[:1000])  # an interrupted earlier run
    counts = download(out, repo="org/data", endpoint=hub.endpoint, log=lambda _: None)
    assert counts == {"fetched": 3, "kept": 0}
    assert (out / "blobs" / "data.safetensors").read_bytes() == BLOB and not part.exists()
    assert ("/datasets/org/data/resolve/main/blobs/data.safetensors", "bytes=1000-") in hub.requests
    assert list(problem_dirs(out)) == ["d1"]  # the downloaded folder is a dataset as it is
    (out / "benchmark" / "L1" / "d1" / "workload.jsonl").write_text("damaged")
    again = download(out, repo="org/data", endpoint=hub.endpoint, log=lambda _: None)
    assert again == {"fetched": 1, "kept": 2}
    assert (out / "benchmark" / "L1" / "d1" / "workload.jsonl").read_bytes() == WORKLOAD


def test_a_checksum_mismatch_is_refused_and_nothing_is_kept(hub, tmp_path):
    hub.corrupt.add("blobs/data.safetensors")
    with pytest.raises(DownloadError, match="blobs/data.safetensors: .*SHA-256 mismatch"):
        download(
            tmp_path, repo="org/data", endpoint=hub.endpoint, include="blobs/*", log=lambda _: None
        )
    assert not (tmp_path / "blobs" / "data.safetensors").exists()
    assert not (tmp_path / "blobs" / "data.safetensors.part").exists()


def test_the_cli_downloads_and_says_what_to_do_offline(hub, tmp_path, capsys):
    assert (
        cli(
            [
                "download",
                "--out",
                str(tmp_path / "d"),
                "--repo",
                "org/data",
                "--endpoint",
                hub.endpoint,
            ]
        )
        == 0
    )
    assert "3 file(s) fetched" in capsys.readouterr().out
    assert cli(["download", "--out", str(tmp_path / "e"), "--endpoint", "http://127.0.0.1:9"]) == 2
    assert "pass its folder as --dataset" in capsys.readouterr().err
