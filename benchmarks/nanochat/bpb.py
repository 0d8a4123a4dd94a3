"""Bits per byte from logits: the harness's own cross-entropy and byte count.

``val_bpb = sum_{targets y with bytes(y) > 0} CE_nats(y) / (ln 2 * sum bytes(y))``, where
bytes(y) is the UTF-8 length of token y and 0 for special tokens (autoresearch's
``evaluate_bpb``). The caller accumulates sums over batches; nothing here trusts the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
