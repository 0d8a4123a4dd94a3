"""The nanochat fitness: train the candidate in a sandbox for a fixed budget, then score val bits per byte.

Three sandboxed runs per evaluation. Training: the harness's supervisor runs the candidate's
``train.py`` with the training split only and times it with its own clock. Export: the
candidate's ``model.py`` builds the model from its config, with no data and no trained weight
in sight, and ``torch.export`` writes it out as a graph (``evolve.harness.exporter``): after the
stop, or on a GPU while the candidate trains, from the code and config it declared before its
clock (``client.save_initial``), when the final ones are the same bytes (``early``).
Scoring: the harness's scorer runs that graph, checked and bound to the checkpoint's own
tensors, on the fixed validation rows and computes cross-entropy and bytes itself; no
candidate code runs there. Lower val_bpb is better. Before
them, the quick stages of ``stages`` (a local check, a short run) stop broken candidates early.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from evolve.harness import compile_cache, exported, phases, profiling, protocol
from evolve.harness.fitness import EvalContext, Limits, Policy, Started, start_sandboxed
from evolve.harness.plaincopy import copy_folder, copy_plain
from evolve.types import Descriptor, Direction, EvalStatus, Evaluation, EvolveError, Objective

from . import ahead, prepare, scales, stages, supervisor
from .early import EarlyExport
from .packing import pack_rows
from .scorer import AHEAD_FAILED, PRELOAD, SPARE_ROWS, eval_rows
from .supervisor import checkpoint_digest, checkpoint_files, is_checkpoint_name
from .tokens import Split

log = logging.getLogger(__name__)
HARNESS_MODULES = {  # the harness processes, by role (their error messages name the role)
    "training": "evolve.benchmarks.nanochat.supervisor",
    "export": "evolve.harness.exporter",
    "scoring": "evolve.benchmarks.nanochat.scorer",
    "local check": "evolve.benchmarks.nanochat.probe",
}
MAX_CHECKPOINT_BYTES = 64 << 30
MAX_MODEL_SOURCE_BYTES = 1 << 20
"""The model's code files and config.json together, which the exporter runs (without weights)."""
STRICT_PROBES = 4  # strict mode multiplies the causality probes by this (the model cannot tell)
PROFILE_STEPS = 3  # timed steps profiled for feedback (cost measured in README "Profile feedback")
PROFILE_SKIP = 2  # timed steps before the profiled ones (the first may still warm up)
_ROWS_CACHE: dict[tuple, bytes] = {}


