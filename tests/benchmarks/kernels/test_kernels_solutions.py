"""Candidates in upstream's solution format: parsed, staged, built by the harness where C++, and scored."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from evolve.benchmarks.kernels import build as build_module
from evolve.benchmarks.kernels.build import BuildError, build
from evolve.benchmarks.kernels.harness import Harness
from evolve.benchmarks.kernels.solution import (
    SpecError,
    load_solution,
    parse_solution,
    read_candidate,
    stage,
)
from evolve.benchmarks.kernels.spec import load_problem
from kernels_candidates import CALIBRATION, SETTINGS, needs_triton
from kernels_fixtures import tiny_rmsnorm

RETURNING = """
import torch

def rmsnorm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
"""

TRITON_DPS = """
import torch
import triton
import triton.language as tl


@triton.jit
def _rms(x_ptr, w_ptr, y_ptr, eps, H: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, H)
    x = tl.load(x_ptr + row * H + cols).to(tl.float32)
    w = tl.load(w_ptr + cols).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    tl.store(y_ptr + row * H + cols, (x * r * w).to(tl.bfloat16))


def run(x, weight, eps, y):
    _rms[(x.shape[0],)](x, weight, y, eps, H=x.shape[1])
"""

LOADS_CPP = """
import torch
import torch.utils.cpp_extension as ce

def run(x, weight, eps):
    ce.load_inline(name="fast", cpp_sources="int f() { return 1; }", functions=["f"])
"""

CPP_RETURNING = r"""
#include <torch/extension.h>

