"""The run's plots and the data behind them: fitness over time, the grid, success per operator/model.

The data functions (``success_rates``, ``grid``) read the archive through the read model
(``evolve.query``) and are shared with the browser; ``write_plots`` draws PNGs with
matplotlib (imported only there, without pyplot) into ``<run_dir>/plots/``.
"""

from __future__ import annotations

import math
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve import query
from evolve.query import Source
from evolve.query.candidates import outcomes
from evolve.query.edges import elite_ids
from evolve.query.run import (
    elite_cells,
    fitness_series,
    grid_axes,
    islands,
    latest_descriptor_names,
    max_seq,
    objective_direction,
)
from evolve.research.lineage import oriented
from evolve.store.database import Store

DEFAULT_WINDOW = 20_000


def success_rates(source: Source, *, last: int | None = DEFAULT_WINDOW) -> dict[str, Any]:
    """Success per operator and per model over the ``last`` candidates (None: the whole run).

    For each key: candidates, evaluated (done or failed), ok (scored), improved (scored
    better than its best parent), gain (summed improvement, in the objective's good
    direction), elites (cells it holds now), and the rates ok/candidates and
    improved/candidates. A candidate without a model counts as ``builtin``. The window
    keeps this fast on any archive size (it reads about 3 index entries per candidate).

    Returns:
        ``{"window": first seq counted, "candidates": how many, "operator": rows, "model": rows}``,
        rows sorted by candidates, most first.
    """
    conn = query.connection(source)
    maximise = objective_direction(conn) == "max"
    top = max_seq(conn)
    start = 0 if last is None or top is None else max(0, top + 1 - last)
    elites = elite_ids(conn)
    tables: dict[str, dict[str, dict[str, Any]]] = {"operator": {}, "model": {}}
    counted = 0
    for cid, operator, model, status, fitness, parent in outcomes(conn, since_seq=start):
        counted += 1
        gain = None
        if fitness is not None and parent is not None:
            gain = fitness - parent if maximise else parent - fitness
        for by, key in (("operator", operator or "?"), ("model", model or "builtin")):
            row = tables[by].setdefault(
                key,
                {
                    by: key,
                    "candidates": 0,
                    "evaluated": 0,
                    "ok": 0,
                    "improved": 0,
                    "gain": 0.0,
                    "elites": 0,
                },
            )
            row["candidates"] += 1
            row["evaluated"] += status in ("done", "failed")
            row["ok"] += fitness is not None
            row["elites"] += cid in elites
            if gain is not None and gain > 0:
                row["improved"] += 1
                row["gain"] += gain
    result: dict[str, Any] = {"window": start, "candidates": counted}
    for by, rows in tables.items():
        for row in rows.values():
            row["ok_rate"] = row["ok"] / row["candidates"]
            row["improve_rate"] = row["improved"] / row["candidates"]
        result[by] = sorted(rows.values(), key=lambda r: (-r["candidates"], str(r[by])))
    return result


@dataclass
class Grid:
    """A 2-D view of the MAP-Elites grid: the best objective per cell.

    Attributes:
        axes: names of the (up to) two descriptors shown, rows first.
        shape: (rows, columns).
        values: rows x columns, None where no elite.
        ids: the candidate in each cell, None where no elite.
        edges: for each axis, its (low, high) range when the run recorded it.
        islands: the islands present; ``island`` the one shown (None: best over all).
        direction: "max" or "min".
    """

    axes: list[str]
    shape: tuple[int, int]
    values: list[list[float | None]]
    ids: list[list[str | None]]
    edges: list[tuple[float, float] | None] = field(default_factory=list)
    islands: list[int] = field(default_factory=list)
    island: int | None = None
    direction: str = "max"

    @property
    def filled(self) -> int:
        """How many cells of the view hold an elite."""
        return sum(v is not None for row in self.values for v in row)

    def to_json(self) -> dict[str, Any]:
        """A plain dict for ``--json`` and the web page."""
        return {
            "axes": self.axes,
            "shape": list(self.shape),
            "values": self.values,
            "ids": self.ids,
            "edges": self.edges,
            "islands": self.islands,
            "island": self.island,
            "direction": self.direction,
            "filled": self.filled,
        }


