"""A toy fitness that changes a harness file at its N-th evaluation (someone edits it mid-run)."""

from __future__ import annotations

from pathlib import Path

from evolve.harness.fitness import EvalContext
from evolve.types import Evaluation
from tests.fixtures.toy import Toy


class TamperingToy(Toy):
    """The toy; at evaluation number ``at`` (counted in the file ``counter``) it appends to ``harness``."""

    def __init__(self, *, harness: str, counter: str, at: int = 5, sleep_s: float = 0.0) -> None:
        super().__init__(sleep_s=sleep_s)
        self.harness, self.counter, self.at = harness, counter, at

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        counter = Path(self.counter)
        count = int(counter.read_text() or 0) + 1 if counter.exists() else 1
        counter.write_text(str(count))
        if count == self.at:
            with open(self.harness, "a") as handle:
                handle.write("\n# changed mid-run\n")
        return super().evaluate(workdir, ctx)
