"""The ``python -m evolve.browse RUN [command]`` command line (click); every command takes ``--json``."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from evolve.browse.source import BrowseError, archive_path, open_run, resolve_id
from evolve.types import EvolveError


class Failure(click.ClickException):
    """A browse command that cannot answer: ``error: message`` on stderr (as ``python -m evolve`` says it), exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class Session:
    """The RUN argument, opened on first use (so that ``--help`` needs no valid RUN)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self._store = None

    @property
    def conn(self):  # noqa: ANN201  (sqlite3.Connection)
        if self._store is None:
            self._store = open_run(self.run)
        return self._store.conn

    @property
    def run_dir(self) -> Path:
        path = archive_path(self.run)
        return path.parent


def _emit(data: Any, *, indent: int | None = 2) -> None:
    click.echo(json.dumps(data, indent=indent, default=str, ensure_ascii=False))


def _named(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with a built-in operator's model (stored as none) named ``builtin``, as the tables do."""
    return {**row, "model": row["model"] or "builtin"}


def _show(renderable: Any) -> None:
    from evolve.browse.render import console

    console().print(renderable)


def command(func: Callable) -> Callable:
    """Register ``func`` as a subcommand with a ``--json`` flag and one-line errors."""

    @click.option(
        "--json", "as_json", is_flag=True, help="Print JSON instead of tables (for scripts)."
    )
    @click.pass_obj
    @functools.wraps(func)
    def wrapper(session: Session, *args: Any, **kwargs: Any) -> None:
        try:
            func(session, *args, **kwargs)
        except EvolveError as exc:
            raise Failure(str(exc)) from None

    return main.command(name=func.__name__.rstrip("_"))(wrapper)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run")
@click.pass_context
def main(ctx: click.Context, run: str) -> None:
    """Browse a run's archive read-only. RUN is a run directory or its archive.db.

    Without a command, prints a short summary. IDs may be a unique prefix, #SEQ or 'best'.
    Works on a live run: every command reads the latest committed state.
    """
    ctx.obj = Session(run)
    if ctx.invoked_subcommand is None:
        try:
            _summary(ctx.obj)
        except EvolveError as exc:
            raise Failure(str(exc)) from None


def _summary(session: Session) -> None:
    from evolve.browse import render
    from evolve.query.candidates import elites
    from evolve.query.run import counts, run_info

    info = run_info(session.conn)
    tally = {k: v for k, v in counts(session.conn).items() if not k.startswith("eval_")}
    _show(
        render.table(
            "Run",
            ["benchmark", "status", "candidates", "best", "best id"],
            [
                [
                    info["benchmark"],
                    info["status"],
                    info["candidates"],
                    info["best_fitness"],
                    (info["best"] or "-")[:12],
                ]
            ],
            numeric=("candidates", "best"),
        )
    )
    _show(
        render.table(
            "Candidates by status", list(tally), [list(tally.values())], numeric=list(tally)
        )
    )
    _show(render.elites(elites(session.conn, limit=5)))
    click.echo(
        "commands: best, show ID, diff A [B], lineage ID, cells, stats, notes, export ID DIR, plot, serve, "
        "migrate (--help each)"
    )


@command
@click.option("-k", "--top", default=10, show_default=True, help="How many elites.")
@click.option("--island", type=int, default=None, help="Only this island.")
@click.option("--cell", default=None, help="Only cells whose key starts with this (e.g. '3,').")
def best(session: Session, as_json: bool, top: int, island: int | None, cell: str | None) -> None:
    """The top elites with fitness, operator, model and key metrics."""
    from evolve.browse import render
    from evolve.query.candidates import elites

    rows = [_named(r) for r in elites(session.conn, limit=top, island=island, cell=cell)]
    _emit(rows) if as_json else _show(render.elites(rows))


