"""benchmarks/gpu_script.py: a GPU figure is judged only against the reference of its own card."""

from __future__ import annotations

import json

from evolve.benchmarks import gpu_script


def test_a_figure_is_judged_against_its_cards_reference_and_never_another_cards(tmp_path):
    path = tmp_path / "references.json"
    h200 = {"mean": 1.4206, "sd": 0.0219, "runs": 13, "days": ["2026-11-29", "2026-12-04"], "setting": 300.0}  # fmt: skip
    path.write_text(json.dumps({"nanochat": {"NVIDIA H200": h200}}))
    line = gpu_script.judged("nanochat", "NVIDIA H200", 1.4425, 300, path=path)
    assert "NVIDIA H200 reference 1.4206" in line and "+1.0 sd" in line and "13 runs" in line
    other = gpu_script.judged("nanochat", "NVIDIA H100 80GB HBM3", 1.4722, 300, path=path)
    assert other.startswith("no nanochat reference for NVIDIA H100 80GB HBM3")
    assert "references exist for: NVIDIA H200" in other and "1.4206" not in other
    at_120 = gpu_script.judged("nanochat", "NVIDIA H200", 1.6, 120, path=path)
    assert "measured at 300, this run at 120: not comparable" in at_120 and "sd" not in at_120
    assert "references exist for: none" in gpu_script.judged("speedrun_1gpu", "NVIDIA H200", 5.1, 820, path=path)  # fmt: skip


def test_the_shipped_references_name_cards_as_torch_does():
    stored = json.loads(gpu_script.REFERENCES.read_text())
    assert set(stored) == {"nanochat", "speedrun_1gpu"}
    for cards in stored.values():
        assert all(card.startswith("NVIDIA ") for card in cards)
        assert all(
            {"mean", "sd", "runs", "days", "setting", "derived_by"} <= set(e)
            for e in cards.values()
        )
