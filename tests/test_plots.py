"""Plots: the data behind them (series, grid) and the PNGs written at run end."""

from __future__ import annotations

import pytest

from evolve.query.run import fitness_series
from evolve.research.plots import grid, write_plots
from evolve.store.database import Store
from evolve.types import CandidateStatus, EvalStatus, Evaluation, Proposal
from tests.fixtures.sample_archive import write_sample_archive

PNG = b"\x89PNG\r\n\x1a\n"


def _elite(store: Store, seq: int, island: int, cell: str, value: float) -> str:
    proposal = Proposal(files={"a.py": f"x = {seq}\n"}, operator="tweak")
    store.add_candidate(proposal, seq=seq, status=CandidateStatus.DONE)
    store.add_evaluation(
        proposal.id, Evaluation(status=EvalStatus.OK, fitness=value, descriptors={"u": 0, "v": 0})
    )
    store.put_elite(island, cell, proposal.id, value)
    return proposal.id


def test_write_plots_on_a_finished_run(tmp_path):
    run = tmp_path / "run"
    write_sample_archive(run / "archive.db", candidates=120, islands=2)
    paths = write_plots(run / "archive.db", run)
    assert [p.name for p in paths] == ["fitness.png", "grid.png", "success.png"]
    for path in paths:
        assert path.parent == run / "plots"
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000


def test_write_plots_on_an_empty_archive(tmp_path):
    Store(tmp_path / "archive.db").close()
    paths = write_plots(Store(tmp_path / "archive.db", readonly=True), tmp_path, subdir="")
    assert all(p.read_bytes().startswith(PNG) for p in paths)


def test_grid_keeps_the_best_over_islands_and_folds_extra_dimensions(tmp_path):
    store = Store(tmp_path / "archive.db")
    store.set_state(
        "grid",
        {
            "descriptors": [
                {"name": "u", "low": 0, "high": 1, "bins": 3},
                {"name": "v", "low": 0, "high": 1, "bins": 4},
                {"name": "w", "low": 0, "high": 1, "bins": 2},
            ]
        },
    )
    low = _elite(store, 0, 0, "2,1,0", 1.0)
    high = _elite(store, 1, 1, "2,1,1", 3.0)
    _elite(store, 2, 0, "0,3,1", 2.0)
    view = grid(store)
    assert view.axes == ["u", "v"] and view.shape == (3, 4) and view.filled == 2
    assert view.values[2][1] == 3.0 and view.ids[2][1] == high
    island0 = grid(store, island=0)
    assert island0.values[2][1] == 1.0 and island0.ids[2][1] == low and island0.islands == [0, 1]
    store.set_state("objective", {"direction": "min"})
    assert grid(store).values[2][1] == 1.0
    store.close()


def test_grid_without_recorded_axes_infers_them(tmp_path):
    store = Store(tmp_path / "archive.db")
    _elite(store, 0, 0, "4", 1.0)
    view = grid(store)
    assert view.shape == (1, 5) and view.values[0][4] == 1.0 and view.axes == ["u"]
    store.close()


@pytest.mark.parametrize("rows", [0, 7, 2000])
def test_fitness_series_is_thinned_and_keeps_the_last_row(tmp_path, rows):
    store = Store(tmp_path / "archive.db")
    for i in range(rows):
        store.add_stats(
            evaluated=i, best=float(i), coverage=0.0, qd_score=0.0, cost=0.0, failures=0
        )
    series = fitness_series(store, points=100)
    assert len(series) <= 101
    if rows:
        assert series[0]["evaluated"] == 0 and series[-1]["evaluated"] == rows - 1
    store.close()


def test_a_run_scoring_1e308_ends_with_its_plots_drawn(tmp_path) -> None:
    from evolve.launch import runner
    from tests.conftest import composed

    cfg = composed(["search.max_candidates=6", "search.workers=1"])
    cfg["benchmark"]["fitness"] = {"_target_": "tests.fixtures.toy.Huge", "value": 1e308}
    runner.run(cfg, tmp_path)  # the QD score overflows to inf; the best is 1e308
    assert all(
        (tmp_path / "plots" / name).stat().st_size > 0 for name in ("fitness.png", "grid.png")
    )
