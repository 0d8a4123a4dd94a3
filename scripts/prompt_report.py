"""What the model sees: the operator prompts of a run, measured (issue 17).

Usage:
  python scripts/prompt_report.py --make 60 --out /tmp/after             # circle packing, scripted
                                                                          # model, 2 islands, 2 workers
  python scripts/prompt_report.py --make 60 --out /tmp/before --repo /work/main   # another checkout
  python scripts/prompt_report.py --archive /tmp/after                   # measure an existing run
Prints one line per measure: prompts and distinct texts, median size, how many show other
elites, the results of earlier children of their parent, the engine's own refusals, failure
notes printed as "X -> X", and cells given as bare numbers. Reads the archive with sqlite3
only, so runs of older evolve versions can be measured too.
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


def user_prompts(archive: Path) -> list[str]:
    """The user message of every operator call (calls made for a candidate's prompt)."""
    conn = sqlite3.connect(f"file:{archive}?mode=ro", uri=True)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(llm_calls)")}
    linked = "prompt_hash IN (SELECT prompt_hash FROM candidates WHERE prompt_hash IS NOT NULL)"
    if "messages" in columns:  # before migration 3
        rows = conn.execute(f"SELECT messages FROM llm_calls WHERE {linked}")
        return [json.loads(text)[-1]["content"] for (text,) in rows]
    sys.path.insert(0, str(REPO))
    from evolve.callstore import prompt_messages

    ids = [row[0] for row in conn.execute(f"SELECT id FROM llm_calls WHERE {linked}")]
    return [prompt_messages(conn, call)[-1]["content"] for call in ids]


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
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, help="a run directory or its archive.db")
    parser.add_argument("--make", type=int, help="make a run of this many candidates first")
    parser.add_argument("--out", type=Path, help="where --make writes its run")
    parser.add_argument("--repo", type=Path, default=REPO, help="the evolve checkout --make runs")
    args = parser.parse_args()
    if args.make:
        make_run(args.make, args.out, ISLANDS, repo=args.repo)
    run = args.out if args.make else args.archive
    archive = run / "archive.db" if run.is_dir() else run
    print("\n".join(report(archive)))


if __name__ == "__main__":
    main()
