"""The harness clock and timed data stream, with small programs that use the stream directly (no torch)."""

import os
import re
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from evolve.harness.clock import (
    BATCH_HEADER,
    MADE_AHEAD_BYTES,
    UNTIMED_ENV,
    Watch,
    Window,
    _Pipes,
    _wire,
    launch,
    run_timed,
)
from evolve.harness.confine import hide_reads
from evolve.harness.stream import tokens
from evolve.sandbox import landlock

WIDTH = 5


def feed(rows: int, real: bool) -> np.ndarray:
    """Real rows are all 7s, synthetic ones all 1s: the program's log shows which it got."""
    return np.full((rows, WIDTH), 7 if real else 1, dtype=np.int32)


def run(
    tmp_path: Path,
    body: str,
    hide: tuple[str, ...] = (),
    ask_ahead: bool = False,
    progress: Callable[[int, float | None], None] | None = None,
    on_initial: Callable[[], None] | None = None,
    **window,
) -> tuple[dict, str]:
    """Run ``body`` as the timed program; ``ask_ahead``: its stream is told the untimed steps
    (``UNTIMED_ENV``, as the nanochat supervisor tells it), so it asks for batches ahead."""
    program = tmp_path / "prog.py"
    program.write_text(
        "import sys, time\nfrom evolve.harness.stream import EndOfData, channel\nc = channel()\n"
        + textwrap.dedent(body)
    )
    settings = dict(
        budget_s=0.5,
        untimed_steps=3,
        startup_limit_s=60.0,
        free_startup_s=60.0,
        finish_limit_s=20.0,
        save_floor_s=5.0,  # honest programs report at once, however loaded the machine
    )
    settings.update(window)
    env = {k: v for k, v in os.environ.items() if k != UNTIMED_ENV}
    if ask_ahead:
        env[UNTIMED_ENV] = str(settings["untimed_steps"])
    log = tmp_path / "prog.log"
    launched = launch(
        [sys.executable, str(program)],
        env=env,
        log_file=str(log),
        marker_var="TEST_CLOCK_TREE",
        preexec=hide_reads(hide) if hide else None,  # planned once the program's files exist
    )
    verdict = run_timed(launched, window=Window(**settings), feed=feed,
                        on_saved=lambda: {"digest": "fixed"}, write_dir=str(tmp_path),
                        progress=progress, on_initial=on_initial)  # fmt: skip
    return verdict, log.read_text()


HONEST = """
seen = []
while True:
    try:
        seen.append(int(c.batch(2)[0, 0]))
    except EndOfData:
        break
    if not c.step(tokens=8, loss=1.0):
        break
print("SEEN", "".join(map(str, seen)), flush=True)
c.saved()
"""


def test_synthetic_rows_before_the_clock_real_rows_while_it_runs_then_the_stream_ends(tmp_path):
    verdict, log = run(tmp_path, HONEST)
    assert verdict["status"] == "ok", verdict
    seen = log.split("SEEN ")[1].strip()
    assert seen.startswith("111") and set(seen[3:]) == {"7"}  # 3 untimed steps, then real rows
    assert verdict["synthetic_batches"] == 3
    assert verdict["tokens"] == (len(seen) - 3) * 2 * (WIDTH - 1)  # counted by the harness
    assert verdict["checkpoint"] == {"digest": "fixed"} and verdict["stopped_by_harness"]


def test_progress_hears_the_steps_and_latest_loss_only_while_the_clock_runs(tmp_path):
    heard: list[tuple[int, float | None]] = []
    verdict, _ = run(tmp_path, HONEST, progress=lambda step, loss: heard.append((step, loss)))
    assert verdict["status"] == "ok", verdict
    steps = [step for step, _ in heard]
    assert steps and steps == sorted(set(steps)) and steps[0] >= 3, heard  # after the 3 untimed
    assert steps[-1] <= verdict["steps"] and {loss for _, loss in heard} == {1.0}, heard


