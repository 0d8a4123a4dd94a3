"""What the model sees: the operator prompts of a run, measured (issue 17).

Usage:
  python scripts/prompt_report.py --make 60 --out /tmp/after             # circle packing, scripted
                                                                          # model, 2 islands, 2 workers
  python scripts/prompt_report.py --make 60 --out /tmp/before --repo /work/main   # another checkout
  python scripts/prompt_report.py --archive /tmp/after                   # measure an existing run
  python scripts/prompt_report.py --make 100 --out /tmp/x --set emitter.selection=weights \
      --set llm.operators.crossover=2                                     # more crossovers
Prints one line per measure: prompts and distinct texts, median size, how many show other
elites, the results of earlier children of their parent, the engine's own refusals, failure
notes printed as "X -> X", and cells given as bare numbers; then the notebook and selection
figures of issue 31: how often the labels of the notebook's first 5 effect lines (what was
changed) differ from those shown 50 proposals earlier, effect lines labelled by the diff (settings ``NAME a -> b``, ``edits f()``,
line counts) rather than the model's prose, ties listed as open directions, crossovers
pairing a program with its own ancestor, the top-3 parents' share of proposals and cells
filled per island. Reads the archive with sqlite3 only, so runs of older evolve versions
(``--repo``, e.g. a ``git archive`` of main) can be measured too.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from llm_storage import make_run  # noqa: E402  (a sibling script)

ISLANDS = ["archive.islands=2"]
BARE_CELL = re.compile(r"\(cell \d+(,\d+)*\)")
ECHO = re.compile(r"^- \S+ \([^)]*\): (?P<what>.+) -> (?P<why>.+)$", re.M)
EFFECTS = re.compile(r"^### (Measured effects|Effects that hold)[^\n]*\n\n(?P<lines>(- [^\n]*\n?)*)", re.M)
OPEN = re.compile(r"^### Open directions[^\n]*\n\n(?P<lines>(- [^\n]*\n?)*)", re.M)
OPEN_EFFECT = re.compile(r"^- `\w+` \((?P<label>.*): (?P<effect>[-+][\d.e+-]+)\) improved", re.M)
# a label the diff gives: settings (NAME a -> b, or their names), the functions edited, line counts
DIFF_LABEL = re.compile(
    r"^- (\d+ other change|(\d+ tries, mean [^;]*; best )?"
    r"([A-Z_][A-Z0-9_.]*(,| |:)|edits |-\d+/\+\d+ lines))"
)
TIE = 1e-6  # a gain below this, relative to the score, is a tie
LAG = 50  # proposals between the two notebooks compared for turnover
KIN_SQL = """
WITH RECURSIVE up(child, id) AS (
    SELECT c.id, e.parent FROM candidates c JOIN edges e ON e.child = c.id
    WHERE e.role IN ('mutation', 'crossover', 'migration')
    UNION SELECT up.child, e.parent FROM edges e JOIN up ON e.child = up.id
    WHERE e.role IN ('mutation', 'crossover', 'migration'))
