"""The exported-model harness: export, screen, rebind to the checkpoint's weights, and what it rejects."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from evolve.harness.exported import (
    CONSTANTS_FILE,
    GRAPH_FILE,
    ExportRejected,
    Program,
    export_model,
)

VOCAB, ROWS, SEQ = 64, 3, 8


class Tiny(nn.Module):
    """Tied embeddings, a non-persistent mask buffer, a persistent scale buffer, causal SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 16)
        self.qkv = nn.Linear(16, 48)
        self.head = nn.Linear(16, VOCAB, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("scale", torch.ones(16))
        self.register_buffer("keep", torch.ones(16), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) * self.scale * self.keep
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)
        return self.head(x)


def exported(model: nn.Module, folder: Path) -> Program:
    export_model(model, folder, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")
    return Program(folder, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (ROWS, SEQ), generator=torch.Generator().manual_seed(1))


def test_the_graph_runs_with_the_checkpoints_weights_never_the_exports(tmp_path):
    torch.manual_seed(0)
    exporting = Tiny()  # the weights the export process held
    torch.manual_seed(1)
    checkpoint = Tiny()  # the weights saved at the stop
    program = exported(exporting, tmp_path)
    bound = program.bind(checkpoint.state_dict())
    with torch.inference_mode():
        got = bound(tokens())
        assert torch.equal(got, checkpoint(tokens()))
        assert not torch.allclose(got, exporting(tokens()))


def test_a_second_checkpoint_is_bound_into_the_same_module_as_a_fresh_bind_would(tmp_path):
    torch.manual_seed(0)
    first, second = Tiny(), Tiny()
    program = exported(first, tmp_path)
    with torch.inference_mode():
        assert torch.equal(program.bind(first.state_dict())(tokens()), first(tokens()))
        halved = {k: v.to(torch.bfloat16) for k, v in second.state_dict().items()}
        again = program.bind(halved)(tokens())
        fresh = Program(tmp_path, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu").bind(halved)
        assert torch.equal(again, fresh(tokens()))
    state = second.state_dict()
    with pytest.raises(ExportRejected, match="checkpoint lacks"):
        program.bind({k: v for k, v in state.items() if k != "scale"})
    with pytest.raises(ExportRejected, match="has shape"):
        program.bind({**state, "scale": torch.ones(17)})
    with torch.inference_mode():  # a refused checkpoint changed nothing
        assert torch.equal(program.bind(halved)(tokens()), again)


def test_weights_of_another_dtype_are_cast_as_load_state_dict_would(tmp_path):
    model = Tiny()
    program = exported(model, tmp_path)
    halved = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    with torch.inference_mode():
        got = program.bind(halved)(tokens())
    assert got.dtype == torch.float32 and torch.isfinite(got).all()


def test_a_checkpoint_missing_a_tensor_or_of_another_shape_is_rejected(tmp_path):
    model = Tiny()
    program = exported(model, tmp_path)
    state = model.state_dict()
    with pytest.raises(ExportRejected, match="checkpoint lacks"):
        program.bind({k: v for k, v in state.items() if k != "scale"})
    with pytest.raises(ExportRejected, match="has shape"):
        program.bind({**state, "scale": torch.ones(17)})


class Mutating(Tiny):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.scale.add_(1.0)  # a counter of calls, kept in a buffer
        return super().forward(idx)


class Dropping(Tiny):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.dropout(super().forward(idx), p=0.1, training=True)


MEMORY: dict = {}


class Remembering(Tiny):
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        key = tuple(idx[0].tolist())  # Python memory keyed by the tokens needs their values
        seen = MEMORY.get(key, 0)
        MEMORY[key] = seen + 1
        return super().forward(idx) + seen


@pytest.mark.parametrize(
    "model, reason",
    [
        (Mutating, r"mutates buffer 'scale'"),
        (Dropping, r"random operator"),
        (Remembering, r"could not trace|reads tensor values into Python"),
    ],
)
def test_a_model_that_is_not_a_pure_function_is_rejected_with_the_fix(model, reason, tmp_path):
    with pytest.raises(ExportRejected, match=reason) as caught:
        export_model(model(), tmp_path, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")
    assert "pure function" in str(caught.value)


def test_a_custom_operator_is_rejected_by_the_export_and_by_the_scorer(tmp_path):
    @torch.library.custom_op("evolve_test::bonus", mutates_args=())
    def bonus(x: torch.Tensor) -> torch.Tensor:
        return x + 1.0

    @bonus.register_fake
    def _(x):
        return torch.empty_like(x)

    class Calling(Tiny):
        def forward(self, idx):
            return bonus(super().forward(idx))

    with pytest.raises(ExportRejected, match="not a PyTorch"):
        export_model(Calling(), tmp_path, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")
    # an export process whose check was patched away writes the graph: the scorer refuses it
    document = forged(tmp_path, Tiny())
    node = document["graph_module"]["graph"]["nodes"][0]
    node["target"] = "torch.ops.evolve_test.bonus.default"
    with pytest.raises(ExportRejected, match="not a PyTorch"):
        load(tmp_path, document)


def forged(folder: Path, model: nn.Module) -> dict:
    export_model(model, folder, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")
    return json.loads((folder / GRAPH_FILE).read_text())


def load(folder: Path, document: dict) -> torch.nn.Module:
    """The scorer's side: screen, rebuild with a checkpoint's weights, check."""
    (folder / GRAPH_FILE).write_text(json.dumps(document))
    program = Program(folder, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")
    return program.bind(Tiny().state_dict())


def test_a_forged_symbolic_expression_is_refused_before_torch_evaluates_it(tmp_path):
    # torch parses symbolic expressions with sympy.sympify, an eval: a forged one must never get there
    witness = tmp_path / "ran"
    document = forged(tmp_path, Tiny())
    graph = document["graph_module"]["graph"]
    graph["sym_int_values"] = {
        "s0": {"as_expr": {"expr_str": f"__import__('pathlib').Path({str(witness)!r}).touch()"}}
    }
    with pytest.raises(ExportRejected, match="symbolic"):
        load(tmp_path, document)
    assert not witness.exists()


@pytest.mark.parametrize(
    "edit, reason",
    [
        (
            lambda d: d["graph_module"]["graph"]["nodes"][0].update(target="torch.load"),
            "not a PyTorch",
        ),
        (
            lambda d: d["graph_module"]["graph"]["nodes"][0].update(
                target="torch.ops.aten.from_file.default",
                inputs=[
                    {"name": "filename", "arg": {"as_string": "/proc/self/fd/0"}, "kind": 1},
                    {"name": "shared", "arg": {"as_bool": False}, "kind": 1},
                    {"name": "size", "arg": {"as_int": 16}, "kind": 1},
                ],
            ),
            "outside its tensors",
        ),
        (
            lambda d: d["graph_module"]["signature"]["output_specs"].append(
                {"buffer_mutation": {"arg": {"name": "x"}, "buffer_name": "model.scale"}}
            ),
            "mutates buffer",
        ),
        (lambda d: d.update(range_constraints={"s0": {"min_val": 1, "max_val": 9}}), "symbolic"),
    ],
    ids=[
        "a torch function as an operator",
        "a file read",
        "a buffer mutation",
        "a range constraint",
    ],
)
def test_forged_graphs_are_refused(edit, reason, tmp_path):
    document = forged(tmp_path, Tiny())
    edit(document)
    with pytest.raises(ExportRejected, match=reason):
        load(tmp_path, document)


def test_constants_that_do_not_match_the_graph_are_refused(tmp_path):
    document = forged(tmp_path, Tiny())
    torch.save({"model.keep": torch.ones(16), "extra": torch.ones(1)}, tmp_path / CONSTANTS_FILE)
    with pytest.raises(ExportRejected, match="constants"):
        load(tmp_path, document)


BUILDS_FROM_ITS_CONFIG = """
import torch
from torch import nn


class Lookup(nn.Module):
    def __init__(self, vocab: int, gain: float) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)
        self.register_buffer("gain", torch.full((), gain), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.gain.fill_(1000.0)  # a constant made from the checkpoint: never reached

    def forward(self, idx):
        return self.gain * self.table(idx)


def build_model(config):
    return Lookup(**config)
"""


def test_the_exporter_builds_the_model_from_code_and_config_and_never_loads_weights(
    tmp_path, monkeypatch
):
    from evolve.harness import exporter

    (tmp_path / "lookup_model.py").write_text(BUILDS_FROM_ITS_CONFIG)
    (tmp_path / "config.json").write_text(json.dumps({"vocab": VOCAB, "gain": 2.0}))
    (tmp_path / "model.pt").write_bytes(b"not a checkpoint: the exporter must not open it")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [*sys.path])  # the exporter puts its folder first
    monkeypatch.setitem(sys.modules, "lookup_model", None)  # and its model module in
    job = {"source": "lookup_model.py", "config": "config.json", "rows": ROWS, "seq": SEQ,
           "vocab": VOCAB, "device": "cpu"}  # fmt: skip
    assert exporter.run(job)["status"] == "ok"
    program = Program(tmp_path, rows=ROWS, seq=SEQ, vocab=VOCAB, device="cpu")
    weights = {"table.weight": torch.eye(VOCAB)}
    logits = program.bind(weights)(tokens())
    assert torch.equal(logits, 2.0 * torch.eye(VOCAB)[tokens()])  # the config's gain, not 1000
