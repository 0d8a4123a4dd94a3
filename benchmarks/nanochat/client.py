"""What a training program may use from the harness: settings, training batches, the step clock, saving.

The training program runs in the sandbox. Its training batches come from the harness
(``train_batches``): synthetic rows of the same shape during the untimed warm-up steps, real
training rows while the harness's clock runs, and none after the stop. It calls
``Clock.step()`` after every optimizer step: that tells the harness a step ended (the
harness times steps with its own clock) and returns False once the budget is spent. Then
it calls ``save_checkpoint`` at once (the harness fixes the checkpoint it scores within
seconds of the stop) and exits. Optionally, before its first step, it calls ``save_initial``
with the same model, config and code files: on a GPU the harness then exports the model's
graph while it trains instead of after the stop (the score is the same). A sketch::

    settings = client.settings()
    client.save_initial(config, code_files=["model.py"])  # optional, before the loop
    batches = client.train_batches(batch_size=32, device=settings.device)
    clock = client.Clock()
    for x, y in batches:  # ends when the harness ends the data, which may come before step() says stop
        ...  # forward, backward, optimizer step
        if not clock.step(tokens=x.numel(), loss=loss.item()):
            break
    client.save_checkpoint(model, config, code_files=["model.py"])
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from evolve.harness.stream import EndOfData, channel

CONFIG_ENV = "NANOCHAT_CONFIG"
CHECKPOINT_FILES = ("model.py", "config.json", "model.pt")
__all__ = [
    "Clock",
    "EndOfData",
    "Settings",
    "save_checkpoint",
    "save_initial",
    "settings",
    "train_batches",
]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The run's fixed settings, chosen by the harness (not the candidate).

    Attributes:
        budget_s: training-loop time budget (harness clock) after the untimed steps.
        untimed_steps: the first steps are not timed (compilation warm-up; synthetic data).
        seq_len: tokens per row the model is evaluated at.
        vocab_size: tokenizer vocabulary; logits must have this last dimension.
        bos_id: id of the BOS token (every document starts with it).
        device: "cuda" or "cpu".
        seed: random seed for this run.
        checkpoint_dir: where ``save_checkpoint`` writes.
        initial_dir: where ``save_initial`` writes.
    """

    budget_s: float
    untimed_steps: int
    seq_len: int
    vocab_size: int
    bos_id: int
    device: str
    seed: int
    checkpoint_dir: str
    initial_dir: str


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


def train_batches(batch_size: int, *, device: str = "cpu") -> Iterator[tuple]:
    """(inputs, targets) int64 tensors of shape (batch_size, seq_len), from the harness, until the stop.

    Rows are BOS-aligned and best-fit packed like the evaluation rows, in an order the
    harness draws from the run's seed. Before the harness's clock starts (the untimed
    warm-up steps) the rows are synthetic: random tokens of the same shape. After the stop
    the iterator ends.
    """
    import torch

    pin = device.startswith("cuda")
    while True:
        try:
            rows = channel().batch(batch_size)
        except EndOfData:
            return
        tensor = torch.from_numpy(rows.astype("int64"))
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
        self._timed_from: float | None = None
        self._stopped = False

    def step(self, tokens: int = 0, loss: float | None = None) -> bool:
        """Record that one optimizer step ended; False means stop now (then save at once).

        Args:
            tokens: training tokens the step used.
            loss: the step's training loss (``loss.item()``); the harness's short run
                compares the first steps' losses with the seed program's.
        """
        self.steps += 1
        going = channel().step(tokens, loss)
        if self.steps == self.untimed_steps:
            self._timed_from = time.monotonic()
        return going

    @property
    def progress(self) -> float:
        """Estimated fraction of the budget spent (0 during the untimed steps)."""
        if self._timed_from is None:
            return 0.0
        return min(1.0, (time.monotonic() - self._timed_from) / self.budget_s)

    def note(self, **values: float) -> None:
        """Send numbers the harness shows as candidate-reported metrics (e.g. peak memory)."""
        channel().note(**values)


def save_checkpoint(model, config: dict, *, code_files: Sequence[str] = ("model.py",)) -> Path:
    """Write the model for the harness: its weights, its constructor config and its code.

    The harness fixes the checkpoint when this returns, then ends the program: make it the
    program's last act, right after the step in flight (the harness allows the stop-to-report
    time a fixed floor, the program's typical step and the write it measures, and rejects a
    later report: ``evolve.harness.savetime``). The
    scorer later runs ``build_model(config)`` from ``model.py`` (the first of ``code_files``;
    the others are copied next to it), loads ``model.pt`` into it and calls ``model(inputs)`` to
    get logits of shape (batch, seq_len, vocab_size).
    """
    import torch

    target = _write_source(Path(settings().checkpoint_dir), config, code_files)
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    torch.save(state, target / "model.pt")
    channel().saved()
    return target


_INITIAL_SAVED: list[Path] = []


def save_initial(config: dict, *, code_files: Sequence[str] = ("model.py",)) -> Path:
    """Optional: declare the model's code and config before the first step.

    Call it once, before the training loop, with the ``config`` and ``code_files`` that
    ``save_checkpoint`` will get. On a GPU the harness then exports the model's graph from
    them while the program trains (the exporter builds ``build_model(config)`` itself and never
    sees any weights; the scorer binds the graph to the final checkpoint's), which saves the
    export after the stop. It uses that graph only when the final checkpoint's code files and
    config.json are byte-identical to these; otherwise it exports after the stop, as without
    this call. The write counts as start-up time; a call once the clock runs is charged as
    training time and ignored; a second call raises.
    """
    if _INITIAL_SAVED:
        raise RuntimeError(
            f"save_initial was already called (it wrote {_INITIAL_SAVED[0]}): call it once, "
            "before the training loop"
        )
    target = _write_source(Path(settings().initial_dir), config, code_files)
    _INITIAL_SAVED.append(target)
    channel().saved_initial()
    return target


def _write_source(target: Path, config: dict, code_files: Sequence[str]) -> Path:
    """model.py (the first of ``code_files``), the others and config.json in ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for index, name in enumerate(code_files):
        shutil.copyfile(name, target / ("model.py" if index == 0 else Path(name).name))
    (target / "config.json").write_text(json.dumps(config))
    return target