def _axes_info(source: Source, dims: int) -> tuple[list[str], list[int | None], list[tuple | None]]:
    descriptors = grid_axes(source)
    if descriptors is not None:
        return (
            [d.get("name", f"d{i}") for i, d in enumerate(descriptors)],
            [d.get("bins") for d in descriptors],
            [(d["low"], d["high"]) if "low" in d and "high" in d else None for d in descriptors],
        )
    names = latest_descriptor_names(source)
    names += [f"d{i}" for i in range(len(names), dims)]
    return names, [None] * dims, [None] * dims


def grid(source: Source, *, island: int | None = None) -> Grid:
    """The grid of elites as a matrix over the first two descriptors.

    Cells are the archive's keys ("3,0,7"); dimensions beyond the second are folded by
    keeping the best elite. ``island`` None keeps the best over all islands.
    """
    conn = query.connection(source)
    direction = objective_direction(conn)
    present = islands(conn)
    cells = []
    for cell, cid, value in elite_cells(conn, island=island):
        index = [int(x) for x in re.findall(r"-?\d+", cell or "")]
        cells.append((index, cid, value))
    dims = max((len(i) for i, _, _ in cells), default=0)
    names, bins, ranges = _axes_info(conn, dims)
    if not cells:
        dims = min(len(names), 2)
    shown = min(dims, 2)
    size = [
        max(
            [(bins[axis] if axis < len(bins) else None) or 1]
            + [i[axis] + 1 for i, _, _ in cells if len(i) > axis]
        )
        for axis in range(shown)
    ]
    rows, cols = (size + [1, 1])[:2] if shown == 2 else (1, size[0] if size else 1)
    values: list[list[float | None]] = [[None] * cols for _ in range(rows)]
    ids: list[list[str | None]] = [[None] * cols for _ in range(rows)]
    for index, cid, value in cells:
        index = index + [0] * (2 - len(index))
        r, c = (index[0], index[1]) if shown == 2 else (0, index[0])
        r, c = min(max(r, 0), rows - 1), min(max(c, 0), cols - 1)
        current = values[r][c]
        if current is None or oriented(value, direction) > oriented(current, direction):
            values[r][c], ids[r][c] = value, cid
    return Grid(
        axes=names[:shown] if shown == 2 else names[:1],
        shape=(rows, cols),
        values=values,
        ids=ids,
        edges=list(ranges[:shown]),
        islands=present,
        island=island,
        direction=direction,
    )


def write_plots(
    store_or_path: Store | sqlite3.Connection | Path | str,
    run_dir: Path | str,
    *,
    subdir: str = "plots",
    last: int | None = None,
) -> list[Path]:
    """Draw the run's plots as PNGs into ``<run_dir>/plots/``.

    Matplotlib is imported here only, and drawn without pyplot (no GUI backend, no global
    state), so this is safe from any thread or process, with or without a display.

    Args:
        store_or_path: an open Store or connection, or the path of an ``archive.db``.
        run_dir: the run directory.
        subdir: the folder under ``run_dir`` for the PNGs ("" for ``run_dir`` itself).
        last: success rates over the last N candidates only (None: the whole run).

    Returns:
        The files written: fitness.png, grid.png, success.png.
    """
    from matplotlib.figure import Figure

    opened = None
    if isinstance(store_or_path, str | Path):
        opened = Store(store_or_path, readonly=True)
        conn = opened.conn
    else:
        conn = query.connection(store_or_path)
    try:
        out = Path(run_dir) / subdir if subdir else Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        return [
            _draw_fitness(Figure, fitness_series(conn, points=2000), out / "fitness.png"),
            _draw_grid(Figure, grid(conn), out / "grid.png"),
            _draw_success(Figure, success_rates(conn, last=last), out / "success.png"),
        ]
    finally:
        if opened is not None:
            opened.close()


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=100, bbox_inches=None)
    return path


PLOT_LIMIT = 1e100  # values beyond ±this (or not finite) are left out of plots, and counted


