"""Terminal rendering with rich: aligned tables, syntax-highlighted code and diffs, the grid heatmap."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.markdown import Markdown
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from evolve.harness import phases

HEAT = ("#313695", "#4575b4", "#74add1", "#abd9e9", "#fee090", "#fdae61", "#f46d43", "#d73027")
SPARK = "▁▂▃▄▅▆▇█"
LEXERS = {
    ".py": "python",
    ".cu": "cuda",
    ".cpp": "cpp",
    ".c": "c",
    ".h": "c",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".md": "markdown",
    ".sh": "bash",
    ".toml": "toml",
    ".txt": "text",
}


def console() -> Console:
    """A console 120 columns wide when output is not a terminal (pipes, tests)."""
    width = None if os.isatty(1) else int(os.environ.get("COLUMNS", "120"))
    return Console(width=width, highlight=False)


def num(value: Any, digits: int = 6) -> str:
    """A number in at most ``digits`` significant digits; '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}g}"


def when(timestamp: float | None) -> str:
    """A UTC timestamp as 'YYYY-MM-DD HH:MM:SS'."""
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def lexer_for(path: str) -> str:
    """The pygments lexer name for a file path."""
    return LEXERS.get(PurePosixPath(path).suffix.lower(), "text")


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    numeric: Sequence[str] = (),
) -> Table:
    """A rich table; columns named in ``numeric`` are right-aligned."""
    out = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left", title_style="bold")
    for column in columns:
        out.add_column(
            column, justify="right" if column in numeric else "left", no_wrap=column in numeric
        )
    for row in rows:
        out.add_row(*[cell if isinstance(cell, Text) else num(cell) for cell in row])
    return out


def _interval(metrics: dict[str, Any]) -> list[Any]:
    """The confidence interval and sample count of a noise-aware verdict, or blanks."""
    low, high = metrics.get("fitness_ci_low"), metrics.get("fitness_ci_high")
    if low is None or high is None:
        return ["", metrics.get("fitness_n", "")]
    return [f"[{low:.6g}, {high:.6g}]", metrics.get("fitness_n", "")]


def elites(rows: list[dict[str, Any]], *, metric_keys: int = 3) -> Table:
    """The ``best`` table: rank, id, island, cell, objective, operator, model, seq and a few metrics."""
    keys: list[str] = []
    for row in rows:  # where the time went is for ``stats``, not a key metric
        keys += [
            k
            for k, v in row["metrics"].items()
            if isinstance(v, int | float) and k not in keys and not phases.is_phase(k)
        ]
    # noise-aware runs (evolve.archive.noise) store a confidence interval and a sample count per verdict
    noisy = any("fitness_ci_low" in row["metrics"] for row in rows)
    keys = [k for k in keys if not (noisy and k.startswith("fitness_"))][:metric_keys]
    noise = ["CI", "n"] if noisy else []
    audited = any(row.get("audit") for row in rows)
    marks = ["audit"] if audited else []
    columns = ["#", "id", "island", "cell", "objective", *noise, *marks, "operator", "model", "seq"]
    columns += keys
    body = [
        [
            rank,
            row["id"][:12],
            row["island"],
            row["cell"],
            row["objective"],
            *(_interval(row["metrics"]) if noisy else []),
            *([(row.get("audit") or "-").split(",")[0]] if audited else []),
            row["operator"],
            row["model"] or "builtin",
            row["seq"],
            *[row["metrics"].get(k) for k in keys],
        ]
        for rank, row in enumerate(rows, 1)
    ]
    out = table(
        f"Best {len(rows)} elites",
        columns,
        body,
        numeric=("#", "island", "objective", "seq", *keys),
    )
    if audited:  # clean or flagged (the auditor's verdict on an elite that was a new best)
        out.columns[columns.index("audit")].min_width = len("flagged")
    return out


