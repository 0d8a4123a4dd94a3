"""Train a GPT for the harness's time budget with AdamW; the harness then scores the saved model.

Run by the nanochat harness (never directly): it passes the settings, owns the clock and
the validation data, and computes val_bpb itself from the checkpoint this program saves.
"""

import math
import time

import torch
import torch.nn.functional as F
from evolve.benchmarks.nanochat import client
from model import build_model

settings = client.settings()
torch.manual_seed(settings.seed)
GPU = settings.device == "cuda"  # one program for both scales: a few sizes differ

# EVOLVE-BLOCK-START
# Hyperparameters: the first number of a pair is the GPU scale's (one H200/H100, 2048-token rows,
# vocab 8192), the second the CPU scale's (a few cores, 128-token rows, vocab 2048, 15 s).
N_LAYER = 8 if GPU else 2
N_HEAD = 8 if GPU else 4
N_EMBD = 512 if GPU else 128
MLP_RATIO = 4
INIT_STD = 0.02
DEVICE_BATCH = 64 if GPU else 8  # rows per forward/backward
GRAD_ACCUM = 4 if GPU else 1  # micro-batches per optimizer step (GPU: 64 * 4 * 2048 = 2^19 tokens)
LR = 0.001
WEIGHT_DECAY = 0.1
BETA1 = 0.9
BETA2 = 0.95
WARMUP_STEPS = 20 if GPU else 10
WARMDOWN = 0.5  # fraction of the budget at the end over which the learning rate decays to 0
GRAD_CLIP = 1.0
# EVOLVE-BLOCK-END

device = settings.device
use_amp = device == "cuda"
if use_amp:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
config = dict(
    vocab_size=settings.vocab_size,
    seq_len=settings.seq_len,
    n_layer=N_LAYER,
    n_head=N_HEAD,
    n_embd=N_EMBD,
    mlp_ratio=MLP_RATIO,
    init_std=INIT_STD,
)
model = build_model(config).to(device)
# optional, before the first step and untimed: the harness exports the model's graph from this
# while the program trains (the final checkpoint's weights are bound to it after the stop)
client.save_initial(config, code_files=["model.py"])
betas = (min(BETA1, 0.999), min(BETA2, 0.9999))  # Adam needs betas below 1, whatever the block says


def lr_scale(step: int, progress: float) -> float:
    """Linear warm-up over WARMUP_STEPS steps, flat, then linear decay to 0 over the last WARMDOWN of the budget."""
    warm = min(1.0, (step + 1) / max(WARMUP_STEPS, 1))
    decay = min(1.0, (1.0 - progress) / max(WARMDOWN, 1e-6))
    return warm * max(decay, 0.0)


# EVOLVE-BLOCK-START
def make_optimizer(model):
    """AdamW over all parameters."""
    return torch.optim.AdamW(
        model.parameters(), lr=LR, betas=betas, weight_decay=WEIGHT_DECAY, fused=use_amp
    )


def loss_of(model, x, y):
    """Mean next-token cross-entropy of a batch (bf16 autocast on GPU)."""
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
        logits = model(x)
    return F.cross_entropy(
        logits.float().reshape(y.numel(), settings.vocab_size), y.reshape(y.numel())
    )


# EVOLVE-BLOCK-END


optimizer = make_optimizer(model)
train_model = torch.compile(model) if use_amp else model
batches = client.train_batches(DEVICE_BATCH, device=device)
clock = client.Clock()
step, started = 0, time.monotonic()
warmup = settings.untimed_steps  # random tokens from the harness: compile on them, learn nothing
while True:
    for group in optimizer.param_groups:
        group["lr"] = LR * lr_scale(max(step - warmup, 0), clock.progress)
    # an untimed step compiles on one micro-batch: the rest would be thrown away, off the clock
    micro = [next(batches, None) for _ in range(GRAD_ACCUM if step >= warmup else 1)]
    if any(batch is None for batch in micro):  # the harness ended the data: the budget is spent
        break
    for x, y in micro:
        loss = loss_of(train_model, x, y)
        (loss / GRAD_ACCUM).backward()
    if GRAD_CLIP > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    if step >= warmup:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    if step % 25 == 0 or step <= 3:
        print(
            f"step {step} loss {loss.item():.4f} progress {clock.progress:.3f} "
            f"elapsed {time.monotonic() - started:.1f}s",
            flush=True,
        )
    if not math.isfinite(loss.item()):
        raise SystemExit(f"loss is {loss.item()} at step {step}; training diverged")
    if not clock.step(tokens=len(micro) * x.numel(), loss=loss.item()):
        break

if device == "cuda":
    clock.note(peak_mem_gb=torch.cuda.max_memory_allocated() / 1e9)
print(f"trained {step} steps in {time.monotonic() - started:.1f}s; saving the checkpoint", flush=True)
# the program's last act: once the checkpoint is in, the harness ends the program
client.save_checkpoint(model, config, code_files=["model.py"])
