"""The reader and input generator follow upstream SOL-ExecBench on the format features its dataset uses."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from evolve.benchmarks.kernels import heuristics, roofline
from evolve.benchmarks.kernels.compare import error_stats, verdict
from evolve.benchmarks.kernels.inputs import InputMaker, load_reference, pack_fp4, unpack_fp4
from evolve.benchmarks.kernels.pool import ShiftedInputs
from evolve.benchmarks.kernels.spec import (
    SpecError,
    Tolerance,
    load_problem,
    parse_definition,
    parse_workload,
)
from kernels_fixtures import write_problem

IDENTITY = "import torch\n\ndef run(x):\n    return x.clone()\n"


def _definition(inputs, outputs=None, reference=IDENTITY, axes=None, **extra):
    return {"name": "p", "axes": axes or {"B": {"type": "var"}, "H": {"type": "const", "value": 8}},
            "inputs": inputs, "outputs": outputs or {"y": {"shape": ["B", "H"], "dtype": "float32"}},
            "reference": reference, **extra}  # fmt: skip


def _maker(tmp_path, definition, axes, inputs=None):
    folder = write_problem(
        tmp_path, definition, [{"uuid": "w", "axes": axes, "inputs": inputs or {}}]
    )
    problem = load_problem(folder)
    reference = load_reference(problem.definition, tmp_path)
    return (
        problem,
        InputMaker(problem, problem.workloads[0], torch.device("cpu"), reference),
        reference,
    )


def test_literal_dimensions_in_shapes_as_strings_or_numbers():
    d = parse_definition(_definition({"x": {"shape": ["B", "1"], "dtype": "float32"},
                                      "s": {"shape": [4, "H"], "dtype": "float32"}}))  # fmt: skip
    axes = d.resolve_axes({"B": 3})
    assert d.shape(d.inputs["x"], axes) == (3, 1)
    assert d.shape(d.inputs["s"], axes) == (4, 8)
    with pytest.raises(SpecError, match="names axes \\['Q'\\]"):
        parse_definition(_definition({"x": {"shape": ["Q"], "dtype": "float32"}}))


def test_extra_workload_axes_and_inputs_are_ignored_and_recorded():
    d = parse_definition(_definition({"x": {"shape": ["B", "H"], "dtype": "float32"}}))
    w = parse_workload({"uuid": "u", "axes": {"B": 2, "extra_axis": 5},
                        "inputs": {"x": {"type": "random"}, "stray": {"type": "scalar", "value": 1}}}, d)  # fmt: skip
    assert dict(w.axes) == {"B": 2}
    assert set(w.inputs) == {"x"}
    assert w.ignored == ("axis extra_axis", "input stray")


def test_constraints_over_values_are_not_evaluated_but_axis_constraints_are():
    d = parse_definition(_definition({"x": {"shape": ["B", "H"], "dtype": "float32"}},
                                     constraints=["kv_indptr[-1].item() == B", "B % 2 == 0"]))  # fmt: skip
    assert d.checked_constraints() == ("B % 2 == 0",)
    assert d.resolve_axes({"B": 4})["B"] == 4  # the .item() constraint is documentation only
    with pytest.raises(SpecError, match="B % 2 == 0"):
        d.resolve_axes({"B": 3})


def test_allow_negative_inf_and_tolerance_keys_as_upstream_names_them():
    d = parse_definition(_definition({"x": {"shape": ["B", "H"], "dtype": "float32"}}))
    w = parse_workload({"uuid": "u", "axes": {"B": 1}, "inputs": {}, "tolerance": {
        "max_atol": 0.1, "max_rtol": 0.2, "required_matched_ratio": 0.9, "max_error_cap": None,
        "allow_negative_inf": True}}, d)  # fmt: skip
    assert w.tolerance == Tolerance(
        max_atol=0.1, max_rtol=0.2, required_matched_ratio=0.9, allow_negative_inf=True
    )
    ref = torch.tensor([0.5, -math.inf, 1.0])
    out = ref.clone()
    assert verdict(error_stats(out, ref, w.tolerance), w.tolerance) is None
    strict = Tolerance()
    assert "NaN/Inf" in verdict(error_stats(out, ref, strict), strict)
    wrong = torch.tensor(
        [0.5, 0.0, 1.0]
    )  # -inf expected, a finite value given: a mismatch, not a pass
    assert "within" in verdict(error_stats(wrong, ref, w.tolerance), w.tolerance)


HEURISTIC_CASES = [  # (name, shape, description, rule)
    ("input_layernorm_weight", (8,), "", "norm_weight"),
    ("norm_weight", (8,), "", "norm_weight"),
    ("post_norm2_bias", (8,), "", "norm_bias"),
    ("causal_mask", (4, 4), "", "causal_mask"),
    ("attention_mask", (2, 4, 4), "", "causal_mask"),
    ("x_mask", (2, 4), "", "binary_mask"),
    ("pad_mask", (2, 4), "1.0 for valid tokens, 0.0 for masked", "binary_mask"),
    ("cos", (16, 8), "", "rope"),
    ("sin_cached", (16, 8), "", "rope"),
    ("rstd", (16,), "", "positive"),
    ("x_var", (16,), "", "positive"),
    ("A_log", (16,), "", "ssm_decay"),
    ("A_cumsum", (2, 16), "", "ssm_decay"),
    ("routing_weights", (4, 8), "", "softmax"),
    ("probs", (4, 8), "softmax output of the router", "softmax"),
    ("o_proj_weight", (64, 256), "", "weight_matrix"),
    ("weight", (64, 256), "", "weight_matrix"),
    ("gate_proj", (64, 256), "", "weight_matrix"),
    ("w_weight2", (64, 256), "", "weight_matrix"),
    ("weight", (256,), "", None),  # 1-d: not a matrix, not a norm name
    ("hidden_states", (64, 256), "", None),
]


@pytest.mark.parametrize(("name", "shape", "description", "expected"), HEURISTIC_CASES)
def test_each_input_rule_is_chosen_and_makes_what_upstream_makes(
    name, shape, description, expected
):
    assert heuristics.rule(name, shape, torch.bfloat16, description) == expected
    gen = torch.Generator().manual_seed(1)
    value = heuristics.generate(name, shape, torch.float32, torch.device("cpu"), gen, description)
    if expected is None:
        assert value is None
        return
    assert value.shape == shape and value.dtype == torch.float32
    checks = {
        "norm_weight": lambda v: bool((v == 1).all()),
        "norm_bias": lambda v: bool((v == 0).all()),
        "causal_mask": lambda v: bool(
            (v[..., 0, 1:] == torch.finfo(torch.float32).min).all() and (v.tril() == 0).all()
        ),
        "binary_mask": lambda v: set(v.unique().tolist()) <= {0.0, 1.0},
        "rope": lambda v: bool((v.abs() <= 1).all()) and v.std() > 0,
        "positive": lambda v: bool((v >= 0.1).all()),
        "ssm_decay": lambda v: bool((v <= 0).all()),
        "softmax": lambda v: torch.allclose(v.sum(-1), torch.ones(shape[:-1])),
        "weight_matrix": lambda v: (
            abs(float(v.std()) - 1 / math.sqrt(shape[-1])) < 0.2 / math.sqrt(shape[-1])
        ),
    }
    assert checks[expected](value), (name, value)


def test_low_precision_inputs_take_the_plain_rule_and_fp4_is_packed(tmp_path):
    assert heuristics.rule("o_proj_weight", (8, 8), torch.float8_e4m3fn) is None
    definition = _definition(
        {"a": {"shape": ["B", "H"], "dtype": "float8_e4m3fn"}, "b": {"shape": ["B", "H"], "dtype": "float8_e5m2"},
         "q": {"shape": ["B", "H"], "dtype": "float4_e2m1fn_x2"}, "norm_weight": {"shape": ["H"], "dtype": "bfloat16"}},
        reference="import torch\n\ndef run(a, b, q, norm_weight):\n    return a.float()\n",
    )  # fmt: skip
    _, maker, _ = _maker(tmp_path, definition, {"B": 4})
    a, b, q, w = maker.make(7)
    assert a.dtype == torch.float8_e4m3fn and float(a.float().abs().max()) <= 2.0
    assert b.dtype == torch.float8_e5m2
    assert q.dtype == torch.float4_e2m1fn_x2 and q.shape == (
        4,
        4,
    )  # two values a byte, as upstream packs
    assert bool((w == 1).all()) and w.dtype == torch.bfloat16
    values = torch.tensor([[0.1, -0.3, 0.8, 1.4, -2.2, 2.9, 4.4, -7.0]])
    assert unpack_fp4(pack_fp4(values)).tolist() == [[0.0, -0.5, 1.0, 1.5, -2.0, 3.0, 4.0, -6.0]]


def test_inputs_follow_the_rules_through_the_input_maker(tmp_path):
    definition = _definition(
        {"x": {"shape": ["B", "H"], "dtype": "float32"}, "o_proj_weight": {"shape": ["H", "H"], "dtype": "float32"},
         "input_layernorm_weight": {"shape": ["H"], "dtype": "float32"}, "cos": {"shape": ["B", "H"], "dtype": "float32"}},
        reference="import torch\n\ndef run(x, o_proj_weight, input_layernorm_weight, cos):\n    return x\n",
    )  # fmt: skip
    _, maker, _ = _maker(tmp_path, definition, {"B": 4})
    x, w, norm, cos = maker.make(3)
    assert bool((norm == 1).all()) and bool((cos.abs() <= 1).all())
    assert float(w.abs().max()) < float(x.abs().max())  # scaled by 1/sqrt(8)
    assert all(
        torch.equal(p, q) for p, q in zip(maker.make(3), (x, w, norm, cos), strict=True)
    )  # a pure function of the seed


DATA_DEPENDENT = {
    "nonzero": "def run(a, b):\n    idx = (a[:, 0] > 0).nonzero().flatten()\n    return a @ b + 0 * idx.sum()\n",
    "item": "def run(a, b):\n    k = int(a.abs().max().item() > -1)\n    return (a @ b) * k\n",
    "bincount": "def run(a, b):\n    c = torch.bincount((a[:, 0] > 0).long(), minlength=2)\n    return a @ b + 0 * c.sum()\n",
}


@pytest.mark.parametrize("op", list(DATA_DEPENDENT))
def test_flops_fall_back_to_real_inputs_and_say_so(tmp_path, op):
    definition = _definition(
        {
            "a": {"shape": ["B", "H"], "dtype": "float32"},
            "b": {"shape": ["H", "H"], "dtype": "float32"},
        },
        reference="import torch\n\n" + DATA_DEPENDENT[op],
    )
    problem, maker, reference = _maker(tmp_path, definition, {"B": 4})
    with pytest.raises(Exception):  # noqa: B017 - what meta tensors raise differs by op
        roofline.count_flops(problem, maker, reference)
    flops, method = roofline.flops_with_fallback(problem, maker, reference)
    assert flops == {"float32": 2.0 * 4 * 8 * 8}
    assert method.startswith("real: counted on one set of real inputs on cpu (meta tensors failed:")


def test_flops_say_when_only_the_memory_bound_is_left(tmp_path):
    reference = "import torch\n\ndef run(a, b):\n    if a.device.type != 'meta':\n        raise ValueError('needs a GPU')\n    return a.nonzero()\n"
    definition = _definition({"a": {"shape": ["B", "H"], "dtype": "float32"}, "b": {"shape": ["H"], "dtype": "float32"}},
                             reference=reference)  # fmt: skip
    problem, maker, ref = _maker(tmp_path, definition, {"B": 4})
    flops, method = roofline.flops_with_fallback(problem, maker, ref)
    assert flops == {}
    assert method.startswith("none: meta tensors failed") and "ValueError: needs a GPU" in method
    assert "memory bound only" in method


def test_shifted_inputs_keep_values_and_move_addresses():
    base = [torch.arange(12.0).reshape(3, 4), torch.ones(1, 4).expand(5, 4), 0.5]
    pool = ShiftedInputs(base, calls=4)
    seen = set()
    for i in range(4):
        a, b, s = pool.get(i)
        assert torch.equal(a, base[0]) and torch.equal(b, base[1]) and s == 0.5
        assert b.stride() == (0, 1)  # a broadcast stays a broadcast: the pool holds 4 values for it
        seen.add(a.data_ptr())
        a.mul_(0)  # a call scribbling on its inputs does not change the next call's values
    assert len(seen) == 4
    with pytest.raises(IndexError):
        pool.get(4)


def test_a_relative_dataset_path_is_resolved_before_the_sandbox(tmp_path, monkeypatch):
    from kernels_fixtures import tiny_rmsnorm

    tiny_rmsnorm(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from evolve.benchmarks.kernels.fitness import KernelFitness

    fitness = KernelFitness(problem="tiny_rmsnorm", dataset="data", device="cpu")
    assert fitness.problem.root == tmp_path / "data" / "tiny_rmsnorm"
    assert fitness.problem.root.is_absolute()


def test_problem_statement_shows_literal_dims(tmp_path):
    from evolve.benchmarks.kernels.fitness import problem_statement

    folder = write_problem(tmp_path, _definition({"x": {"shape": ["B", "1"], "dtype": "float32"}},
                           outputs={"y": {"shape": ["B", "1"], "dtype": "float32"}}), [{"uuid": "w", "axes": {"B": 2}}])  # fmt: skip
    assert "input x: [B, 1] float32" in problem_statement(load_problem(folder))


def test_upstream_like_reference_runs_on_generated_inputs(tmp_path):
    """A backward reference dividing by a norm weight: finite on upstream's inputs (ones), not on plain normals."""
    reference = textwrap.dedent(
        """
        import torch

        def run(grad, rms_norm_weight):
            return grad / rms_norm_weight.unsqueeze(0)
        """
    )
    definition = _definition({"grad": {"shape": ["B", "H"], "dtype": "float32"},
                              "rms_norm_weight": {"shape": ["H"], "dtype": "float32"}}, reference=reference)  # fmt: skip
    _, maker, ref = _maker(tmp_path, definition, {"B": 4})
    out = ref.run(*maker.make(0))
    assert bool(torch.isfinite(out).all()) and bool((maker.make(0)[1] == 1).all())