def numbered_feed(made: list[int]):
    """A feed whose real rows are numbered in the order made (synthetic rows are -1s)."""

    def numbered(rows: int, real: bool) -> np.ndarray:
        if not real:
            return np.full((rows, WIDTH), -1, dtype=np.int32)
        first = len(made)
        made.extend(range(first, first + rows))
        return np.arange(first, first + rows, dtype=np.int32)[:, None].repeat(WIDTH, axis=1)

    return numbered


@pytest.mark.parametrize(
    ("reports", "heard"),
    [
        ("c.saved_initial()\nc.saved_initial()\n", 1),  # before the clock: the first counts
        ("", 0),  # never: a program without it runs as before
    ],
)
def test_an_initial_checkpoint_reported_before_the_clock_is_heard_once(tmp_path, reports, heard):
    calls = []
    verdict, log = run(tmp_path, reports + HONEST, on_initial=lambda: calls.append(1))
    assert verdict["status"] == "ok", verdict
    assert len(calls) == heard


def test_an_initial_checkpoint_reported_once_the_clock_runs_is_ignored(tmp_path):
    # the clock starts at the last untimed step's report, which comes before this one: work
    # the harness began on it would overlap time the program is charged for anyway
    body = HONEST.replace(
        "    if not c.step(tokens=8, loss=1.0):",
        "    going = c.step(tokens=8, loss=1.0)\n    if c.steps == 3:\n        c.saved_initial()\n"
        "    if not going:",
    )
    calls = []
    verdict, _ = run(tmp_path, body, on_initial=lambda: calls.append(1))
    assert verdict["status"] == "ok", verdict
    assert calls == []


@pytest.mark.parametrize("ask_ahead", [False, True])
def test_rows_keep_their_order_whatever_the_batch_sizes(tmp_path, monkeypatch, ask_ahead):
    """The harness makes real rows ahead while the program trains on the last ones, and
    (``ask_ahead``) the stream asks for the next step's batches while a step trains: a program
    that takes several batches a step and changes their sizes still gets every real row once,
    in the feed's order, real rows from the first timed step on, and the harness counts only
    the rows it read (not those made or asked for ahead when the stop came)."""
    made: list[int] = []
    monkeypatch.setattr(sys.modules[__name__], "feed", numbered_feed(made))
    body = """
    seen, plans = [], [[2], [2, 2], [3, 1, 1], [4], [1, 2, 2]]
    step = 0
    while True:
        try:
            for rows in plans[step % len(plans)]:
                seen += [int(r) for r in c.batch(rows)[:, 0]]
        except EndOfData:
            break
        step += 1
        time.sleep(0.01)
        if not c.step(tokens=8):
            break
    print("SEEN", " ".join(map(str, seen)), flush=True)
    c.saved()
    """
    verdict, log = run(tmp_path, body, ask_ahead=ask_ahead, budget_s=1.0)
    assert verdict["status"] == "ok", verdict
    seen = [int(x) for x in log.split("SEEN ")[1].split()]
    untimed = sum([2, 2 + 2, 3 + 1 + 1])  # the 3 untimed steps' rows
    assert set(seen[:untimed]) == {-1}  # synthetic
    real = seen[untimed:]
    assert len(real) > 20 and real == list(range(len(real)))  # every row once, in order
    # only the rows read are counted; asked ahead, the stream may hold back part of a batch
    # when the program's sizes change (here at most 3 rows), which the harness cannot see
    assert len(real) * (WIDTH - 1) <= verdict["tokens"] <= (len(real) + 3 * ask_ahead) * (WIDTH - 1)
    assert verdict["unread_tokens"] is not None  # Linux pipes say what is left in them


