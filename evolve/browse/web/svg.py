"""Server-side SVG charts for the web page: line chart, grid heatmap, bars (no JavaScript library)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

PALETTE = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#b5de2b",
    "#fde725",
)


def color(share: float) -> str:
    """A viridis-like colour for a value in [0, 1]."""
    share = min(1.0, max(0.0, share))
    return PALETTE[min(len(PALETTE) - 1, int(share * len(PALETTE)))]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 1)]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def line_chart(
    xs: Sequence[float],
    series: dict[str, Sequence[float | None]],
    *,
    x_label: str,
    width: int = 640,
    height: int = 260,
    css_id: str = "",
) -> str:
    """A line chart of one or more series sharing the x axis (each series scaled to its own range
    when there are several, labelled in the legend with its range)."""
    pad_l, pad_r, pad_t, pad_b = 56, 12, 22, 34
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    out = [
        f'<svg class="chart" id="{css_id}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">'
    ]
    if not xs:
        out.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no data yet</text></svg>'
        )
        return "".join(out)
    x_low, x_high = min(xs), max(xs)
    x_span = (x_high - x_low) or 1.0
    colours = ("#d84315", "#1565c0", "#2e7d32", "#6a1b9a")
    first = next(iter(series.values()))
    values = [v for v in first if v is not None and math.isfinite(v)]
    y_low, y_high = (min(values), max(values)) if values else (0.0, 1.0)
    if y_high == y_low:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    for tick in _ticks(y_low, y_high):
        y = pad_t + h - (tick - y_low) / (y_high - y_low) * h
        out.append(
            f'<line x1="{pad_l}" x2="{pad_l + w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{pad_l - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_fmt(tick)}</text>'
        )
    for tick in _ticks(x_low, x_high):
        x = pad_l + (tick - x_low) / x_span * w
        out.append(
            f'<text x="{x:.1f}" y="{pad_t + h + 14}" text-anchor="middle" class="tick">{_fmt(tick)}</text>'
        )
    out.append(
        f'<text x="{pad_l + w / 2}" y="{height - 4}" text-anchor="middle" class="label">'
        f"{escape(x_label)}</text>"
    )
    for index, (name, ys) in enumerate(series.items()):
        finite = [v for v in ys if v is not None and math.isfinite(v)]
        low, high = (
            (y_low, y_high)
            if index == 0
            else ((min(finite), max(finite)) if finite else (0.0, 1.0))
        )
        span = (high - low) or 1.0
        points = " ".join(
            f"{pad_l + (x - x_low) / x_span * w:.1f},{pad_t + h - (y - low) / span * h:.1f}"
            for x, y in zip(xs, ys, strict=False)
            if y is not None and math.isfinite(y)
        )
        colour = colours[index % len(colours)]
        out.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="{2 if index == 0 else 1.2}" '
            f'points="{points}"><title>{escape(name)}</title></polyline>'
        )
        legend = escape(name) + ("" if index == 0 else f" ({_fmt(low)}–{_fmt(high)})")
        out.append(
            f'<text x="{pad_l + 6 + index * 150}" y="14" fill="{colour}" class="legend">{legend}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def heatmap(view: dict[str, Any], link: Callable[[str], str], *, cell_px: int = 34) -> str:
    """The grid: one square per cell coloured by its best objective, linked to its elite."""
    rows, cols = view["shape"]
    values = [v for row in view["values"] for v in row if v is not None]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    pad_l, pad_b = 34, 34
    width, height = pad_l + cols * cell_px + 8, rows * cell_px + pad_b + 8
    out = [
        f'<svg class="heatmap" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">'
    ]
    for r in range(rows):
        y = (rows - 1 - r) * cell_px + 4
        out.append(
            f'<text x="{pad_l - 4}" y="{y + cell_px / 2 + 4}" text-anchor="end" class="tick">{r}</text>'
        )
        for c in range(cols):
            x = pad_l + c * cell_px
            value, cid = view["values"][r][c], view["ids"][r][c]
            if value is None:
                out.append(
                    f'<rect x="{x}" y="{y}" width="{cell_px - 2}" height="{cell_px - 2}" class="empty"/>'
                )
                continue
            share = (value - low) / (high - low) if high > low else 1.0
            if view.get("direction") == "min":
                share = 1 - share
            out.append(
                f'<a href="{escape(link(cid))}"><rect x="{x}" y="{y}" width="{cell_px - 2}" '
                f'height="{cell_px - 2}" fill="{color(share)}" data-cell="{r},{c}"><title>cell {r},{c}: '
                f"{_fmt(value)} ({cid[:10]})</title></rect></a>"
            )
    for c in range(cols):
        out.append(
            f'<text x="{pad_l + c * cell_px + cell_px / 2}" y="{rows * cell_px + 18}" text-anchor="middle" '
            f'class="tick">{c}</text>'
        )
    axes = view.get("axes") or []
    label = f"rows: {axes[0]}, columns: {axes[1]}" if len(axes) == 2 else (axes[0] if axes else "")
    out.append(f'<text x="{pad_l}" y="{height - 2}" class="label">{escape(label)}</text></svg>')
    return "".join(out)


def bars(rows: list[dict[str, Any]], key: str, *, width: int = 420) -> str:
    """Horizontal bars: share of candidates scored ok and share that beat their parent."""
    bar_h, label_w = 14, 170
    height = len(rows) * (2 * bar_h + 10) + 24
    out = [
        f'<svg class="bars" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        '<text x="0" y="12" class="legend" fill="#1976d2">scored ok</text>'
        '<text x="90" y="12" class="legend" fill="#ef6c00">beat its parent</text>',
    ]
    span = width - label_w - 60
    for i, row in enumerate(rows):
        y = 22 + i * (2 * bar_h + 10)
        out.append(
            f'<text x="{label_w - 6}" y="{y + bar_h + 3}" text-anchor="end" class="tick">'
            f"{escape(str(row[key]))[:28]}</text>"
        )
        for j, (name, fill) in enumerate((("ok_rate", "#90caf9"), ("improve_rate", "#ef6c00"))):
            share = row[name]
            out.append(
                f'<rect x="{label_w}" y="{y + j * bar_h}" width="{max(1.0, share * span):.1f}" '
                f'height="{bar_h - 2}" fill="{fill}"><title>{name}: {share:.1%}</title></rect>'
                f'<text x="{label_w + share * span + 4:.1f}" y="{y + j * bar_h + bar_h - 4}" class="tick">'
                f"{share:.0%}{'' if j else ' of ' + str(row['candidates'])}</text>"
            )
    out.append("</svg>")
    return "".join(out)
