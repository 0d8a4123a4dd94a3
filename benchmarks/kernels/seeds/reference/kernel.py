"""Seed candidate for any problem: the problem's own reference, called destination-passing style.

The harness writes ``definition.json`` and ``reference.py`` (the definition's reference
source) next to this file before every evaluation. Replace the body of ``run`` with a
faster kernel (Triton or PyTorch) that writes the same values into the output tensors.
"""

import json
from pathlib import Path

import reference
import torch

N_INPUTS = len(json.loads((Path(__file__).parent / "definition.json").read_text())["inputs"])


# EVOLVE-BLOCK-START
def run(*args):
    """Inputs in definition order, then the pre-allocated outputs to fill."""
    inputs, outputs = args[:N_INPUTS], args[N_INPUTS:]
    result = reference.run(*inputs)
    if isinstance(result, dict):
        result = list(result.values())
    elif isinstance(result, torch.Tensor) or not isinstance(result, tuple | list):
        result = (result,)
    for out, value in zip(outputs, result, strict=True):
        out.copy_(value)


# EVOLVE-BLOCK-END