@pytest.mark.parametrize("values, itemsize", [((0, 65535), 2), ((-1, 7), 4), ((0, 1 << 16), 4)])
def test_a_batch_travels_as_uint16_where_every_token_fits_and_arrives_unchanged(values, itemsize):
    batch = np.array([values, values[::-1], values], dtype=np.int32)
    wire = bytes(_wire(batch))
    header = BATCH_HEADER.unpack(wire[: BATCH_HEADER.size])
    assert header == (3, 2, itemsize) and len(wire) == BATCH_HEADER.size + 6 * itemsize
    arrived = tokens(wire[BATCH_HEADER.size :], *header)
    assert arrived.dtype == np.int32 and np.array_equal(arrived, batch)


def test_a_step_of_rows_is_made_ahead_a_batch_at_a_time_and_sent_in_order():
    """While the program trains (nothing asked), the harness makes up to the last step's rows
    ahead, one batch a call; a request is answered from them, in the feed's order."""
    made: list[int] = []
    pipes, now = _Pipes(), time.monotonic()
    watch = Watch(Window(budget_s=9.0, untimed_steps=0, startup_limit_s=9.0, free_startup_s=9.0,
                         finish_limit_s=9.0, save_floor_s=9.0), now)  # fmt: skip
    watch.timed_from = now  # the clock runs
    for line in ["batch 2"] * 4 + ["step 0 8"]:  # a step of four batches of 2 rows
        watch.on_line(line, now)
    while watch.requests:
        pipes.serve(watch, numbered_feed(made))
    assert watch.rows_per_step == 8 and made == list(range(8))
    calls = 0
    while pipes.to_prepare(watch):
        pipes.prepare(watch, numbered_feed(made))
        calls += 1
    assert calls == 4 and sum(map(len, pipes.ahead)) == 8 and made == list(range(16))
    # a program asking for huge steps cannot fill the harness's memory: here the 8 rows made
    # are as wide as MADE_AHEAD_BYTES allows
    watch.rows_per_step, pipes.width = 10**9, MADE_AHEAD_BYTES // 4 // 8
    assert pipes.to_prepare(watch) == 0
    watch.rows_per_step, pipes.width = 8, WIDTH
    watch.on_line("batch 3", now)
    assert pipes.to_prepare(watch) == 0  # a request is answered before anything is made
    pipes.serve(watch, numbered_feed(made))
    answers = os.read(pipes.data_r, 1 << 16)
    header = BATCH_HEADER.unpack(answers[-BATCH_HEADER.size - 3 * WIDTH * 2 : -3 * WIDTH * 2])
    last = tokens(answers[-3 * WIDTH * 2 :], *header)
    assert header == (3, WIDTH, 2) and list(last[:, 0]) == [8, 9, 10] and len(made) == 16
    assert watch.real_tokens == 11 * (WIDTH - 1)  # the rows sent, not the 5 still made ahead
    pipes.close()
    pipes.close_child_ends()


def test_rows_sent_and_never_read_are_not_counted():
    """Batches asked for ahead and answered before the stop, then never read (the program
    ended): the harness takes their tokens off what it counted (``unread_tokens``)."""
    pipes = _Pipes()
    watch = Watch(Window(budget_s=1.0, untimed_steps=0, startup_limit_s=9.0, free_startup_s=9.0,
                         finish_limit_s=9.0, save_floor_s=9.0), time.monotonic())  # fmt: skip
    watch.timed_from, watch.requests = time.monotonic(), [3, 2, 4]  # the clock runs
    while watch.requests:  # one answer made a call
        pipes.serve(watch, feed)
    assert watch.real_tokens == 9 * (WIDTH - 1)
    rows, width, itemsize = BATCH_HEADER.unpack(os.read(pipes.data_r, BATCH_HEADER.size))
    assert (rows, width, itemsize) == (3, WIDTH, 2)  # small token ids travel as uint16
    assert len(os.read(pipes.data_r, 3 * WIDTH * 2 + BATCH_HEADER.size + WIDTH * 2)) == 52
    # the program read the first batch and one row of the second, then was gone
    assert pipes.unread_tokens() == 5 * (WIDTH - 1)  # the rows it never read
    pipes.close()
    pipes.close_child_ends()


