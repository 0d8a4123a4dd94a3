"""Scoring one run: the export of the candidate's model, the evaluation process's rows (scored and probe rows shuffled together), and the checks of its answers.

After the stop, the candidate's ``train.build_model()`` runs once more, in an export process
of its own that sees a pristine copy of the code and the verified checkpoints, no data
(``evolve.harness.exporter``): it writes the model as a ``torch.export`` graph. The
evaluation process (``evaluate.py``) runs no candidate code: it checks that graph and binds it
to each checkpoint's own tensors (``evolve.harness.exported``).

The harness lays out every row the evaluation process computes: the validation rows, and
probe copies of some of them (``evolve.harness.lm.make_probes``) whose inputs change after a
secret cut (or not at all) but whose targets stay the base row's, in batches of the scored shape, in an order drawn from
this evaluation's secret randomness. The process returns the loss of each target, computed from
the exported model's logits for the inputs alone; it is not told which rows are scored. A causal model with independent rows
gives every probe row the losses of its base row before the cut (everywhere for an untouched
row), which the harness checks here.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evolve.harness import compile_cache, exported, phases, protocol
from evolve.harness.fitness import Limits, Policy, Started, start_sandboxed
from evolve.harness.hashing import sha256_file
from evolve.harness.lm import make_probes
from evolve.harness.plaincopy import copy_plain
from evolve.harness.protocol import SAFE_PATH
from evolve.types import EvalStatus

if TYPE_CHECKING:
    from .runner import RunRecord, RunSettings

HERE = Path(__file__).resolve().parent
EVALUATOR = "evolve.benchmarks.speedrun.evaluate"  # run with -m: in the harness hash
EXPORTER = "evolve.harness.exporter"
CLOCK_MODULE = HERE / "clock.py"
CUT_STRATUM = 8
"""Every range of this many positions holds a probe's cut in every evaluation (drawn anew each time)."""


@dataclass(frozen=True)
class Layout:
    """The rows of the final checkpoint's evaluation, in the order they are computed.

    Attributes:
        inputs / targets: (R, T) token ids, R a multiple of the batch size.
        scored: ``scored[i]`` is the validation row that layout row i scores, or -1.
        base / cut: for a probe row, the layout row it copies and its first changed input
            position (T: untouched); -1 / T elsewhere.
    """

    inputs: np.ndarray
    targets: np.ndarray
    scored: np.ndarray
    base: np.ndarray
    cut: np.ndarray


