"""What each evaluation is handed, and the harness it is scored by: a candidate's ``Job``.

A job's seed is a pure function of the run's seed and the candidate's ``seq`` (extra
samples under noise or audit derive theirs from it, ``evolve.archive.noise``), so a replay hands
out the same jobs. The harness files' hash is taken when the run starts; ``check_harness``
refuses to go on once they differ, since scores made by another harness are not comparable.
"""

from __future__ import annotations

import hashlib

from evolve.archive import noise
from evolve.harness.fitness import Benchmark
from evolve.types import Candidate, EvolveError, Job


class HarnessChanged(EvolveError):
    """The benchmark's harness files changed during the run."""


def eval_seed(seed: int, seq: int) -> int:
    """The evaluation seed handed to the fitness for candidate ``seq``: a hash, like the seeds of
    its extra samples (a seed that grew with ``seq`` would tell a program its first evaluation
    from a re-evaluation)."""
    digest = hashlib.sha256(f"evaluation:{seed}:{seq}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**31)


class Jobs:
    """The jobs of one run (``benchmark`` under the run's ``seed``), its harness as at the start."""

    def __init__(self, benchmark: Benchmark, seed: int) -> None:
        self.benchmark, self.seed = benchmark, seed
        self.harness_hash = benchmark.harness_hash()

    def check_harness(self, *, started: str | None = None) -> None:
        """Raise HarnessChanged if the harness files differ from the run's (or from ``started``)."""
        name, now = self.benchmark.name, self.benchmark.harness_hash()
        if started and started != now:
            raise HarnessChanged(
                f"the harness files of benchmark {name!r} differ from those the run started "
                f"with (hash {started[:12]}, now {now[:12]}); restore them to resume, or start a new run"
            )
        if now != self.harness_hash:
            raise HarnessChanged(
                f"the harness files of benchmark {name!r} changed during the run; "
                "restore them (the run's hash is in the runs table) or start a new run"
            )

    def job(self, candidate: Candidate, sample: int = 0, *, strict: bool = False) -> Job:
        """The evaluation of ``candidate`` (``sample`` > 0: its extra samples under noise or audit;
        ``strict``: the auditor's stricter mode, ``EvalContext.strict``)."""
        seed = eval_seed(self.seed, candidate.seq)
        if sample:
            seed = noise.reevaluation_seed(seed, sample)
        return Job(
            candidate_id=candidate.id,
            files=dict(candidate.files),
            seed=seed,
            timeout_s=self.benchmark.timeout_s,
            strict=strict,
        )
