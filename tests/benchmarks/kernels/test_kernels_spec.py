"""The SOL-ExecBench reader: fixtures with expr axes, scalar, custom and safetensors inputs; our suite."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from evolve.benchmarks.kernels import inputs, roofline
from evolve.benchmarks.kernels.fitness import SUITE
from evolve.benchmarks.kernels.spec import (
    SpecError,
    evaluate_expression,
    find_problem,
    load_problem,
    problem_dirs,
)
from kernels_fixtures import tiny_rmsnorm, write_problem

SPLIT_HEADS = textwrap.dedent(
    """
    import torch

    def make_inputs(axes_and_scalars, device):
        rows = axes_and_scalars["batch_seq"]
        x = torch.randn(rows, axes_and_scalars["hidden"], device=device)
        index = torch.randint(0, rows, (axes_and_scalars["picked"],), device=device)
        return {"x": x, "index": index}

    def run(x, index, scale):
        return x[index] * scale
    """
).strip()


def custom_problem(root):
    """Expression axes (one built on another), const/var axes, a constraint, a custom entry point and a scalar."""
    definition = {
        "name": "gather_scale",
        "op_type": None,
        "description": None,
        "tags": ["status:verified"],
        "axes": {
            "batch": {"type": "var", "description": None},
            "seq": {"type": "var"},
            "hidden": {"type": "const", "value": 16},
            "k": {"type": "var"},
            "batch_seq": {"type": "expr", "expression": "batch * seq"},
            "picked": {"type": "expr", "expression": "batch_seq * k"},
        },
        "constraints": ["hidden % 8 == 0", "k >= 1"],
        "custom_inputs_entrypoint": "make_inputs",
        "inputs": {
            "x": {"shape": ["batch_seq", "hidden"], "dtype": "float32"},
            "index": {"shape": ["picked"], "dtype": "int64"},
            "scale": {"shape": None, "dtype": "float32"},
        },
        "outputs": {"out": {"shape": ["picked", "hidden"], "dtype": "float32"}},
        "reference": SPLIT_HEADS,
    }
    custom = {"type": "custom"}
    workloads = [
        {"uuid": "w1", "axes": {"batch": 2, "seq": 3, "k": 2}, "inputs": {"x": custom, "index": custom, "scale": {"type": "scalar", "value": 0.5}},
         "correctness": {"max_atol": 1e-5, "max_rtol": 1e-5, "required_matched_ratio": 1.0, "max_error_cap": 0.1}},
        {"uuid": "w2", "axes": {"batch": 1, "seq": 5, "k": 1}, "inputs": {"x": custom, "index": custom, "scale": {"type": "scalar", "value": 2.0}}},
    ]  # fmt: skip
    return write_problem(root, definition, workloads)


def test_expressions_allow_arithmetic_and_comparisons_only():
    assert evaluate_expression("a * b // 2 + 2 ** 3 - -1", {"a": 3, "b": 4}) == 15
    assert evaluate_expression("a % 2 == 0 and a < 10", {"a": 4}) is True
    with pytest.raises(SpecError, match="not allowed"):
        evaluate_expression("__import__('os')", {})
    with pytest.raises(SpecError, match="not a known axis"):
        evaluate_expression("missing + 1", {})


def test_reader_resolves_expr_axes_constraints_custom_inputs_and_tolerance(tmp_path):
    problem = load_problem(custom_problem(tmp_path))
    d = problem.definition
    assert d.custom_inputs_entrypoint == "make_inputs"
    assert d.inputs["scale"].shape is None
    axes = d.resolve_axes(problem.workloads[0].axes)
    assert axes == {"batch": 2, "seq": 3, "hidden": 16, "k": 2, "batch_seq": 6, "picked": 12}
    w1, w2 = problem.workloads
    assert w1.custom and w1.scalars() == {"scale": 0.5}
    assert (
        w1.tolerance.max_atol == 1e-5
        and w1.tolerance.required_matched_ratio == 1.0
        and w1.tolerance.max_error_cap == 0.1
    )
    assert w2.tolerance.max_atol == 1e-2 and w2.tolerance.required_matched_ratio == 0.99  # defaults
    reference = inputs.load_reference(d, tmp_path)
    maker = inputs.InputMaker(problem, w1, torch.device("cpu"), reference)
    x, index, scale = maker.make(seed=7)
    assert x.shape == (6, 16) and index.shape == (12,) and scale == 0.5
    assert int(index.max()) < 6
    again = maker.make(seed=7)
    assert torch.equal(again[0], x) and torch.equal(
        again[1], index
    )  # inputs are a function of the seed
    assert not torch.equal(maker.make(seed=8)[0], x)
    out = maker.normalize(reference.run(x, index, scale))
    assert out[0].shape == (12, 16)
    assert maker.output_shapes() == [((12, 16), torch.float32)]


def test_random_scalar_and_safetensors_inputs(tmp_path):
    folder = tiny_rmsnorm(tmp_path, rows=(4,))
    weight = torch.arange(64, dtype=torch.bfloat16)
    inputs.write_safetensors(
        folder / "weights.safetensors", {"w": weight, "other": torch.zeros(2, 3)}
    )
    record = json.loads((folder / "workload.jsonl").read_text())
    record["inputs"]["weight"] = {
        "type": "safetensors",
        "path": "weights.safetensors",
        "tensor_key": "w",
    }
    (folder / "workload.jsonl").write_text(json.dumps(record) + "\n")
    problem = load_problem(folder)
    maker = inputs.InputMaker(
        problem,
        problem.workloads[0],
        torch.device("cpu"),
        inputs.load_reference(problem.definition, tmp_path),
    )
    x, w, eps = maker.make(seed=1)
    assert x.dtype == torch.bfloat16 and x.shape == (4, 64)
    (folder / "weights.safetensors").rename(
        tmp_path / "blob.safetensors"
    )  # relative to the dataset root
    record["inputs"]["weight"]["path"] = "blob.safetensors"
    (folder / "workload.jsonl").write_text(json.dumps(record) + "\n")
    problem = load_problem(folder)
    maker = inputs.InputMaker(
        problem,
        problem.workloads[0],
        torch.device("cpu"),
        inputs.load_reference(problem.definition, tmp_path),
    )
    assert torch.equal(maker.make(seed=1)[1], weight)
    assert torch.equal(w, weight) and eps == 1e-6
    outs = maker.allocate()
    assert outs[0].shape == (4, 64) and bool(outs[0].isnan().all())  # fresh outputs start as NaN
    assert maker.input_bytes() == 4 * 64 * 2 + 64 * 2 and maker.output_bytes() == 4 * 64 * 2


def test_reader_rejects_broken_problems_with_the_reason(tmp_path):
    folder = tiny_rmsnorm(tmp_path)
    definition = json.loads((folder / "definition.json").read_text())
    bad = dict(
        definition, inputs={**definition["inputs"], "x": {"shape": ["T", "Q"], "dtype": "bfloat16"}}
    )
    (folder / "definition.json").write_text(json.dumps(bad))
    with pytest.raises(SpecError, match="axes \\['Q'\\] that are not in 'axes'"):
        load_problem(folder)
    (folder / "definition.json").write_text(
        json.dumps(dict(definition, outputs={"y": {"shape": ["T"], "dtype": "float7"}}))
    )
    with pytest.raises(SpecError, match="dtype 'float7'"):
        load_problem(folder)
    (folder / "definition.json").write_text(json.dumps(definition))
    (folder / "workload.jsonl").write_text(
        json.dumps({"uuid": "x", "axes": {}, "inputs": {}}) + "\n"
    )
    with pytest.raises(SpecError, match="no value for var axis 'T'"):
        load_problem(folder)
    mixed = {
        "uuid": "m",
        "axes": {"T": 2},
        "inputs": {"x": {"type": "custom"}, "weight": {"type": "random"}},
    }
    (folder / "workload.jsonl").write_text(json.dumps(mixed) + "\n")
    with pytest.raises(SpecError, match="custom inputs need 'custom_inputs_entrypoint'"):
        load_problem(folder)
    with pytest.raises(SpecError, match="available: tiny_rmsnorm"):
        find_problem(tmp_path, "nope")


def test_constraint_failure_is_reported(tmp_path):
    folder = custom_problem(tmp_path)
    (folder / "workload.jsonl").write_text(
        json.dumps({"uuid": "w", "axes": {"batch": 1, "seq": 1, "k": 0}, "inputs": {}}) + "\n"
    )
    with pytest.raises(SpecError, match="constraint 'k >= 1' fails"):
        load_problem(folder)


def test_flashinfer_trace_records_are_unwrapped(tmp_path):
    folder = tiny_rmsnorm(tmp_path)
    record = {
        "definition": "tiny_rmsnorm",
        "workload": {"uuid": "wrapped", "axes": {"T": 3}, "inputs": {}},
        "solution": None,
    }
    (folder / "workload.jsonl").write_text(json.dumps(record) + "\n")
    problem = load_problem(folder)
    assert problem.workloads[0].uuid == "wrapped"
    assert (
        problem.workloads[0].inputs["eps"].kind == "random"
    )  # an input left out is drawn at random


def test_our_suite_has_twelve_problems_across_the_three_families():
    dirs = problem_dirs(SUITE)
    assert len(dirs) >= 12
    must = {"rmsnorm", "layernorm", "softmax", "silu_and_mul", "rotary_embedding", "cross_entropy", "add_rmsnorm",
            "matmul_bf16", "matmul_bias_gelu", "causal_attention", "fp8_quant_tensor", "fp8_quant_token"}  # fmt: skip
    assert must <= set(dirs)
    for path in dirs.values():
        problem = load_problem(path)
        assert len(problem.workloads) >= 3, problem.name
        assert len({w.uuid for w in problem.workloads}) == len(problem.workloads)


def test_roofline_counts_matmul_flops_by_dtype_and_honours_sol_json(tmp_path):
    matmul = find_problem(SUITE, "matmul_bf16")
    reference = inputs.load_reference(matmul.definition, tmp_path)
    w = matmul.workload("matmul_bf16_M4096_N4096_K4096")
    maker = inputs.InputMaker(matmul, w, torch.device("cpu"), reference)
    assert roofline.count_flops(matmul, maker, reference) == {"bfloat16": 2.0 * 4096**3}
    attention = find_problem(SUITE, "causal_attention")
    reference = inputs.load_reference(attention.definition, tmp_path)
    w = attention.workloads[0]
    maker = inputs.InputMaker(attention, w, torch.device("cpu"), reference)
    b, h, s = (w.axes[k] for k in ("B", "H", "S"))
    assert roofline.count_flops(attention, maker, reference) == {
        "bfloat16": 2.0 * b * h * s * s * 128
    }
    rms = find_problem(SUITE, "rmsnorm")
    reference = inputs.load_reference(rms.definition, tmp_path)
    maker = inputs.InputMaker(rms, rms.workloads[0], torch.device("cpu"), reference)
    assert roofline.count_flops(rms, maker, reference) == {}
    calibration = {"bandwidth_bytes_per_s": 4e12, "matrix_flops_per_s": {"bfloat16": 8e14}}
    sol = roofline.sol_ms(4e9, {"bfloat16": 8e11}, calibration)
    assert sol == {
        "sol_ms": 1.0,
        "memory_ms": 1.0,
        "compute_ms": 1.0,
    }  # 4 GB at 4 TB/s; 0.8 TFLOP at 800 TFLOP/s
    assert roofline.sol_ms(4e6, {"float8": 8e14}, calibration)["sol_ms"] == pytest.approx(
        1000.0
    )  # missing rate: bf16
