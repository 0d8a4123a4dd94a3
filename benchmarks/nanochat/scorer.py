"""The harness's process in the evaluation sandbox: feeds validation tokens, computes bits per byte.

Reads its job (one JSON line) and then the packed validation rows (int32) from stdin: the
validation files themselves stay hidden from this sandbox. It starts ``model_worker`` (which
runs the candidate's model code, guarded) as a child when it starts, before its job (the
worker imports torch meanwhile and runs no candidate code until its spec arrives), sends it
batches of inputs and reads back logits through shared memory. This process never imports
candidate code: it copies each batch of logits out of shared memory, checks it, and computes
cross-entropy and bytes itself (``evolve.harness.lm``). Causality and row independence are
checked on probes that cannot be told from scored batches: copies of randomly chosen scored
batches with some rows' futures replaced at cuts drawn from this process's secret randomness
(stratified over all positions) and all rows shuffled, sent among the scored batches in a
random order. Logits before a cut, and of untouched rows, must equal the scored batch's. The
verdict is one JSON line on stdout carrying the job's nonce.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch  # imported before the job: a scorer started ahead has it ready
from evolve.benchmarks.nanochat.model_worker import HEADER, MAGIC, SPEC, WORKER_ENV
from evolve.benchmarks.nanochat.packing import pack_rows
from evolve.benchmarks.nanochat.tokens import Split

from evolve.harness.lm import BpbSums, batch_sums, make_probes, probe_diffs, shared_logits
from evolve.harness.protocol import SAFE_PATH, EvalFailure, serve_job, tail
from evolve.harness.reaper import kill_group

LOG_FILE = "worker.log"
SPARE_ROWS = 4  # validation rows beyond the scored ones whose tokens make the probes' other futures


def eval_rows(val_dir: Path, seq_len: int, n_rows: int, spare: int) -> np.ndarray:
    """The first ``n_rows + spare`` packed validation rows of ``seq_len + 1`` tokens."""
    rows = []
    for row in pack_rows(Split(val_dir).documents(), seq_len + 1):
        rows.append(row)
        if len(rows) == n_rows + spare:
            return np.stack(rows)
    raise EvalFailure(
        "error",
        f"the validation split gives only {len(rows)} rows of {seq_len + 1} tokens; "
        f"{n_rows + spare} are needed (prepare more validation text or lower eval_tokens)",
    )


def read_rows(stream, count: int, width: int) -> np.ndarray:
    """``count`` rows of ``width`` int32 tokens sent by the fitness after the job line."""
    data = stream.read(count * width * 4)
    if len(data) != count * width * 4:
        raise EvalFailure(
            "error",
            f"the harness sent {len(data)} bytes of validation rows, expected {count * width * 4}",
        )
    return np.frombuffer(data, dtype=np.int32).reshape(count, width).astype(np.int64)


def count_params(path: Path) -> int:
    """Numbers in the checkpoint's tensors (loaded as plain tensors, no code runs)."""
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(state, dict):
        raise EvalFailure("invalid", "model.pt must hold a state dict")
    return int(sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor)))


class Worker:
    """The model worker child, its pipes and the two logits slots it writes (``shared_logits``:
    GPU memory on a GPU, so a batch's logits never cross to the host and back).

    Started with this process, before the job: it imports torch meanwhile (on a GPU this
    process is started while the candidate trains) and then waits for ``begin``, which sends
    what it needs from the job; no candidate code runs in it before that.
    """

    def __init__(self) -> None:
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.report_r, report_w = os.pipe()
        self.memory_file = os.memfd_create("logits")  # the slots on a CPU, sized by ``begin``
        fds = {"request_fd": req_r, "response_fd": resp_w, "report_fd": report_w}
        env = {**os.environ, WORKER_ENV: json.dumps(fds)}
        with open(LOG_FILE, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *SAFE_PATH, "-m", "evolve.benchmarks.nanochat.model_worker"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(req_r, resp_w, report_w, self.memory_file),
            )
        for fd in (req_r, resp_w, report_w):
            os.close(fd)
        self.buffer = b""
        self.violations: list[dict] = []
        self.logits: torch.Tensor | None = None

    def begin(self, job: dict, batch_rows: int) -> None:
        """Send the waiting worker its part of the job: the logits slots (made now), the device
        and the paths its guard refuses; it then loads the checkpoint and answers ``ready``."""
        shape = (2, batch_rows, job["seq_len"], job["vocab_size"])
        self.logits, handle, _ = shared_logits(shape, job["device"], self.memory_file)
        spec = {"logits": handle, "device": job["device"], "forbidden": job["forbidden"]}
        text = json.dumps(spec).encode()
        try:
            self._write_all(SPEC.pack(len(text)) + text)
        except BrokenPipeError as exc:
            raise EvalFailure("error", "the model worker exited early:\n" + tail(LOG_FILE)) from exc

    def send(self, slot: int, inputs: np.ndarray) -> None:
        batch, seq = inputs.shape
        payload = HEADER.pack(MAGIC, slot, batch, seq) + inputs.astype(np.int32).tobytes()
        try:
            os.write(self.req_w, payload) if len(payload) < 65536 else self._write_all(payload)
        except BrokenPipeError as exc:
            raise EvalFailure("error", "the model worker exited early:\n" + tail(LOG_FILE)) from exc

    def _write_all(self, payload: bytes) -> None:
        view = memoryview(payload)
        while view:
            written = os.write(self.req_w, view[: 1 << 20])
            view = view[written:]

    def check_guard(self) -> None:
        while select.select([self.report_r], [], [], 0)[0]:
            chunk = os.read(self.report_r, 65536)
            if not chunk:
                break
            for line in chunk.decode(errors="replace").splitlines():
                if line.startswith("violation "):
                    self.violations.append({"report": line[10:300]})
        if self.violations:
            raise EvalFailure("rejected", f"the model read forbidden data: {self.violations[0]}")

    def answer(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.resp_r], [], [], remaining)[0]:
                raise EvalFailure("timeout", f"the model gave no answer within {timeout_s:.0f}s")
            chunk = os.read(self.resp_r, 65536)
            if not chunk:
                self.check_guard()
                raise EvalFailure("error", "the model worker exited:\n" + tail(LOG_FILE))
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        self.check_guard()
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise EvalFailure("error", "the model worker's answer was garbled") from exc
        if "error" in message:
            raise EvalFailure("error", str(message["error"])[:2000] + "\n" + tail(LOG_FILE, 2000))
        return message

    def close(self) -> None:
        os.close(self.req_w)
        kill_group(self.proc)


