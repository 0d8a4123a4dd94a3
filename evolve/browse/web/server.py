"""Start Datasette with our plugin on one archive, read-only, and serve it with uvicorn."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from datasette.app import Datasette
from datasette.plugins import pm

from evolve.browse.web import plugin

HERE = Path(__file__).parent
DATASETTE_ERRORS = "datasette.handle_exception"  # its default error pages print rich tracebacks
SETTINGS = {
    "sql_time_limit_ms": 3000,
    "facet_time_limit_ms": 300,
    "num_sql_threads": 4,
    "default_page_size": 50,
    "allow_download": False,
}


def make_app(archive: Path | str) -> Datasette:
    """A Datasette over ``archive`` (opened read-only, so a live run's writes appear) with our pages."""
    if not pm.is_registered(plugin):
        pm.register(plugin, name="evolve-browse")
    pm.set_blocked(DATASETTE_ERRORS)  # ours answer instead (plugin.handle_exception)
    path = Path(archive)
    return Datasette(
        files=[str(path)],
        settings=SETTINGS,
        template_dir=str(HERE / "templates"),
        static_mounts=[(plugin.STATIC, str(HERE / "static"))],
        metadata={"title": f"evolve: {path.parent.name or path.name}"},
    )


def serve(
    archive: Path | str,
    *,
    host: str = "127.0.0.1",
    port: int = 8001,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the page until interrupted; ``on_ready(url)`` is called once the socket listens."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    url = f"http://{host}:{sock.getsockname()[1]}/-/evolve"
    server = uvicorn.Server(
        uvicorn.Config(make_app(archive).app(), log_level="warning", lifespan="off")
    )
    if on_ready is not None:
        on_ready(url)
    server.run(sockets=[sock])
