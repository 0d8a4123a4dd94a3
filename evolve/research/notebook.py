"""The run's research notebook: what was tried, what it did (with its noise), why things failed.

Built mechanically from the archive (operators, diffs, scores, failure reasons) each time a
proposal is asked, so it is a pure function of the archive at that moment; a version is
stored in the ``notebook`` table whenever it changes (a resumed run and an offline replay
show the same text). It is organised by recency and significance, not by raw delta, so its
first lines keep changing as the run learns: the run so far (with the measured noise), what
was tried most recently, the effects that hold beyond noise (newest first), failures by cause
(latest first), the best programs of every island, open directions (improvements beyond
noise, never ties) and the latest summary a model wrote of it (``evolve.research.summary``).
Every change is labelled by its diff (``change_label``: the settings it changes, else the
functions it edits), never by the model's prose; a single try is called one. Proposals the
engine refused without a model answer (e.g. a crossover with one elite) are not the model's
lessons and are left out.
"""

from __future__ import annotations

import ast
import difflib
import heapq
import re
from collections import ChainMap, Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evolve.archive.grid import describe_cell
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
SHOWN = 60  # at most this many lines per section (the size budget usually cuts earlier)
RECENT = 8  # proposals listed under "Tried recently"
TOLERANCE = 1e-6  # relative gain below which two scores tie (the archive's default min_improvement)


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
        edited = edited_definitions(before, after)
        size = f"-{lines['-']}/+{lines['+']} lines"
        if not edited:
            return "", size
        shown = ", ".join(edited[:4]) + (f" and {len(edited) - 4} more" if len(edited) > 4 else "")
        return f"edits {shown}", f"edits {shown} ({size})"
    label = ", ".join(f"{n} {removed.get(n, '(new)')} -> {added.get(n, '(gone)')}" for n in names)
    return ", ".join(names), label