@command
@click.argument("candidate_id", metavar="ID")
@click.option("--full", is_flag=True, help="Do not shorten long artifacts, prompts and answers.")
def show(session: Session, as_json: bool, candidate_id: str, full: bool) -> None:
    """A candidate: code, metrics, artifacts, operator, model, prompt and answer."""
    from evolve.browse import render
    from evolve.query.candidates import candidate

    item = _named(candidate(session.conn, resolve_id(session.conn, candidate_id)))
    _emit(item) if as_json else _show(render.candidate(item, full=full))


@command
@click.argument("a", metavar="A")
@click.argument("b", metavar="[B]", required=False)
@click.option("-U", "--context", default=3, show_default=True, help="Lines of context.")
def diff(session: Session, as_json: bool, a: str, b: str | None, context: int) -> None:
    """Unified diff from A's parent to A, or from A to B when B is given."""
    from evolve.browse import render
    from evolve.browse.diffs import diff as diff_of
    from evolve.query.edges import parent_ids

    conn = session.conn
    first = resolve_id(conn, a)
    if b is None:
        parents = parent_ids(conn, first)
        if not parents:
            raise BrowseError(
                f"{first[:12]} has no parent (it is a seed): give a second ID to compare with"
            )
        old, new = parents[0], first
    else:
        old, new = first, resolve_id(conn, b)
    text = diff_of(conn, old, new, context=context)
    _emit({"from": old, "to": new, "diff": text}) if as_json else _show(render.diff(text))


@command
@click.argument("candidate_id", metavar="ID")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "dot", "json"]),
    default="text",
    show_default=True,
    help="text: the path of primary parents; dot/json: the neighbourhood graph.",
)
@click.option(
    "--depth",
    default=30,
    show_default=True,
    help="Generations shown (text) or ancestors kept (graph).",
)
@click.option("--inspirations", is_flag=True, help="Also follow inspiration edges (graph formats).")
def lineage(
    session: Session, as_json: bool, candidate_id: str, fmt: str, depth: int, inspirations: bool
) -> None:
    """Ancestry of a candidate: the path from the seed, as text, Graphviz dot or JSON."""
    from evolve.browse import render
    from evolve.query.edges import ALL_ROLES, PARENT_ROLES
    from evolve.research.lineage import Lineage, ancestry

    conn = session.conn
    cid = resolve_id(conn, candidate_id)
    if fmt == "text" and not as_json:
        data = ancestry(conn, cid, depth=depth)
        title = f"Lineage of {cid[:12]}: {data['generations']} generations"
        if data["shown_from"]:
            title += f" (last {len(data['path'])} shown; --depth for more)"
        _show(render.lineage(data["path"], title=title))
        return
    graph = Lineage.around(
        conn, cid, roles=ALL_ROLES if inspirations else PARENT_ROLES, max_ancestors=depth * 10
    )
    if fmt == "dot":
        click.echo(graph.to_dot(), nl=False)
    elif fmt == "json":
        _emit(graph.to_json())
    else:
        _emit(ancestry(conn, cid, depth=depth))


@command
@click.option(
    "--island", type=int, default=None, help="One island (default: the best over all islands)."
)
def cells(session: Session, as_json: bool, island: int | None) -> None:
    """The MAP-Elites grid as a heatmap of the best objective per cell."""
    from evolve.browse import render
    from evolve.research.plots import grid

    view = grid(session.conn, island=island).to_json()
    _emit(view) if as_json else _show(render.heatmap(view))


@command
@click.option("--points", default=12, show_default=True, help="Rows of the time series shown.")
@click.option(
    "--last",
    default=20_000,
    show_default=True,
    help="Success rates over the last N candidates (0: the whole run).",
)
def stats(session: Session, as_json: bool, points: int, last: int) -> None:
    """Counts by status, success per operator and model, cost, and the time series."""
    from evolve.browse import render, summary

    data = summary.stats(session.conn, points=points, last=last or None)
    _emit(data) if as_json else _show(render.stats(data))