torch::Tensor rms(torch::Tensor x, torch::Tensor weight, double eps) {
    auto xf = x.to(torch::kFloat32);
    auto r = torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
    return (xf * r * weight.to(torch::kFloat32)).to(x.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("rms", &rms); }
"""


def solution(language: str, entry: str, sources: dict[str, str], dps: bool, **spec) -> dict:
    return {"name": f"s_{language}", "definition": "tiny_rmsnorm", "author": "test",
            "spec": {"languages": [language], "target_hardware": ["LOCAL"], "entry_point": entry,
                     "destination_passing_style": dps, **spec},
            "sources": [{"path": p, "content": c} for p, c in sources.items()]}  # fmt: skip


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernels-solutions")
    tiny_rmsnorm(root, rows=(33,))
    return root


def score(dataset, data: dict, workdir, settings=SETTINGS):
    """Stage a solution as a candidate folder (solution.json + its sources) and score it."""
    problem = load_problem(dataset / "tiny_rmsnorm")
    path = workdir / "input" / "solution_x.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data))
    stage(load_solution(path), workdir / "cand")
    return Harness(problem, settings, calibration=CALIBRATION).evaluate(
        workdir / "cand", env={"TRITON_INTERPRET": "1"}
    )


def test_the_format_is_checked_with_the_field_named():
    good = solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": RETURNING}, False)
    parsed = parse_solution(good)
    assert (parsed.entry_file, parsed.entry_function, parsed.destination_passing) == (
        "kernel.py",
        "rmsnorm",
        False,
    )
    assert parse_solution({**good, "spec": {k: v for k, v in good["spec"].items() if k != "destination_passing_style"}}).destination_passing  # fmt: skip
    bad = [
        ({**good, "spec": {**good["spec"], "languages": ["fortran"]}}, "spec.languages"),
        (
            {**good, "spec": {**good["spec"], "entry_point": "other.py::run"}},
            "is not among the sources",
        ),
        ({**good, "sources": [{"path": "../kernel.py", "content": ""}]}, "must be relative"),
        (
            {**good, "spec": {**good["spec"], "languages": ["cuda_cpp", "triton"]}},
            "cannot be mixed",
        ),
        (solution("cuda_cpp", "k.cu::run", {"k.cu": ""}, True, binding="tvm"), "binding 'tvm'"),
    ]
    for data, message in bad:
        with pytest.raises(SpecError, match=message):
            parse_solution(data)


def test_a_candidate_folder_reads_its_sources_from_files(tmp_path):
    stage(
        parse_solution(solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": RETURNING}, False)),
        tmp_path,
    )
    (tmp_path / "kernel.py").write_text(RETURNING + "\n# edited by an operator\n")
    assert read_candidate(tmp_path).sources["kernel.py"].endswith("# edited by an operator\n")
    (tmp_path / "kernel.py").unlink()
    with pytest.raises(SpecError, match="source kernel.py named in solution.json is missing"):
        read_candidate(tmp_path)
    assert read_candidate(tmp_path / "nowhere") is None


def test_a_pytorch_solution_that_returns_its_outputs_is_scored(dataset, tmp_path):
    report = score(
        dataset,
        solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": RETURNING}, False),
        tmp_path,
    )
    assert report.status == "ok", report.message + report.output
    assert report.language == "pytorch" and report.timer == "host"
    assert report.rows[0].kernel_ms > 0 and len(report.rows[0].repeat_medians) == 1


def test_a_wrong_returning_solution_is_invalid(dataset, tmp_path):
    wrong = RETURNING.replace("* weight.float()", "")
    report = score(
        dataset, solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": wrong}, False), tmp_path
    )
    assert report.status == "invalid" and "within atol" in report.message


def test_a_triton_solution_in_the_interpreter(dataset, tmp_path):
    needs_triton()
    report = score(
        dataset, solution("triton", "kernel.py::run", {"kernel.py": TRITON_DPS}, True), tmp_path
    )
    assert report.status == "ok", report.message + report.output
    assert report.language == "triton"


def test_fresh_inputs_per_call_remain_available(dataset, tmp_path):
    settings = replace(SETTINGS, inputs="fresh")
    report = score(
        dataset,
        solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": RETURNING}, False),
        tmp_path,
        settings,
    )
    assert report.status == "ok", report.message


def test_loading_cpp_at_run_time_is_refused_in_a_solution(dataset, tmp_path):
    report = score(
        dataset, solution("pytorch", "kernel.py::run", {"kernel.py": LOADS_CPP}, False), tmp_path
    )
    assert report.status == "cheat" and "load_inline" in report.message


def test_cuda_sources_without_nvcc_fail_with_the_fix_named(monkeypatch, tmp_path):
    monkeypatch.setattr(build_module, "find_nvcc", lambda: None)
    cu = CPP_RETURNING.replace("rms", "run")
    with pytest.raises(BuildError, match=r"cuda_cpp needs the CUDA toolkit \(nvcc\)"):
        build(
            parse_solution(solution("cuda_cpp", "k.cu::run", {"k.cu": cu}, False)), cache=tmp_path
        )
    with pytest.raises(BuildError, match="PYBIND11_MODULE"):
        build(
            parse_solution(solution("cuda_cpp", "k.cu::run", {"k.cu": "void run() {}"}, False)),
            cache=tmp_path,
        )


def test_cutlass_without_headers_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(build_module, "find_nvcc", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(build_module, "cutlass_include", lambda: [])
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    data = solution("cutlass", "main.cpp::run", {"main.cpp": CPP_RETURNING}, False)
    with pytest.raises(BuildError, match="cutlass needs the CUTLASS headers"):
        build(parse_solution(data), cache=tmp_path)


@pytest.mark.slow
def test_a_build_failure_is_an_error_with_the_compiler_output(dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVE_KERNELS_BUILD_CACHE", str(tmp_path / "cache"))
    broken = CPP_RETURNING.replace("return (xf", "return (this_is_not_declared + xf")
    data = solution("cuda_cpp", "main.cpp::rms", {"main.cpp": broken}, False)
    report = score(dataset, data, tmp_path)
    assert report.status == "error" and report.message.startswith("build failed")
    assert "this_is_not_declared" in report.message


@pytest.mark.slow
def test_a_cpp_solution_is_built_by_the_harness_cached_and_timed(dataset, tmp_path, monkeypatch):
    """A cuda_cpp solution with only C++ sources builds on any machine with a C++ compiler (~90 s here)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EVOLVE_KERNELS_BUILD_CACHE", str(cache))
    data = solution(
        "cuda_cpp", "main.cpp::rms", {"main.cpp": CPP_RETURNING}, False, binding="torch"
    )
    report = score(dataset, data, tmp_path / "first")
    assert report.status == "ok", report.message + report.output
    assert report.language == "cuda_cpp" and report.build["cached"] is False
    assert report.rows[0].kernel_ms > 0
    again = score(dataset, data, tmp_path / "second")
    assert (
        again.status == "ok"
        and again.build["cached"] is True
        and again.build["key"] == report.build["key"]
    )
    shutil.rmtree(cache)


def test_published_mode_scores_against_the_dataset_times(tmp_path):
    folder = tiny_rmsnorm(tmp_path / "data", rows=(33,))
    (folder / "published.json").write_text(
        json.dumps({"hardware": "B200", "workloads": {"t33": {"baseline_ms": 2.0, "sol_ms": 1.0}}})
    )
    report = score(
        tmp_path / "data",
        solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": RETURNING}, False),
        tmp_path,
    )
    assert report.status == "ok", report.message
    row = report.rows[0]
    assert row.published_score == pytest.approx(1 / (1 + (row.kernel_ms - 1.0) / (2.0 - 1.0)))
    assert (
        report.published_score == pytest.approx(row.published_score)
        and report.published_hardware == "B200"
    )
    assert "comparable only there" in report.table()


def test_gpu_run_scores_examples_with_their_own_solutions_on_the_cpu(tmp_path, monkeypatch):
    from evolve.benchmarks.kernels.gpu_run import main as gpu_run

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    examples = tmp_path / "examples"
    for language, entry, source, dps in (("pytorch", "kernel.py::rmsnorm", RETURNING, False),
                                         ("triton", "kernel.py::run", TRITON_DPS, True)):  # fmt: skip
        folder = tiny_rmsnorm(examples / language, rows=(8,))
        (folder / f"solution_{language}.json").write_text(
            json.dumps(solution(language, entry, {"kernel.py": source}, dps))
        )
    out = tmp_path / "out"
    assert (
        gpu_run(
            ["--device", "cpu", "--no-suite-table", "--examples", str(examples), "--out", str(out)]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert [(e["language"], e["status"]) for e in results["examples"]] == [
        ("pytorch", "ok"),
        ("triton", "ok"),
    ]
    assert all(e["score_published"] is None for e in results["examples"])
    assert {t["events_timer"] for t in results["timers"]} == {"host"}
    assert "| pytorch/tiny_rmsnorm | pytorch | ok |" in (out / "upstream.md").read_text()


@pytest.mark.gpu
def test_a_cuda_solution_is_built_by_the_harness_and_timed_on_the_gpu(tmp_path, monkeypatch):
    """On the H200: a .cu kernel with its own launch, compiled by the harness (nvcc), then timed."""
    cu = r"""
#include <torch/extension.h>
#include <cuda_bf16.h>

__global__ void rms_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, float eps, int H) {
    extern __shared__ float partial[];
    const __nv_bfloat16* row = x + blockIdx.x * H;
    float sum = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) { float v = __bfloat162float(row[i]); sum += v * v; }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) { if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s]; __syncthreads(); }
    float r = rsqrtf(partial[0] / H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        y[blockIdx.x * H + i] = __float2bfloat16(__bfloat162float(row[i]) * r * __bfloat162float(w[i]));
}

void run(torch::Tensor x, torch::Tensor w, double eps, torch::Tensor y) {
    int H = x.size(1);
    rms_kernel<<<x.size(0), 64, 64 * sizeof(float)>>>((const __nv_bfloat16*)x.data_ptr(), (const __nv_bfloat16*)w.data_ptr(),
                                                      (__nv_bfloat16*)y.data_ptr(), (float)eps, H);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
"""
    monkeypatch.setenv("EVOLVE_KERNELS_BUILD_CACHE", str(tmp_path / "cache"))
    tiny_rmsnorm(tmp_path / "data", rows=(33, 1024))
    settings = replace(SETTINGS, device="cuda", warmup=5, iters=20, timeout_s=600.0)
    report = score(
        tmp_path / "data",
        solution("cuda_cpp", "kernel.cu::run", {"kernel.cu": cu}, True),
        tmp_path,
        settings,
    )
    assert report.status == "ok", report.message + report.output
    assert report.language == "cuda_cpp" and report.build["cached"] is False
    # timed by the timer process's clock up to its reads of the outputs (``kernels.timer``)
    assert report.timer == "host" and all(r.kernel_ms > 0 for r in report.rows)


def test_the_stage_command_writes_a_candidate_folder(tmp_path, capsys):
    from evolve.benchmarks.kernels.__main__ import main as cli

    data = solution(
        "cuda_cpp", "main.cpp::rms", {"main.cpp": CPP_RETURNING, "inc/k.h": "#pragma once\n"}, False
    )
    (tmp_path / "solution_cuda.json").write_text(json.dumps(data))
    assert cli(["stage", str(tmp_path / "solution_cuda.json"), str(tmp_path / "seed")]) == 0
    assert "editable: main.cpp, inc/k.h" in capsys.readouterr().out
    assert (tmp_path / "seed" / "inc" / "k.h").read_text() == "#pragma once\n"
    assert read_candidate(tmp_path / "seed").sources["main.cpp"] == CPP_RETURNING


def test_the_flop_fallback_is_said_in_the_report_and_the_metrics(tmp_path, monkeypatch):
    import evolve.benchmarks.kernels.fitness as fitness_module
    from evolve.benchmarks.kernels.fitness import KernelFitness

    from evolve.harness.fitness import EvalContext

    folder = tiny_rmsnorm(tmp_path / "data", rows=(8,))
    definition = json.loads((folder / "definition.json").read_text())
    definition["reference"] = definition["reference"].replace(
        "xf = x.to(torch.float32)", "xf = x.to(torch.float32) + 0 * (x > 100).nonzero().numel()"
    )
    (folder / "definition.json").write_text(json.dumps(definition))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps(CALIBRATION))
    fitness = KernelFitness(problem="tiny_rmsnorm", dataset=str(tmp_path / "data"), device="cpu", rounds=2, warmup=1,
                            iters=4, audits=1, baseline="eager", calibration=str(calibration))  # fmt: skip
    stage(
        parse_solution(solution("pytorch", "kernel.py::rmsnorm", {"kernel.py": RETURNING}, False)),
        tmp_path / "c",
    )
    evaluation = fitness.evaluate(tmp_path / "c", EvalContext(seed=1))
    assert evaluation.fitness is not None, evaluation.artifacts
    assert evaluation.metrics["flops_counted_on_real_inputs"] == 1.0
    assert evaluation.metrics["flops_memory_bound_only"] == 0.0
    assert (
        "t8: FLOPs real: counted on one set of real inputs" in evaluation.artifacts["measurement"]
    )
    assert "language: pytorch" in evaluation.artifacts["measurement"]
    assert "returning: the inputs only" in evaluation.artifacts["language"]
    assert fitness_module.read_candidate(tmp_path / "c").language == "pytorch"