def plan_batches(
    rows: np.ndarray, spare: np.ndarray, batch_rows: int, probes: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], list]:
    """The scored batches, and every batch in the order sent: ("score", i) and ("probe", Probe) shuffled."""
    batches = [rows[i : i + batch_rows] for i in range(0, len(rows), batch_rows)]
    plan = [("score", i) for i in range(len(batches))]
    plan += [("probe", probe) for probe in make_probes(batches, spare, probes, rng)]
    order = rng.permutation(len(plan))
    return batches, [plan[i] for i in order]


def evaluate(job: dict, worker: Worker) -> dict:
    """Score the checkpoint in the current directory per ``job`` with ``worker`` (started before the
    job, ``Worker``); raises EvalFailure."""
    start = time.monotonic()
    seq, rows_per_batch, device = job["seq_len"], job["batch_rows"], job["device"]
    n_rows = job["eval_tokens"] // seq
    rows = read_rows(sys.stdin.buffer, n_rows + SPARE_ROWS, seq + 1)
    rng = np.random.default_rng(secrets.randbits(128))  # never seen by the model's process
    batches, plan = plan_batches(
        rows[:n_rows], rows[n_rows:], rows_per_batch, job["probe_batches"], rng
    )
    token_bytes = torch.from_numpy(np.load(job["token_bytes"]).astype(np.int64)).to(device)
    params = count_params(Path("model.pt"))
    worker.begin(job, rows_per_batch)
    probed_bases = {item.base for kind, item in plan if kind == "probe"}
    kept: dict[int, torch.Tensor] = {}  # logits of the scored batches that a probe copies
    probe_logits: list = []
    sums = BpbSums()
    try:
        worker.answer(job["worker_startup_s"])
        load_s = time.monotonic() - start

        def collect(slot: int, kind: str, item) -> None:
            message = worker.answer(job["batch_timeout_s"])
            if message.get("slot") != slot:
                raise EvalFailure("error", "the model worker answered out of order")
            logits = worker.logits[slot].to(device, copy=True)  # ours: the worker can't change it
            if logits.is_cuda:
                torch.cuda.synchronize()  # copied before the worker may write the slot again
            if not bool(torch.isfinite(logits).all()):
                raise EvalFailure("invalid", "the model produced non-finite logits")
            if kind == "probe":
                probe_logits.append((item, logits))
                return
            if item in probed_bases:
                kept[item] = logits
            targets = torch.from_numpy(batches[item][:, 1:]).to(device)
            sums.add(*batch_sums(logits, targets, token_bytes))

        in_flight: deque = deque()
        for index, (kind, item) in enumerate(plan):
            if len(in_flight) == 2:
                collect(*in_flight.popleft())
            inputs = batches[item] if kind == "score" else item.rows
            worker.send(index % 2, inputs[:, :-1])
            in_flight.append((index % 2, kind, item))
        while in_flight:
            collect(*in_flight.popleft())
        forwarded = time.monotonic()
    finally:
        worker.close()
    diffs = [probe_diffs(kept[probe.base], logits, probe) for probe, logits in probe_logits]
    causal = {
        "max_prefix_diff": max((d[0] for d in diffs), default=0.0),
        "max_row_diff": max((d[1] for d in diffs), default=0.0),
        "probe_batches": len(diffs),
    }
    if max(causal["max_prefix_diff"], causal["max_row_diff"]) > job["causal_atol"]:
        raise EvalFailure(
            "rejected",
            f"the model is not causal: logits before a position changed when later tokens changed "
            f"(max diff {causal['max_prefix_diff']:.3g}) or a row's logits changed when the other rows "
            f"of its batch or their order changed (max diff {causal['max_row_diff']:.3g}); "
            f"tolerance {job['causal_atol']}",
        )
    return {
        "val_bpb": sums.bpb,
        "nats": sums.nats,
        "bytes": sums.bytes,
        "targets": sums.targets,
        "params": params,
        "eval_s": time.monotonic() - start,
        "load_s": load_s,
        "marks": {"ready": start + load_s, "forwarded": forwarded},
        **causal,
        "worker_log": tail(LOG_FILE, 1500),
    }


def answer(job: dict, worker: Worker) -> dict:
    """The scorer's verdict on ``job``: the sums, or the failure with the worker's log."""
    try:
        return {"status": "ok", **evaluate(job, worker)}
    except EvalFailure as failure:
        return {
            "status": failure.status,
            "reason": failure.reason,
            "worker_log": tail(LOG_FILE, 1500),
        }


if __name__ == "__main__":
    waiting = Worker()  # imports torch while this process waits for its job
    serve_job(lambda job: answer(job, waiting))