@command
@click.argument("candidate_id", metavar="ID")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that already exist in DIR.")
@click.option(
    "--with-meta", is_flag=True, help="Also write candidate.json (metrics, parents, artifacts)."
)
def export(
    session: Session,
    as_json: bool,
    candidate_id: str,
    directory: Path,
    force: bool,
    with_meta: bool,
) -> None:
    """Write a candidate's files into DIR (to run or read it outside the archive)."""
    from evolve.query.candidates import candidate

    conn = session.conn
    cid = resolve_id(conn, candidate_id)
    item = candidate(conn, cid)
    root = directory.resolve()
    targets = {path: (root / path).resolve() for path in item["files"]}
    for path, target in targets.items():
        if not target.is_relative_to(root):
            raise BrowseError(f"file path {path!r} leaves {root}; export refused")
        if target.exists() and not force:
            raise BrowseError(f"{target} exists: choose an empty DIR or pass --force")
    written = []
    for path, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(item["files"][path])
        written.append(str(target))
    if with_meta:
        meta = {k: v for k, v in item.items() if k != "files"}
        (root / "candidate.json").write_text(json.dumps(meta, indent=2, default=str))
        written.append(str(root / "candidate.json"))
    _emit({"id": cid, "files": written}) if as_json else click.echo(
        f"wrote {len(written)} files of {cid} to {root}"
    )


@command
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the PNGs (default: RUN's plots/ folder).",
)
@click.option(
    "--last",
    default=20_000,
    show_default=True,
    help="Success rates over the last N candidates (0: the whole run).",
)
def plot(session: Session, as_json: bool, out: Path | None, last: int) -> None:
    """Draw fitness over time, the grid heatmap and success per operator and model as PNGs."""
    from evolve.research.plots import write_plots

    paths = write_plots(
        session.conn,
        out if out is not None else session.run_dir,
        subdir="" if out else "plots",
        last=last or None,
    )
    _emit([str(p) for p in paths]) if as_json else click.echo(
        "\n".join(f"wrote {p}" for p in paths)
    )


@command
@click.option(
    "--at", "seq", type=int, default=None, help="As proposal SEQ was shown it (default: latest)."
)
def notes(session: Session, as_json: bool, seq: int | None) -> None:
    """The research notebook: effects of changes, failures by cause, best programs, open directions."""
    from evolve.browse import render
    from evolve.query.notebook import notebook_at

    data = notebook_at(session.conn, seq)
    if as_json:
        _emit(data)
    elif data["text"] is None:
        click.echo("no notebook in this run (a run keeps one when an operator asks a model)")
    else:
        _show(render.notebook(data))


@command
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8001, show_default=True, help="Port (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a web browser.")
def serve(session: Session, as_json: bool, host: str, port: int, open_browser: bool) -> None:
    """A local web page: overview, elites, candidates, lineage graph (Datasette + our plugin)."""
    from evolve.browse.web.server import serve as run_server

    path = archive_path(session.run)
    session.conn  # noqa: B018  (validate the archive before starting the server)

    def ready(url: str) -> None:
        _emit({"url": url, "archive": str(path)}, indent=None) if as_json else click.echo(
            f"serving {path} at {url} (Ctrl-C stops)"
        )
        sys.stdout.flush()
        if open_browser:
            import webbrowser

            webbrowser.open(url)

    run_server(path, host=host, port=port, on_ready=ready)


@command
def migrate(session: Session, as_json: bool) -> None:
    """Upgrade an archive written by an older evolve to this version, in place (the old file is
    kept beside it as <name>.schema<N>.bak). The other commands only read; they ask for this."""
    from evolve.store.database import migrate as migrate_archive

    path = archive_path(session.run)
    backup = migrate_archive(path)
    if as_json:
        _emit(
            {"archive": str(path), "migrated": backup is not None, "backup": backup and str(backup)}
        )
    else:
        click.echo(
            f"{path} is already at this evolve's schema: nothing to do"
            if backup is None
            else f"{path} upgraded; the old file is kept as {backup}"
        )