def layout(
    val: np.ndarray, seq_len: int, batch: int, rng: np.random.Generator, strict: bool = False
) -> Layout:
    """Validation rows of ``val`` (n + 1 tokens) plus probe rows, batched and shuffled by ``rng``.

    The probes are ``evolve.harness.lm``'s (half of a scored batch's rows get another future
    after a stratified secret cut, the rest stay; the rows are shuffled); there are enough
    that every range of ``CUT_STRATUM`` positions holds a cut (``2 (T - 1) / (8 B)`` batches,
    at least a quarter of the scored ones); ``strict`` (the auditor's re-evaluation): twice as
    many and at least one per full scored batch, so that whichever batches a model treats
    differently, one is a probe or a probe's base. A probe row keeps its base row's targets.
    """
    rows = (len(val) - 1) // seq_len
    tokens = np.stack([val[i * seq_len : (i + 1) * seq_len + 1] for i in range(rows)])
    groups = [list(range(i, min(i + batch, rows))) for i in range(0, rows, batch)]
    full = [g for g in groups if len(g) == batch] or groups
    changed = max(1, len(full[0]) // 2)
    strata = math.ceil((seq_len - 1) / CUT_STRATUM)
    count = max(math.ceil(strata / changed), math.ceil(len(groups) / 4))
    if strict:
        count = max(2 * count, len(full))
    probes = make_probes([tokens[g] for g in full], tokens, count, rng)
    batches = [(g, None) for g in groups] + [(None, p) for p in probes]
    batches = [batches[i] for i in rng.permutation(len(batches))]
    where = {
        source: b * batch + i
        for b, (members, _) in enumerate(batches)
        for i, source in enumerate(members or ())
    }
    inputs, targets, scored, base, cut = [], [], [], [], []
    for members, probe in batches:
        if probe is not None:
            sources = [full[probe.base][i] for i in probe.order]
            inputs += list(probe.rows[:, :seq_len])
            scored += [-1] * len(sources)
            base += [where[source] for source in sources]
            cut += [min(c, seq_len) for c in probe.cuts]
        else:
            sources = members + [members[0]] * (batch - len(members))  # pad a short last batch
            inputs += list(tokens[sources, :seq_len])
            scored += members + [-1] * (batch - len(members))
            base += [-1] * batch
            cut += [seq_len] * batch
        targets += list(tokens[sources, 1:])
    return Layout(
        inputs=np.stack(inputs).astype("<u2"),
        targets=np.stack(targets).astype("<u2"),
        scored=np.asarray(scored),
        base=np.asarray(base),
        cut=np.asarray(cut),
    )


def causal_violation(nats: np.ndarray, plan: Layout) -> tuple[float, str]:
    """The largest change of a probe row's losses where its inputs equal its base row's, and where."""
    worst, where = 0.0, ""
    for row in np.flatnonzero(plan.base >= 0):
        cut = int(plan.cut[row])
        diff = np.abs(nats[row, :cut] - nats[plan.base[row], :cut])
        if diff.size and float(diff.max()) > worst:
            worst = float(diff.max())
            position = int(diff.argmax())
            kind = (
                "an untouched row" if cut == nats.shape[1] else f"a row changed from position {cut}"
            )
            where = f"position {position} of {kind}"
    return worst, where


@dataclass(frozen=True)
class Scorers:
    """The two sandboxed processes that score a run: ``export`` (the candidate's model code, run
    once after the stop to write its graph) and ``score`` (harness code only)."""

    export: Started
    score: Started

    def cancel(self) -> None:
        """End both (a no-op for one that had its job)."""
        self.export.cancel()
        self.score.cancel()


def _copy_code(candidate: Path, folder: Path) -> None:
    """A pristine copy of the candidate's files (not the training run's folder, which the run
    could write), with the harness's clock module."""
    shutil.copytree(
        candidate, folder, ignore=shutil.ignore_patterns("__pycache__", "speedrun_clock.py")
    )
    shutil.copyfile(CLOCK_MODULE, folder / "speedrun_clock.py")


def place(checkpoint: Path, target: Path) -> None:
    """Put a verified checkpoint where the export and evaluation processes read it (read-only to
    both): a hard link, no copy, where both are on one file system. Only the harness can write
    either name once the training has exited: its checkpoint folder is hidden from both
    processes and the run's link count was checked (``runner._own_file``)."""
    try:
        os.link(checkpoint, target)
    except OSError:  # another file system
        shutil.copyfile(checkpoint, target)


def start_evaluation(
    candidate: Path,
    *,
    run_dir: Path,
    env: dict,
    gpus: list[str] | None,
    settings: RunSettings,
    hidden: list[Path],
) -> Scorers:
    """The export and evaluation processes of the run in ``run_dir``, started now in fresh
    sandboxes: they import torch, then wait for their jobs (``evaluate_run``).

    The export runs in a pristine copy of the candidate's files, where the harness will place
    copies of the verified checkpoints; the evaluation sees only the checkpoints and the
    graph the harness copies into its read-only input folder. ``cancel()`` them when the run
    fails before scoring.
    """
    eval_dir = run_dir / "eval"
    shutil.rmtree(eval_dir, ignore_errors=True)
    code, given, out_dir = eval_dir / "code", eval_dir / "in", eval_dir / "out"
    _copy_code(candidate, code)
    given.mkdir()
    out_dir.mkdir()
    eval_env = {
        k: v for k, v in env.items() if not k.startswith(("SPEEDRUN_CLOCK", "SPEEDRUN_DATA"))
    }
    eval_env["CUDA_VISIBLE_DEVICES"] = gpus[0] if gpus else ""
    limits = Limits(timeout_s=settings.eval_timeout_s, memory_bytes=settings.memory_bytes)
    cache = compile_cache.access(settings.compile_cache, warming=False)
    # both read the checkpoints where the harness places them, read-only (``place``)
    readonly, shared = [given, *cache.readonly], cache.shared_caches
    export = start_sandboxed(
        [sys.executable, *SAFE_PATH, "-m", EXPORTER],
        cwd=code,
        env=eval_env,
        limits=limits,
        policy=Policy(writable=[code], readonly=readonly, shared_caches=shared, hidden=hidden),
    )
    try:
        score = start_sandboxed(
            [sys.executable, *SAFE_PATH, "-m", EVALUATOR],
            cwd=out_dir,
            env=eval_env,
            limits=limits,
            policy=Policy(
                writable=[out_dir], readonly=readonly, shared_caches=shared, hidden=hidden
            ),
        )
    except BaseException:
        export.cancel()
        raise
    return Scorers(export=export, score=score)


def export_run(
    scorers: Scorers, *, run_dir: Path, gpus: list[str] | None, settings: RunSettings, seed: int
) -> tuple[dict, str]:
    """Have the export process write the graph of the model as ``build_model()`` makes it (and
    check the initial checkpoint where ``Export.begin`` placed it against ``torch.manual_seed(seed);
    build_model()`` on the way; the scorer binds the graph to each checkpoint's own weights), and
    copy the graph into the evaluation's input folder: (its verdict, "" or why it failed)."""
    code, given = run_dir / "eval" / "code", run_dir / "eval" / "in"
    scorers.export.accept_readonly_changes()  # the checkpoint just placed is the harness's
    job = {
        "source": "train.py",
        "config": None,
        "reference": {"weights": str(given / "init.pt"), "seed": seed},
        "rows": settings.eval_batch_size,
        "seq": settings.eval_seq_len,
        "vocab": settings.vocab_size,
        "device": "cuda" if gpus else "cpu",
    }
    nonce, stdin = protocol.job_input(job)
    verdict = protocol.read_verdict(scorers.export.finish(stdin), nonce, "export")
    if not isinstance(verdict, dict):
        return {"status": verdict.status.value}, verdict.artifacts.get("error", "")
    if verdict.get("status") != "ok":
        return verdict, str(verdict.get("reason", ""))
    for name in (exported.GRAPH_FILE, exported.CONSTANTS_FILE):
        made = code / name
        if made.is_symlink() or not made.is_file():
            return {"status": "rejected"}, f"the export wrote no plain file {name}"
        shutil.copyfile(made, given / name)
    return verdict, ""


class Export:
    """The export of a run's model, double-buffered: it needs only the initial checkpoint, so on a
    GPU it begins when the clock starts and overlaps the training (``begin``, from the clock's
    thread); otherwise, or when that copy failed its checks, after the stop (``verdict``)."""

    def __init__(
        self,
        scorers: Scorers,
        *,
        run_dir: Path,
        gpus: list[str] | None,
        settings: RunSettings,
        seed: int,
    ) -> None:
        self.scorers, self.given = scorers, run_dir / "eval" / "in"
        self.job = dict(run_dir=run_dir, gpus=gpus, settings=settings, seed=seed)
        self._thread: threading.Thread | None = None
        self._outcome: tuple[dict, str] = ({"status": "error"}, "the export never ran")

    def begin(self, init: Path, sha256: str) -> None:
        """Copy the initial checkpoint ``init`` of the running training (its own plain file, read
        through one descriptor: never a link to a file hidden from the run) and, when the copy's
        digest is ``sha256`` (the clock's), export from it in a thread; else do nothing (the
        checks after the stop decide)."""
        target = self.given / "init.pt"
        if not copy_plain(init, target):
            return
        if sha256_file(target) != sha256:  # changed while copied: the checks after the stop decide
            target.unlink()
            return
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def began(self) -> bool:
        """Whether the export began during training (``begin`` accepted the checkpoint)."""
        return self._thread is not None

    def _run(self) -> None:
        try:
            self._outcome = export_run(self.scorers, **self.job)
        except OSError as exc:  # the run's folder went away: it failed and was cancelled
            self._outcome = ({"status": "error"}, f"the export was cut short: {exc}")

    def close(self) -> None:
        """Wait for an export begun during training (ended by ``Scorers.cancel`` when the run failed)."""
        if self._thread is not None:
            self._thread.join()

    def verdict(self, init: Path) -> tuple[dict, str]:
        """The export's (verdict, problem): the one begun during training, else one now from
        ``init`` (verified by the caller)."""
        if self._thread is None:
            (self.given / "init.pt").unlink(missing_ok=True)
            place(init, self.given / "init.pt")
            self._run()
        else:
            self._thread.join()
        return self._outcome


def evaluate_run(
    record: RunRecord,
    *,
    scorer: Scorers,
    export: Export,
    run_dir: Path,
    gpus: list[str] | None,
    settings: RunSettings,
    val: np.ndarray,
    init: Path,
    final: Path,
    probes: list[tuple[float, Path]],
    begin: float,
    fail: Callable[[EvalStatus, str], RunRecord],
) -> RunRecord:
    """Export the model (``export``, begun already or now), evaluate the initial, probe and final
    weights with ``scorer`` (``start_evaluation``'s processes for ``run_dir``) and check its
    answers; the phases of their work are marked."""
    started = time.monotonic()
    phases.mark("checkpoint_copy", started)
    rng = np.random.default_rng(secrets.randbits(128))
    seq, n = settings.eval_seq_len, settings.val_tokens
    plan = layout(val[: n + 1], seq, settings.eval_batch_size, rng, settings.strict_probes)
    plain = np.flatnonzero(plan.scored >= 0)[np.argsort(plan.scored[plan.scored >= 0])]
    init_rows = max(1, min(len(plain), settings.init_check_tokens // seq))
    given, out = run_dir / "eval" / "in", run_dir / "eval" / "out" / "eval.npz"
    names = {"final": final, **{f"probe{i}": p for i, (_, p) in enumerate(probes)}}
    for name, path in names.items():
        place(path, given / f"{name}.pt")
    phases.mark("export")  # what is left of it when it began during training
    made, problem = export.verdict(init)
    if problem:
        status = {"rejected": EvalStatus.REJECTED, "timeout": EvalStatus.TIMEOUT}
        return fail(
            status.get(made.get("status"), EvalStatus.ERROR),
            f"exporting the model failed: {problem}",
        )
    scorer.score.accept_readonly_changes()  # the files just placed there are the harness's
    checkpoints = [
        {"name": "init", "rows": plain[:init_rows].tolist()},
        {"name": "final", "rows": list(range(len(plan.scored)))},
    ] + [{"name": f"probe{i}", "rows": plain.tolist()} for i in range(len(probes))]
    spec = {
        "vocab_size": settings.vocab_size,
        "batch_size": settings.eval_batch_size,
        "shape": list(plan.inputs.shape),
        "checkpoints": [{**c, "path": str(given / f"{c['name']}.pt")} for c in checkpoints],
        "out": str(out),
        "graph": str(given),
        "device": "cuda" if gpus else "cpu",
    }
    phases.mark("scoring_start")
    result = scorer.score.finish(
        json.dumps(spec).encode() + b"\n" + plan.inputs.tobytes() + plan.targets.tobytes()
    )
    record.eval_s = time.monotonic() - started
    if result.modified:
        return fail(
            EvalStatus.REJECTED,
            f"the evaluation modified its read-only inputs: {', '.join(result.modified)}",
        )
    if result.leftover:  # work left behind could have written the answers
        return fail(
            EvalStatus.REJECTED,
            f"the evaluation left {result.leftover} process(es) running after it exited (killed)",
        )
    if not result.ok or not out.is_file():
        record.output = result.tail(3000)
        status = EvalStatus.TIMEOUT if result.timed_out else EvalStatus.ERROR
        return fail(
            status,
            f"evaluating the checkpoint failed (exit {result.returncode}): {result.tail(600)}",
        )
    with np.load(out, allow_pickle=False) as arrays:
        data = {key: arrays[key] for key in arrays.files}
    summary = json.loads(data["summary"].tobytes())
    phases.mark_each(map(tuple, summary["marks"]))  # the evaluation process's own phases
    phases.mark("scoring_check")
    if summary.get("rejected"):
        return fail(
            EvalStatus.REJECTED, f"the exported model cannot be scored: {summary['rejected']}"
        )
    nats = data["nats_final"].astype(np.float64)
    if nats.shape != plan.inputs.shape or not np.isfinite(nats[plan.scored >= 0]).all():
        return fail(EvalStatus.INVALID, "the model's validation loss is not finite")
    worst, where = causal_violation(nats, plan)
    record.causal_diff = worst
    if not worst <= settings.causal_tol:
        return fail(
            EvalStatus.REJECTED,
            f"the model is not causal or its rows are not independent: a loss changed by {worst:.4g} "
            f"at {where} when other inputs changed (tokens after it, or other rows of the batch); "
            "a language model may not look ahead or across rows",
        )
    if made.get("reference_diff"):
        return fail(
            EvalStatus.REJECTED,
            "the weights at the first clock mark are not the model that torch.manual_seed(EVOLVE_SEED) "
            f"then build_model() gives ({made['reference_diff']}); build the model that "
            "way and train only after speedrun_clock.start",
        )
    record.params = int(summary["final"]["params"])
    record.init_loss = float(data["nats_init"].astype(np.float64).mean())
    floor = math.log(settings.vocab_size) - settings.init_loss_margin
    if record.init_loss < floor:
        return fail(
            EvalStatus.REJECTED,
            f"the model was already trained when the clock started: its initial loss "
            f"{record.init_loss:.3f} is below {floor:.3f} (ln vocab - {settings.init_loss_margin}); train only "
            "after speedrun_clock.start",
        )
    record.loss = float(nats[plan.scored >= 0].mean())
    record.probes = [
        (t, float(data[f"nats_probe{i}"].astype(np.float64).mean()))
        for i, (t, _) in enumerate(probes)
    ]
    record.wall_s = time.monotonic() - begin
    return record