def test_a_program_launched_ahead_runs_at_its_go_and_its_start_up_counts_from_then(tmp_path):
    """Launched before its job (``waits``), a program prepares (here: 1 s of imports) and then
    waits; it gets the go's message, and only the time after the go is its start-up."""
    program = tmp_path / "prog.py"
    program.write_text(
        "import json, sys, time\nfrom evolve.harness.stream import EndOfData, channel, wait_for_go\n"
        "time.sleep(1.0)  # preparing\nmessage = wait_for_go()\n"
        "print('GO', json.dumps(message), flush=True)\nc = channel()\n" + textwrap.dedent(HONEST)
    )
    launched = launch([sys.executable, str(program)], env=dict(os.environ),
                      log_file=str(tmp_path / "prog.log"), marker_var="TEST_CLOCK_TREE", waits=True)  # fmt: skip
    window = Window(budget_s=0.5, untimed_steps=3, startup_limit_s=60.0, free_startup_s=0.0,
                    finish_limit_s=20.0, save_floor_s=0.5)  # fmt: skip
    with pytest.raises(RuntimeError, match="once it had its go"):
        run_timed(launched, window=window, feed=feed)
    time.sleep(2.0)  # the job comes later than the program's preparation ends
    launched.go({"argv": ["train.py"], "env": {"A": "1"}})
    verdict = run_timed(launched, window=window, feed=feed)
    log = (tmp_path / "prog.log").read_text()
    assert verdict["status"] == "ok", verdict
    assert 'GO {"argv": ["train.py"], "env": {"A": "1"}}' in log
    assert verdict["startup_s"] < 1.0 and verdict["startup_charged_s"] < 1.0  # not the 3 s before


def test_after_the_stop_no_batch_arrives(tmp_path):
    verdict, log = run(
        tmp_path,
        HONEST.replace(
            "    if not c.step(tokens=8, loss=1.0):\n        break", "    c.step(tokens=8)"
        ).replace("c.saved()", "c.saved()  # never reached: the stream ended"),
    )
    # one step after the stop is the step in flight; the next asks for data and gets none
    assert verdict["status"] == "ok", verdict
    assert verdict["stop_to_save_s"] is not None


def test_no_checkpoint_before_the_finish_limit_is_rejected(tmp_path):
    verdict, _ = run(
        tmp_path, HONEST.replace("c.saved()", "time.sleep(30)\nc.saved()"), finish_limit_s=2.0
    )
    assert verdict["status"] == "rejected"
    assert "no checkpoint within 2s of the stop" in verdict["reason"]


def test_a_checkpoint_reported_later_than_its_allowance_is_rejected_naming_it(tmp_path):
    # 3 s between the stop and the report: no step (milliseconds here) nor a write of a few
    # bytes needs that; the allowance is the floor, the step (at most the floor) and the write
    verdict, _ = run(
        tmp_path, HONEST.replace("c.saved()", "time.sleep(3.0)\nc.saved()"), save_floor_s=0.5
    )
    assert verdict["status"] == "rejected", verdict
    assert re.search(
        r"checkpoint \d+\.\d\ds after the stop.*floor of 0\.5s.*write", verdict["reason"]
    )
    assert 0.5 <= verdict["save_allowed_s"] < 1.5
    assert not list(tmp_path.glob(".write-probe-*"))  # the measurement leaves nothing


def test_an_honest_save_reports_its_allowance(tmp_path):
    verdict, _ = run(tmp_path, HONEST)
    assert verdict["status"] == "ok", verdict
    assert verdict["stop_to_save_s"] < verdict["save_allowed_s"] < 2 * 5.0  # floor, step <= floor


