"""The GPU measurement script runs end to end on CPU with tiny settings (so its first GPU run is not its first run)."""

import json
import lzma
import sysconfig
from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import gpu_run


def small_wiki(folder: Path, files: int = 60) -> Path:
    """Shards in the Wikipedia layout (train-00, val) holding the standard library's sources."""
    folder.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(stdlib.glob("*.py"))[:files]
    cut = files * 5 // 6
    for name, chunk in (("train-00", sources[:cut]), ("val", sources[cut:])):
        with lzma.open(folder / f"{name}.jsonl.xz", "wt") as handle:
            for i, path in enumerate(chunk):
                handle.write(
                    json.dumps({"id": i, "title": path.name, "text": path.read_text()}) + "\n"
                )
    return folder


def test_prepare_only_needs_no_gpu_on_a_gpu_machine(tmp_path, monkeypatch):
    """The device's first step: the data alone, with the default --gpus naming GPUs it lacks."""
    monkeypatch.setattr(gpu_run.scales, "cuda_available", lambda: True)

    def no_gpus(spec):
        raise ValueError(f"GPU indices {spec} are not visible")

    monkeypatch.setattr(gpu_run.placement, "chosen", no_gpus)
    wiki = small_wiki(tmp_path / "wikipedia", files=12)
    argv = ["--prepare-only", "--tiny", "--wiki", str(wiki), "--data-dir", str(tmp_path / "data")]
    assert gpu_run.main(argv) == 0
    assert (tmp_path / "data" / "wikipedia-tiny" / "dataset.json").is_file()


@pytest.mark.slow
def test_gpu_run_tiny_on_cpu(tmp_path, monkeypatch):
    wiki = small_wiki(tmp_path / "wikipedia")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    code = gpu_run.main(
        [
            "--device",
            "cpu",
            "--tiny",
            "--wiki",
            str(wiki),
            "--data-dir",
            str(tmp_path / "data"),
            "--budget",
            "2",
            "--bare",
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    summary = results["summary"]
    assert summary["runs_ok"] == 2 and summary["val_bpb_mean"] > 0
    assert summary["mfu"] > 0 and summary["overhead_s"] > 0
    text = (tmp_path / "out" / "RESULTS-gpu.md").read_text()
    assert "val_bpb" in text and "| seed |" in text
    for run in results["runs"]:  # the seed run again bare, timed the same way
        assert run["bare"]["returncode"] == 0 and run["bare"]["tokens_per_s"] > 0, run["bare"]
        assert run["bare"]["steps"] > 11  # past the untimed steps
    assert text.count("timed tokens/s: run bare") == 2


def test_the_overhead_per_evaluation_leaves_the_once_per_run_warmup_apart():
    # the H200 campaign of 2026-12-04 (code 07e2a5d): wall − budget 64.7 s, of which the
    # compile cache's warm-up 42.1 s once per run; 22.6 s per evaluation
    stored = Path(gpu_run.__file__).parent / "results/2026-12-04/campaign-nanochat-300.json"
    made = json.loads(stored.read_text())["runs"][0]["results"]["results.json"]
    [run] = made["runs"]
    line = gpu_run.overhead_line(run, made["summary"]["budget_s"])
    assert line.startswith(
        "overhead per evaluation 22.6 s = 7.5% of budget: startup 6.0, export 5.3"
    )
    assert "training" not in line and line.endswith("once per run, apart: cache_warmup 42.1 s")
    scale = gpu_run.scales.resolve("nanochat", budget_s=made["summary"]["budget_s"])
    summary = gpu_run.summarize([run], made["summary"]["peak_flops"], scale, "H200")
    assert round(summary["overhead_per_eval_s"], 1) == 22.6