def validation_rows(val_dir: Path, seq_len: int, eval_tokens: int) -> bytes:
    """The fixed evaluation rows (plus the causality check's spares) as int32 bytes, cached per process."""
    key = (str(val_dir), seq_len, eval_tokens)
    if key not in _ROWS_CACHE:
        try:
            rows = eval_rows(val_dir, seq_len, eval_tokens // seq_len, spare=SPARE_ROWS)
        except protocol.EvalFailure as failure:
            raise EvolveError(failure.reason) from None
        _ROWS_CACHE[key] = rows.astype("int32").tobytes()
    return _ROWS_CACHE[key]


class NanochatFitness:
    """Fixed-budget language-model training scored by validation bits per byte (lower is better).

    Args:
        scale: "auto" (nanochat with CUDA, else cpu), "nanochat" or "cpu"; see ``scales``.
        data_dir: where prepared datasets live (default ``$EVOLVE_DATA_DIR`` or ~/.cache/evolve/nanochat).
        compile_cache: a folder of torch.compile caches (inductor, Triton) that evaluations
            read; None (default) gives each evaluation its own. Candidates see it through a
            private writable layer (``Policy.shared_caches``): their own writes vanish with the
            evaluation, so it is never a channel between candidates; it helps only once
            something outside the candidates (the harness) has filled it.
        layered: the quick stages before the full run (``stages.LayeredSettings``):
            ``{"local_check": true, "short_run_steps": null}`` by default (null: the scale's
            default number of steps, 0: no short run).
        profile_steps: timed steps of the full run profiled with torch.profiler in the
            training process (from the third timed step on) for the candidate's feedback,
            never its score (``evolve.harness.profiling``); 0: none.
        **overrides: any ``Scale`` field, e.g. ``budget_s=60`` or ``dataset="wikipedia"``;
            ``eval_tokens=0`` scores all whole batches the validation split holds.

    Attributes:
        objective: val_bpb, minimised.
        descriptors: log10 of the parameter count and of the training tokens processed.
        stages: the local check and the short run as configured, then the full run
            (``evaluate``); ``evolve`` runs them in order and stops at the first that fails.
        benchmark_overrides: the seed folder of the chosen scale, the GPUs one evaluation
            needs (1 at a CUDA scale, else 0) and a bound on one evaluation's wall time;
            ``evolve.launch.config`` uses them instead of the YAML's ``seed``, ``gpus``, ``timeout_s``.
    """

    def __init__(
        self,
        *,
        scale: str = "auto",
        data_dir: str | None = None,
        compile_cache: str | None = None,
        layered: dict | None = None,
        profile_steps: int = PROFILE_STEPS,
        **overrides,
    ) -> None:
        self.scale = scales.resolve(scale, **overrides)
        self.profile_steps = int(profile_steps)
        self.layered = stages.LayeredSettings.of(layered, self.scale)
        self.compile_cache = (
            str(Path(compile_cache).expanduser().resolve()) if compile_cache else None
        )
        self.data_dir = str(prepare.data_dir(data_dir))
        self.objective = Objective(name="val_bpb", direction=Direction.MINIMIZE)
        self.descriptors = (
            Descriptor(
                name="log10_params",
                low=self.scale.params_range[0],
                high=self.scale.params_range[1],
                bins=8,
            ),
            Descriptor(
                name="log10_tokens",
                low=self.scale.tokens_range[0],
                high=self.scale.tokens_range[1],
                bins=8,
            ),
        )
        self.benchmark_overrides = {
            "seed": str(self.scale.seed_dir),
            "gpus": 1 if self.scale.device == "cuda" else 0,
            "timeout_s": self.scale.train_limit_s
            + self.scale.eval_limit_s
            + 60.0
            + stages.time_limit_s(self.scale, self.layered)
            + (self.scale.train_limit_s if self.compile_cache else 0.0),  # the cache's warm-up
        }
        log.info("nanochat: %s; %s", self.scale.describe(), self.layered.describe())
        self._dataset_meta()  # fail now, not at the first evaluation, when the data is missing
        if self.scale.eval_tokens == 0:  # "all the validation split holds", in whole batches
            self.scale = dataclasses.replace(self.scale, eval_tokens=self.available_eval_tokens())
            log.info(
                "nanochat: scoring %s validation targets (all the split holds)",
                f"{self.scale.eval_tokens:,}",
            )
        self.validation_rows()  # fail now, not after the seed's first stages, when the split is short
        self.stages = stages.build(self, self.layered)

    @property
    def dataset_root(self) -> Path:
        """The prepared dataset's folder (the automatic stdlib set is kept per vocabulary size)."""
        name = self.scale.dataset
        return Path(self.data_dir) / (
            prepare.stdlib_name(self.scale.vocab_size) if name == "stdlib" else name
        )

    @property
    def starts_ahead(self) -> bool:
        """Start harness processes before they are needed: the scorer when training begins, the
        training program while the local check runs (``prepare_training``). On a GPU, where the
        CPU is idle meanwhile; on a CPU scale they would share its cores with the work."""
        return self.scale.device == "cuda"

    @property
    def calibration_dir(self) -> Path:
        """Where the quick stages keep the seed's references (``stages``): harness-written, hidden from candidates."""
        return Path(self.data_dir) / "calibration"

    def available_eval_tokens(self) -> int:
        """Targets in the whole batches of rows the validation split gives (the probes' spare rows kept aside)."""
        scale = self.scale
        rows = sum(
            1
            for _ in pack_rows(
                Split(prepare.split_dirs(self.dataset_root)["val"]).documents(), scale.seq_len + 1
            )
        )
        batches = (rows - SPARE_ROWS) // scale.eval_batch_rows
        if batches < 1:
            raise EvolveError(
                f"the validation split of {self.dataset_root} gives only {rows} rows of "
                f"{scale.seq_len + 1} tokens; prepare more validation text"
            )
        return batches * scale.eval_batch_rows * scale.seq_len

    def validation_rows(self) -> bytes:
        """The rows this scale scores, with the probes' spares (read once per process)."""
        return validation_rows(
            prepare.split_dirs(self.dataset_root)["val"], self.scale.seq_len, self.scale.eval_tokens
        )

    def _dataset_meta(self) -> dict:
        root = self.dataset_root
        if self.scale.dataset == "stdlib":
            prepare.ensure_stdlib(root, self.scale.vocab_size, log=log.info)
        if not prepare.is_prepared(root):
            raise EvolveError(
                f"nanochat dataset {self.scale.dataset!r} is not prepared under {root.parent}; run "
                f"`python -m evolve.benchmarks.nanochat.prepare --name {self.scale.dataset} ...` "
                "(see benchmarks/nanochat/README.md) or choose another with benchmark.fitness.dataset=NAME"
            )
        meta = json.loads((root / "dataset.json").read_text())
        if meta["vocab_size"] != self.scale.vocab_size:
            raise EvolveError(
                f"dataset {root} has vocabulary {meta['vocab_size']} but scale {self.scale.name} "
                f"needs {self.scale.vocab_size}; prepare it with --vocab {self.scale.vocab_size}"
            )
        return meta

    def forbidden(self) -> list[str]:
        """Paths candidate code must not read: everything in the data directory but our train and
        tokenizer, and the text files the dataset was made from (``prepare.hidden_sources``: for
        the stdlib set, the test package its validation text comes from)."""
        root, data = self.dataset_root, Path(self.data_dir)
        parts = prepare.split_dirs(root)
        allowed = {parts["train"], parts["tokenizer"]}
        found = [p for p in data.iterdir() if p != root] if data.is_dir() else []
        found += [p for p in root.iterdir() if p not in allowed and p.name != "dataset.json"]
        sources = prepare.hidden_sources(root)
        return sorted({str(p) for p in found} | {str(parts["val"])} | set(sources))

    def hidden_from(self, role: str) -> list[str]:
        """Paths the harness process of ``role`` (``HARNESS_MODULES``) and what it runs may not read:
        ``forbidden()``, and for the export and the scorer the training split too (only the
        training supervisor reads it, to stream it while its clock runs: model code that could
        read it after the stop would train on it after the budget)."""
        if role not in ("export", "scoring"):
            return self.forbidden()
        return sorted({*self.forbidden(), str(prepare.split_dirs(self.dataset_root)["train"])})

    def _policy(self, forbidden: list[str], *, warming: bool = False) -> Policy:
        """Sandbox policy: the validation data and other datasets hidden (Landlock, where the kernel has it);
        the compile cache readable but never written by candidates (no channel between evaluations),
        written only when ``warming`` (the harness's run of the seed, ``stages.CacheWarmup``); its
        Python bytecode read-only otherwise (``evolve.harness.bytecode``)."""
        cache = compile_cache.access(self.compile_cache, warming)
        return Policy(
            hidden=tuple(forbidden),
            writable=cache.writable,
            shared_caches=cache.shared_caches,
            readonly=cache.readonly,
        )

    def program_env(self, ctx: EvalContext, *, warming: bool = False) -> dict[str, str]:
        """The candidate's (and harness processes') environment: seed and GPU, the shared compile
        cache if set, with the libraries' bytecode (``evolve.harness.bytecode``; written only
        when ``warming``). Thread counts follow the sandbox's cores (``Limits.cores``)."""
        env = ctx.env()
        if self.compile_cache:
            env.update(compile_cache.environment(self.compile_cache, warming))
        return env

    def _limits(self, timeout_s: float) -> Limits:
        memory = None if self.scale.memory_gb is None else int(self.scale.memory_gb * (1 << 30))
        return Limits(timeout_s=timeout_s, memory_bytes=memory, cores=self.scale.threads)

    def training_sandbox(self) -> tuple[Limits, Policy]:
        """The limits and policy the training harness and its program run under."""
        return self._limits(self.scale.train_limit_s), self._policy(self.forbidden())

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        """Train the candidate in ``workdir`` and score its checkpoint."""
        scratch = Path(tempfile.mkdtemp(prefix="nanochat-eval-", dir=ctx.scratch))
        try:
            return self._evaluate(Path(workdir), ctx, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def program_settings(self, workdir: Path, ctx: EvalContext) -> dict:
        """What the candidate's training program is told (``client.CONFIG_KEYS``), for ``workdir`` and ``ctx``."""
        scale = self.scale
        meta, parts = self._dataset_meta(), prepare.split_dirs(self.dataset_root)
        return {
            "budget_s": scale.budget_s,
            "untimed_steps": scale.untimed_steps,
            "seq_len": scale.seq_len,
            "vocab_size": scale.vocab_size,
            "bos_id": meta["bos_id"],
            "device": scale.device,
            "seed": ctx.seed,
            "train_dir": str(parts["train"]),
            "checkpoint_dir": str(Path(workdir) / "checkpoint"),
            "initial_dir": str(Path(workdir) / "initial"),
            "forbidden": self.forbidden(),
        }  # the harness process keeps train_dir from the program (it streams the rows itself)

    def run_harness(
        self,
        role: str,
        cwd: Path,
        ctx: EvalContext,
        job: dict,
        *,
        limit_s: float,
        payload: bytes = b"",
        warming: bool = False,
        started: Started | None = None,
        heard: Callable[[str], None] | None = None,
        hide: tuple[str, ...] = (),
    ) -> dict | Evaluation:
        """Run the harness process of ``role`` (``HARNESS_MODULES``) sandboxed in ``cwd`` with ``job``.

        Returns its verdict, or the failed Evaluation. The job goes to the process's stdin
        with a fresh nonce (then ``payload``); only a stdout line carrying that nonce counts.
        ``warming``: the seed program filling the compile cache (it may write there).
        ``started``: the process, started ahead by ``start_harness`` with the same arguments.
        ``heard``: gets each line of its stdout as it arrives (``Started.finish``).
        ``hide``: more paths it may not read (``start_harness``).
        """
        nonce, stdin = protocol.job_input(job, payload)
        started = started or self.start_harness(
            role, cwd, ctx, limit_s=limit_s, warming=warming, hide=hide
        )
        result = started.finish(stdin, heard)
        verdict = protocol.read_verdict(result, nonce, role)
        if isinstance(verdict, dict):  # when the harness process began and ended, for the phases
            verdict["sandbox"] = {"started": result.started_at, "exited": result.exited_at}
        return verdict

    def start_harness(
        self,
        role: str,
        cwd: Path,
        ctx: EvalContext,
        *,
        limit_s: float,
        warming: bool = False,
        args: tuple[str, ...] = (),
        hide: tuple[str, ...] = (),
    ) -> Started:
        """The harness process of ``role`` started in ``cwd`` ahead of its job: it imports what it
        needs, then waits for the job ``run_harness`` sends (``cancel()`` it when unused).
        ``args``: the module's own (``supervisor.AHEAD``: the training harness also launches the
        training program, which imports torch while it waits; ``scorer.PRELOAD``: the scorer
        builds the graph in its folder before the job). The training split's folder is in its
        environment (``TRAIN_DIR_ENV``), to hide it from children launched before the job.
        ``hide``: more paths it may not read (the export's: the candidate's folder, where its
        training may leave anything)."""
        argv = [sys.executable, *protocol.SAFE_PATH, "-m", HARNESS_MODULES[role], *args]
        env = self.program_env(ctx, warming=warming)
        env[supervisor.TRAIN_DIR_ENV] = str(prepare.split_dirs(self.dataset_root)["train"])
        return start_sandboxed(
            argv,
            cwd=cwd,
            limits=self._limits(limit_s),
            env=env,
            policy=self._policy([*self.hidden_from(role), *hide], warming=warming),
        )

    def prepare_training(self, workdir: Path, ctx: EvalContext) -> Started:
        """Start the training harness for ``workdir``'s next ``train`` now, with its program
        launched and waiting (torch imported): the quick stages call this as the
        local check begins, so that the program's start-up overlaps the check instead of
        following it. One is kept per process; an unused one is ended by the next call, or at
        this process's exit."""
        ahead.drop()  # one at a time: the new one is the next to be taken
        started = self.start_harness(
            "training", workdir, ctx, limit_s=self.scale.train_limit_s, args=(supervisor.AHEAD,)
        )
        ahead.keep(workdir, ctx, started)
        return started

    def train(
        self,
        workdir: Path,
        ctx: EvalContext,
        *,
        max_steps: int | None = None,
        warming: bool = False,
        early: EarlyExport | None = None,
    ) -> dict | Evaluation:
        """Run the candidate's ``train.py`` under the supervisor (until the budget, or ``max_steps``
        steps); ``early`` hears its lines (the export from the initial checkpoint)."""
        scale = self.scale
        for folder in ("checkpoint", "initial"):
            shutil.rmtree(Path(workdir) / folder, ignore_errors=True)
        job = {
            **self.program_settings(workdir, ctx),
            "entry": "train.py",
            "startup_limit_s": scale.startup_limit_s,
            "free_startup_s": scale.free_startup_s,
            "finish_limit_s": scale.finish_limit_s,
            "save_floor_s": scale.save_floor_s,
        }
        if max_steps is not None:
            job["max_steps"] = max_steps
        elif self.profile_steps:
            job["profile"] = [scale.untimed_steps + PROFILE_SKIP, self.profile_steps]
        started = None if warming else ahead.take(workdir, ctx)
        progress = _TrainingProgress(full=max_steps is None)
        heard = progress if early is None else lambda line: progress(line) or early.heard(line)
        return self.run_harness(
            "training", workdir, ctx, job, limit_s=scale.train_limit_s, warming=warming,
            started=started, heard=heard,
        )  # fmt: skip

    def probe_batches(self, ctx: EvalContext) -> int:
        """Causality probes among the scored batches: the scale's, or in strict mode (the auditor's
        re-evaluation) ``STRICT_PROBES`` times as many and at least one per scored batch."""
        scale = self.scale
        if not ctx.strict:
            return scale.probe_batches
        scored = scale.eval_tokens // (scale.seq_len * scale.eval_batch_rows)
        return max(STRICT_PROBES * scale.probe_batches, scored)

    def scoring_shape(self) -> dict:
        """What the scorer builds the graph for (``scorer.SHAPE``): batch shape, logits, device."""
        scale = self.scale
        return {
            "batch_rows": scale.eval_batch_rows,
            "seq_len": scale.seq_len,
            "vocab_size": scale.vocab_size,
            "device": scale.device,
        }

    def preloaded_scorer(
        self, graph: Path, evaldir: Path, ctx: EvalContext, hide: tuple[str, ...]
    ) -> Started | None:
        """A scorer started in ``evaldir`` with the graph exported in ``graph`` copied there
        first, building and running it before its job (``scorer.PRELOAD``); None when the graph
        is not plain files. ``hide``: as for the scorer started ahead."""
        if not copy_graph(graph, evaldir):
            return None
        return self.start_harness(
            "scoring", evaldir, ctx, limit_s=self.scale.eval_limit_s,
            args=(PRELOAD, json.dumps(self.scoring_shape())), hide=hide,
        )  # fmt: skip

    def score(
        self, checkpoint: Path, ctx: EvalContext, started: Started | None = None
    ) -> dict | Evaluation:
        """Score the checkpoint in ``checkpoint`` (a harness-owned copy) with the scorer: its verdict,
        or the failed Evaluation. ``started``: a scorer started ahead in ``checkpoint``."""
        scale, parts = self.scale, prepare.split_dirs(self.dataset_root)
        job = {
            **self.scoring_shape(),
            "token_bytes": str(parts["tokenizer"] / "token_bytes.npy"),
            "eval_tokens": scale.eval_tokens,
            "causal_atol": scale.causal_atol,
            "probe_batches": self.probe_batches(ctx),
            "forbidden": self.hidden_from("scoring"),
            "worker_startup_s": min(300.0, scale.eval_limit_s / 2),
            "batch_timeout_s": min(120.0, scale.eval_limit_s),
        }
        rows = self.validation_rows()
        return self.run_harness("scoring", checkpoint, ctx, job, limit_s=scale.eval_limit_s,
                                payload=rows, started=started)  # fmt: skip

    def _evaluate(self, workdir: Path, ctx: EvalContext, scratch: Path) -> Evaluation:
        phases.mark("data")
        self.validation_rows()  # the rows scored later, read before training
        # On a GPU (``starts_ahead``) the scorer starts now, in the folder the checkpoint will be
        # copied to, and imports while the candidate starts and trains; it touches the GPU only
        # once it has its job. On a CPU scale it starts after training (on the 2-core machine
        # the overlap only moved 1.3 s from the scorer's start to the candidate's).
        evaldir, exportdir = scratch / "checkpoint", scratch / "export"
        evaldir.mkdir()
        exportdir.mkdir()
        ready: dict[str, Started] = {}
        early = None
        hide = (str(workdir),)  # what the training writes never reaches candidate code after it
        if self.starts_ahead:
            for role, folder in (("export", exportdir), ("scoring", evaldir)):
                ready[role] = self.start_harness(
                    role, folder, ctx, limit_s=self.scale.eval_limit_s, hide=hide
                )
            early = EarlyExport(
                workdir / "initial",
                exportdir,
                ready.pop("export"),
                lambda folder, exporter: self.run_export(folder, ctx, exporter),
                lambda graph: self.preloaded_scorer(graph, evaldir, ctx, hide),
            )
        try:
            return self._train_and_score(workdir, ctx, evaldir, exportdir, ready, early, hide)
        finally:
            for started in ready.values():
                started.cancel()  # a no-op once it had its job
            if early is not None:
                early.close()

    def export(
        self,
        checkpoint: Path,
        folder: Path,
        ctx: EvalContext,
        started: Started | None = None,
        hide: tuple[str, ...] = (),
    ) -> dict | Evaluation:
        """Export the model of ``checkpoint`` (a harness-owned, digest-checked copy) as a graph, in a
        sandbox of its own that sees a copy of the model's code and config in ``folder`` (not its
        weights) and no data (nor ``hide``); the graph's files are then copied next to the
        checkpoint. The verdict, or the failed Evaluation."""
        folder.mkdir(parents=True, exist_ok=True)
        for path in model_source(checkpoint):
            shutil.copyfile(path, folder / path.name)
        verdict = self.run_export(folder, ctx, started, hide)
        return take_graph(verdict, folder, checkpoint)

    def run_export(
        self,
        folder: Path,
        ctx: EvalContext,
        started: Started | None = None,
        hide: tuple[str, ...] = (),
    ) -> dict | Evaluation:
        """The exporter's verdict on the model's code and config in ``folder`` (its graph written there)."""
        scale = self.scale
        job = {
            "source": "model.py",
            "config": "config.json",
            "rows": scale.eval_batch_rows,
            "seq": scale.seq_len,
            "vocab": scale.vocab_size,
            "device": scale.device,
        }
        return self.run_harness(
            "export", folder, ctx, job, limit_s=scale.eval_limit_s, started=started, hide=hide
        )

    def export_and_score(
        self,
        checkpoint: Path,
        exportdir: Path,
        ctx: EvalContext,
        ready: dict[str, Started] | None = None,
        early: EarlyExport | None = None,
        hide: tuple[str, ...] = (),
    ) -> dict | Evaluation:
        """Export the model of ``checkpoint`` (``export``, in ``exportdir``), then score it
        (``score``): the scorer's verdict, or the failed export's. ``ready``: the harness
        processes started ahead, by role. ``hide``: paths an exporter started here may not read
        (the candidate's folder). ``early``: the export begun during training, whose
        graph is taken when it serves this checkpoint (``EarlyExport.graph_for``: the same code
        and config, so the same graph). An ok verdict says which graph it scored
        (``graph_from_initial``)."""
        ready = ready or {}
        phases.mark("export")
        if sum(path.stat().st_size for path in model_source(checkpoint)) > MAX_MODEL_SOURCE_BYTES:
            return rejected(
                "the checkpoint's code files and config.json hold more than 1 MiB: the exporter "
                "runs them with no clock, so they hold the model's code and its constructor "
                "arguments only (weights belong in model.pt)"
            )
        graph = early.graph_for(checkpoint) if early is not None else None
        if graph is not None:
            made = take_graph(graph, early.folder, checkpoint)
        elif early is not None and early.began:  # its folder holds the initial code and config
            final = exportdir.with_name(exportdir.name + "-final")
            made = self.export(checkpoint, final, ctx, hide=hide)
        else:
            exporter = early.spare() if early is not None else ready.pop("export", None)
            made = self.export(checkpoint, exportdir, ctx, exporter, hide)
        if isinstance(made, Evaluation) or made["status"] != "ok":
            return made
        phases.mark("scoring_start")
        scorer = early.take_scorer() if graph is not None else None  # built ahead from this graph
        score = self.score(checkpoint, ctx, scorer or ready.pop("scoring", None))
        if scorer is not None and scorer.proc.returncode == AHEAD_FAILED:  # ended before its job
            score = self.score(checkpoint, ctx, ready.pop("scoring", None))
        if isinstance(score, dict):
            score["graph_from_initial"] = graph is not None
        return score

    def _train_and_score(
        self,
        workdir: Path,
        ctx: EvalContext,
        evaldir: Path,
        exportdir: Path,
        ready: dict[str, Started],
        early: EarlyExport | None,
        hide: tuple[str, ...],
    ) -> Evaluation:
        checkpoint = workdir / "checkpoint"
        phases.mark("sandbox_start")
        train = self.train(workdir, ctx, early=early)
        if isinstance(train, Evaluation):
            return train
        marks = train.get("marks", {})
        phases.mark_each(
            [
                ("harness_start", train["sandbox"]["started"]),
                ("startup", marks.get("launched")),
                ("warmup", marks.get("first_batch")),
                ("training", marks.get("timed_from")),
                ("checkpoint", marks.get("stopped")),
                ("train_exit", marks.get("saved")),
                ("sandbox_exit", marks.get("reaped")),
            ]
        )
        phases.mark("checkpoint_copy")
        metrics = {
            "steps": train["steps"],
            "tokens": train["tokens"],
            "reported_tokens": train["reported_tokens"],
            "warmup_batches": train["synthetic_batches"],
            "training_s": train["training_s"],
            "startup_s": train["startup_s"],
            "startup_charged_s": train.get("startup_charged_s", 0.0),
            "train_wall_s": train["total_s"],
            "tokens_per_s": train["tokens"] / train["training_s"]
            if train["training_s"] > 0
            else 0.0,
            **{f"reported_{k}": v for k, v in train.get("notes", {}).items()},
        }
        if train.get("unread_tokens") is not None:  # sent ahead, never read: not in ``tokens``
            metrics["unread_tokens"] = train["unread_tokens"]
        for key in ("stop_to_save_s", "save_allowed_s"):  # the save's time and its allowance
            if train.get(key) is not None:
                metrics[key] = train[key]
        artifacts = {"train_log": train.get("log_tail", "")}
        if train["status"] != "ok":
            return protocol.failed(train, metrics=metrics, **artifacts)
        problem = self._copy_checkpoint(checkpoint, evaldir)
        if problem:
            return Evaluation(
                status=EvalStatus.ERROR, metrics=metrics, artifacts={**artifacts, "error": problem}
            )
        if checkpoint_digest(evaldir) != train["checkpoint"].get("digest"):
            return Evaluation(
                status=EvalStatus.REJECTED,
                metrics=metrics,
                artifacts={
                    **artifacts,
                    "error": "the checkpoint changed after the program reported it (the harness "
                    "scores the state saved at the stop)",
                },
            )
        score = self.export_and_score(evaldir, exportdir, ctx, ready, early, hide)
        if isinstance(score, dict):
            phases.mark_each(
                [
                    ("scoring_forward", score.get("marks", {}).get("ready")),
                    ("scoring_check", score.get("marks", {}).get("forwarded")),
                    ("sandbox_exit", score["sandbox"]["exited"]),
                ]
            )
        phases.mark("verdict")
        if isinstance(score, Evaluation):
            return Evaluation(
                status=score.status, metrics=metrics, artifacts={**artifacts, **score.artifacts}
            )
        if score["status"] != "ok":
            return protocol.failed(score, metrics=metrics, **artifacts)
        bpb = float(score["val_bpb"])
        if not math.isfinite(bpb):
            return Evaluation(
                status=EvalStatus.INVALID,
                metrics=metrics,
                artifacts={**artifacts, "error": "val_bpb is not finite"},
            )
        metrics.update(
            {
                "val_bpb": bpb,
                "params": score["params"],
                "eval_s": score["eval_s"],
                "eval_targets": score["targets"],
                "eval_bytes": score["bytes"],
                "max_prefix_diff": score["max_prefix_diff"],
                "max_row_diff": score["max_row_diff"],
                "probe_batches": score["probe_batches"],
                "graph_from_initial": float(score.get("graph_from_initial", False)),
                "graph_built_ahead": float(score["graph_built_ahead"]),
            }
        )
        descriptors = {
            "log10_params": math.log10(max(1, score["params"])),
            "log10_tokens": math.log10(max(1, train["tokens"])),
        }
        artifacts["feedback"] = (
            f"val_bpb {bpb:.4f} after {train['steps']} steps ({train['tokens']:,} tokens, "
            f"{metrics['tokens_per_s']:,.0f} tokens/s in the timed {train['training_s']:.1f}s); "
            f"{score['params']:,} parameters"
        )
        if train.get("profile"):
            artifacts["profile"] = profiling.describe(train["profile"])
            metrics.update(
                {
                    f"reported_profile_{key}": train["profile"][key]
                    for key in (
                        "steps",
                        "seconds",
                        "window_s",
                        "report_s",
                        "step_s_before",
                        "step_s_after",
                    )
                    if key in train["profile"]
                }
            )
        return Evaluation(
            status=EvalStatus.OK,
            fitness=bpb,
            metrics=metrics,
            descriptors=descriptors,
            artifacts=artifacts,
            seeds=(ctx.seed,),
            hardware=ctx.hardware,
        )

    @staticmethod
    def _copy_checkpoint(source: Path, target: Path) -> str | None:
        """Copy model.py, other .py files, config.json and model.pt, each a plain file of its own
        (``plaincopy``: never through a link the training left); return a problem or None."""
        missing = [n for n in ("model.py", "config.json", "model.pt") if not (source / n).is_file()]
        if missing:
            return (
                f"no checkpoint: {', '.join(missing)} missing in checkpoint/; the training program must call "
                "client.save_checkpoint(model, config) after Clock.step() returns False"
            )
        files = checkpoint_files(source)
        if sum(p.stat().st_size for p in files) > MAX_CHECKPOINT_BYTES:
            return "checkpoint is larger than 64 GiB"
        if copy_folder(source, target, is_checkpoint_name) is None:
            return (
                "checkpoint/ and its files must be plain files of the training's own, not links "
                "(symbolic or hard) nor folders: write them with client.save_checkpoint"
            )
        return None


def take_graph(verdict: dict | Evaluation, folder: Path, checkpoint: Path) -> dict | Evaluation:
    """The export's ``verdict``, its graph files copied from ``folder`` next to ``checkpoint``
    when it succeeded (a rejection when it wrote no plain files)."""
    if not isinstance(verdict, dict) or verdict["status"] != "ok" or copy_graph(folder, checkpoint):
        return verdict
    return rejected(
        f"the export wrote no plain files {exported.GRAPH_FILE} and {exported.CONSTANTS_FILE}"
    )


def copy_graph(folder: Path, target: Path) -> bool:
    """Copy the graph files an exporter wrote in ``folder`` into ``target`` (``copy_plain``);
    False when one is not a plain file of its own."""
    return all(
        copy_plain(folder / name, target / name)
        for name in (exported.GRAPH_FILE, exported.CONSTANTS_FILE)
    )


class _TrainingProgress:
    """Tells the log how training goes, from the training harness's progress lines: a full run
    enters the phase ``training`` live at the first (its boundary is set from the clock's marks
    afterwards), then each line is the phase's detail (``phases.detail``, throttled there)."""

    def __init__(self, *, full: bool) -> None:
        self.enter = full

    def __call__(self, line: str) -> None:
        text = protocol.progress_detail(line)
        if text is None:
            return
        if self.enter:
            self.enter = False
            phases.mark("training")
        phases.detail(text)


def model_source(checkpoint: Path) -> list[Path]:
    """The checkpoint's code files and config.json: what the exporter gets (never model.pt)."""
    return [path for path in checkpoint_files(checkpoint) if path.name != "model.pt"]


def rejected(reason: str) -> Evaluation:
    """The evaluation refused by the harness itself (no sandboxed process's verdict), for ``reason``."""
    return Evaluation(status=EvalStatus.REJECTED, artifacts={"error": reason})
