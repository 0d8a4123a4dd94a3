"""The seeds of two commits trained for the same number of steps on the same data: their losses side by side.

A difference in loss at a fixed step is the code, not the clock (issue 30). For each tree (the
working tree, and an older commit written out by ``scripts/old_tree.py``) a child process
imports that tree's ``evolve`` and runs its seed's own ``train.py`` unchanged, with only the
clock replaced: training stops after ``--steps`` steps, and the learning-rate schedule's
``progress`` is the share of timed steps done instead of the share of seconds. Each tree feeds
the data its own way: nanochat's older client packed rows itself and trained on them from step
0, the newer harness streams the same packing with synthetic rows for the untimed steps;
speedrun's older program read the shards itself, the newer one asks the harness's token server.
Fixed seeds and ``torch.use_deterministic_algorithms`` (with ``CUBLAS_WORKSPACE_CONFIG``) make
a tree's run repeatable; ``--repeat`` runs the working tree again to show what remains.

    python scripts/old_tree.py d648b9c
    python scripts/fixed_steps.py nanochat --device cpu --steps 60 --untimed 0
    python scripts/fixed_steps.py speedrun --device cuda --steps 150 --out $OUT

Writes ``fixed-steps-BENCHMARK.json`` (every step's training loss, the validation loss of the
model at the last step, the pairs compared) under ``--out`` and prints the comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OLD = REPO / ".old"
RESULT_TAG = "FIXED_STEPS_RESULT "
SEED_DIRS = {"nanochat": "benchmarks/nanochat/seed", "speedrun": "benchmarks/speedrun/seed"}
# the CPU sizes both commits' nanochat seed are run at on CPU (the older one is GPU-only)
NANOCHAT_CPU_SIZES = dict(N_LAYER=2, N_HEAD=4, N_EMBD=128, DEVICE_BATCH=8, GRAD_ACCUM=1, WARMUP_STEPS=10)  # fmt: skip
NANOCHAT_SEQ = {"cpu": 128, "cuda": 2048}
SPEEDRUN_PRESET = {"cpu": "cpu", "cuda": "gpu1"}
VAL_ROWS = 16  # validation rows scored at the last step (nanochat)
VAL_TOKENS = {"cpu": 32768, "cuda": 1 << 18}  # validation tokens scored at the last step (speedrun)


# ---- the child: one tree's seed, run in that tree's interpreter -------------------------


def deterministic(device: str) -> None:
    """Fixed algorithms, one CPU thread: a tree's run repeats bit for bit where torch allows."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    if device == "cpu":
        torch.set_num_threads(1)


def shrunk(source: str, sizes: dict[str, object]) -> str:
    """``source`` with each ``NAME = ...`` line of ``sizes`` set to its value and the older seed's
    "GPU only" exit removed: the same sizes for both commits on CPU."""
    for name, value in sizes.items():
        source, count = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", source, flags=re.M)
        if count != 1:
            raise ValueError(f"the seed has {count} lines '{name} = ...'; expected one")
    return re.sub(r'^if settings\.device != "cuda":\n    raise SystemExit\(.*?\n    \)\n', "", source, flags=re.M | re.S)  # fmt: skip


class Steps:
    """The stand-in clock's record: steps reported, their losses, when to stop."""

    def __init__(self, total: int, untimed: int) -> None:
        self.total, self.untimed = total, untimed
        self.done = 0
        self.synthetic = 0  # the first steps train on synthetic rows (None in ``losses``)
        self.losses: list[float | None] = []

    def report(self, loss: float | None) -> bool:
        real = loss is not None and self.done >= self.synthetic
        self.losses.append(float(loss) if real else None)
        self.done += 1
        return self.done < self.total

    @property
    def progress(self) -> float:
        """The share of the timed steps done (0 during the untimed ones)."""
        timed = self.total - self.untimed
        return min(1.0, max(0, self.done - self.untimed) / max(timed, 1))


