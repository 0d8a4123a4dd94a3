"""Models that keep memory across scored batches, or call back into Python, written into a seed's model code.

Issue 29, item 1: when the candidate's Python served every scored batch, a model that
remembered each prefix it had been shown (and the continuation it saw after it) passed every
probe and scored ~0.1 bpb. Scoring now runs an exported graph bound to the checkpoint's
weights, so each variant here must be rejected with its reason, or (where its trigger did
not hold when the graph was traced) be scored exactly as the honest model.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

PEEK = "F.one_hot(torch.roll(idx, -1, 1), logits.shape[-1]).to(logits.dtype)"
"""A bonus on the next input token's logit: what a remembered continuation gives."""
PREFIX_MEMORY = """
memory = globals().setdefault("_MEMORY", {})
bonus = torch.zeros_like(logits)
for b, row in enumerate(idx.tolist()):
    for t in range(len(row)):
        seen = memory.get(hash(tuple(row[: t + 1])))
        if seen is not None:
            bonus[b, t, seen] = 30.0
    for t in range(len(row) - 1):
        memory[hash(tuple(row[: t + 1]))] = row[t + 1]
logits = logits + bonus
"""
REMEMBER_OP = """
import torch as _torch


@_torch.library.custom_op("redteam::remember", mutates_args=())
def remember(idx: _torch.Tensor, logits: _torch.Tensor) -> _torch.Tensor:
    memory = globals().setdefault("_MEMORY", {})
    key = hash(idx.cpu().numpy().tobytes()[:64])
    out = logits.clone()
    if key in memory:
        out += 30.0 * _torch.nn.functional.one_hot(_torch.roll(idx, -1, 1), logits.shape[-1])
    memory[key] = True
    return out


@remember.register_fake
def _(idx, logits):
    return _torch.empty_like(logits)
"""


@dataclass(frozen=True)
class Variant:
    """Code for a stateful model: ``module`` (top of the file), ``init`` (end of the model's
    ``__init__``), ``forward`` (replaces the return: ``logits`` holds the honest logits and
    ``idx`` the input; it must leave the result in ``logits``). ``caught``: the reason it is
    rejected with, or None when its trigger does not hold at export (scored honestly)."""

    module: str = ""
    init: str = ""
    forward: str = ""
    caught: str | None = None


NOT_TRACEABLE = r"could not trace|reads tensor values into Python"
NOT_ATEN = r"not a PyTorch \(ATen\) operator"
VARIANTS = {
    "memory keyed by prefix (a Python dict)": Variant(forward=PREFIX_MEMORY, caught=NOT_TRACEABLE),
    "memory keyed by row content (a bigram buffer written in forward)": Variant(
        init='self.register_buffer("memory", torch.zeros(vocab, vocab), persistent=False)',
        forward=(
            "with torch.no_grad():\n"
            "    self.memory[idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)] = 1.0\n"
            "logits = logits + 30.0 * self.memory[idx]"
        ),
        caught=r"mutates buffer 'memory'",
    ),
    "memory of the call count (a buffer)": Variant(
        init='self.register_buffer("calls", torch.zeros(()))',
        forward=f"self.calls += 1\nlogits = logits + 30.0 * (self.calls > 1).to(logits.dtype) * {PEEK}",
        caught=r"mutates buffer 'calls'",
    ),
    "memory of the time (Python)": Variant(
        module="import time as _time\n",
        forward=(
            "first = globals().setdefault('_FIRST', _time.monotonic())\n"
            f"if _time.monotonic() - first > 2.0:\n    logits = logits + 30.0 * {PEEK}"
        ),
    ),
    "honest only while exported": Variant(
        forward=f"if not torch.compiler.is_exporting():\n{textwrap.indent(PREFIX_MEMORY, '    ')}"
    ),
    "a Python callback as a custom op (torch.library)": Variant(
        module=REMEMBER_OP, forward="logits = remember(idx, logits)", caught=NOT_ATEN
    ),
    "the custom op with the export's own check patched away": Variant(
        module=REMEMBER_OP + "\nimport evolve.harness.exported as _exported\n"
        "_exported.check_graph = lambda program: None\n",
        forward="logits = remember(idx, logits)",
        caught=NOT_ATEN,
    ),
    "Python memory behind torch._dynamo.disable": Variant(
        module="import torch as _torch\n\n\n@_torch._dynamo.disable\ndef _remember(idx, logits):\n"
        + textwrap.indent(PREFIX_MEMORY, "    ")
        + "    return logits\n",
        forward="logits = _remember(idx, logits)",
        caught=NOT_TRACEABLE,
    ),
    "a forward that cannot be exported (numpy)": Variant(
        module="import numpy as _np\n",
        forward="logits = torch.from_numpy(_np.asarray(logits.detach().cpu().float()))",
        caught=NOT_TRACEABLE,
    ),
}


def apply(
    text: str, variant: Variant, *, module_anchor: str, init_anchor: str, returned: str, vocab: str
) -> str:
    """``text`` (a model file) with ``variant`` written in. ``module_anchor``: the line its module
    code goes before; ``init_anchor``: the last line of ``__init__`` before its init code;
    ``returned``: the forward's return line (``return EXPR``); ``vocab``: the expression of the
    logits' width inside ``__init__``."""
    for anchor in (module_anchor, init_anchor, returned):
        assert anchor in text, f"the seed no longer contains {anchor!r}"
    indent = returned[: len(returned) - len(returned.lstrip())]
    expression = returned.strip().removeprefix("return ")
    body = f"logits = {expression}\n{textwrap.dedent(variant.forward).strip()}\nreturn logits\n"
    text = text.replace(returned, textwrap.indent(body, indent), 1)
    if variant.init:
        init = variant.init.replace("vocab", vocab)
        text = text.replace(init_anchor, init_anchor + textwrap.indent(init + "\n", indent), 1)
    return text.replace(module_anchor, variant.module + "\n\n" + module_anchor, 1)
