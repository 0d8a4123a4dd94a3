"""The speedrun fitness: mean training time to a target validation loss, significant at p < alpha.

A candidate is run with ``n_seeds`` seeds; each run is timed by the harness's clock and
its final weights are evaluated by the harness (``runner.py``). The candidate is valid
when ``scipy.stats.ttest_1samp(losses, target, alternative='less').pvalue < alpha``;
its fitness is then the mean timed training seconds (lower is better). Otherwise it is
INVALID, with the p-value and every loss kept in its metrics. As a cascade, one seed
runs first; the others only when its loss is within ``reach`` of the target. With a
``compile_cache``, a stage before them fills it once per cache, seed program, settings and
machine (the seed trained one step by the harness, ``runner.warm_cache``), so candidates
that compile what the seed compiles find it there; each run reads it through a private layer
(``evolve.harness.compile_cache``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib.metadata
import math
import shutil
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evolve.archive.statistics import one_sided_pvalue
from evolve.harness import once, phases
from evolve.harness.fitness import EvalContext, Stage
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, Objective

from .data import DataSpec
from .runner import (
    RunRecord,
    RunSettings,
    rescore,
    run_seed,
    warm_cache,
)

ALPHA = 0.01  # the speedrun's significance level (BENCHMARKS.md section 2)
SEED_PROGRAM = Path(__file__).resolve().parent / "seed"


def decide(losses: list[float], target: float, alpha: float) -> tuple[bool, float]:
    """(passed, p-value) of the one-sided t-test that the mean loss is below ``target``.

    Passing needs ``p < alpha`` strictly: a p-value equal to alpha fails.
    """
    pvalue = one_sided_pvalue(losses, target, alternative="less")
    return pvalue < alpha, pvalue


class SpeedrunFitness:
    """Time to a target validation loss, proven over seeds. Picklable; see the module docstring.

    Args:
        preset: which size the seed program trains (``SPEEDRUN_PRESET``: cpu, gpu1, full).
        target: validation cross-entropy (nats per token) to beat.
        data_dir: shard folder, or ``stdlib`` (Python's sources, prepared on first use).
        train_glob / val_glob: shard name patterns inside ``data_dir``.
        tokenizer: the tokenizer ``target`` was set on (``gpt2``, ``bpe``): shards made with
            another one are refused with one line, never scored (None: not checked).
        val_tokens: how many validation targets are scored (a multiple of ``eval_seq_len``).
        vocab_size: tokens the model must give logits for (50257 for GPT-2).
        eval_seq_len / eval_batch_size: shape of the harness's evaluation batches.
        n_seeds: runs per candidate; alpha: significance level of the one-sided t-test.
        reach: the first seed's loss must be below ``target + reach`` for more seeds to run.
        nproc_per_node: training processes per run (torchrun when > 1), one GPU each.
        run_timeout_s / eval_timeout_s: wall-clock limits of one training run / its evaluation.
        warmup_cap_s: the most seconds from launch to ``start`` (startup, compile, warm-up).
        compile_allowance_s: start-up seconds not charged; the rest up to ``start`` counts
            as training time (absolute per scale, so work before the clock is not free).
        init_loss_margin: the initial weights' loss must be at least ln(vocab) minus this.
        cpu_threads: OMP_NUM_THREADS for CPU runs (None leaves it).
        probe_every_s: > 0 asks the candidate for probe checkpoints (calibration only).
        overrides: hyperparameters passed to the program as ``SPEEDRUN_OVERRIDES`` (tests, calibration).
        params_max_m: upper end of the ``params_m`` descriptor, in millions.
        cpu_parallel: on CPU (no GPUs in the slot), how many seeds run at the same time.
        compile_cache: a folder of torch.compile caches that each run starts from (through a
            private layer; nothing a candidate's run writes goes back), filled by the harness's run of
            the seed (the ``cache_warmup`` stage). None: a fresh cache per run.
    """

    def __init__(
        self,
        *,
        preset: str,
        target: float,
        data_dir: str,
        train_glob: str = "*_train_*.bin",
        val_glob: str = "*_val_*.bin",
        tokenizer: str | None = None,
        val_tokens: int,
        vocab_size: int = 50257,
        eval_seq_len: int = 1024,
        eval_batch_size: int = 16,
        n_seeds: int = 3,
        alpha: float = ALPHA,
        reach: float = 0.05,
        nproc_per_node: int = 1,
        run_timeout_s: float = 600.0,
        eval_timeout_s: float = 300.0,
        warmup_cap_s: float = 120.0,
        compile_allowance_s: float = 60.0,
        init_loss_margin: float = 1.0,
        cpu_threads: int | None = None,
        probe_every_s: float = 0.0,
        overrides: dict | None = None,
        params_max_m: float = 400.0,
        cpu_parallel: int = 1,
        compile_cache: str | None = None,
    ) -> None:
        if val_tokens % eval_seq_len:
            raise ValueError(
                f"val_tokens ({val_tokens}) must be a multiple of eval_seq_len ({eval_seq_len})"
            )
        if n_seeds < 1:
            raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
        self.target, self.alpha, self.reach, self.n_seeds = target, alpha, reach, n_seeds
        self.cpu_parallel = cpu_parallel
        self.data = DataSpec(
            data_dir=data_dir, train_glob=train_glob, val_glob=val_glob, tokenizer=tokenizer
        )
        self.settings = RunSettings(
            preset=preset,
            vocab_size=vocab_size,
            eval_seq_len=eval_seq_len,
            eval_batch_size=eval_batch_size,
            val_tokens=val_tokens,
            nproc_per_node=nproc_per_node,
            run_timeout_s=run_timeout_s,
            eval_timeout_s=eval_timeout_s,
            warmup_cap_s=warmup_cap_s,
            compile_allowance_s=compile_allowance_s,
            init_loss_margin=init_loss_margin,
            cpu_threads=cpu_threads,
            probe_every_s=probe_every_s,
            overrides=dict(overrides or {}),
            compile_cache=compile_cache,
        )
        self.objective = Objective(name="train_time_s", direction=Direction.MINIMIZE)
        self.descriptors = (
            Descriptor(name="params_m", low=0.0, high=params_max_m, bins=8),
            Descriptor(name="loss_margin", low=0.0, high=max(4 * reach, 0.04), bins=4),
        )
        self._first: dict[str, RunRecord] = {}

    @property
    def stages(self) -> list[Stage]:
        """The cascade: the compile cache filled (with ``compile_cache``), one seed, then the
        remaining seeds and the t-test."""
        warmup = [Stage(name="cache_warmup", run=self.cache_warmup)] if self.settings.compile_cache else []
        return [
            *warmup,
            Stage(name="first_seed", run=self.first_seed),
            Stage(name="all_seeds", run=self.all_seeds),
        ]

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """The stages in one call (for callers that do not run cascades)."""
        if self.settings.compile_cache:
            self.cache_warmup(workdir, ctx)
        first = self.first_seed(workdir, ctx)
        return self.all_seeds(workdir, ctx) if first.ok else first

    def cache_warmup(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """Fill the compile cache with the seed's compilation, once per cache, seed program,
        settings and machine (a record in the cache folder; workers asking at the same time
        wait for the first). It never fails a candidate: a seed that does not train leaves
        the cache as it is, and ``cache_warmup_ok`` says so."""
        settings = self.settings
        facts = {"seed": {p.name: p.read_text() for p in sorted(SEED_PROGRAM.glob("*.py"))},
                 "settings": {k: str(v) for k, v in dataclasses.asdict(settings).items()},
                 "torch": importlib.metadata.version("torch"), "hardware": ctx.hardware}  # fmt: skip

        def warm() -> dict:
            if ctx.scratch is not None:
                Path(ctx.scratch).mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="speedrun-warmup-", dir=ctx.scratch) as tmp:
                record = warm_cache(SEED_PROGRAM, settings=settings, seed=ctx.seed,
                                    train_files=self.data.train_files(), val=self.data.val_tokens(settings.val_tokens),
                                    gpus=self.gpu_groups(ctx)[0], scratch=Path(tmp), hidden=self.data.hidden())  # fmt: skip
            return {"status": record.status.value, "reason": record.reason, "wall_s": record.wall_s}

        record = once.stored(Path(settings.compile_cache) / f"warmed-{once.key(facts)}.json", warm)
        return Evaluation(status=EvalStatus.OK, fitness=0.0,
                          metrics={"cache_warmup_ok": int(record["status"] == EvalStatus.OK.value)})  # fmt: skip

    def gpu_groups(self, ctx: EvalContext) -> list[list[str] | None]:
        """The slot's GPUs in groups of ``nproc_per_node``, one run each; on a CPU,
        ``cpu_parallel`` runs without GPUs."""
        gpus = [g for g in (ctx.gpu or "").split(",") if g.strip()]
        width = self.settings.nproc_per_node
        if gpus and len(gpus) < width:
            raise ValueError(
                f"a run needs {width} GPUs but the slot has {len(gpus)} ({ctx.gpu}); set gpus: {width}"
            )
        groups: list[list[str] | None] = [
            gpus[i : i + width] for i in range(0, len(gpus) - width + 1, width)
        ]
        return groups or [None] * max(1, self.cpu_parallel)

    def seeds(self, ctx: EvalContext) -> list[int]:
        """The seeds of one evaluation: ``ctx.seed`` and the ``n_seeds - 1`` after it."""
        return [ctx.seed + i for i in range(self.n_seeds)]

    def first_seed(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """Stage 1: one run. OK (with a provisional time) only when its loss is within reach."""
        record = self.run_seeds(workdir, self.seeds(ctx)[:1], ctx)[0]
        phases.mark("verdict")
        if record.ok:
            self._first[str(workdir)] = record
        evaluation = self.verdict([record])
        if not record.ok or self.n_seeds == 1:
            return evaluation
        if record.loss is not None and record.loss > self.target + self.reach:
            return Evaluation(
                status=EvalStatus.INVALID,
                metrics=evaluation.metrics,
                descriptors=evaluation.descriptors,
                artifacts={
                    **evaluation.artifacts,
                    "error": (
                        f"the first seed's validation loss {record.loss:.4f} is not within reach of the "
                        f"target {self.target} (+{self.reach}); more seeds were not run"
                    ),
                },
            )
        return Evaluation(
            status=EvalStatus.OK,
            fitness=record.train_s,
            metrics=evaluation.metrics,
            descriptors=evaluation.descriptors,
            artifacts=evaluation.artifacts,
            seeds=(record.seed,),
        )

    def all_seeds(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """Stage 2: the remaining seeds, then the t-test over all of them."""
        seeds = self.seeds(ctx)
        first = self._first.pop(str(workdir), None)
        records = [first] if first is not None else []
        records += self.run_seeds(workdir, seeds[len(records) :], ctx)
        phases.mark("verdict")
        return self.verdict(records)

    def run_seeds(
        self, workdir: Path, seeds: list[int], ctx: EvalContext, *, keep: bool = False
    ) -> list[RunRecord]:
        """Run ``seeds``, in parallel when the slot has GPUs for more than one run at a time.
        ``keep``: leave each run's folder (code, checkpoints) under ``ctx.scratch`` for ``rescore_kept``."""
        if not seeds:
            return []
        if keep and ctx.scratch is None:
            raise ValueError("keep=True needs ctx.scratch: the kept runs' folders go there")
        groups = self.gpu_groups(ctx)
        settings = self.run_settings(ctx)
        train_files = self.data.train_files()
        val = self.data.val_tokens(self.settings.val_tokens)
        hidden = self.data.hidden()
        own_scratch = ctx.scratch is None
        scratch_root = (ctx.scratch or Path(tempfile.mkdtemp(prefix="speedrun-"))).resolve()
        slots = [slot_dir(scratch_root, i) for i in range(len(groups))]
        for slot in slots:
            slot.mkdir(parents=True, exist_ok=True)

        def one(index: int) -> RunRecord:
            slot = index % len(groups)
            return run_seed(
                workdir,
                seed=seeds[index],
                settings=settings,
                train_files=train_files,
                val=val,
                gpus=groups[slot],
                scratch=slots[slot],
                hidden=[*hidden, *(s for s in slots if s != slots[slot])],
                keep=keep,
            )

        def timed(index: int) -> RunRecord:
            """The first run of a wave marks the evaluation's phases; the wave then waits for the rest."""
            record = one(index)
            phases.mark("other_seeds")
            return record

        records: list[RunRecord] = []
        try:
            for wave in range(0, len(seeds), len(groups)):
                indices = range(wave, min(wave + len(groups), len(seeds)))
                with ThreadPoolExecutor(max_workers=len(indices)) as pool:
                    first = pool.submit(contextvars.copy_context().run, timed, wave)
                    rest = list(pool.map(one, indices[1:]))
                    records += [first.result(), *rest]
        finally:
            if own_scratch:
                shutil.rmtree(scratch_root, ignore_errors=True)
        return records

    def run_settings(self, ctx: EvalContext) -> RunSettings:
        """The runs' settings: the fitness's, or in strict mode (``ctx.strict``) the auditor's."""
        return self.settings.strict() if ctx.strict else self.settings

    def rescore_kept(self, workdir: Path, record: RunRecord, ctx: EvalContext) -> RunRecord:
        """The first wave's run of ``record.seed``, kept by ``run_seeds(..., keep=True)`` with the
        same ``ctx.scratch``, evaluated again: as usual, or with ``ctx.strict`` as the auditor's
        strict re-evaluation does (what strict mode adds is the difference of their ``eval_s``)."""
        run_dir = slot_dir(Path(ctx.scratch).resolve(), 0) / f"seed-{record.seed}"
        if not (run_dir / "ckpt").is_dir():
            raise FileNotFoundError(f"{run_dir} holds no kept run: run_seeds(..., keep=True) first")
        return rescore(
            workdir,
            record,
            run_dir=run_dir,
            settings=self.run_settings(ctx),
            val=self.data.val_tokens(self.settings.val_tokens),
            gpus=self.gpu_groups(ctx)[0],
            hidden=self.data.hidden(),
        )

    def verdict(self, records: list[RunRecord]) -> Evaluation:
        """The module's ``verdict`` at this fitness's target and alpha."""
        return verdict(records, self.target, self.alpha)


def slot_dir(scratch_root: Path, index: int) -> Path:
    """The folder of the runs on a slot's ``index``-th GPU group (one wave's run at a time)."""
    return scratch_root / f"slot-{index}"


def verdict(records: list[RunRecord], target: float, alpha: float) -> Evaluation:
    """Combine runs: the first failed run decides; else the t-test over their losses."""
    metrics: dict[str, Any] = {"n_seeds": len(records)}
    lines = []
    for i, r in enumerate(records):
        values = (
            ("loss", r.loss),
            ("time_s", r.train_s),
            ("init_loss", r.init_loss),
            ("charged_s", r.charged_s),
            ("causal_diff", r.causal_diff),
            ("post_stop_s", r.post_stop_s),  # ran on after its stop mark (nothing of it scored)
        )
        for key, value in values:
            if value is not None:
                metrics[f"{key}_{i}"] = value
        lines.append(
            f"seed {r.seed}: {r.status.value} time {_fmt(r.train_s)} s, loss {_fmt(r.loss, 4)}, "
            f"untimed {_fmt(r.untimed_s)} s (charged {_fmt(r.charged_s)} s), eval {_fmt(r.eval_s)} s "
            f"{r.reason}".rstrip()
        )
    artifacts = {"runs": "\n".join(lines), "output": records[0].output if records else ""}
    seeds = tuple(r.seed for r in records)
    failed = next((r for r in records if not r.ok), None)
    if failed is not None:
        return Evaluation(
            status=failed.status,
            metrics=metrics,
            seeds=seeds,
            artifacts={
                **artifacts,
                "error": f"seed {failed.seed}: {failed.reason}",
                "output": failed.output,
            },
        )
    losses = [r.loss for r in records]
    times = [r.train_s for r in records]
    passed, pvalue = decide(losses, target, alpha)
    metrics.update(
        pvalue=pvalue,
        loss_mean=statistics.fmean(losses),
        time_mean_s=statistics.fmean(times),
        loss_std=statistics.stdev(losses) if len(losses) > 1 else 0.0,
        time_std_s=statistics.stdev(times) if len(times) > 1 else 0.0,
        untimed_mean_s=statistics.fmean(r.untimed_s for r in records),
        charged_mean_s=statistics.fmean(r.charged_s for r in records),
        eval_mean_s=statistics.fmean(r.eval_s for r in records),
        overhead_mean_s=statistics.fmean(r.overhead_s for r in records),
        params_m=records[0].params / 1e6,
        target=target,
    )
    descriptors = {
        "params_m": metrics["params_m"],
        "loss_margin": target - metrics["loss_mean"],
    }
    if not passed:
        artifacts["error"] = (
            f"mean validation loss {metrics['loss_mean']:.4f} over {len(losses)} seed(s) is not "
            f"below the target {target} at p < {alpha} (p = {pvalue:.4g})"
        )
        return Evaluation(
            status=EvalStatus.INVALID,
            metrics=metrics,
            descriptors=descriptors,
            artifacts=artifacts,
            seeds=seeds,
        )
    return Evaluation(
        status=EvalStatus.OK,
        fitness=metrics["time_mean_s"],
        metrics=metrics,
        descriptors=descriptors,
        artifacts=artifacts,
        seeds=seeds,
    )


def _fmt(value: float | None, digits: int = 1) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.{digits}f}"
    )
