"""The language-model scorer's arithmetic: cross-entropy and bytes from logits, causality and row-independence probes.

``val_bpb = sum_{targets y with bytes(y) > 0} CE_nats(y) / (ln 2 * sum bytes(y))``, where
bytes(y) is the UTF-8 length of token y and 0 for special tokens (autoresearch's
``evaluate_bpb``). The caller accumulates sums over batches; nothing here trusts the model.

Causality is checked with probe batches that look like scored batches (same shape, same
rows): a probe is a copy of a scored batch with some rows' futures replaced after a cut and
all rows shuffled. A causal model whose rows are independent gives the same logits as on the
scored batch for every position before a cut and for every untouched row. Cuts are drawn
from the caller's (secret) randomness, stratified so that over an evaluation they cover
every position range; the caller sends probes among the scored batches in random order.

The model runs in a child process that never holds a target; it hands its logits back
through a buffer the scorer allocates and shares (``shared_logits``).
"""

from __future__ import annotations

import math
import mmap
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class BpbSums:
    """Running sums over scored targets."""

    nats: float = 0.0
    bytes: int = 0
    targets: int = 0

    def add(self, nats: float, n_bytes: int, targets: int) -> None:
        self.nats += nats
        self.bytes += n_bytes
        self.targets += targets

    @property
    def bpb(self) -> float:
        """Bits per byte; raises when no byte was scored."""
        if self.bytes <= 0:
            raise ValueError("no target with a non-zero byte count was scored")
        return self.nats / (math.log(2) * self.bytes)


