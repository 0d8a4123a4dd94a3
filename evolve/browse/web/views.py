"""The plugin's pages: overview, elites, candidate, lineage, and the version probe for live updates."""

from __future__ import annotations

import sqlite3
import traceback
from collections.abc import Callable
from typing import Any

from datasette.utils.asgi import Response
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound

from evolve.browse.diffs import diff_files
from evolve.browse.render import when
from evolve.browse.source import BrowseError, resolve_id
from evolve.browse.web import svg
from evolve.browse.web.graph import lineage_svg
from evolve.query import candidates as stored
from evolve.query.edges import ALL_ROLES, PARENT_ROLES
from evolve.query.run import cost, counts, fitness_series, islands, run_info, version
from evolve.research.lineage import Lineage
from evolve.research.plots import DEFAULT_WINDOW, grid, success_rates

PREFIX = "/-/evolve"
FORMATTER = HtmlFormatter(cssclass="highlight", linenos="inline", wrapcode=True)


def candidate_url(candidate_id: str) -> str:
    """The candidate page of an id."""
    return f"{PREFIX}/c/{candidate_id}"


def _code(path: str, text: str) -> Markup:
    try:
        lexer = get_lexer_for_filename(path, stripnl=False)
    except ClassNotFound:
        lexer = TextLexer(stripnl=False)
    return Markup(highlight(text, lexer, FORMATTER))


def _diff(text: str) -> Markup:
    return Markup(
        highlight(text, DiffLexer(stripnl=False), HtmlFormatter(cssclass="highlight diff"))
    )


