"""Upstream's name-based rules for random inputs: weights, norm parameters, masks, rotary tables...

SOL-ExecBench draws a ``random`` input from a plain normal unless its name (and sometimes
its description) says it is something a normal would make unrealistic; the rules below
follow ``sol_execbench/core/bench/io.py`` (``_generate_heuristic_tensor``), checked in
order, for floating dtypes of two bytes or more (fp8/fp4 always take the plain rule):

- norm weights (``norm_weight``, ``*_norm_weight``, ``*layernorm<N>_weight``): ones;
- norm biases (same names with ``_bias``): zeros;
- causal attention masks (``attention_mask``/``causal_mask`` or a description saying
  "causal" and "attention mask", last two dims square): 0 on and below the diagonal,
  the dtype's lowest value above it;
- binary masks (``x_mask``, ``text_mask``, ``aspect_ratio_mask``, ``drop_mask``,
  ``attention_mask``, or ``*_mask`` described as binary / 0 or 1): 0 or 1;
- rotary tables (``cos``, ``sin``, ``cos_cached``, ``sin_cached``, ``rope_cos``,
  ``rope_sin``): cos/sin of a normal clamped to [-pi, pi];
- positive statistics (``rstd``, ``std``, ``variance``, ``var`` and ``*_rstd`` ...):
  ``|normal| + 0.1``;
- SSM decays: ``A_cumsum`` a cumulative sum of U(-0.1, 0), ``A_log`` U(-5, -1),
  ``A`` U(-1, -0.001), ``g`` U(-5, 0);
- softmax outputs (``attn_weights``, ``attention_weights``, ``routing_weights``, or a
  description mentioning softmax and output): softmax of a normal over the last dim;
- weight matrices (2-d or more, named ``weight``, ``*_weight(s)``, ``*_proj(s)``,
  ``*_proj_weight(s)``, ``*_weight_matrix``, with trailing digits allowed): a normal
  divided by sqrt(fan_in), fan_in being the last dimension.

Every draw here takes an explicit generator, so inputs stay a pure function of the seed.
"""

from __future__ import annotations

import math

import torch

_WEIGHT_SUFFIXES = ("_weight", "_weights", "_proj", "_projs", "_proj_weight", "_proj_weights",
                    "_weight_matrix")  # fmt: skip
_NORM_ENDINGS = ("_norm", "_layernorm", "layernorm")
_BINARY_MASKS = ("x_mask", "text_mask", "aspect_ratio_mask", "drop_mask", "attention_mask")
_BINARY_WORDS = ("binary", "{0, 1}", "0 or 1", "1.0 for valid", "0.0 for masked")
_ROPE = ("cos", "sin", "cos_cached", "sin_cached", "rope_cos", "rope_sin")
_POSITIVE = ("rstd", "std", "variance", "var")
_SOFTMAX = ("attn_weights", "attention_weights", "routing_weights")


def _norm_parameter(name: str, suffix: str) -> bool:
    if name == f"norm{suffix}":
        return True
    if not name.endswith(suffix):
        return False
    prefix = name[: -len(suffix)]
    stripped = prefix.rstrip("0123456789")
    return (
        prefix.endswith(_NORM_ENDINGS)
        or bool(stripped)
        and stripped.endswith(("norm", "layernorm"))
    )


def _weight_matrix(name: str, shape: tuple[int, ...]) -> bool:
    if len(shape) < 2:
        return False
    stripped = name.rstrip("0123456789")
    return (name == "weight" or name.endswith(_WEIGHT_SUFFIXES) or stripped == "weight"
            or bool(stripped) and stripped.endswith(_WEIGHT_SUFFIXES))  # fmt: skip


def _positive(name: str) -> bool:
    base = name.rstrip("0123456789")
    return (name in _POSITIVE or name.endswith(("_rstd", "_std", "_variance", "_var"))
            or base in _POSITIVE or base.endswith(("_rstd", "_std", "_var")))  # fmt: skip


def _causal_mask(name: str, shape: tuple[int, ...], description: str) -> bool:
    if len(shape) < 2 or shape[-1] != shape[-2]:
        return False
    text = description.lower()
    return name in ("attention_mask", "causal_mask") or (
        "attention mask" in text and "causal" in text
    )


def _binary_mask(name: str, description: str) -> bool:
    if name in _BINARY_MASKS:
        return True
    return name.endswith("_mask") and any(w in description.lower() for w in _BINARY_WORDS)


def rule(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, description: str = ""
) -> str | None:
    """Which upstream rule applies to a random input, or None for the plain normal."""
    if not dtype.is_floating_point or dtype.itemsize < 2:
        return None
    text = description.lower()
    checks = (
        ("norm_weight", _norm_parameter(name, "_weight")),
        ("norm_bias", _norm_parameter(name, "_bias")),
        ("causal_mask", _causal_mask(name, shape, description)),
        ("binary_mask", _binary_mask(name, description)),
        ("rope", name in _ROPE),
        ("positive", _positive(name)),
        ("ssm_decay", name in ("A", "A_log", "A_cumsum", "g")),
        ("softmax", name in _SOFTMAX or ("softmax" in text and "output" in text)),
        ("weight_matrix", _weight_matrix(name, shape)),
    )
    return next((label for label, hit in checks if hit), None)


def generate(name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
             gen: torch.Generator, description: str = "") -> torch.Tensor | None:  # fmt: skip
    """The tensor upstream's rule makes for this input, or None when no rule applies."""
    label = rule(name, shape, dtype, description)
    if label is None:
        return None

    def normal(kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(shape, dtype=kind, device=device, generator=gen)

    def uniform(low: float, high: float) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device).uniform_(low, high, generator=gen)

    if label == "norm_weight":
        return torch.ones(shape, dtype=dtype, device=device)
    if label == "norm_bias":
        return torch.zeros(shape, dtype=dtype, device=device)
    if label == "causal_mask":
        above = torch.triu(torch.ones(shape[-1], shape[-1], device=device), diagonal=1).bool()
        mask = torch.zeros(shape, dtype=dtype, device=device)
        mask[..., above] = torch.finfo(dtype).min
        return mask
    if label == "binary_mask":
        return torch.randint(0, 2, shape, device=device, generator=gen).to(dtype)
    if label == "rope":
        angle = normal(torch.float32).clamp_(-math.pi, math.pi)
        return (torch.cos(angle) if "cos" in name else torch.sin(angle)).to(dtype)
    if label == "positive":
        return normal().abs() + 0.1
    if label == "ssm_decay":
        if name == "A_cumsum":
            return uniform(-0.1, 0.0).cumsum(dim=-1)
        return {"A_log": lambda: uniform(-5.0, -1.0), "A": lambda: uniform(-1.0, -0.001),
                "g": lambda: uniform(-5.0, 0.0)}[name]()  # fmt: skip
    if label == "softmax":
        return torch.softmax(normal(torch.float32), dim=-1).to(dtype)
    return normal() / math.sqrt(shape[-1])  # weight_matrix
