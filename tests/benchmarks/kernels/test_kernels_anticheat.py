"""Each cheat is caught, or has nothing left to gain: a candidate per cheat, run through the sandboxed harness.

The timer (``timer.py``) owns the inputs, the clock and every comparison in a process the
candidate cannot reach, so cheats that patched the process hosting the candidate (its clocks,
torch modes, the harness's checks) change no number; the harness scores them as the honest
kernels they otherwise are.
"""

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

CAUGHT = {
    "proxy output (storage swapped)": (PROXY_OUTPUT, "invalid", "round 0: output 0: 2112 NaN/Inf value(s)"),
    "outputs cached across calls": (CACHED_OUTPUT, "cheat", "although the correctness rounds passed"),
    "inline C++ loading": (INLINE_CPP, "cheat", "tried inline C++ loading (load_inline)"),
    "process left running": (LEFTOVER_PROCESS, "cheat", "left 1 process(es) running"),
    "harness checks disabled in the candidate's process": (
        TAMPERED_DRIVER,
        "invalid",
        "round 0: output 0: all zeros where the reference is not",
    ),
}
HARMLESS = {  # each was a cheat while the candidate shared its process with the clock
    "patched timer at import": PATCHED_TIMER,
    "patched clock during a call": PATCHED_CLOCK_AT_CALL,
    "extra threads": EXTRA_THREAD,
    "kernels changing between iterations": KERNEL_SWITCH,
    "torch dispatch mode": DISPATCH_MODE,
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every candidate evaluated once, a few in parallel (each in its own sandboxed process)."""
    root = tmp_path_factory.mktemp("kernels-cheats")
    tiny_rmsnorm(root, rows=(33,))
    codes = {name: code for name, (code, _, _) in CAUGHT.items()} | HARMLESS
    return evaluate_many(root, codes, root)


@pytest.mark.parametrize("cheat", list(CAUGHT))
def test_each_cheat_is_caught(reports, cheat):
    _, status, message = CAUGHT[cheat]
    report = reports[cheat]
    assert report.status == status, f"{cheat}: {report.status} {report.message}\n{report.output}"
    assert message in report.message, report.message
    assert report.score == 0.0


@pytest.mark.parametrize("cheat", list(HARMLESS))
def test_what_the_candidates_process_patches_changes_no_number(reports, cheat):
    report = reports[cheat]
    assert report.status == "ok", f"{cheat}: {report.status} {report.message}\n{report.output}"
    assert all(row.status == "ok" and row.kernel_ms > 0 for row in report.rows)