def target_nats(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy in nats of each target under ``logits`` (computed in float32).

    Args:
        logits: (..., V) unnormalised scores.
        targets: (...) token ids.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def batch_sums(
    logits: torch.Tensor, targets: torch.Tensor, token_bytes: torch.Tensor
) -> tuple[float, int, int]:
    """(nats, bytes, counted targets) of one batch, skipping targets whose byte count is 0."""
    nats = target_nats(logits, targets)
    n_bytes = token_bytes[targets]
    mask = n_bytes > 0
    return float(nats[mask].double().sum()), int(n_bytes.sum()), int(mask.sum())


@dataclass(frozen=True)
class Probe:
    """A probe batch derived from scored batch ``base``.

    Attributes:
        base: index of the scored batch it copies.
        rows: (B, T+1) tokens: the base's rows, shuffled, some with another future.
        order: ``rows[i]`` comes from the base's row ``order[i]``.
        cuts: ``cuts[i]`` is the first changed input position of ``rows[i]`` (T+1: untouched).
    """

    base: int
    rows: np.ndarray
    order: tuple[int, ...]
    cuts: tuple[int, ...]


def stratified_cuts(count: int, seq_len: int, rng: np.random.Generator) -> list[int]:
    """``count`` cut positions in [1, seq_len - 1], one per equal stratum, in random order."""
    span = seq_len - 1
    cuts = [1 + min(span - 1, int((i + rng.random()) * span / count)) for i in range(count)]
    rng.shuffle(cuts)
    return cuts


def make_probes(
    batches: Sequence[np.ndarray], spare: np.ndarray, count: int, rng: np.random.Generator
) -> list[Probe]:
    """``count`` probes of randomly chosen ``batches`` (rows of T+1 tokens), futures from ``spare``.

    The bases are drawn without replacement, in rounds: every batch is some probe's base
    before any is again (so ``count >= len(batches)`` covers them all). In each probe about
    half of the rows (at least one) get another future after their cut: the tokens of a spare
    row from the cut on, so the input changes at the cut. The rows are then shuffled, so a
    model whose output depends on a row's place or on other rows shows it.
    """
    n_rows, width = batches[0].shape
    changed = max(1, n_rows // 2)
    cuts = iter(stratified_cuts(count * changed, width - 1, rng))
    rounds = math.ceil(count / len(batches))
    bases = np.concatenate([rng.permutation(len(batches)) for _ in range(rounds)])[:count]
    probes = []
    for base in map(int, bases):
        rows = batches[base].copy()
        row_cuts = [width] * n_rows
        for row in rng.choice(n_rows, size=changed, replace=False):
            cut = next(cuts)
            future = spare[int(rng.integers(len(spare)))]
            rows[row, cut:] = future[cut:]
            if (rows[row, cut:] == batches[base][row, cut:]).all():  # same text: shift it by one
                rows[row, cut:] = np.roll(future, 1)[cut:]
            row_cuts[row] = cut
        order = rng.permutation(n_rows)
        probes.append(
            Probe(
                base=base,
                rows=rows[order],
                order=tuple(int(i) for i in order),
                cuts=tuple(row_cuts[i] for i in order),
            )
        )
    return probes


def probe_diffs(base: torch.Tensor, probed: torch.Tensor, probe: Probe) -> tuple[float, float]:
    """(largest change before a cut, largest change in an untouched row) between two logit batches.

    ``base`` holds the logits (B, T, V) of the scored batch, ``probed`` those of the probe.
    Position t's logits see inputs 0..t, so they must not change for t < cut.
    """
    prefix = rows = 0.0
    for i, (source, cut) in enumerate(zip(probe.order, probe.cuts, strict=True)):
        got, want = probed[i].float(), base[source].float()
        if cut >= got.shape[0]:
            rows = max(rows, float((got - want).abs().max()))
        else:
            prefix = max(prefix, float((got[:cut] - want[:cut]).abs().max()))
    return prefix, rows


def perturb_(model: torch.nn.Module, generator: torch.Generator, scale: float = 0.02) -> None:
    """Add noise to every floating-point parameter of ``model``, in place (buffers, e.g. masks, kept).

    Noise of each tensor's own spread (at least ``scale``), so that zero-initialised layers
    (a common recipe for output projections) come alive and a local causality probe of a
    fresh model sees the paths that training will open. Each value moves by at least that
    spread (a normal draw's magnitude floored at 1): a zero-initialised scalar gate drawn
    near zero would otherwise hide what is behind it from the probe now and then. A scalar
    (a gate, a residual weight: training moves them by order 1) moves by at least 1: a gate
    at zero in front of the next token's embedding, opened to 0.02, changed bf16 logits by
    0.041, under the GPU scale's tolerance of 0.05, and passed the local check on the H200.
    """
    with torch.no_grad():
        for tensor in model.parameters():
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            spread = float(tensor.float().std()) if tensor.numel() > 1 else 1.0
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            noise = noise.sign() * noise.abs().clamp(min=1.0)
            tensor.add_((noise * max(spread, scale)).to(tensor.device, tensor.dtype))


def shared_logits(
    shape: tuple[int, ...], device: str, memory_file: int | None = None
) -> tuple[torch.Tensor, dict, tuple[int, ...]]:
    """A float32 buffer of ``shape`` that a child process writes logits into, without a copy between them.

    Returns the buffer, the handle the child opens it with (``open_shared_logits``) and the
    file descriptors to pass to the child. On CUDA the buffer is device memory shared by
    CUDA IPC handle (PyTorch's ``torch.multiprocessing`` reduction: the child maps this
    process's allocation); elsewhere an anonymous memory file both processes map
    (``memory_file``: one made by ``os.memfd_create`` and passed to a child started before
    the shape was known; it is sized here). The buffer is allocated here, so this process
    only ever sends a handle, never unpickles one.
    """
    if device.startswith("cuda"):
        from torch.multiprocessing.reductions import reduce_tensor

        buffer = torch.empty(shape, dtype=torch.float32, device=device)
        return buffer, {"cuda": pickle.dumps(reduce_tensor(buffer)).hex()}, ()
    size = 4 * math.prod(shape)
    fd = os.memfd_create("logits") if memory_file is None else memory_file
    os.ftruncate(fd, size)
    buffer = torch.frombuffer(mmap.mmap(fd, size), dtype=torch.float32).view(shape)
    return buffer, {"fd": fd, "shape": list(shape)}, (fd,)


def open_shared_logits(handle: dict) -> torch.Tensor:
    """The child's view of a buffer made by ``shared_logits`` (a handle from the harness only: it is unpickled)."""
    if "cuda" in handle:
        rebuild, args = pickle.loads(bytes.fromhex(handle["cuda"]))
        return rebuild(*args)
    size = 4 * math.prod(handle["shape"])
    return torch.frombuffer(mmap.mmap(handle["fd"], size), dtype=torch.float32).view(
        handle["shape"]
    )
