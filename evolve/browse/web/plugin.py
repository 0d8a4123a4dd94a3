"""The Datasette plugin: routes for our pages, error pages, menu links, CSS and the live-update script."""

from __future__ import annotations

from typing import Any

from datasette import hookimpl

from evolve.browse.web import notes, views

STATIC = "evolve-static"


@hookimpl
def register_routes(datasette: Any) -> list[tuple[str, Any]]:
    """Our pages under /-/evolve (plugin routes are matched before Datasette's own)."""
    return [
        (r"^/$", views.home),
        (r"^/-/evolve/?$", views.overview),
        (r"^/-/evolve/elites$", views.elites),
        (r"^/-/evolve/c/(?P<id>[^/]+)$", views.candidate),
        (r"^/-/evolve/lineage(?:/(?P<id>[^/]+))?$", views.lineage),
        (r"^/-/evolve/version\.json$", views.version_json),
        (r"^/-/evolve/notes$", notes.notes),
    ]


@hookimpl
def handle_exception(datasette: Any, request: Any, exception: Exception) -> Any:
    """Our error pages; ``server.make_app`` blocks Datasette's own, which prints a traceback for a 404."""
    return lambda: views.error(datasette, request, exception)


@hookimpl
def menu_links(datasette: Any, actor: Any, request: Any) -> list[dict[str, str]]:
    """Links in Datasette's navigation menu."""
    name = datasette.get_database().name
    return [
        {"href": "/-/evolve", "label": "Overview"},
        {"href": "/-/evolve/elites", "label": "Elites"},
        {"href": "/-/evolve/lineage", "label": "Lineage of the best"},
        {"href": "/-/evolve/notes", "label": "Research notebook"},
        {"href": f"/{name}", "label": "Tables and SQL (Datasette)"},
    ]


@hookimpl
def extra_css_urls() -> list[str]:
    """Our stylesheet, on every page (a hook implementation takes only the arguments it uses)."""
    return [f"/{STATIC}/evolve.css"]


@hookimpl
def extra_js_urls(template: str) -> list[str]:
    """The live-update script, on our pages only."""
    return [f"/{STATIC}/evolve.js"] if template.startswith("evolve_") else []
