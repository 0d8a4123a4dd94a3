"""What a training program may use from the harness: settings, training batches, the step clock, saving.

The training program runs in the sandbox with only the training split. It calls
``Clock.step()`` after every optimizer step: that tells the harness a step ended (the
harness times steps with its own clock) and returns False once the harness says the
budget is spent. Then it calls ``save_checkpoint`` and exits. A sketch::

    settings = client.settings()
    batches = client.train_batches(batch_size=32, device=settings.device)
    clock = client.Clock()
    while True:
        x, y = next(batches)
        ...  # forward, backward, optimizer step
        if not clock.step(tokens=x.numel(), loss=loss.item()):
            break
    client.save_checkpoint(model, config, code_files=["model.py"])
"""

from __future__ import annotations

import json
import os
import select
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from evolve.benchmarks.nanochat.packing import pack_batches
from evolve.benchmarks.nanochat.tokens import Split

CONFIG_ENV = "NANOCHAT_CONFIG"
REPORT_FD_ENV = "NANOCHAT_REPORT_FD"
CONTROL_FD_ENV = "NANOCHAT_CONTROL_FD"
CHECKPOINT_FILES = ("model.py", "config.json", "model.pt")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The run's fixed settings, chosen by the harness (not the candidate).

    Attributes:
        budget_s: training-loop time budget (harness clock) after the untimed steps.
        untimed_steps: the first steps are not timed (compilation warm-up).
        seq_len: tokens per row the model is evaluated at.
        vocab_size: tokenizer vocabulary; logits must have this last dimension.
        bos_id: id of the BOS token (every document starts with it).
        device: "cuda" or "cpu".
        seed: random seed for this run.
        train_dir: the training split (the only data this process may read).
        checkpoint_dir: where ``save_checkpoint`` writes.
    """

    budget_s: float
    untimed_steps: int
    seq_len: int
    vocab_size: int
    bos_id: int
    device: str
    seed: int
    train_dir: str
    checkpoint_dir: str


CONFIG_KEYS = (*Settings.__dataclass_fields__, "forbidden")
"""What the harness passes in CONFIG_ENV: the settings and the guard's forbidden paths."""


def settings() -> Settings:
    """The settings the harness passed to this process."""
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        raise RuntimeError(
            f"{CONFIG_ENV} is not set: run this program through the nanochat harness"
        )
    data = json.loads(raw)
    return Settings(**{k: data[k] for k in Settings.__dataclass_fields__})


def train_batches(
    batch_size: int, *, device: str = "cpu", seed: int | None = None
) -> Iterator[tuple]:
    """Endless (inputs, targets) int64 tensors of shape (batch_size, seq_len), BOS-aligned best-fit packed.

    Documents are visited in a random order per epoch (seeded); rows follow the
    original's packing rule, so training rows look like the evaluation rows.
    """
    import torch

    cfg = settings()
    split = Split(Path(cfg.train_dir))
    rng = np.random.default_rng(cfg.seed if seed is None else seed)

    def documents() -> Iterator[np.ndarray]:
        while True:
            yield from split.documents(rng.permutation(len(split)))

    pin = device.startswith("cuda")
    for rows in pack_batches(documents(), batch_size, cfg.seq_len):
        tensor = torch.from_numpy(rows)
        if pin:
            tensor = tensor.pin_memory()
        tensor = tensor.to(device, non_blocking=pin)
        yield tensor[:, :-1], tensor[:, 1:]


class Clock:
    """Reports step ends to the harness and learns when to stop.

    ``progress`` is this process's own estimate of the fraction of the budget spent
    (for learning-rate schedules); the harness's clock is the one that counts.
    """

    def __init__(self) -> None:
        cfg = settings()
        self.budget_s = cfg.budget_s
        self.untimed_steps = cfg.untimed_steps
        self.steps = 0
        self._report = int(os.environ[REPORT_FD_ENV])
        self._control = int(os.environ[CONTROL_FD_ENV])
        self._timed_from: float | None = None
        self._stopped = False

    def _send(self, line: str) -> None:
        os.write(self._report, (line + "\n").encode())

    def step(self, tokens: int = 0, loss: float | None = None) -> bool:
        """Record that one optimizer step ended; False means stop now.

        Args:
            tokens: training tokens the step used.
            loss: the step's training loss (``loss.item()``); the harness's short run
                compares the first steps' losses with the seed program's.
        """
        self.steps += 1
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the step ends when the GPU is done, not when it was queued
        report = f"step {self.steps} {int(tokens)}"
        self._send(report if loss is None else f"{report} {float(loss)!r}")
        if self.steps == self.untimed_steps:
            self._timed_from = time.monotonic()
        if not self._stopped and select.select([self._control], [], [], 0)[0]:
            self._stopped = bool(os.read(self._control, 1))
        return not self._stopped

    @property
    def progress(self) -> float:
        """Estimated fraction of the budget spent (0 during the untimed steps)."""
        if self._timed_from is None:
            return 0.0
        return min(1.0, (time.monotonic() - self._timed_from) / self.budget_s)

    def note(self, **values: float) -> None:
        """Send numbers the harness shows as candidate-reported metrics (e.g. peak memory)."""
        self._send("note " + json.dumps({k: float(v) for k, v in values.items()}))


def save_checkpoint(model, config: dict, *, code_files: Sequence[str] = ("model.py",)) -> Path:
    """Write the model for the harness: its weights, its constructor config and its code.

    The harness's scorer later runs ``build_model(config)`` from ``model.py`` (the first of
    ``code_files``; the others are copied next to it), loads ``model.pt`` into it and calls
    ``model(inputs)`` to get logits of shape (batch, seq_len, vocab_size).
    """
    import torch

    target = Path(settings().checkpoint_dir)
    target.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(code_files):
        shutil.copyfile(name, target / ("model.py" if index == 0 else Path(name).name))
    (target / "config.json").write_text(json.dumps(config))
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    torch.save(state, target / "model.pt")
    return target
