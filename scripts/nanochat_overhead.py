"""Where a nanochat evaluation's time goes besides training, on the GPU path on this CPU, for this tree and a baseline commit in one run.

Each measurement is one evaluation of the tree's seed program through the real fitness at the
tests' tiny CPU size (a dataset made here from a few standard-library files, vocabulary 512,
64-token rows), on the GPU path: ``starts_ahead`` is set, as on a GPU, so the export and the
scoring processes start with the training and, in a tree with ``client.save_initial``, the
export runs while the candidate trains (on the CPU here, sharing its cores). Two arms, the
baseline and this tree, alternate, so a change of the machine's load falls on both alike. It
prints each phase's mean seconds (``evolve.harness.phases``) and the overhead per evaluation
(wall − budget) per arm, with the load before and after::

    python scripts/nanochat_overhead.py --baseline 8622a87 --repeats 3

The baseline is the commit's files (``git archive``) imported ahead of the installed package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speedrun_overhead import baseline_tree, run_child  # noqa: E402

SETTINGS = dict(  # the tests' tiny size (tests/fixtures/nanochat_tiny.py), a longer budget
    scale="cpu", dataset="tiny", vocab_size=512, seq_len=64, budget_s=5.0, eval_tokens=64 * 8 * 2,
    eval_batch_rows=8, startup_limit_s=60.0, finish_limit_s=15.0, save_floor_s=2.0,
    layered={"local_check": False, "short_run_steps": 0},
)  # fmt: skip
ARMS = ("baseline", "this")


def make_data(root: Path) -> None:
    """The tiny dataset, as the tests make it."""
    from evolve.benchmarks.nanochat import prepare
    from evolve.benchmarks.nanochat.sources import chunk_text

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [c for name in ("argparse.py", "textwrap.py", "pathlib.py", "json/decoder.py")
             for c in chunk_text((stdlib / name).read_text())]  # fmt: skip
    val = list(chunk_text((stdlib / "string.py").read_text()))
    prepare.build(root / "tiny", train=lambda: texts, val=lambda: val * 3, vocab_size=512,
                  log=lambda _: None)  # fmt: skip


def measure(data: Path, scratch: Path) -> dict:
    """One evaluation of the seed with the evolve found first on sys.path: its phases and figures."""
    import shutil

    from evolve.benchmarks.nanochat import prepare
    from evolve.benchmarks.nanochat.fitness import NanochatFitness

    import evolve
    from evolve.harness.fitness import EvalContext, evaluate_safely

    NanochatFitness.starts_ahead = property(lambda self: True)  # the GPU path, on this CPU
    fitness = NanochatFitness(data_dir=str(data), **SETTINGS)
    work = scratch / "work"
    shutil.copytree(Path(prepare.__file__).parent / "seed", work)
    ev = evaluate_safely(fitness, work, EvalContext(seed=0, scratch=scratch))
    return {
        "evolve": str(Path(evolve.__file__).parent),
        "status": ev.status.value,
        "error": ev.artifacts.get("error", ""),
        "val_bpb": ev.metrics.get("val_bpb"),
        "graph_from_initial": ev.metrics.get("graph_from_initial"),
        "wall_s": ev.wall_s,
        "phases": {k[5:]: v for k, v in ev.metrics.items() if k.startswith("time_")},
    }


def child(arm: str, tree: Path, data: Path, index: int, work: Path) -> dict:
    """``measure`` in a fresh process importing ``tree`` (the baseline) or this one."""
    scratch = work / f"{arm}-{index}"
    scratch.mkdir()
    baseline = tree if arm == "baseline" else None
    return run_child(Path(__file__), arm, [str(data), str(scratch)], baseline, work)


def summary(name: str, runs: list[dict]) -> list[str]:
    """Mean seconds per phase and the overhead per evaluation (wall − budget) over ``runs``."""
    names = list(dict.fromkeys(p for run in runs for p in run["phases"]))
    mean = {p: statistics.fmean(run["phases"].get(p, 0.0) for run in runs) for p in names}
    budget = SETTINGS["budget_s"]
    overhead = [run["wall_s"] - budget for run in runs]
    return [
        f"{name}, evolve from {runs[0]['evolve']}: {len(runs)} runs, status {[r['status'] for r in runs]}, "
        f"graph from the initial checkpoint {[r['graph_from_initial'] for r in runs]}",
        f"  overhead per evaluation (wall − budget {budget:g} s) {statistics.fmean(overhead):.2f} s "
        f"(runs {', '.join(f'{o:.2f}' for o in overhead)})",
        "  phases: "
        + ", ".join(f"{p} {s:.2f}" for p, s in sorted(mean.items(), key=lambda kv: -kv[1])),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="the commit to compare with (required)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), Path(args.child[1]))))
        return
    if not args.baseline:
        parser.error(
            "--baseline COMMIT is required (e.g. the branch's base: git merge-base HEAD main)"
        )
    print(f"load before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="nanochat-overhead-") as tmp:
        work = Path(tmp)
        tree = baseline_tree(args.baseline, work / "baseline-tree")
        make_data(work / "data")
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for index in range(args.repeats):
            for arm in ARMS if index % 2 == 0 else reversed(ARMS):
                runs[arm].append(child(arm, tree, work / "data", index, work))
                print(f"{arm} #{index}: {json.dumps(runs[arm][-1])}", flush=True)
    for arm, made in runs.items():
        print("\n".join(summary(f"{arm} ({args.baseline})" if arm == "baseline" else arm, made)))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