def candidate(item: dict[str, Any], *, full: bool = False) -> Group:
    """``show``: header, description, metrics, artifacts, files, and the prompt and answer."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    parents = ", ".join(f"{p['id'][:10]} ({p['role']})" for p in item["parents"]) or "none (seed)"
    cells = (
        ", ".join(f"island {c['island']} cell {c['cell']}" for c in item["cells"]) or "not an elite"
    )
    for label, value in (
        ("id", item["id"]),
        ("seq", item["seq"]),
        ("status", item["status"]),
        ("fitness", num(item["fitness"])),
        ("operator", item["operator"]),
        ("model", item["model"] or "builtin"),
        ("island", item["island"]),
        ("parents", parents),
        ("children", item["children_count"]),
        ("elite of", cells),
        ("created", when(item["created_at"])),
    ):
        head.add_row(label, str(value))
    parts: list[Any] = [Panel(head, title=f"candidate {item['id'][:12]}", title_align="left")]
    if item["description"]:
        parts.append(Panel(Text(item["description"]), title="description", title_align="left"))
    if item.get("audit") is not None:
        parts.append(audit(item["audit"]))
    for ev in item["evaluations"]:
        rows = [[k, v] for k, v in ev["metrics"].items()] + [
            [f"descriptor {k}", v] for k, v in ev["descriptors"].items()
        ]
        rows += [["wall_s", ev["wall_s"]], ["seeds", ", ".join(map(str, ev["seeds"])) or "-"]]
        parts.append(
            Text(
                f"evaluation: stage {ev['stage']}, {ev['status']}, fitness {num(ev['fitness'])}",
                style="bold",
            )
        )
        parts.append(table(None, ["metric", "value"], rows, numeric=("value",)))
        for name, text in ev["artifacts"].items():
            parts.append(
                Panel(Text(_clip(str(text), full)), title=f"artifact: {name}", title_align="left")
            )
    for path, text in sorted(item["files"].items()):
        parts.append(
            Panel(
                Syntax(text, lexer_for(path), line_numbers=True, word_wrap=False),
                title=path,
                title_align="left",
            )
        )
    for call in item["llm_calls"]:
        messages = (
            call["messages"]
            if isinstance(call["messages"], list)
            else [{"role": "?", "content": call["messages"]}]
        )
        prompt = "\n\n".join(f"[{m.get('role', '?')}]\n{m.get('content', '')}" for m in messages)
        title = (
            f"LLM call: {call['model']}, {num(call['tokens_in'])} in / {num(call['tokens_out'])} out, "
            f"${num(call['cost'], 3)}, {num(call['latency_s'], 3)} s"
        )
        parts.append(
            Panel(Text(_clip(prompt, full)), title=title + " — prompt", title_align="left")
        )
        answer = call["response"] or f"(no answer: {call['error']})"
        parts.append(Panel(Text(_clip(answer, full)), title="answer", title_align="left"))
    return Group(*parts)


def audit(verdict: dict[str, Any]) -> Panel:
    """The auditor's verdict: decision, strict fitness, and each flag with file:line and reason."""
    decision = f"flagged, {verdict['decision']}" if verdict["flagged"] else "clean"
    lines = [f"verdict: {decision}"]
    if verdict["strict_fitness"] is not None:
        lines.append(f"strict re-evaluation fitness: {num(verdict['strict_fitness'])}")
    if verdict["reason"]:
        lines.append(verdict["reason"])
    for flag in verdict["flags"]:
        lines.append(f"{flag['path']}:{flag['line']} [{flag['rule']}] {flag['reason']}")
        lines.append(f"    {flag['code']}")
    lines += [f"{path}: not valid Python; not audited" for path in verdict["unparsed"]]
    review = verdict.get("review")
    if review is not None:
        lines.append(f"model review by {review['model']}: {review['verdict']}")
        lines += [f"    {line}" for line in review["reasons"].splitlines()]
    style = "red" if verdict["flagged"] else "green"
    return Panel(Text("\n".join(lines)), title="audit", title_align="left", border_style=style)


def _clip(text: str, full: bool, lines: int = 40) -> str:
    split = text.splitlines()
    if full or len(split) <= lines:
        return text
    return "\n".join(split[:lines]) + f"\n... ({len(split) - lines} more lines; --full shows all)"


def diff(text: str) -> Syntax | Text:
    """A unified diff, coloured."""
    return Syntax(text, "diff", word_wrap=False) if text else Text("(no difference)")


def lineage(rows: list[dict[str, Any]], *, title: str) -> Table:
    """The ancestry path as a table, oldest first, with each step's fitness change."""
    body = [
        [
            row["generation"],
            row["id"][:12],
            row["operator"],
            row["model"] or "builtin",
            row["status"],
            row["fitness"],
            _delta(row.get("delta")),
            ", ".join(p[:10] for p in row["other_parents"]),
        ]
        for row in rows
    ]
    return table(
        title,
        ["gen", "id", "operator", "model", "status", "fitness", "change", "other parents"],
        body,
        numeric=("gen", "fitness", "change"),
    )


def _delta(value: float | None) -> Text:
    if value is None:
        return Text("")
    style = "green" if value > 0 else "red" if value < 0 else ""
    return Text(f"{value:+.4g}", style=style)