def test_training_on_kept_rows_after_the_stop_is_rejected(tmp_path):
    body = """
    kept = None
    while True:
        try:
            kept = c.batch(2)
        except EndOfData:
            pass
        c.step(tokens=8)
    """
    verdict, _ = run(tmp_path, body)
    assert verdict["status"] == "rejected"
    assert "kept training after the harness said stop" in verdict["reason"]


def test_start_up_beyond_the_allowance_is_charged(tmp_path):
    verdict, _ = run(tmp_path, "time.sleep(1.0)\n" + HONEST, free_startup_s=0.0, budget_s=3.0)
    assert verdict["status"] == "ok", verdict
    assert verdict["startup_charged_s"] >= 1.0
    assert verdict["training_s"] < 3.0  # the budget less the charge, plus a step of microseconds


@pytest.mark.parametrize("rows", [0, 70000])
def test_odd_batch_requests_are_answered_or_capped(tmp_path, rows):
    body = f"""
    b = c.batch({rows})
    print("SHAPE", b.shape)
    for _ in range(4):
        if not c.step():
            break
    c.saved()
    """
    verdict, log = run(tmp_path, body, budget_s=0.0)
    assert verdict["status"] == "ok", verdict
    assert f"SHAPE ({min(max(rows, 1), 65536)}, {WIDTH})" in log


def test_the_program_is_ended_once_its_checkpoint_is_in(tmp_path):
    # a slow exit (teardown) is not waited for, and nothing can be saved after the first
    # checkpoint since the stop: a second save, or any later work, never happens
    after = (
        "c.saved()\ntime.sleep(1.5)\nc.saved()\nprint('STILL HERE', flush=True)\ntime.sleep(600)"
    )
    verdict, log = run(tmp_path, HONEST.replace("c.saved()", after), finish_limit_s=120.0)
    assert verdict["status"] == "ok", verdict
    assert verdict["ended_by_harness"] and "STILL HERE" not in log
    assert verdict["checkpoint"] == {"digest": "fixed"}


def test_with_a_profile_asked_for_the_program_is_ended_after_reporting_it(tmp_path):
    # (a program whose profile failed sends null: it is ended all the same)
    for line, profile in (('{"steps": 3}', {"steps": 3.0}), ("null", None)):
        body = HONEST.replace("c.saved()", f"c.saved()\nc.send('profile {line}')\ntime.sleep(600)")
        verdict, _ = run(tmp_path, body, finish_limit_s=120.0, profiled=True)
        assert verdict["status"] == "ok" and verdict["ended_by_harness"], verdict
        assert (verdict["profile"] or {}).get("steps") == (profile or {}).get("steps")


def test_checkpoints_saved_along_the_way_are_allowed_the_last_counts(tmp_path):
    body = HONEST.replace("    if not c.step(", "    c.saved()\n    if not c.step(")
    verdict, _ = run(tmp_path, body)
    assert verdict["status"] == "ok", verdict
    assert verdict["stop_to_save_s"] is not None


@pytest.mark.skipif(landlock.abi() < 1, reason="needs Landlock (Linux >= 5.13)")
def test_hidden_files_are_unreadable_to_the_program_even_by_native_code(tmp_path):
    secret = tmp_path / "data" / "train"
    secret.mkdir(parents=True)
    (secret / "tokens.bin").write_bytes(b"secret")
    body = f"""
    import ctypes
    fd = ctypes.CDLL(None).open({str(secret / "tokens.bin").encode()!r}, 0)
    try:
        open({str(secret / "tokens.bin")!r}, "rb").read()
        python = "read"
    except PermissionError:
        python = "refused"
    print("NATIVE", fd, "PYTHON", python)
    for _ in range(4):
        c.step()
    c.saved()
    """
    verdict, log = run(tmp_path, body, budget_s=0.0, hide=(str(secret),))
    assert verdict["status"] == "ok", verdict
    assert "NATIVE -1 PYTHON refused" in log
