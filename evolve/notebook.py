"""The run's research notebook: what was tried, what it did (with its noise), why things failed.

Built mechanically from the archive (operators, diffs, scores, failure reasons) each time a
proposal is asked, so it is a pure function of the archive at that moment; a version is
stored in the ``notebook`` table whenever it changes (a resumed run and an offline replay
show the same text). Sections, most useful first: the run so far, measured effects per
change (grouped by the settings a diff changes, or by the model's own description of its
idea), failures grouped by cause, the best programs of every island, open directions, and
the latest summary a model wrote of it (``evolve.operators.summary``). Proposals the engine
refused without a model answer (e.g. a crossover with one elite) are not the model's
lessons and are left out.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.query import Source
from evolve.query.candidates import brief, elites, files_of
from evolve.query.edges import elite_ids
from evolve.query.notebook import attempts, children_attempts, noise_sd, note_at
from evolve.query.run import grid_axes, objective_direction

_ASSIGNMENT = re.compile(r"^\s*(?P<name>[A-Za-z_][\w.]*)\s*[:=]\s*(?P<value>[^#]+?)\s*(#.*)?$")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_HEX_ID = re.compile(r"\b[0-9a-f]{8,}\b")
FINAL = ("done", "failed", "rejected")  # statuses a proposal keeps for good


def describe_cell(cell: str | None, axes: Sequence[Mapping[str, Any]] | None) -> str:
    """``cell`` with its axes named: ``radius_std 0.01-0.02 [bin 2/6], wall_fraction ...``."""
    if not cell:
        return ""
    parts = cell.split(",")
    if not axes or len(parts) != len(axes) or not all(p.strip().isdigit() for p in parts):
        names = " x ".join(str(a["name"]) for a in axes or ())
        return f"{cell} ({names})" if names else cell
    shown = []
    for part, axis in zip(parts, axes, strict=True):
        index, bins = int(part), int(axis["bins"])
        width = (float(axis["high"]) - float(axis["low"])) / bins
        low = float(axis["low"]) + index * width
        shown.append(f"{axis['name']} {low:.4g}-{low + width:.4g} [bin {index + 1}/{bins}]")
    return ", ".join(shown)


def change_label(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[str, str]:
    """(key, label) of the change from ``before`` to ``after``: the settings it changes
    (``N_ITER 8 -> 32``), or '' as key when it changes more than settings."""
    removed: dict[str, str] = {}
    added: dict[str, str] = {}
    lines = {"-": 0, "+": 0}
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, "").splitlines(), after.get(path, "").splitlines()
        for line in difflib.unified_diff(old, new, n=0, lineterm=""):
            if line.startswith(("---", "+++", "@@")) or not line[1:].strip():
                continue
            lines[line[0]] += 1
            match = _ASSIGNMENT.match(line[1:])
            if match is None:
                removed[""] = added[""] = ""  # more than settings changed
            else:
                (removed if line[0] == "-" else added)[match["name"]] = match["value"]
    names = sorted(set(removed) | set(added))
    if "" in names or not names or len(names) > 4:
        return "", f"-{lines['-']}/+{lines['+']} lines"
    label = ", ".join(f"{n} {removed.get(n, '(new)')} -> {added.get(n, '(gone)')}" for n in names)
    return ", ".join(names), label


def cause(text: str) -> str:
    """A failure reason with its particulars (numbers, quoted text, ids) blanked, to group by."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return "no reason recorded"
    line = lines[-1] if lines[0].startswith("Traceback") or len(lines) > 3 else lines[0]
    line = _HEX_ID.sub("<id>", _NUMBER.sub("N", _QUOTED.sub("'...'", line)))
    return line.split(";")[0][:140]


