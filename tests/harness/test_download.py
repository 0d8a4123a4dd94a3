"""The harness's downloader: a connection dropped mid-body is resumed from what arrived."""

import hashlib
import http.server
import threading

from evolve.harness import download


class DroppingServer(http.server.ThreadingHTTPServer):
    """Serves one file; the first answer announces it whole but closes after ``cut`` bytes."""

    def __init__(self, data: bytes, cut: int):
        self.data, self.cut, self.ranges = data, cut, []
        super().__init__(("127.0.0.1", 0), DroppingHandler)


class DroppingHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        server: DroppingServer = self.server
        spec = self.headers.get("Range")
        server.ranges.append(spec)
        start = int(spec[6:].split("-")[0]) if spec else 0
        self.send_response(206 if spec else 200)
        if spec:
            self.send_header(
                "Content-Range", f"bytes {start}-{len(server.data) - 1}/{len(server.data)}"
            )
        self.send_header("Content-Length", str(len(server.data) - start))
        self.end_headers()
        if len(server.ranges) == 1:  # the first answer breaks off mid-body
            self.wfile.write(server.data[: server.cut])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(server.data[start:])


def test_a_connection_dropped_mid_body_resumes_from_the_bytes_that_arrived(tmp_path):
    data = bytes(range(256)) * 4000
    server = DroppingServer(data, cut=300_000)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/blob.bin"
        dest = tmp_path / "blob.bin"
        sha = hashlib.sha256(data).hexdigest()
        assert download.download(url, dest, sha256=sha, retries=3) == dest
    finally:
        server.shutdown()
        server.server_close()
    assert dest.read_bytes() == data
    assert server.ranges == [None, "bytes=300000-"]  # the second request continued the part
    assert not (tmp_path / "blob.bin.part").exists()