async def _render(
    datasette: Any, request: Any, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    base = {
        "prefix": PREFIX,
        "pygments_css": Markup(FORMATTER.get_style_defs(".highlight")),
        "curl": candidate_url,
    }
    html = await datasette.render_template(template, {**base, **context}, request=request)
    return Response.html(html, status=status)


# The pages a 404 lists: the plugin's routes (and Datasette's tables, named per archive).
KNOWN_PAGES = (
    (PREFIX, "overview: fitness over time, the grid, cost, success per operator and model"),
    (f"{PREFIX}/elites", "elites, sortable and filterable"),
    (f"{PREFIX}/c/ID", "one candidate (ID: a unique prefix, #SEQ or best)"),
    (f"{PREFIX}/lineage", "the lineage of the best; /lineage/ID for another candidate"),
    (f"{PREFIX}/notes", "the research notebook"),
    (f"{PREFIX}/version.json", "the live-update probe"),
)


async def _error(datasette: Any, request: Any, message: str, status: int = 404) -> Response:
    tables = (f"/{datasette.get_database().name}", "Datasette: the archive's tables and SQL")
    routes = (*KNOWN_PAGES, tables) if status == 404 else ()
    context = {"message": message, "version": "", "routes": routes}
    return await _render(datasette, request, "evolve_error.html", context, status)


async def error(datasette: Any, request: Any, exception: Exception) -> Response:
    """The page (or JSON) for any error Datasette meets; only a server fault prints a traceback."""
    status = int(getattr(exception, "status", 500))  # Datasette's 4xx errors carry theirs
    message = str(getattr(exception, "message", None) or (exception.args or ("",))[0])
    if status == 404:
        message = f"no page at {request.path}" + (
            f" ({message})" if message not in ("", "404") else ""
        )
    if status >= 500:
        traceback.print_exception(exception)
    if request.path.endswith(".json"):
        return Response.json({"ok": False, "error": message, "status": status}, status=status)
    return await _error(datasette, request, message, status)


async def _page(
    datasette: Any,
    request: Any,
    template: str,
    work: Callable[[sqlite3.Connection], dict[str, Any]],
    context: Callable[[dict[str, Any]], dict[str, Any]],
) -> Response:
    """``template`` filled with ``context`` of what ``work`` read from the archive; a BrowseError
    (an unknown or ambiguous id) is the error page."""
    try:
        data = await datasette.get_database().execute_fn(work)
    except BrowseError as exc:
        return await _error(datasette, request, str(exc))
    return await _render(datasette, request, template, context(data))


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") and value.lstrip("-").isdigit() else None


async def version_json(datasette: Any, request: Any) -> Response:
    """``/-/evolve/version.json``: the live-update probe."""
    token = await datasette.get_database().execute_fn(version)
    return Response.json({"version": token}, headers={"Cache-Control": "no-store"})


async def overview(datasette: Any, request: Any) -> Response:
    """``/-/evolve``: fitness over time, the grid, cost, success per operator and model."""
    island = _int(request.args.get("island"))
    window = _int(request.args.get("window"))
    window = DEFAULT_WINDOW if window is None else window

    def work(conn: sqlite3.Connection) -> dict[str, Any]:
        return {
            "run": run_info(conn),
            "counts": counts(conn),
            "cost": cost(conn),
            "success": success_rates(conn, last=None if window == 0 else window),
            "series": fitness_series(conn, points=400),
            "grid": grid(conn, island=island).to_json(),
            "version": version(conn),
        }

    def context(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "charts": _charts(data), "island": island, "window": window}

    return await _page(datasette, request, "evolve_overview.html", work, context)


def _charts(data: dict[str, Any]) -> dict[str, Markup]:
    """The overview's charts: fitness, coverage and QD score, cost, the grid, success rates."""
    series = data["series"]
    xs = [row["evaluated"] or 0 for row in series]
    return {
        "fitness": Markup(
            svg.line_chart(
                xs,
                {"best": [r["best"] for r in series]},
                x_label="candidates evaluated",
                css_id="fitness-chart",
            )
        ),
        "quality": Markup(
            svg.line_chart(
                xs,
                {
                    "coverage": [r["coverage"] for r in series],
                    "QD score": [r["qd_score"] for r in series],
                },
                x_label="candidates evaluated",
                css_id="quality-chart",
            )
        ),
        "cost": Markup(
            svg.line_chart(
                xs,
                {"cost (USD)": [r["cost"] for r in series]},
                x_label="candidates evaluated",
                height=180,
                css_id="cost-chart",
            )
        ),
        "grid": Markup(svg.heatmap(data["grid"], candidate_url)),
        "by_operator": Markup(svg.bars(data["success"]["operator"], "operator")),
        "by_model": Markup(svg.bars(data["success"]["model"], "model")),
    }


async def elites(datasette: Any, request: Any) -> Response:
    """``/-/evolve/elites``: every elite, sortable and filterable by island and cell."""
    island, cell = _int(request.args.get("island")), (request.args.get("cell") or "").strip()
    sort = request.args.get("sort") or "objective"
    if sort not in stored.ELITE_SORTS:
        sort = "objective"
    order = request.args.get("order")
    descending = None if order not in ("asc", "desc") else order == "desc"

    def work(conn: sqlite3.Connection) -> dict[str, Any]:
        rows = stored.elites(
            conn, limit=None, island=island, cell=cell or None, sort=sort, descending=descending
        )
        return {"rows": rows, "islands": islands(conn), "version": version(conn)}

    def context(data: dict[str, Any]) -> dict[str, Any]:
        keys: list[str] = []
        for row in data["rows"]:
            row["updated"] = when(row["updated_at"])
            keys += [
                k for k, v in row["metrics"].items() if isinstance(v, int | float) and k not in keys
            ]
        return {
            **data,
            "metric_keys": keys[:4],
            "island": island,
            "cell": cell,
            "sort": sort,
            "order": order
            or ("desc" if descending or (descending is None and sort == "objective") else "asc"),
            "sorts": stored.ELITE_SORTS,
        }

    return await _page(datasette, request, "evolve_elites.html", work, context)


async def candidate(datasette: Any, request: Any) -> Response:
    """``/-/evolve/c/<id>``: code, diff to each parent, metrics, artifacts, prompt and answer, lineage."""
    given = request.url_vars["id"]

    def work(conn: sqlite3.Connection) -> dict[str, Any]:
        cid = resolve_id(conn, given)
        item = stored.candidate(conn, cid)
        diffs = [
            {
                "parent": p,
                "diff": diff_files(
                    stored.files_of(conn, p["id"]),
                    item["files"],
                    old_name=p["id"][:10],
                    new_name=cid[:10],
                ),
            }
            for p in item["parents"]
            if p["role"] in PARENT_ROLES
        ]
        graph = Lineage.around(conn, cid, max_ancestors=60, max_children=30)
        return {"item": item, "diffs": diffs, "graph": graph, "version": version(conn)}

    def context(data: dict[str, Any]) -> dict[str, Any]:
        item = data["item"]
        return {
            "item": item,
            "version": data["version"],
            "files": [
                {"path": path, "html": _code(path, text), "lines": text.count("\n") + 1}
                for path, text in sorted(item["files"].items())
            ],
            "diffs": [
                {**d, "html": _diff(d["diff"]) if d["diff"] else None} for d in data["diffs"]
            ],
            "lineage": Markup(lineage_svg(data["graph"], item["id"], candidate_url)),
        }

    return await _page(datasette, request, "evolve_candidate.html", work, context)


async def lineage(datasette: Any, request: Any) -> Response:
    """``/-/evolve/lineage[/<id>]``: the neighbourhood of a candidate (default: the best) as a graph."""
    given = request.url_vars.get("id") or "best"
    inspirations = request.args.get("inspirations") == "1"

    def work(conn: sqlite3.Connection) -> dict[str, Any]:
        cid = resolve_id(conn, given)
        graph = Lineage.around(
            conn,
            cid,
            roles=ALL_ROLES if inspirations else PARENT_ROLES,
            max_ancestors=300,
            max_children=60,
        )
        return {"id": cid, "graph": graph, "version": version(conn)}

    def context(data: dict[str, Any]) -> dict[str, Any]:
        graph = data["graph"]
        return {
            "id": data["id"],
            "version": data["version"],
            "inspirations": inspirations,
            "nodes": graph.graph.number_of_nodes(),
            "path_length": len(graph.path_to_best()),
            "svg": Markup(lineage_svg(graph, data["id"], candidate_url)),
        }

    return await _page(datasette, request, "evolve_lineage.html", work, context)


async def home(datasette: Any, request: Any) -> Response:
    """``/``: straight to the overview (Datasette's own index stays at ``/-/databases``-style pages)."""
    return Response.redirect(PREFIX)