SELECT child, id FROM up
"""


def user_prompts(archive: Path) -> list[str]:
    """The user message of every operator call (calls made for a candidate's prompt), in
    proposal order."""
    conn = sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(llm_calls)")}
    linked = (
        "FROM llm_calls l JOIN (SELECT prompt_hash, MIN(seq) AS seq FROM candidates "
        "WHERE prompt_hash IS NOT NULL GROUP BY prompt_hash) c ON c.prompt_hash = l.prompt_hash "
        "GROUP BY l.prompt_hash ORDER BY c.seq"
    )
    if "messages" in columns:  # before migration 3
        rows = conn.execute(f"SELECT l.messages {linked}")
        return [json.loads(text)[-1]["content"] for (text,) in rows]
    sys.path.insert(0, str(REPO))
    from evolve.store.calls import prompt_messages

    ids = [row[0] for row in conn.execute(f"SELECT MIN(l.id) {linked}")]
    return [prompt_messages(conn, call)[-1]["content"] for call in ids]


def notebook_figures(prompts: list[str]) -> list[str]:
    """Turnover of the first effect lines, labels from diffs, and ties among open directions."""
    tops = []
    labels = diff_labels = 0
    opens = ties = 0
    for prompt in prompts:
        notebook = prompt.split("## Research notebook", 1)[-1] if "## Research notebook" in prompt else ""
        found = EFFECTS.search(notebook)
        lines = found["lines"].strip().splitlines() if found else []
        lines = [line for line in lines if not line.startswith("- ... ")]  # a cut, not an effect
        tops.append(tuple(line.split(":", 1)[0] for line in lines[:5]))  # what was changed
        labels += len(lines)
        diff_labels += sum(bool(DIFF_LABEL.match(line)) for line in lines)
        shown = OPEN.search(notebook)
        for match in OPEN_EFFECT.finditer(shown["lines"] if shown else ""):
            opens += 1
            ties += abs(float(match["effect"])) <= TIE * 2.64  # circle packing's scores are ~2.6
    later = [k for k in range(LAG, len(tops)) if tops[k] or tops[k - LAG]]
    changed = sum(tops[k] != tops[k - LAG] for k in later)
    return [
        f"notebook's first 5 effect labels differ from {LAG} proposals earlier: "
        f"{changed} of {len(later)}",
        f"effect lines labelled by the diff: {diff_labels} of {labels}",
        f"open directions that are ties (|effect| <= {TIE:g} relative): {ties} of {opens}",
    ]


def selection_figures(archive: Path) -> list[str]:
    """Crossovers with an ancestor, the top-3 parents' share of proposals, cells per island."""
    conn = sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
    ancestors: dict[str, set[str]] = {}
    for child, ancestor in conn.execute(KIN_SQL):
        ancestors.setdefault(child, set()).add(ancestor)
    pairs = conn.execute(
        "SELECT child, GROUP_CONCAT(parent) FROM edges WHERE role = 'crossover' GROUP BY child "
        "HAVING COUNT(*) = 2"
    ).fetchall()
    with_ancestor = 0
    for _, both in pairs:
        a, b = both.split(",")
        with_ancestor += a in ancestors.get(b, set()) or b in ancestors.get(a, set())
    parents = Counter(
        parent
        for (parent,) in conn.execute(
            "SELECT (SELECT e.parent FROM edges e WHERE e.child = c.id AND e.role IN "
            "('mutation', 'crossover', 'migration') ORDER BY e.rowid LIMIT 1) FROM candidates c "
            "WHERE c.seq > 0"
        )
        if parent
    )
    top = sum(n for _, n in parents.most_common(3))
    cells = dict(conn.execute("SELECT island, COUNT(*) FROM elites GROUP BY island ORDER BY island"))
    return [
        f"crossovers pairing a program with its own ancestor: {with_ancestor} of {len(pairs)}",
        f"top-3 parents' share of proposals: {top} of {parents.total()} "
        f"({top / max(1, parents.total()):.0%})",
        "cells filled per island: " + " / ".join(str(n) for n in cells.values()),
    ]


def report(archive: Path) -> list[str]:
    prompts = user_prompts(archive)
    repeats = Counter(prompts)
    echoes = sum(
        1 for p in prompts for m in ECHO.finditer(p) if m["what"].strip() == m["why"].strip()
    )
    share = lambda hits: f"{hits} of {len(prompts)}"  # noqa: E731
    return [
        f"prompts: {len(prompts)}, distinct: {len(repeats)}, most repeated: {max(repeats.values(), default=0)}x",
        f"median characters: {statistics.median(len(p) for p in prompts) if prompts else 0:.0f}",
        "show other elites (inspirations or the notebook's best programs): "
        + share(sum("## Other good programs" in p or "### Best programs" in p for p in prompts)),
        "show scores of earlier children of their parent: "
        + share(sum(bool(re.search(r"-> scored [\d.]+", p)) for p in prompts)),
        "show the engine's own refusals: "
        + share(sum("crossover needs two different parents" in p for p in prompts)),
        f"failure notes printed as 'X -> X': {echoes}",
        "name cells by bare numbers only: "
        + share(sum(bool(BARE_CELL.search(p)) for p in prompts)),
        "show a research notebook: " + share(sum("## Research notebook" in p for p in prompts)),
        *notebook_figures(prompts),
        *selection_figures(archive),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help="a run directory or its archive.db")
    parser.add_argument("--make", type=int, help="make a run of this many candidates first")
    parser.add_argument("--out", type=Path, help="where --make writes its run")
    parser.add_argument("--repo", type=Path, default=REPO, help="the evolve checkout --make runs")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for --make"
    )
    args = parser.parse_args()
    if args.make:
        make_run(args.make, args.out, [*ISLANDS, *args.set], repo=args.repo)
    run = args.out if args.make else args.archive
    archive = run / "archive.db" if run.is_dir() else run
    print("\n".join(report(archive)))


if __name__ == "__main__":
    main()
