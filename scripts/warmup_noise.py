"""Does a model trained on the harness's random warm-up rows learn worse afterwards? Fixed steps, on CPU.

The nanochat harness gives random tokens during the untimed warm-up steps (the timed-window
rule). This trains the seed's model (``benchmarks/nanochat/seed/model.py``) with the seed's
optimizer settings for the same number of real steps twice, once after ``--noise-steps``
optimizer steps on random rows, and prints the held-out loss at fixed real steps::

    python -m evolve.benchmarks.nanochat.gpu_run --device cpu --tiny --prepare-only --data-dir /tmp/nc
    python scripts/warmup_noise.py /tmp/nc/wikipedia-tiny --layers 4 --width 512 --steps 200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from evolve.benchmarks.nanochat.packing import pack_rows
from evolve.benchmarks.nanochat.tokens import Split

SEED_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "nanochat" / "seed"
CHECKPOINTS = (10, 25, 50, 100, 200, 300, 500)


def rows(split: Split, seq_len: int, seed: int):
    rng = np.random.default_rng(seed)

    def documents():
        while True:
            yield from split.documents(rng.permutation(len(split)))

    return pack_rows(documents(), seq_len + 1)


def train(args, build_model, split: Split, vocab: int, noise_steps: int) -> dict[int, float]:
    """Held-out loss at real steps in CHECKPOINTS, after ``noise_steps`` steps on random rows."""
    torch.manual_seed(0)
    config = dict(vocab_size=vocab, seq_len=args.seq_len, n_layer=args.layers, n_head=4,
                  n_embd=args.width, mlp_ratio=4, init_std=0.02)  # fmt: skip
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    held = torch.from_numpy(
        np.stack([r for r, _ in zip(rows(split, args.seq_len, 99), range(64), strict=False)])
    )
    real, noise, losses = rows(split, args.seq_len, 0), np.random.default_rng(1), {}
    for step in range(noise_steps + args.steps):
        for group in optimizer.param_groups:
            group["lr"] = 1e-3 * min(
                1.0, (step + 1) / 20
            )  # the seed's warm-up, counted from step 0
        if step < noise_steps:
            batch = noise.integers(0, vocab, size=(args.batch, args.seq_len + 1))
        else:
            batch = np.stack([next(real) for _ in range(args.batch)])
        x = torch.from_numpy(batch.astype("int64"))
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, vocab), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 - noise_steps in CHECKPOINTS:
            with torch.no_grad():
                logits = model(held[:, :-1].long()).reshape(-1, vocab)
                losses[step + 1 - noise_steps] = round(
                    F.cross_entropy(logits, held[:, 1:].reshape(-1).long()).item(), 3
                )
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "dataset", type=Path, help="a prepared nanochat dataset (its train/ and dataset.json)"
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200, help="real steps")
    parser.add_argument("--noise-steps", type=int, default=11, help="the scale's untimed steps")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    sys.path.insert(0, str(SEED_DIR))
    from model import build_model

    torch.set_num_threads(1)
    split = Split(args.dataset / "train")
    vocab = int(json.loads((args.dataset / "dataset.json").read_text())["vocab_size"])
    for noise_steps in (0, args.noise_steps):
        losses = train(args, build_model, split, vocab, noise_steps)
        print(
            f"after {noise_steps:2d} steps on random rows: held-out loss at real steps {losses}",
            flush=True,
        )


if __name__ == "__main__":
    main()