def nanochat_child(args: argparse.Namespace, work: Path) -> dict:
    """Run the tree's nanochat seed for ``args.steps`` steps; its losses and validation loss."""
    import runpy

    import torch
    from evolve.benchmarks.nanochat import client
    from evolve.benchmarks.nanochat.packing import pack_rows
    from evolve.benchmarks.nanochat.tokens import Split

    data = Path(args.data)
    meta = json.loads((data / "dataset.json").read_text())
    seq = NANOCHAT_SEQ[args.device]
    settings = dict(budget_s=1e9, untimed_steps=args.untimed, seq_len=seq, vocab_size=meta["vocab_size"],
                    bos_id=meta["bos_id"], device=args.device, seed=args.seed,
                    checkpoint_dir=str(work / "checkpoint"), initial_dir=str(work / "initial"), train_dir=str(data / "train"), forbidden=[])  # fmt: skip
    os.environ[client.CONFIG_ENV] = json.dumps(settings)
    steps = Steps(args.steps, args.untimed)

    class FixedClock:
        """``client.Clock`` with steps for seconds."""

        def __init__(self) -> None:
            self.budget_s, self.untimed_steps = settings["budget_s"], args.untimed

        @property
        def steps(self) -> int:
            return steps.done

        def step(self, tokens: int = 0, loss: float | None = None) -> bool:
            return steps.report(loss)

        @property
        def progress(self) -> float:
            return steps.progress

        def note(self, **values: float) -> None:
            """Notes (peak memory) are not compared."""

    client.Clock = FixedClock
    if "train_dir" not in client.Settings.__dataclass_fields__:  # the harness streams the rows
        from evolve.benchmarks.nanochat.supervisor import Rows

        from evolve.harness import stream

        rows = Rows({**settings, "train_dir": str(data / "train")})
        steps.synthetic = args.untimed

        class Feed:
            """The stream's stand-in: the harness's rows, synthetic until the untimed steps are done."""

            def batch(self, count: int) -> np.ndarray:
                return rows(count, steps.done >= args.untimed)

            def saved_initial(self) -> None:
                """Nor is the initial one."""

            def saved(self) -> None:
                """The checkpoint is not scored here."""

        stream.install(Feed())
    program = work / "program"
    shutil.copytree(args.seed_dir, program)
    train = program / "train.py"
    if args.device == "cpu":
        train.write_text(shrunk(train.read_text(), NANOCHAT_CPU_SIZES))
    os.chdir(program)
    sys.path.insert(0, str(program))
    deterministic(args.device)
    scope = runpy.run_path(str(train), run_name="__main__")
    model = scope["model"].eval()
    val = np.stack([row for _, row in zip(range(VAL_ROWS), pack_rows(Split(data / "val").documents(), seq + 1), strict=False)])  # fmt: skip
    with torch.no_grad():
        batch = torch.from_numpy(val.astype(np.int64)).to(args.device)
        val_loss = float(scope["loss_of"](model, batch[:, :-1], batch[:, 1:]))
    return {"losses": steps.losses, "val_loss": val_loss}


