"""Every GPU measurement as a named part that finishes within 9 minutes on one H200.

On the device machine, from the repository root, after installing the carried wheels:

    python3 scripts/gpu_campaign.py PART [--seed N]       # runs PART; results under $OUT
    python3 scripts/gpu_campaign.py --list                # the parts, their benchmark and commands

Here, once the files are back:

    python scripts/gpu_campaign.py merge FILES_AT/PART.json ...   # into benchmarks/<name>/RESULTS.md

What a device call carries (``run``'s ``carry``; the paths are ignored by git):
- ``.whl``: wheels the device image lacks, for Python 3.12 (hydra-core, omegaconf,
  antlr4-python3-runtime, sqlite-utils, sqlite-fts4, click-default-group);
- ``data``: ``data/wikipedia/`` (``train-00..07.jsonl.xz``, the 8 shards every reference trained on, and ``val.jsonl.xz`` from
  ../shared/data/wikipedia) and ``data/tiktoken/`` (GPT-2's ranks file, named by the sha1 of
  its URL, for speedrun's tokenizer; litellm ships it).
- ``.old``: for the part ``fixed-steps`` only, the older commit's training path
  (``python scripts/old_tree.py d648b9c``, ~1 MB).

The command of a call, whatever the part:

    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-index --no-deps \
      --no-build-isolation -e . && CAMPAIGN_COMMIT=<hash> python3 scripts/gpu_campaign.py PART

Each part writes ``$OUT/PART.json`` (date, GPU, commit, each command's exit status, wall time,
last lines and the result files its scripts wrote) and ``$OUT/PART.md`` (the same as a
RESULTS.md section), the whole output in ``$OUT/PART.log`` (line by line as it comes, so a
part killed from outside keeps what had finished) and its scripts' text logs in
``$OUT/PART-logs.txt``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
PART_LIMIT_S = 9 * 60
# Every variable a part's commands read, set here whatever the machine's image sets: the device
# image sets TIKTOKEN_CACHE_DIR to a folder of its own, which once made speedrun train another
# tokenizer without a word (issue 48). UNSET: variables that would send a command to other data.
CAMPAIGN_ENV = {
    "TIKTOKEN_CACHE_DIR": str(REPO / "data" / "tiktoken"),
    "PYTHONUNBUFFERED": "1",
}
UNSET = (
    "DATA_GYM_CACHE_DIR",
    "EVOLVE_DATA_DIR",
    "EVOLVE_SPEEDRUN_DATA",
    "EVOLVE_SPEEDRUN_1GPU_DATA",
    "XDG_CACHE_HOME",
)


@dataclass(frozen=True)
class Part:
    """A measurement: the benchmark whose RESULTS.md it belongs to and the commands it runs.

    Commands of one part run at the same time when ``together`` is set (they share the GPU,
    so their timings are not comparable with runs alone), else one after another.
    """

    benchmarks: tuple[str, ...]  # whose RESULTS.md it goes to; () is benchmarks/RESULTS.md
    what: str
    commands: tuple[tuple[str, ...], ...]
    together: bool = False


def pytest(*paths: str) -> tuple[str, ...]:
    """A shard of the GPU tests: each test named as it ends (the log keeps what finished when a
    part is cut at its limit) and held to 4 minutes."""
    return (
        PY,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-v",
        "-rA",
        "--timeout=240",
        "--durations=15",
        "-p",
        "no:cacheprovider",
        *paths,
    )


SHARD_LIMIT_S = 8 * 60


@dataclass(frozen=True)
class Shard:
    """GPU-marked test files that run as one part, expected to take ``expected_s`` on one H200
    (each GPU-marked file in exactly one shard: tests/test_gpu_campaign.py checks it)."""

    benchmarks: tuple[str, ...]
    what: str
    paths: tuple[str, ...]
    expected_s: int


# Expected seconds: the tests' durations on the H200 (benchmarks/RESULTS.md 2026-12-03 and
# 2026-12-04, the RESULTS.md of nanochat 2026-12-01), tests not measured yet estimated in the comment.
SHARDS = {
    "tests-core": Shard(
        (),
        "GPU tests of the sandbox, the CPU red team, the Ray backend and the nanochat and "
        "speedrun seeds",
        (
            "tests/test_sandbox.py",  # CUDA, Triton, compile 21 s; NCCL on 2 GPUs 14 s (skips on 1)
            "tests/redteam/test_cpu.py",  # CUDA and NCCL on one core: 6 s per mode
            "tests/backends",  # Ray on the GPUs: skips where Ray is not installed (the device)
            "tests/benchmarks/nanochat",  # the seed trained and scored: 61 s
            "tests/redteam/test_speedrun.py",  # the seed passes, a peek caught: 57 s (+~90 s on 2 GPUs)
        ),
        expected_s=240,
    ),
    "tests-nanochat-redteam": Shard(
        ("nanochat",),
        "GPU tests of nanochat's red team",
        # measured on 2026-12-04: 20 programs scored 4 at a time 104-109 s, the strong program
        # with torch.compile through every stage 204-233 s (once past 240 s: its own limit is
        # 420 s), three zero-initialised look-aheads 12-18 s each
        ("tests/redteam/test_nanochat.py",),
        expected_s=400,
    ),
    "tests-kernels": Shard(
        ("kernels",),
        "GPU tests of kernels and their red team",
        # measured on 2026-12-04: the harness tax 95 s, gpu_run --smoke 94 s, the CUDA
        # solution 103 s (nvcc 68 s of it), the red team 40 s
        ("tests/benchmarks/kernels", "tests/redteam/test_kernels.py"),
        expected_s=345,
    ),
}


def keep(archive: str, name: str) -> tuple[str, ...]:
    """A command that copies a run's SQLite archive into $OUT through SQLite's backup (the rows a
    killed run left in its write-ahead log come along; a plain file copy loses them), as one
    self-contained file (rollback journal, no WAL beside it)."""
    return (
        PY,
        "-c",
        "import os, sqlite3, sys\n"
        "copy = sqlite3.connect(os.path.join(os.environ['CAMPAIGN_OUT'], sys.argv[2]))\n"
        "sqlite3.connect(sys.argv[1]).backup(copy)\n"
        "copy.execute('PRAGMA journal_mode=delete')\n"
        "copy.close()",
        archive,
        name,
    )


def parts(seed: int) -> dict[str, Part]:
    """Every part; ``seed`` picks the seed of the parts that run one."""
    nanochat_gpu_run = (PY, "-m", "evolve.benchmarks.nanochat.gpu_run", "--gpus", "0")
    speedrun_gpu_run = (
        PY,
        "-m",
        "evolve.benchmarks.speedrun.gpu_run",
        "--gpus",
        "0",
        "--no-scaling",
        "--compile-cache",  # as a search runs it: start-up from the cache, warmed once per call
        "data/speedrun-compile-cache",
        "--probe-every",  # as a search runs it: no loss-curve probes (8 of them added 10 s of
        "0",  # scoring and audit to the overhead on 2026-12-04, and 13 s of paused clock)
    )
    return {
        **{
            name: Part(shard.benchmarks, shard.what, (pytest(*shard.paths),))
            for name, shard in SHARDS.items()
        },
        "redteam-kernels": Part(
            ("kernels",),
            "the kernels red team, full (scripts/redteam_gpu.py)",
            ((PY, "scripts/redteam_gpu.py"),),
        ),
        "scorer": Part(
            ("nanochat", "speedrun"),
            "the nanochat seed (120 s budget) and a speedrun one-GPU seed (400 steps) end to end "
            "through the harness's scorer, side by side on one GPU",
            (
                (*nanochat_gpu_run, "--seeds", str(seed), "--budget", "120"),
                (*speedrun_gpu_run, "--seeds", str(seed), "--steps", "400"),
            ),
            together=True,
        ),
        "nanochat-300": Part(
            ("nanochat",),
            f"the nanochat seed at the 300 s budget, seed {seed}",
            ((*nanochat_gpu_run, "--seeds", str(seed)),),
        ),
        "speedrun-seed": Part(
            ("speedrun",),
            f"the speedrun one-GPU seed at its fixed step count (820), seed {seed}",
            ((*speedrun_gpu_run, "--seeds", str(seed), "--steps", "820"),),
        ),
        "references": Part(
            ("nanochat", "speedrun"),
            "the references' seeds in one call on an 8-GPU host (kind nvidia-h200-x8): nanochat at "
            "300 s, seeds 0-2 on GPUs 0-2, and speedrun one-GPU at 820 steps, seeds 0-4 on GPUs "
            "3-7, side by side (scripts/derive_reference.py reads the JSON)",
            (
                (*nanochat_gpu_run[:-1], "0,1,2", "--seeds", "0,1,2"),
                (
                    *speedrun_gpu_run[:3],
                    "--gpus",
                    "3,4,5,6,7",
                    "--no-scaling",
                    "--probe-every",
                    "0",
                    "--seeds",
                    "0,1,2,3,4",
                    "--steps",
                    "820",
                ),
            ),
            together=True,
        ),
        "fixed-steps": Part(
            ("nanochat", "speedrun"),
            "the seeds of d648b9c and of this commit at fixed steps, deterministic algorithms, the "
            "same data (scripts/fixed_steps.py; nanochat without untimed steps, run twice here)",
            (
                (
                    PY,
                    "scripts/fixed_steps.py",
                    "nanochat",
                    "--steps",
                    "60",
                    "--untimed",
                    "0",
                    "--repeat",
                ),
                (PY, "scripts/fixed_steps.py", "speedrun", "--steps", "60"),
            ),
        ),
        "search": Part(
            ("nanochat",),
            "an evolutionary search on nanochat at a 60 s budget with the built-in operators, 4 minutes of proposals after the seed",
            (
                (*nanochat_gpu_run, "--prepare-only"),
                (
                    PY,
                    "-m",
                    "evolve",
                    "benchmark=nanochat",
                    "benchmark.fitness.dataset=wikipedia",
                    "benchmark.fitness.data_dir=data/nanochat",
                    "benchmark.fitness.budget_s=60",
                    "benchmark.fitness.eval_tokens=0",  # the offline split holds ~1M tokens
                    "benchmark.fitness.layered.short_run_steps=0",  # ~60 s: as long as the run
                    "benchmark.fitness.compile_cache=data/nanochat-compile-cache",
                    "search.max_candidates=40",
                    "search.max_wall_s=240",
                    "search.progress=false",
                    "hydra.run.dir=archives/nanochat/gpu-search",
                ),
                (PY, "-m", "evolve.browse", "archives/nanochat/gpu-search", "best"),
                (PY, "-m", "evolve.browse", "archives/nanochat/gpu-search", "stats"),
                (PY, "-m", "evolve.browse", "archives/nanochat/gpu-search", "notes"),
                keep("archives/nanochat/gpu-search/archive.db", "search-archive.db"),
            ),
        ),
    }


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"


def commit() -> str:
    """The code's commit: $CAMPAIGN_COMMIT where the caller names it (a copied tree's .git may
    be stale), else git's HEAD."""
    if os.environ.get("CAMPAIGN_COMMIT"):
        return os.environ["CAMPAIGN_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def out_dir() -> Path:
    """Where a part's reports go: $OUT on the device, else ./campaign-out."""
    return Path(os.environ.get("OUT") or "campaign-out").resolve()


@dataclass
class Running:
    """A started command: its process, when it began, and its output lines so far (copied into
    the part's log as they come, so a part killed from outside keeps what had finished)."""

    proc: subprocess.Popen
    began: float
    lines: list[str]
    copier: threading.Thread


def start(command: tuple[str, ...], scratch: Path, log) -> Running:
    """Start one command with $OUT set to its own scratch folder (its scripts write there)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if k not in UNSET},
        **CAMPAIGN_ENV,
        "OUT": str(scratch),
        "CAMPAIGN_OUT": str(out_dir()),
    }
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []

    def copy() -> None:
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            log.flush()

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()
    return Running(proc, time.monotonic(), lines, copier)


def finish(run: Running, deadline: float) -> dict:
    """Wait for ``run`` until ``deadline`` (then kill it); its status, wall time and last lines."""
    try:
        run.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        timed_out = False
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait()
        timed_out = True
    run.copier.join(timeout=10)  # the pipe's last lines (a leftover child may hold it open)
    shown = [line.rstrip("\n") for line in run.lines if line.strip()]
    return {
        "rc": run.proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(time.monotonic() - run.began, 1),
        "tail": shown[-25:],
    }


def result_files(scratch: Path) -> dict[str, object]:
    """The JSON files a command's scripts wrote into its scratch folder, parsed."""
    found = {}
    for path in sorted(scratch.rglob("*.json")):
        try:
            found[str(path.relative_to(scratch))] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def keep_logs(scratches: list[Path], target: Path) -> None:
    """Gather the text logs the commands' scripts wrote into their scratch folders (e.g.
    ``gpu_run``'s per-seed training output, ``logs/seed-N.txt``) into the one file ``target``,
    each under a header naming its command and path: the device brings back at most 8 files,
    none more than 2 folders down."""
    sections = [
        f"==> command {index}: {path.relative_to(scratch)} <==\n{path.read_text(errors='replace')}"
        for index, scratch in enumerate(scratches)
        for path in sorted(scratch.rglob("*.txt"))
    ]
    if sections:
        target.write_text("\n".join(sections))


def run_part(name: str, part: Part, out: Path) -> int:
    """Run one part's commands; write PART.json, PART.md and PART.log under ``out``."""
    deadline = time.monotonic() + PART_LIMIT_S
    scratch_root = Path(tempfile.mkdtemp(prefix=f"campaign-{name}-"))
    runs = []
    with (out / f"{name}.log").open("w") as log:
        scratches = [scratch_root / str(i) for i in range(len(part.commands))]
        if part.together:
            started = [start(c, s, log) for c, s in zip(part.commands, scratches, strict=True)]
            runs = [finish(running, deadline) for running in started]
        else:
            for command, scratch in zip(part.commands, scratches, strict=True):
                runs.append(finish(start(command, scratch, log), deadline))
    for command, scratch, record in zip(part.commands, scratches, runs, strict=True):
        record["command"] = " ".join(Path(c).name if c == PY else c for c in command)
        record["results"] = result_files(scratch)
    keep_logs(scratches, out / f"{name}-logs.txt")
    report = {
        "part": name,
        "benchmarks": list(part.benchmarks),
        "what": part.what,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": gpu_name(),
        "commit": commit(),
        "runs": runs,
    }
    (out / f"{name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{name}.md").write_text(markdown(report))
    shutil.rmtree(scratch_root, ignore_errors=True)
    failed = [r for r in runs if r["rc"] != 0]
    print(markdown(report))
    return 1 if failed else 0


def markdown(report: dict) -> str:
    """A RESULTS.md section for one part's report."""
    lines = [
        f"### {report['what']} ({report['date']})",
        "",
        f"GPU: {report['gpu']}; code `{report['commit']}`; `python scripts/gpu_campaign.py {report['part']}`.",
        "",
    ]
    for run in report["runs"]:
        state = "timed out" if run["timed_out"] else f"exit {run['rc']}"
        lines += [
            f"- `{run['command']}`: {state}, {run['wall_s']} s",
            "",
            "```",
            *run["tail"][-12:],
            "```",
            "",
        ]
    return "\n".join(lines) + "\n"


def merge(files: list[Path]) -> int:
    """Append each report's section to its benchmark's RESULTS.md and keep its JSON in results/."""
    for path in files:
        report = json.loads(path.read_text())
        day, hour = report["date"].split()[:2]  # a part run twice a day keeps both reports
        for home in [REPO / "benchmarks" / name for name in report["benchmarks"]] or [
            REPO / "benchmarks"
        ]:
            keep = (
                home / "results" / day / f"campaign-{report['part']}-{hour.replace(':', '')}.json"
            )
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, keep)
            with (home / "RESULTS.md").open("a") as handle:
                handle.write("\n" + markdown(report))
            print(
                f"{path.name} -> {(home / 'RESULTS.md').relative_to(REPO)} and {keep.relative_to(REPO)}"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "part", nargs="?", help="the part to run, or 'merge' followed by report files"
    )
    parser.add_argument(
        "files", nargs="*", type=Path, help="with merge: the PART.json files to merge"
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed of parts that run one seed")
    parser.add_argument("--list", action="store_true", help="list the parts and their commands")
    args = parser.parse_args(argv)
    table = parts(args.seed)
    if args.list or not args.part:
        for name, part in table.items():
            print(f"{name:16} [{', '.join(part.benchmarks) or 'all'}] {part.what}")
        return 0
    if args.part == "merge":
        if not args.files:
            parser.error("merge needs the PART.json files to merge")
        return merge(args.files)
    if args.part not in table:
        parser.error(f"unknown part {args.part!r}; parts: {', '.join(table)}")
    out = out_dir()
    out.mkdir(parents=True, exist_ok=True)
    return run_part(args.part, table[args.part], out)


if __name__ == "__main__":
    sys.exit(main())