def plottable(values: list[Any]) -> tuple[list[float], int]:
    """``values`` with those no axis can show (None, not finite, beyond ``PLOT_LIMIT``) as NaN,
    and how many such there were besides None (matplotlib cannot place ticks across ~1e308)."""
    out, left_out = [], 0
    for value in values:
        usable = value is not None and math.isfinite(value) and abs(value) <= PLOT_LIMIT
        left_out += value is not None and not usable
        out.append(float(value) if usable else math.nan)
    return out, left_out


def _left_out_note(count: int) -> str:
    return f" ({count} value(s) beyond ±{PLOT_LIMIT:g} or not finite left out)" if count else ""


def _draw_fitness(figure: Any, series: list[dict[str, Any]], path: Path) -> Path:
    fig = figure(figsize=(8, 6))
    fig.subplots_adjust(left=0.1, right=0.9, top=0.93, bottom=0.09, hspace=0.12)
    top, bottom = fig.subplots(2, 1, sharex=True)
    xs = [row["evaluated"] for row in series]
    best, left_best = plottable([row["best"] for row in series])
    qd, left_qd = plottable([row["qd_score"] for row in series])
    top.plot(xs, best, color="#d84315", label="best")
    top.set_ylabel("best fitness")
    top.grid(alpha=0.3)
    bottom.plot(xs, [row["coverage"] for row in series], color="#1565c0", label="coverage")
    bottom.set_ylabel("coverage")
    bottom.set_xlabel("candidates evaluated")
    bottom.grid(alpha=0.3)
    twin = bottom.twinx()
    twin.plot(xs, qd, color="#2e7d32", alpha=0.7, label="QD score")
    twin.set_ylabel("QD score")
    if not series:
        top.text(0.5, 0.5, "no stats recorded yet", ha="center", transform=top.transAxes)
    top.set_title("Fitness over time" + _left_out_note(left_best + left_qd))
    return _save(fig, path)


def _draw_grid(figure: Any, view: Grid, path: Path) -> Path:
    import numpy as np

    fig = figure(figsize=(6.5, 5.5))
    fig.subplots_adjust(left=0.12, right=0.98, top=0.92, bottom=0.1)
    ax = fig.subplots()
    rows = [plottable(list(row)) for row in view.values]
    data = np.array([row for row, _ in rows], dtype=float)
    left_out = sum(count for _, count in rows)
    image = ax.imshow(
        data,
        origin="lower",
        cmap="viridis" if view.direction == "max" else "viridis_r",
        aspect="auto",
        interpolation="nearest",
    )
    fig.colorbar(
        image,
        ax=ax,
        label="best objective" + (" (lower is better)" if view.direction == "min" else ""),
    )
    if len(view.axes) == 2:
        ax.set_ylabel(view.axes[0])
        ax.set_xlabel(view.axes[1])
    elif view.axes:
        ax.set_xlabel(view.axes[0])
    ax.set_title(
        f"Grid: {view.filled} of {view.shape[0] * view.shape[1]} cells filled (best over islands)"
        + _left_out_note(left_out)
    )
    return _save(fig, path)


def _draw_success(figure: Any, success: dict[str, Any], path: Path) -> Path:
    fig = figure(figsize=(11, 4.5))
    fig.subplots_adjust(left=0.06, right=0.99, top=0.9, bottom=0.16, wspace=0.15)
    axes = fig.subplots(1, 2)
    for ax, key in ((axes[0], "operator"), (axes[1], "model")):
        rows = success[key]
        labels = [f"{row[key]}\n(n={row['candidates']:,})" for row in rows]
        ok = [row["ok"] / row["candidates"] if row["candidates"] else 0 for row in rows]
        improved = [row["improved"] / row["candidates"] if row["candidates"] else 0 for row in rows]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], ok, width=0.4, label="scored (ok)", color="#90caf9")
        ax.bar([x + 0.2 for x in xs], improved, width=0.4, label="beat its parent", color="#ef6c00")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylim(0, 1)
        ax.set_ylabel("fraction of candidates")
        scope = f" (last {success['candidates']:,} candidates)" if success["window"] else ""
        ax.set_title(f"Success per {key}{scope}")
        ax.legend(fontsize=8, loc="upper right")
    return _save(fig, path)
