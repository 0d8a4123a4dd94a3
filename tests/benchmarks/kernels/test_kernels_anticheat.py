"""Each anti-cheat check catches its cheat: a candidate per cheat, run through the sandboxed harness."""

from __future__ import annotations

import pytest
from kernels_candidates import (
    CACHED_OUTPUT,
    DISPATCH_MODE,
    EXTRA_THREAD,
    INLINE_CPP,
    KERNEL_SWITCH,
    LEFTOVER_PROCESS,
    PATCHED_CLOCK_AT_CALL,
    PATCHED_TIMER,
    PROXY_OUTPUT,
    TAMPERED_DRIVER,
    evaluate_many,
)
from kernels_fixtures import tiny_rmsnorm

CHEATS = {
    "patched timer at import": (PATCHED_TIMER, "torch.cuda.Event.elapsed_time"),
    "patched clock during a call": (PATCHED_CLOCK_AT_CALL, "time.perf_counter_ns"),
    "extra threads": (EXTRA_THREAD, "extra thread(s) still running"),
    "proxy output (storage swapped)": (PROXY_OUTPUT, "replaced or reshaped"),
    "outputs cached across calls": (CACHED_OUTPUT, "although the correctness rounds passed"),
    "inline C++ loading": (INLINE_CPP, "tried inline C++ loading (load_inline)"),
    "kernels changing between iterations": (
        KERNEL_SWITCH,
        "kernels launched changed between iterations",
    ),
    "torch dispatch mode": (DISPATCH_MODE, "dispatch mode is active"),
    "process left running": (LEFTOVER_PROCESS, "left 1 process(es) running"),
    "driver checks disabled (caught by the witness)": (
        TAMPERED_DRIVER,
        "witness: outputs saved from a timed call",
    ),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every cheat evaluated once, a few in parallel (each in its own sandboxed process)."""
    root = tmp_path_factory.mktemp("kernels-cheats")
    tiny_rmsnorm(root, rows=(33,))
    return evaluate_many(root, {name: code for name, (code, _) in CHEATS.items()}, root)


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_each_cheat_is_caught(reports, cheat):
    message = CHEATS[cheat][1]
    report = reports[cheat]
    assert report.status == "cheat", f"{cheat}: {report.status} {report.message}\n{report.output}"
    assert message in report.message, report.message
    assert report.score == 0.0
