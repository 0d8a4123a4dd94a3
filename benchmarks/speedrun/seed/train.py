"""Seed program of the speedrun: a GPT-2-small-style transformer trained with AdamW.

Run by the harness on each GPU through torchrun (or plain python for one process). The
harness gives: EVOLVE_SEED, SPEEDRUN_PRESET (which size of the benchmark), SPEEDRUN_VOCAB_SIZE,
the clock, and the training tokens through speedrun_clock.tokens (random tokens before
the clock starts, the real stream while it runs). The program
trains and calls speedrun_clock.start / stop around the timed part; the harness then
evaluates the weights that stop() saved, through build_model(). It never validates.
Two EVOLVE-BLOCKs hold what may change: the model and hyperparameters, and the training
step and loop; the data reader between them stays as it is (the token stream is fixed).
"""

import contextlib
import copy
import json
import math
import os
import time

import numpy as np
import speedrun_clock
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# EVOLVE-BLOCK-START
# Each preset: the model, the batch and steps, the optimiser schedule, compilation.
# tiny, for tests on CPU (512-token vocabulary): seconds
CPU = (
    dict(n_layer=2, n_head=2, n_embd=64, block_size=64, seq_len=64)
    | dict(micro_batch=16, total_batch=1024, steps=150)
    | dict(lr=3e-3, warmup_steps=10, cooldown_frac=0.3, weight_decay=0.0)
    | dict(compile=0, compile_warmup_steps=0)
)
# one H200: GPT-2 small on a 2^17-token batch, 820 steps = 252 s of training (measured)
GPU1 = (
    dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, seq_len=1024)
    | dict(micro_batch=32, total_batch=131072, steps=820)
    | dict(lr=1e-3, warmup_steps=30, cooldown_frac=0.4, weight_decay=0.1)
    | dict(compile=1, compile_warmup_steps=3)
)
# the original scale: GPT-2 small, 2^19-token batch, 8 GPUs (llm.c's GPT-2 124M recipe)
FULL = (
    GPU1
    | dict(micro_batch=64, total_batch=524288, steps=19000)
    | dict(lr=6e-4, warmup_steps=700, cooldown_frac=0.5)
)
PRESETS = {"cpu": CPU, "gpu1": GPU1, "full": FULL}
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
INIT_STD = 0.02


def preset() -> dict:
    """The hyperparameters of the benchmark size the harness asked for."""
    config = dict(PRESETS[os.environ.get("SPEEDRUN_PRESET", "cpu")])
    config.update(json.loads(os.environ.get("SPEEDRUN_OVERRIDES") or "{}"))
    config["vocab_size"] = int(os.environ.get("SPEEDRUN_VOCAB_SIZE", "50257"))
    return config


class Attention(nn.Module):
    """Causal multi-head self-attention."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: attention then a 4x GELU MLP, each with a residual."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = Attention(n_embd, n_head)
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.out = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2: learned positions, tied input/output embeddings, vocabulary padded to 64."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        padded = (vocab_size + 63) // 64 * 64
        self.wte = nn.Embedding(padded, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, padded, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                scale = (
                    1 / math.sqrt(2 * n_layer)
                    if name.endswith(("attn.proj.weight", "out.weight"))
                    else 1.0
                )
                nn.init.normal_(p, mean=0.0, std=INIT_STD * scale)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model() -> nn.Module:
    """The model for this preset (the harness builds it this way to evaluate checkpoints)."""
    c = preset()
    return GPT(c["vocab_size"], c["block_size"], c["n_layer"], c["n_head"], c["n_embd"])


def make_optimizer(model: nn.Module, c: dict) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": c["weight_decay"]},
        {"params": other, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=c["lr"], betas=BETAS, fused=torch.cuda.is_available())


def lr_at(step: int, c: dict) -> float:
    """Linear warm-up, constant, then linear cool-down to zero over the last cooldown_frac."""
    if step < c["warmup_steps"]:
        return c["lr"] * (step + 1) / c["warmup_steps"]
    cooldown = int(c["steps"] * c["cooldown_frac"])
    return c["lr"] * min(1.0, (c["steps"] - step) / max(1, cooldown))


# EVOLVE-BLOCK-END


class Batches:
    """Sequential (input, target) batches of the harness's token stream, each rank its own slice."""

    def __init__(self, micro_batch: int, seq_len: int, rank: int, world: int):
        self.b, self.t, self.rank, self.world = micro_batch, seq_len, rank, world
        self.reset()

    def reset(self) -> None:
        self.pos = 0

    def next(self, device: str) -> tuple[torch.Tensor, torch.Tensor]:
        span = self.b * self.t
        tokens = speedrun_clock.tokens(self.pos + self.rank * span, span + 1)
        chunk = torch.from_numpy(tokens.astype(np.int64))
        self.pos += span * self.world
        x, y = chunk[:-1].view(self.b, self.t), chunk[1:].view(self.b, self.t)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


# EVOLVE-BLOCK-START
def train_step(model, optimizer, batches, step, accum, c, device) -> torch.Tensor:
    """One optimizer step over ``accum`` micro-batches; returns the mean training loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, c)
    total = torch.zeros((), device=device)
    for micro in range(accum):
        x, y = batches.next(device)
        sync = not isinstance(model, DistributedDataParallel) or micro == accum - 1
        context = contextlib.nullcontext() if sync else model.no_sync()
        with (
            context,
            torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device != "cpu"),
        ):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1)) / accum
            loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def main() -> None:
    c = preset()
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = f"cuda:{local}" if torch.cuda.is_available() else "cpu"
    if device != "cpu":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(int(os.environ.get("EVOLVE_SEED", "0")))
    accum = c["total_batch"] // (c["micro_batch"] * c["seq_len"] * world)
    assert accum >= 1 and accum * c["micro_batch"] * c["seq_len"] * world == c["total_batch"], (
        "batch does not split"
    )
    batches = Batches(c["micro_batch"], c["seq_len"], rank, world)

    raw = build_model().to(device)
    model = torch.compile(raw) if c["compile"] and device != "cpu" else raw
    if distributed:
        model = DistributedDataParallel(model, device_ids=[local] if device != "cpu" else None)
    optimizer = make_optimizer(raw, c)

    if c["compile_warmup_steps"]:  # compile outside the clock, then undo the steps
        speedrun_clock.warmup_begin(raw, optimizer)
        saved_model = {k: v.clone() for k, v in raw.state_dict().items()}
        saved_opt = copy.deepcopy(optimizer.state_dict())
        for step in range(c["compile_warmup_steps"]):
            train_step(model, optimizer, batches, step, accum, c, device)
        raw.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_opt)
        batches.reset()

    speedrun_clock.start(raw, optimizer)
    begin = time.perf_counter()
    for step in range(c["steps"]):
        loss = train_step(model, optimizer, batches, step, accum, c, device)
        speedrun_clock.tick(raw)
        if rank == 0 and (step % 100 == 0 or step == c["steps"] - 1):
            print(
                f"step {step}/{c['steps']} train_loss {loss.item():.4f} {time.perf_counter() - begin:.1f}s",
                flush=True,
            )
    speedrun_clock.stop(raw)
    if rank == 0:
        print(f"trained_tokens={c['steps'] * c['total_batch']}", flush=True)
    if distributed:
        dist.destroy_process_group()


# EVOLVE-BLOCK-END
if __name__ == "__main__":
    main()