def _words(text: str | None, limit: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _number(value: float) -> str:
    return f"{value:+.4g}"


@dataclass
class Notebook:
    """Builds the notebook text of one run (``text``) and records it at each ask (``record``).

    Args:
        source: the run's store (read through ``evolve.query``).
        editable: whether a path is editable (only those files' changes are described).
        max_chars: the notebook's size budget (sections are cut from the end, saying so).
    """

    source: Source
    editable: Callable[[str], bool] = lambda path: True
    max_chars: int = 6000
    _labels: dict[str, tuple[str, str]] = field(default_factory=dict)
    _settled: list[dict] = field(default_factory=list)  # oldest proposals, all with a final status
    _causes: dict[str, str] = field(default_factory=dict)

    def _attempts(self) -> list[dict]:
        """Every proposal, the seed first; an unbroken run of them from the seed whose
        status is final is read once (a proposal still in flight has no row yet)."""
        after = self._settled[-1]["seq"] if self._settled else -1
        fresh = attempts(self.source, after_seq=after)
        while fresh and fresh[0]["status"] in FINAL and fresh[0]["seq"] == after + 1:
            after = fresh[0]["seq"]
            self._settled.append(fresh.pop(0))
        return self._settled + fresh

    def _label(self, child: str, parent: str) -> tuple[str, str]:
        if child not in self._labels:
            before = {p: t for p, t in files_of(self.source, parent).items() if self.editable(p)}
            after = {p: t for p, t in files_of(self.source, child).items() if self.editable(p)}
            self._labels[child] = change_label(before, after)
        return self._labels[child]

    def text(self) -> str:
        """The notebook as the archive is now (markdown, at most ``max_chars``); '' before any proposal."""
        every = self._attempts()  # the seed too: it is a parent
        rows = [row for row in every if row["seq"] > 0]
        if not rows:
            return ""
        sign = 1.0 if objective_direction(self.source) == "max" else -1.0
        fitness = {row["id"]: row["fitness"] for row in every if row["fitness"] is not None}
        sd = noise_sd(self.source)
        sections = [
            self._overview(rows, sd),
            self._effects(rows, fitness, sign, sd),
            self._failures(rows),
            self._best(),
            self._open(rows, fitness, sign, sd),
            self._summary(rows[-1]["seq"]),
        ]
        return _fit([s for s in sections if s], self.max_chars)

    def record(self, store: Any, seq: int) -> None:
        """Store the notebook proposal ``seq`` is shown, when it differs from the last stored one."""
        text = self.text()
        last = note_at(self.source, seq)
        if text and (last is None or last["text"] != text):
            store.put_note(seq, "notes", text)

    # --- sections -----------------------------------------------------------------------------

    def _overview(self, rows: list[dict], sd: float | None) -> str:
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        told = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        noise = (
            f"repeated evaluations of one program vary by sd {sd:.3g}"
            if sd is not None
            else "noise not measured (no program was evaluated twice)"
        )
        return f"### The run so far\n\n{len(rows)} proposals ({told}); {noise}."

    def _effects(self, rows: list[dict], fitness: dict, sign: float, sd: float | None) -> str:
        groups: dict[str, list[tuple[float, str, dict]]] = {}
        for row in rows:
            if row["fitness"] is None or fitness.get(row["parent"]) is None:
                continue
            key, label = self._label(row["id"], row["parent"])
            idea = key or _words(row["description"], 90).lower()
            effect = row["fitness"] - fitness[row["parent"]]
            groups.setdefault(idea, []).append((effect, label if key else idea, row))
        if not groups:
            return ""
        lines = []
        ranked = sorted(groups.items(), key=lambda kv: -max(sign * e for e, _, _ in kv[1]))
        for idea, tries in ranked:
            best, label, row = max(tries, key=lambda t: sign * t[0])
            mean = sum(e for e, _, _ in tries) / len(tries)
            verdict = ""
            if sd is not None:
                verdict = " (within noise)" if abs(mean) <= 2 * sd else " (beyond noise)"
            where = f"{row['operator']} on `{row['parent'][:8]}`, island {row['island']}"
            if len(tries) == 1:
                lines.append(f"- {label}: {_number(best)}{verdict}; 1 try ({where})")
            else:
                lines.append(
                    f"- {idea}: {len(tries)} tries, mean {_number(mean)}{verdict}; best "
                    f"{label}: {_number(best)} ({where})"
                )
        return "### Measured effects (child minus parent, best first)\n\n" + "\n".join(lines)

    def _failures(self, rows: list[dict]) -> str:
        groups: dict[str, list[dict]] = {}
        for row in rows:
            failed = row["status"] == "failed"
            refused = row["status"] == "rejected" and (row["answer"] or "").strip()
            if failed or refused:
                if row["id"] not in self._causes:
                    self._causes[row["id"]] = cause(row["error"] or row["description"] or "")
                why = ("failed: " if failed else "refused: ") + self._causes[row["id"]]
                groups.setdefault(why, []).append(row)
        if not groups:
            return ""
        lines = []
        for why, rows_ in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            ids = ", ".join(f"`{r['id'][:8]}`" for r in rows_[-3:])
            lines.append(f"- {len(rows_)}x {why} (latest {ids})")
        return "### Failures by cause (most frequent first)\n\n" + "\n".join(lines)

    def _best(self) -> str:
        axes = grid_axes(self.source)
        rows = elites(self.source, limit=6)
        if not rows:
            return ""
        lines = [
            f"- `{e['id'][:8]}` {e['objective']:.6g} on island {e['island']}, cell "
            f"{describe_cell(e['cell'], axes)} (#{e['seq']}, {e['operator']})"
            for e in rows
        ]
        return "### Best programs across all islands\n\n" + "\n".join(lines)

    def _open(self, rows: list[dict], fitness: dict, sign: float, sd: float | None) -> str:
        built_on = {row["parent"] for row in rows}
        margin = 2 * sd if sd is not None else 0.0
        leads = [
            row
            for row in rows
            if row["fitness"] is not None
            and fitness.get(row["parent"]) is not None
            and sign * (row["fitness"] - fitness[row["parent"]]) > margin
            and row["id"] not in built_on
        ]
        if not leads:
            return ""
        lines = [
            f"- `{r['id'][:8]}` ({self._label(r['id'], r['parent'])[1]}: "
            f"{_number(r['fitness'] - fitness[r['parent']])}) improved on its parent and has no "
            f"children yet: {_words(r['description'], 160)}"
            for r in leads[-5:]
        ]
        return "### Open directions (improvements not built on yet)\n\n" + "\n".join(lines)

    def _summary(self, seq: int) -> str:
        summary = note_at(self.source, seq, "summary")
        if summary is None:
            return ""
        return (
            f"### Lessons summarised by {summary['model']} at proposal {summary['seq']}\n\n"
            + summary["text"].strip()
        )


def _fit(sections: list[str], limit: int) -> str:
    """Sections joined, each cut line by line from its end so that all fit in ``limit``, saying so."""
    text = "\n\n".join(sections)
    if len(text) <= limit:
        return text
    share = max(200, limit // len(sections))
    kept = []
    for section in sections:
        lines = section.split("\n")
        while len("\n".join(lines)) > share and len(lines) > 3:
            lines.pop()
        cut = len(section.split("\n")) - len(lines)
        kept.append("\n".join(lines) + (f"\n- ... {cut} more lines left out" if cut else ""))
    return "\n\n".join(kept)[:limit]


def sibling_notes(source: Source, parent_ids: list[str], *, limit: int = 6) -> list[str]:
    """What came of the latest proposals made from these parents: score and change, or why they failed.

    Proposals the engine refused without a model answer are left out (nothing to learn).
    """
    rows = children_attempts(source, parent_ids, limit=limit * 2)
    kept = elite_ids(source)
    notes = []
    for row in rows:
        if row["status"] == "rejected" and not (row["answer"] or "").strip():
            continue
        what = _words(row["description"], 200)
        if row["fitness"] is not None:
            parent = brief(source, row["parent"])[3] if row["parent"] else None
            change = (
                f", {_number(row['fitness'] - parent)} vs its parent" if parent is not None else ""
            )
            fate = "now an elite" if row["id"] in kept else "not kept"
            outcome = f"scored {row['fitness']:.6g}{change} ({fate})"
        elif row["status"] in ("failed", "rejected"):
            reason = " ".join((row["error"] or "").strip().splitlines()[-3:])
            outcome = f"{row['status']}: {reason[:400]}" if reason != what else row["status"]
        else:
            outcome = "not evaluated yet"
        notes.append(f"`{row['id'][:8]}` ({row['operator']}): {what} -> {outcome}")
    return notes[:limit]