def edited_definitions(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The functions and classes a change adds, removes or edits (``construct()``, ``class
    Grid``, ``module level``), in file order; [] when a file is not Python it can parse."""
    edited: list[str] = []
    for path in sorted(set(before) | set(after)):
        if before.get(path) == after.get(path):
            continue
        old, new = _definitions(before.get(path, "")), _definitions(after.get(path, ""))
        if old is None or new is None:
            return []
        edited += [name for name in new if old.get(name) != new[name]]
        edited += [name for name in old if name not in new]
    return list(dict.fromkeys(edited))


def _definitions(text: str) -> dict[str, str] | None:
    """Each top-level function, class and method of ``text`` -> its code, plus ``module level``
    -> every other statement (None: not valid Python)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    found: dict[str, str] = {}
    rest = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[f"{node.name}()"] = ast.dump(node)
        elif isinstance(node, ast.ClassDef):
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
            others = [ast.dump(n) for n in node.body if n not in methods]
            found[f"class {node.name}"] = "\n".join(others)
            for method in methods:
                found[f"{node.name}.{method.name}()"] = ast.dump(method)
        else:
            rest.append(ast.dump(node))
    found["module level"] = "\n".join(rest)
    return found


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


@dataclass(frozen=True)
class _Group:
    """The tries of one idea: how many, their summed effect, the best (effect, label, row),
    and the newest try's seq."""

    tries: int
    total: float
    best: tuple[float, str, dict]
    last: int

    def join(self, other: _Group, sign: float) -> _Group:
        best = max(self.best, other.best, key=lambda t: sign * t[0])
        return _Group(
            self.tries + other.tries, self.total + other.total, best, max(self.last, other.last)
        )


@dataclass
class _Tally:
    """What the notebook counts over some proposals: statuses, scores, effects per idea,
    failures per cause (count and latest ids), parents built on, children that improved."""

    counts: Counter[str] = field(default_factory=Counter)
    fitness: dict[str, float] = field(default_factory=dict)
    effects: dict[str, _Group] = field(default_factory=dict)
    failures: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    built_on: set[str] = field(default_factory=set)
    improved: list[tuple[float, dict]] = field(default_factory=list)
    recent: list[str] = field(default_factory=list)  # the newest proposals, one line each

    def joined(self, later: _Tally, sign: float) -> _Tally:
        """This tally followed by ``later``'s proposals (neither changes)."""
        effects = dict(self.effects)
        for idea, group in later.effects.items():
            effects[idea] = effects[idea].join(group, sign) if idea in effects else group
        failures = dict(self.failures)
        for why, (n, ids) in later.failures.items():
            before, old = failures.get(why, (0, ()))
            failures[why] = (before + n, (old + ids)[-3:])
        return _Tally(
            counts=self.counts + later.counts,
            fitness={**self.fitness, **later.fitness},
            effects=effects,
            failures=failures,
            built_on=self.built_on | later.built_on,
            improved=self.improved + later.improved,
            recent=(self.recent + later.recent)[-RECENT:],
        )


@dataclass
class Notebook:
    """Builds the notebook text of one run (``text``) and records it at each ask (``record``).

    Proposals are counted once when their outcome is final (an unbroken run of them from
    the seed: one still in flight has no row yet); those after are counted anew each time,
    so a build costs about the same at 100 or 10,000 candidates.

    Args:
        source: the run's store (read through ``evolve.query``).
        editable: whether a path is editable (only those files' changes are described).
        max_chars: the notebook's size budget (sections are cut from the end, saying so).
    """

    source: Source
    editable: Callable[[str], bool] = lambda path: True
    max_chars: int = 6000
    _settled: _Tally = field(default_factory=_Tally)
    _after: int = -1  # the last settled proposal's seq
    _labels: dict[str, tuple[str, str]] = field(default_factory=dict)
    _sign: float = 0.0

    def _tally(self) -> tuple[_Tally, int]:
        """Every proposal counted, and the newest one's seq."""
        if not self._sign:
            self._sign = 1.0 if objective_direction(self.source) == "max" else -1.0
        fresh = attempts(self.source, after_seq=self._after)
        while fresh and fresh[0]["status"] in FINAL and fresh[0]["seq"] == self._after + 1:
            row = fresh.pop(0)
            self._add(self._settled, row, self._settled.fitness)
            self._after = row["seq"]
        later = _Tally()
        for row in fresh:  # proposals still in flight taught nothing yet (and their status is timing)
            if row["status"] in FINAL:
                self._add(later, row, ChainMap(later.fitness, self._settled.fitness))
        newest = fresh[-1]["seq"] if fresh else self._after
        return self._settled.joined(later, self._sign), newest

    def _add(self, tally: _Tally, row: dict, fitness: Mapping[str, float]) -> None:
        if row["fitness"] is not None:
            tally.fitness[row["id"]] = row["fitness"]
        if row["seq"] == 0:  # the seed: a parent, not a proposal
            return
        tally.counts[row["status"]] += 1
        parent = row["parent"]
        if parent:
            tally.built_on.add(parent)
        label = self._label(row["id"], parent)[1] if parent else row["operator"]
        where = f"{row['operator']} on `{parent[:8]}`" if parent else row["operator"]
        if row["status"] == "done" and fitness.get(parent) is not None:
            key = self._label(row["id"], parent)[0] or label
            effect = row["fitness"] - fitness[parent]
            group = _Group(1, effect, (effect, label, row), row["seq"])
            old = tally.effects.get(key)
            tally.effects[key] = old.join(group, self._sign) if old else group
            if self._sign * effect > 0:
                tally.improved.append((effect, row))
            outcome = f"{_number(effect)} vs its parent"
            if row["twin"]:
                outcome += f", the same score as `{row['twin'][:8]}` (a twin, not kept)"
        elif row["status"] == "done":
            outcome = f"scored {row['fitness']:.6g}"
        else:
            outcome = f"{row['status']}: {cause(row['error'] or '')}"
        if row["status"] != "rejected" or (row["answer"] or "").strip():
            tally.recent = [*tally.recent, f"- #{row['seq']} {label} ({where}): {outcome}"][-RECENT:]
        failed = row["status"] == "failed"
        if failed or (row["status"] == "rejected" and (row["answer"] or "").strip()):
            why = ("failed: " if failed else "refused: ") + cause(
                row["error"] or row["description"] or ""
            )
            n, ids = tally.failures.get(why, (0, ()))
            tally.failures[why] = (n + 1, (*ids, row["id"])[-3:])

    def _label(self, child: str, parent: str) -> tuple[str, str]:
        if child not in self._labels:
            before = {p: t for p, t in files_of(self.source, parent).items() if self.editable(p)}
            after = {p: t for p, t in files_of(self.source, child).items() if self.editable(p)}
            self._labels[child] = change_label(before, after)
        return self._labels[child]

    def text(self) -> str:
        """The notebook as the archive is now (markdown, at most ``max_chars``); '' before any
        proposal, unless the noise was measured (the seed's calibration): that comes first."""
        tally, newest = self._tally()
        sd = noise_sd(self.source)
        if not tally.counts and sd is None:
            return ""
        sections = [
            self._overview(tally, sd),
            self._recent(tally),
            self._effects(tally, sd),
            self._failures(tally),
            self._best(),
            self._open(tally, sd),
            self._summary(newest),
        ]
        return _fit([s for s in sections if s], self.max_chars)

    def record(self, store: Any, seq: int) -> None:
        """Store the notebook proposal ``seq`` is shown, when it differs from the last stored one."""
        text = self.text()
        last = note_at(self.source, seq)
        if text and (last is None or last["text"] != text):
            store.put_note(seq, "notes", text)

    # --- sections -----------------------------------------------------------------------------

    def _overview(self, tally: _Tally, sd: float | None) -> str:
        told = ", ".join(f"{n} {status}" for status, n in sorted(tally.counts.items())) or "none yet"
        noise = (
            f"repeated evaluations of one program vary by sd {sd:.3g}, so an effect holds "
            f"only beyond {2 * sd:.3g} (2 sd); a single try is a single try"
            if sd is not None
            else "noise not measured (no program was evaluated twice): a single try is a "
            "single try"
        )
        return f"### The run so far\n\n{tally.counts.total()} proposals ({told}); {noise}."

    def _recent(self, tally: _Tally) -> str:
        if not tally.recent:
            return ""
        return "### Tried recently (newest last)\n\n" + "\n".join(tally.recent)

    def _margin(self, sd: float | None, value: float) -> float:
        """The smallest effect that is more than a tie or noise next to a score of ``value``."""
        return max(2 * sd if sd is not None else 0.0, TOLERANCE * max(1.0, abs(value)))

    def _effects(self, tally: _Tally, sd: float | None) -> str:
        held = [
            (idea, group)
            for idea, group in tally.effects.items()
            if abs(group.total / group.tries)
            > self._margin(sd, group.best[2]["fitness"] - group.best[0])
        ]
        lines = []
        for idea, group in heapq.nlargest(SHOWN, held, key=lambda kv: kv[1].last):
            best, label, row = group.best
            mean = group.total / group.tries
            where = f"{row['operator']} on `{row['parent'][:8]}`, island {row['island']}"
            if group.tries == 1:
                lines.append(f"- {label}: {_number(best)}, a single try ({where}, #{row['seq']})")
            else:
                lines.append(
                    f"- {idea}: {group.tries} tries, mean {_number(mean)}; best "
                    f"{label}: {_number(best)} ({where}, #{row['seq']})"
                )
        if not tally.effects:
            return ""
        ties = len(tally.effects) - len(held)
        if ties:
            lines.append(
                f"- {ties} other change(s) moved the score by no more than "
                + ("the noise (within noise)" if sd is not None else "ties")
            )
        title = "beyond noise" if sd is not None else "more than ties; noise not measured"
        return f"### Effects that hold ({title}; newest first)\n\n" + "\n".join(lines)

    def _failures(self, tally: _Tally) -> str:
        ranked = heapq.nsmallest(SHOWN, tally.failures.items(), key=lambda kv: (-kv[1][0], kv[0]))
        lines = [
            f"- {n}x {why} (latest {', '.join(f'`{i[:8]}`' for i in ids)})"
            for why, (n, ids) in ranked
        ]
        if not lines:
            return ""
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

    def _open(self, tally: _Tally, sd: float | None) -> str:
        leads = []
        for effect, row in reversed(tally.improved):
            if len(leads) == 5:
                break
            margin = self._margin(sd, row["fitness"] - effect)
            if self._sign * effect > margin and row["id"] not in tally.built_on:
                leads.append((effect, row))
        lines = [
            f"- `{r['id'][:8]}` ({self._label(r['id'], r['parent'])[1]}: {_number(effect)}) "
            f"improved on its parent and has no children yet: {_words(r['description'], 160)}"
            for effect, r in reversed(leads)
        ]
        if not lines:
            return ""
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
            if row["twin"]:
                fate = f"the same as `{row['twin'][:8]}`: a twin, not kept"
            outcome = f"scored {row['fitness']:.6g}{change} ({fate})"
        elif row["status"] in ("failed", "rejected"):
            reason = " ".join((row["error"] or "").strip().splitlines()[-3:])
            outcome = f"{row['status']}: {reason[:400]}" if reason != what else row["status"]
        else:
            outcome = "not evaluated yet"
        notes.append(f"`{row['id'][:8]}` ({row['operator']}): {what} -> {outcome}")
    return notes[:limit]