def speedrun_child(args: argparse.Namespace, work: Path) -> dict:
    """Run the tree's speedrun seed for ``args.steps`` steps; its losses and validation loss."""
    import torch
    import torch.nn.functional as F

    prepared = json.loads((Path(args.data) / "prepared.json").read_text())
    files = [str(Path(args.data) / name) for name in prepared["train"]["shards"]]
    val = [Path(args.data) / name for name in prepared["val"]["shards"]]
    os.environ.update(SPEEDRUN_PRESET=SPEEDRUN_PRESET[args.device], EVOLVE_SEED=str(args.seed),
                      SPEEDRUN_VOCAB_SIZE=str(prepared["vocab_size"]),
                      SPEEDRUN_OVERRIDES=json.dumps({"steps": args.steps}),
                      SPEEDRUN_TRAIN_FILES=os.pathsep.join(files))  # fmt: skip
    phase = {"now": "before", "model": None}
    clock = types.ModuleType("speedrun_clock")
    clock.warmup_begin = lambda model, optimizer=None: None
    clock.start = lambda model, optimizer=None: phase.update(now="running")
    clock.tick = lambda model: None
    clock.stop = lambda model: phase.update(now="after", model=model)
    sys.modules["speedrun_clock"] = clock
    server = None
    train = Path(args.seed_dir) / "train.py"
    if "speedrun_clock.tokens(" in train.read_text():  # the harness's stream
        from evolve.benchmarks.speedrun import clock as real_clock
        from evolve.benchmarks.speedrun.stream import TokenServer

        server = TokenServer([Path(f) for f in files], vocab_size=prepared["vocab_size"],
                             phase=lambda: phase["now"], seed=args.seed).__enter__()  # fmt: skip
        os.environ["SPEEDRUN_DATA"] = server.address
        clock.tokens = real_clock.tokens
    spec = importlib.util.spec_from_file_location("seed_train", train)
    seed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(seed)
    losses: list[float | None] = []
    train_step = seed.train_step

    def recorded(*step_args, **step_kwargs):
        loss = train_step(*step_args, **step_kwargs)
        losses.append(float(loss) if phase["now"] == "running" else None)
        return loss

    seed.train_step = recorded
    deterministic(args.device)
    try:
        seed.main()
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    model, c = phase["model"].eval(), seed.preset()
    header = np.fromfile(val[0], dtype="<i4", count=256)
    tokens = np.memmap(val[0], dtype="<u2", mode="r", offset=1024, shape=(int(header[2]),))
    rows = (min(VAL_TOKENS[args.device], len(tokens) - 1)) // c["seq_len"]
    total, device = 0.0, next(model.parameters()).device
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda"):
        for first in range(0, rows, 8):
            span = np.arange(first, min(first + 8, rows))
            chunk = np.stack([tokens[r * c["seq_len"] : (r + 1) * c["seq_len"] + 1] for r in span])
            chunk = torch.from_numpy(chunk.astype(np.int64)).to(device)
            logits = model(chunk[:, :-1]).float()
            total += float(F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))  # fmt: skip
    return {"losses": losses, "val_loss": total / (rows * c["seq_len"])}


def child(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="fixed-steps-"))
    try:
        run = nanochat_child if args.benchmark == "nanochat" else speedrun_child
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.stdout.write(RESULT_TAG + json.dumps(result) + "\n")
    return 0


# ---- the parent: data, one child per tree, the comparison --------------------------------


def prepare(benchmark: str, device: str, data_root: Path, wiki: Path) -> Path:
    """The data both trees train on, made by this tree's code: its folder."""
    if benchmark == "nanochat":
        if device == "cpu":
            from evolve.benchmarks.nanochat import prepare as nanochat_prepare

            root = data_root / "nanochat" / nanochat_prepare.stdlib_name(2048)
            return nanochat_prepare.ensure_stdlib(root, 2048)
        from evolve.benchmarks.nanochat.gpu_run import prepare_wiki

        return prepare_wiki(
            wiki.resolve(), data_root / "nanochat", "wikipedia-smoke", 8192, 20_000_000
        )
    from evolve.benchmarks.speedrun.gpu_run import prepare_data

    options = argparse.Namespace(
        cpu=device == "cpu", smoke=False, data=wiki, work=data_root / "speedrun"
    )
    return Path(prepare_data(options)[0])


def tree_commit(tree: Path) -> str:
    """The commit a tree holds: ``COMMIT`` in an old tree, else the working tree's HEAD."""
    if (tree / "COMMIT").is_file():
        return (tree / "COMMIT").read_text().strip()
    if os.environ.get("CAMPAIGN_COMMIT"):
        return os.environ["CAMPAIGN_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def run_tree(tree: Path, args: argparse.Namespace, data: Path) -> dict:
    """One child in ``tree``'s interpreter (the working tree's own when ``tree`` is the repo)."""
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}  # fmt: skip
    if tree.resolve() != REPO:
        env["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)  # fmt: skip
    seed_dir = (tree / SEED_DIRS[args.benchmark]) if tree.resolve() == REPO else (tree / "evolve" / SEED_DIRS[args.benchmark])  # fmt: skip
    argv = [sys.executable, str(Path(__file__).resolve()), args.benchmark, "--child", str(seed_dir),
            "--device", args.device, "--steps", str(args.steps), "--untimed", str(args.untimed),
            "--seed", str(args.seed), "--data", str(data)]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tree)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the run in {tree} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")  # fmt: skip
    result = json.loads(lines[-1][len(RESULT_TAG) :])
    return {"tree": str(tree), "commit": tree_commit(tree), "wall_s": round(time.monotonic() - began, 1), **result}  # fmt: skip


