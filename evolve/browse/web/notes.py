"""The research notebook page: ``/-/evolve/notes[?at=SEQ]``, the notebook as a proposal was shown it."""

from __future__ import annotations

from typing import Any

from datasette.utils.asgi import Response
from markdown_it import MarkdownIt
from markupsafe import Markup

from evolve.browse.web.views import _int, _render
from evolve.query.notebook import notebook_at
from evolve.query.run import version

MARKDOWN = MarkdownIt("commonmark", {"html": False})  # the notebook quotes model text: no raw HTML


async def notes(datasette: Any, request: Any) -> Response:
    """The latest notebook (or the one proposal ``at`` was shown), its versions linked."""
    at = _int(request.args.get("at"))

    def work(conn: Any) -> dict[str, Any]:
        return {**notebook_at(conn, at), "version": version(conn)}

    data = await datasette.get_database().execute_fn(work)
    html = Markup(MARKDOWN.render(data["text"])) if data["text"] else None
    return await _render(datasette, request, "evolve_notes.html", {**data, "html": html, "at": at})
