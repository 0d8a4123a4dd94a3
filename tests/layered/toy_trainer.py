"""A tiny training benchmark's probes for the layered stages: they run the harness's probe script sandboxed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolve.harness.fitness import EvalContext, Limits, run_sandboxed, sandbox_failure
from evolve.types import EvalStatus, Evaluation

SCRIPT = Path(__file__).with_name("probe_script.py")
SEED = {
    "model.py": '''"""A causal next-token model: embeddings, a causal running mean, an MLP head."""
import torch

WIDTH = 32
LR = 0.03


class Net(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, WIDTH)
        self.head = torch.nn.Sequential(torch.nn.Linear(2 * WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Linear(WIDTH, vocab))

    def forward(self, x):
        h = self.embed(x)
        steps = torch.arange(1, x.shape[1] + 1, device=x.device).view(1, -1, 1)
        context = h.cumsum(1) / steps  # mean of the tokens so far: causal
        return self.head(torch.cat([h, context], -1))


def build(vocab):
    return Net(vocab)


def optimizer(net):
    return torch.optim.Adam(net.parameters(), lr=LR)
''',
}


def _probe(workdir: Path, ctx: EvalContext, args: list[str]) -> dict | Evaluation:
    result = run_sandboxed(
        [sys.executable, str(SCRIPT), *args],
        cwd=workdir,
        limits=Limits(timeout_s=ctx.timeout_s, memory_bytes=None),
        env=ctx.env(),
    )
    failure = sandbox_failure(result, "probe")
    if failure is not None:
        return failure
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    if not lines:
        return Evaluation(
            status=EvalStatus.ERROR,
            artifacts={"error": "the probe printed no result", "output": result.tail()},
        )
    return json.loads(lines[-1][len("PROBE ") :])


def local_probe(workdir: Path, ctx: EvalContext) -> dict | Evaluation:
    return _probe(workdir, ctx, ["local"])


def train_probe(workdir: Path, ctx: EvalContext, steps: int) -> list[float] | Evaluation:
    values = _probe(workdir, ctx, ["train", str(steps)])
    return values if isinstance(values, Evaluation) else values["losses"]
