"""The benchmark's scales: the original's constants for one GPU, and a small CPU scale.

``nanochat`` keeps autoresearch's constants (300 s budget, 2048-token rows, vocab 8192,
40 x 524288 = 20,971,520 evaluation targets). ``cpu`` is a tiny version that runs anywhere
in about 30-40 s per evaluation on two cores, on a dataset built offline from Python's standard
library. ``auto`` picks ``nanochat`` when CUDA is available, else ``cpu``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, kw_only=True)
class Scale:
    """Every constant of one scale of the benchmark.

    Attributes:
        name: scale name.
        device: "cuda" or "cpu".
        dataset: prepared dataset name (a folder of the data directory); "stdlib" is built automatically.
        vocab_size: tokenizer vocabulary the dataset must have.
        seq_len: tokens per row (the model sees seq_len inputs, predicts seq_len targets).
        budget_s: training-loop seconds (harness clock) after the untimed steps.
        untimed_steps: steps not timed at the start (compile warm-up, synthetic data), 11 =
            steps 0..10 as in the original.
        startup_limit_s: wall limit from process start to the end of the untimed steps.
        free_startup_s: the compile allowance: start-up (process start to the end of the
            untimed steps) allowed for free, in absolute seconds; the excess is taken off the
            training budget.
        finish_limit_s: wall limit after the budget for the last step and the checkpoint.
        save_floor_s: the fixed part of the time the checkpoint may be reported after the
            stop; the harness adds the program's typical step (at most as much again) and,
            for a large checkpoint, the write it measures (``evolve.harness.savetime``).
            What is scored is the state at the stop, so the rest is training time it rejects.
        eval_tokens: validation targets scored (a multiple of seq_len * eval_batch_rows).
        eval_batch_rows: rows per evaluation batch (fixed by the harness, not the candidate).
        eval_limit_s: wall limit of the whole evaluation process.
        causal_atol: largest allowed logit change in the causality check.
        probe_batches: causality probes sent among the scored batches.
        memory_gb: address-space limit per sandboxed process (None: no limit, needed with CUDA).
        threads: CPU cores per evaluation: each sandboxed process runs on this many of its
            slot's cores, held there by the kernel (``Limits.cores``, ``evolve.sandbox.cores``), and
            OMP_NUM_THREADS follows; so a candidate gains nothing from more threads or
            processes, and evaluations side by side do not share a core. None: the slot's cores.
        seed_dir: the seed program for this scale.
        params_range: log10 range of the parameter-count descriptor.
        tokens_range: log10 range of the tokens-processed descriptor.
    """

    name: str
    device: str
    dataset: str
    vocab_size: int
    seq_len: int
    budget_s: float
    untimed_steps: int = 11
    startup_limit_s: float
    free_startup_s: float
    finish_limit_s: float
    save_floor_s: float
    eval_tokens: int
    eval_batch_rows: int
    eval_limit_s: float
    causal_atol: float
    probe_batches: int = 4
    memory_gb: float | None
    threads: int | None = None
    seed_dir: Path
    params_range: tuple[float, float]
    tokens_range: tuple[float, float]

    def __post_init__(self) -> None:
        per_batch = self.seq_len * self.eval_batch_rows
        if self.eval_tokens % per_batch:
            raise ValueError(
                f"scale {self.name!r}: eval_tokens ({self.eval_tokens}) must be a multiple of "
                f"seq_len * eval_batch_rows ({per_batch})"
            )
        if self.eval_batch_rows < 2:
            raise ValueError(
                f"scale {self.name!r}: eval_batch_rows must be at least 2 (causality check)"
            )

    @property
    def train_limit_s(self) -> float:
        """Wall limit of the whole training sandbox."""
        return self.startup_limit_s + self.budget_s + self.finish_limit_s + 30.0

    def describe(self) -> str:
        return (
            f"scale {self.name}: {self.device}, dataset {self.dataset}, vocab {self.vocab_size}, "
            f"seq {self.seq_len}, budget {self.budget_s:g}s, eval {self.eval_tokens:,} tokens "
            f"in batches of {self.eval_batch_rows} rows"
        )


SCALES = {
    "nanochat": Scale(
        name="nanochat",
        device="cuda",
        dataset="climbmix",
        vocab_size=8192,
        seq_len=2048,
        budget_s=300.0,
        startup_limit_s=240.0,
        free_startup_s=120.0,
        finish_limit_s=60.0,
        save_floor_s=2.0,
        eval_tokens=40 * 524288,
        eval_batch_rows=32,
        eval_limit_s=600.0,
        causal_atol=5e-2,
        memory_gb=None,
        seed_dir=HERE / "seed",
        params_range=(6.5, 9.0),
        tokens_range=(7.5, 10.5),
    ),
    "cpu": Scale(
        name="cpu",
        device="cpu",
        dataset="stdlib",
        vocab_size=2048,
        seq_len=128,
        budget_s=15.0,
        startup_limit_s=120.0,
        free_startup_s=30.0,
        finish_limit_s=15.0,
        save_floor_s=0.5,
        eval_tokens=32768,
        eval_batch_rows=16,
        eval_limit_s=120.0,
        causal_atol=1e-3,
        probe_batches=2,
        memory_gb=12.0,
        threads=1,
        seed_dir=HERE / "seed",
        params_range=(4.5, 7.5),
        tokens_range=(4.0, 7.0),
    ),
}


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def resolve(name: str = "auto", **overrides) -> Scale:
    """The scale called ``name`` ("auto": nanochat with CUDA, else cpu) with ``overrides`` applied.

    Overrides whose value is None are ignored, so config keys can default to null.
    """
    if name == "auto":
        name = "nanochat" if cuda_available() else "cpu"
    if name not in SCALES:
        raise ValueError(f"nanochat scale {name!r} not found; available: auto, {', '.join(SCALES)}")
    known = {f.name for f in fields(Scale)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(
            f"unknown nanochat scale settings {sorted(unknown)}; known: {sorted(known)}"
        )
    chosen = {k: v for k, v in overrides.items() if v is not None}
    for key in ("params_range", "tokens_range"):
        if key in chosen:
            chosen[key] = tuple(chosen[key])
    if "seed_dir" in chosen:
        chosen["seed_dir"] = Path(chosen["seed_dir"])
    return replace(SCALES[name], **chosen)