def compare(first: dict, second: dict, tail: int) -> dict:
    """The two runs' losses at the last ``tail`` steps where both trained on real rows, and at validation."""
    both = [i for i, (a, b) in enumerate(zip(first["losses"], second["losses"], strict=False)) if a is not None and b is not None]  # fmt: skip
    steps = both[-tail:]
    differences = [second["losses"][i] - first["losses"][i] for i in steps]
    return {
        "commits": [first["commit"][:7], second["commit"][:7]],
        "steps": [i + 1 for i in steps],
        "first": [first["losses"][i] for i in steps],
        "second": [second["losses"][i] for i in steps],
        "max_abs_difference": max((abs(d) for d in differences), default=None),
        "identical_steps": sum(first["losses"][i] == second["losses"][i] for i in both),
        "compared_steps": len(both),
        "val_loss": [first["val_loss"], second["val_loss"]],
        "val_difference": second["val_loss"] - first["val_loss"],
    }


def text(report: dict) -> str:
    """The comparison as a few lines."""
    lines = [f"{report['benchmark']} on {report['device']}: {report['steps']} steps, {report['untimed']} untimed, seed {report['seed']}"]  # fmt: skip
    for pair in report["pairs"]:
        a, b = pair["commits"]
        lines.append(f"  {a} vs {b}: identical at {pair['identical_steps']} of {pair['compared_steps']} steps; "
                     f"last steps {pair['steps']}: " + ", ".join(f"{x:.4f}/{y:.4f}" for x, y in zip(pair["first"], pair["second"], strict=True))
                     + f"; validation {pair['val_loss'][0]:.4f} vs {pair['val_loss'][1]:.4f} ({pair['val_difference']:+.4f})")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(SEED_DIRS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument(
        "--steps", type=int, default=150, help="steps each seed trains (untimed ones included)"
    )
    parser.add_argument(
        "--untimed", type=int, default=11, help="nanochat's untimed steps (the GPU scale's 11)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--old", default="d648b9c", help="the older commit (its tree: scripts/old_tree.py)"
    )
    parser.add_argument(
        "--old-tree", type=Path, help="that commit's tree (default .old/<its hash>)"
    )
    parser.add_argument(
        "--repeat", action="store_true", help="run the working tree twice: what remains"
    )
    parser.add_argument("--tail", type=int, default=5, help="steps shown before the last")
    parser.add_argument(
        "--wiki", type=Path, default=Path("data/wikipedia"), help="Wikipedia shards (GPU)"
    )
    parser.add_argument(
        "--data-root", type=Path, default=Path("data"), help="where prepared data goes"
    )
    parser.add_argument("--child", dest="seed_dir", help=argparse.SUPPRESS)  # a child: this seed
    parser.add_argument("--data", help=argparse.SUPPRESS)  # the child's prepared data
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    args = parser.parse_args(argv)
    if args.seed_dir:
        return child(args)
    old = args.old_tree or OLD / tree_commit_full(args.old)
    if not old.is_dir():
        raise SystemExit(f"{old} is missing: write it with `python scripts/old_tree.py {args.old}` and carry .old")  # fmt: skip
    data = prepare(args.benchmark, args.device, args.data_root.resolve(), args.wiki)
    runs = [run_tree(old, args, data), run_tree(REPO, args, data)]
    if args.repeat:
        runs.append(run_tree(REPO, args, data))
    report = {"benchmark": args.benchmark, "device": args.device, "steps": args.steps,
              "untimed": args.untimed if args.benchmark == "nanochat" else 0, "seed": args.seed,
              "data": str(data), "runs": runs,
              "pairs": [compare(runs[0], runs[1], args.tail), *([compare(runs[1], runs[2], args.tail)] if args.repeat else [])]}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"fixed-steps-{args.benchmark}.json").write_text(json.dumps(report, indent=1))
    print(text(report))
    return 0


def tree_commit_full(commit: str) -> str:
    """The full hash of ``commit`` (an old tree's folder name): from git, else the one tree
    under .old/ whose name starts with it (the device's copy may have no history)."""
    done = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode == 0:
        return done.stdout.strip()
    found = sorted(p.name for p in OLD.glob(f"{commit}*"))
    return found[0] if found else commit


if __name__ == "__main__":
    raise SystemExit(main())