def heatmap(view: dict[str, Any]) -> Table:
    """The grid as a coloured table: rows are the first descriptor's bins (high at top)."""
    values = [v for row in view["values"] for v in row if v is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    axes = view["axes"] + ["", ""]
    title = (
        f"Grid ({'best over islands' if view['island'] is None else 'island ' + str(view['island'])}): "
        f"{view['filled']} of {view['shape'][0] * view['shape'][1]} cells filled; "
        f"rows: {axes[0] or '-'}, columns: {axes[1] or axes[0] or '-'}"
    )
    out = Table(title=title, box=box.SQUARE, show_lines=False, title_justify="left", padding=(0, 0))
    out.add_column("", justify="right", style="dim")
    for col in range(view["shape"][1]):
        out.add_column(str(col), justify="center", min_width=7)
    for r in reversed(range(view["shape"][0])):
        cells: list[Any] = [str(r)]
        for value in view["values"][r]:
            if value is None:
                cells.append(Text("·", style="dim"))
                continue
            share = (value - low) / (high - low) if high > low else 1.0
            if view.get("direction") == "min":
                share = 1.0 - share
            color = HEAT[min(len(HEAT) - 1, int(share * len(HEAT)))]
            cells.append(Text(f"{value:.4g}", style=f"bold black on {color}"))
        out.add_row(*cells)
    return out


def sparkline(values: Sequence[float | None]) -> str:
    """A one-line chart of a series."""
    nums = [v for v in values if v is not None]
    if not nums:
        return ""
    low, high = min(nums), max(nums)
    span = (high - low) or 1.0
    return "".join(
        " " if v is None else SPARK[min(7, int((v - low) / span * 7.999))] for v in values
    )


def stats(data: dict[str, Any]) -> Group:
    """``stats``: the run, counts, success per operator and model, cost, and the time series."""
    run = data["run"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for label, value in (
        ("benchmark", run["benchmark"]),
        ("status", run["status"]),
        ("candidates", num(run["candidates"])),
        (
            "best",
            f"{num(run['best_fitness'])} ({(run['best'] or '-')[:12]}, {run['direction']}imise)",
        ),
        ("started", when(run["started_at"])),
        ("last update", when(run["last_update_at"])),
    ):
        head.add_row(label, str(value))
    parts: list[Any] = [Panel(head, title="run", title_align="left")]
    counts = data["counts"]
    parts.append(
        table(
            "Candidates by status",
            ["status", "count"],
            [[k, v] for k, v in counts.items() if not k.startswith("eval_")],
            numeric=("count",),
        )
    )
    success = data["success"]
    scope = (
        f"last {success['candidates']:,} candidates (from #{success['window']}; --last 0 for all)"
        if success["window"]
        else f"all {success['candidates']:,} candidates"
    )
    columns = [
        "candidates",
        "evaluated",
        "ok",
        "ok rate",
        "improved",
        "improve rate",
        "gain",
        "elites",
    ]
    for key in ("operator", "model"):
        body = [
            [
                r[key],
                r["candidates"],
                r["evaluated"],
                r["ok"],
                f"{r['ok_rate']:.1%}",
                r["improved"],
                f"{r['improve_rate']:.1%}",
                r["gain"],
                r["elites"],
            ]
            for r in success[key]
        ]
        parts.append(table(f"Success per {key} ({scope})", [key, *columns], body, numeric=columns))
    cost = data["cost"]
    parts.append(
        table(
            f"LLM cost: ${cost['cost']:.4f} over {cost['calls']} calls",
            ["model", "calls", "errors", "tokens in", "tokens out", "USD", "mean latency s"],
            [
                [
                    r["model"],
                    r["calls"],
                    r["errors"],
                    r["tokens_in"],
                    r["tokens_out"],
                    r["cost"],
                    r["latency_s"],
                ]
                for r in cost["per_model"]
            ],
            numeric=("calls", "errors", "tokens in", "tokens out", "USD", "mean latency s"),
        )
    )
    series = data["series"]
    parts.append(Text(f"best over time: {sparkline([r['best'] for r in series])}"))
    parts.append(
        table(
            "Time series",
            ["evaluated", "best", "coverage", "qd_score", "cost", "failures", "time"],
            [
                [
                    r["evaluated"],
                    r["best"],
                    r["coverage"],
                    r["qd_score"],
                    r["cost"],
                    r["failures"],
                    when(r["created_at"]),
                ]
                for r in series
            ],
            numeric=("evaluated", "best", "coverage", "qd_score", "cost", "failures"),
        )
    )
    spent = data.get("time")
    if spent and spent["phases"]:
        parts.append(
            table(
                f"Where the evaluations' time went ({run['benchmark']}): {spent['evaluations']:,} "
                f"evaluations, {spent['wall_s']:,.0f} s of slot time (GPU time on a GPU benchmark)",
                ["phase", "share", "seconds", "mean s", "evaluations"],
                [
                    [r["phase"], f"{r['share']:.1%}", r["seconds"], r["mean_s"], r["evaluations"]]
                    for r in spent["phases"]
                ],
                numeric=("seconds", "mean s", "evaluations"),
            )
        )
    return Group(*parts)


def notebook(data: dict[str, Any]) -> Group:
    """The research notebook of ``evolve.query.notebook.notebook_at``, as rendered markdown."""
    versions = sum(1 for v in data["versions"] if v["kind"] == "notes")
    title = Text(
        f"Research notebook as shown to proposal #{data['seq']} ({versions} versions)", style="bold"
    )
    return Group(title, Markdown(data["text"]))
