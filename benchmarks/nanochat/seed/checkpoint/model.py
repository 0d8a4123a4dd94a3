"""A standard GPT: token and learned position embeddings, pre-norm blocks, causal attention, GELU MLP.

The harness builds the model with ``build_model(config)`` (config = what train.py saved)
and calls ``model(inputs)`` -> logits of shape (batch, seq_len, vocab_size). The model must
be causal: the logits at position t may depend only on inputs[:, :t+1].
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """(B, T, C) -> (B, n_head, T, C // n_head)."""
    b, t, c = x.shape
    return x.view(b, t, n_head, c // n_head).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B, T, H * D)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


# EVOLVE-BLOCK-START
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_embd, n_embd, bias=False)
        self.key = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(n_embd, n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.query(x), self.n_head)
        k = split_heads(self.key(x), self.n_head)
        v = split_heads(self.value(x), self.n_head)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(merge_heads(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, mlp_ratio: int):
        super().__init__()
        self.up = nn.Linear(n_embd, mlp_ratio * n_embd, bias=False)
        self.down = nn.Linear(mlp_ratio * n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, mlp_ratio: int):
        super().__init__()
        self.norm_attn = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.norm_mlp = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, mlp_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


class GPT(nn.Module):
    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int,
        n_layer: int,
        n_head: int,
        n_embd: int,
        mlp_ratio: int,
        init_std: float,
    ):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, n_embd)
        self.position_embedding = nn.Embedding(seq_len, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, mlp_ratio) for _ in range(n_layer))
        self.norm_out = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for name, param in self.named_parameters():
            if (
                name.endswith("weight") and "norm" not in name
            ):  # matrices; projections shrink with depth
                std = (
                    init_std / math.sqrt(2 * n_layer)
                    if name.endswith(("proj.weight", "down.weight"))
                    else init_std
                )
                nn.init.normal_(param, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, length = idx.shape
        positions = torch.arange(length, device=idx.device)
        x = self.token_embedding(idx) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_out(x))


# EVOLVE-BLOCK-END


def build_model(config: dict) -> nn.Module:
    """The harness's entry point: a model from the config train.py saved."""
    return GPT(**config)
