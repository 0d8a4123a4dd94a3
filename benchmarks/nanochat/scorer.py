"""The harness's process in the evaluation sandbox: runs the exported model on validation tokens, computes bits per byte.

Reads its job (one JSON line) and then the packed validation rows (int32) from stdin: the
validation files themselves stay hidden from this sandbox. Its folder holds the checkpoint
(digest-checked) and the graph that ``evolve.harness.exporter`` made of it in a sandbox of
its own after the stop. No candidate code runs here: ``evolve.harness.exported.Program``
screens and checks the graph and rebuilds it with the checkpoint's own tensors, and this
process runs that pure function of the input tokens, then computes cross-entropy and bytes
itself (``evolve.harness.lm``). Causality and row independence are checked on probes that
cannot be told from scored batches: copies of randomly chosen scored batches with some rows'
futures replaced at cuts drawn from this process's secret randomness (stratified over all
positions) and all rows shuffled, run among the scored batches in a random order. Logits
before a cut, and of untouched rows, must equal the scored batch's. The verdict is one JSON
line on stdout carrying the job's nonce.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

import numpy as np
import torch  # imported before the job: a scorer started ahead has it ready

from evolve.harness.exported import ExportRejected, Program, load_weights
from evolve.harness.lm import BpbSums, batch_sums, make_probes, probe_diffs
from evolve.harness.protocol import EvalFailure, serve_job

from .packing import pack_rows
from .tokens import Split

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
        f"{n_rows + spare} are needed (prepare more validation text, lower eval_tokens, or set "
        "benchmark.fitness.eval_tokens=0 to score every whole batch the split holds)",
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


def plan_batches(
    rows: np.ndarray, spare: np.ndarray, batch_rows: int, probes: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], list]:
    """The scored batches, and every batch in the order sent: ("score", i) and ("probe", Probe) shuffled."""
    batches = [rows[i : i + batch_rows] for i in range(0, len(rows), batch_rows)]
    plan = [("score", i) for i in range(len(batches))]
    plan += [("probe", probe) for probe in make_probes(batches, spare, probes, rng)]
    order = rng.permutation(len(plan))
    return batches, [plan[i] for i in order]


def load_model(job: dict) -> tuple[torch.nn.Module, int]:
    """The exported graph in the current folder bound to the checkpoint's tensors, and their
    count; raises EvalFailure naming why the model cannot be scored."""
    try:
        weights = load_weights(Path("model.pt"))
        program = Program(
            Path.cwd(), rows=job["batch_rows"], seq=job["seq_len"], vocab=job["vocab_size"],
            device=job["device"],
        )  # fmt: skip
        return program.bind(weights), sum(t.numel() for t in weights.values())
    except ExportRejected as exc:
        raise EvalFailure("rejected", str(exc)) from exc


def evaluate(job: dict) -> dict:
    """Score the checkpoint in the current directory per ``job``; raises EvalFailure."""
    start = time.monotonic()
    seq, rows_per_batch, device = job["seq_len"], job["batch_rows"], job["device"]
    model, params = load_model(job)
    n_rows = job["eval_tokens"] // seq
    rows = read_rows(sys.stdin.buffer, n_rows + SPARE_ROWS, seq + 1)
    rng = np.random.default_rng(secrets.randbits(128))
    batches, plan = plan_batches(
        rows[:n_rows], rows[n_rows:], rows_per_batch, job["probe_batches"], rng
    )
    token_bytes = torch.from_numpy(np.load(job["token_bytes"]).astype(np.int64)).to(device)
    probed_bases = {item.base for kind, item in plan if kind == "probe"}
    kept: dict[int, torch.Tensor] = {}  # logits of the scored batches that a probe copies
    probe_logits: list = []
    sums = BpbSums()
    load_s = time.monotonic() - start
    with torch.inference_mode():
        for kind, item in plan:
            inputs = batches[item] if kind == "score" else item.rows
            logits = model(torch.from_numpy(inputs[:, :-1]).to(device))
            if not bool(torch.isfinite(logits).all()):
                raise EvalFailure("invalid", "the model produced non-finite logits")
            if kind == "probe":
                probe_logits.append((item, logits))
                continue
            if item in probed_bases:
                kept[item] = logits
            targets = torch.from_numpy(batches[item][:, 1:]).to(device)
            sums.add(*batch_sums(logits, targets, token_bytes))
    forwarded = time.monotonic()
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
    }


def answer(job: dict) -> dict:
    """The scorer's verdict on ``job``: the sums, or the failure."""
    try:
        return {"status": "ok", **evaluate(job)}
    except EvalFailure as failure:
        return {"status": failure.status, "reason": failure.reason}


if __name__ == "__main__":
    serve_job(answer)
    # the verdict is out (flushed) and nothing else is kept: the interpreter's and CUDA's
    # teardown would only delay the evaluation that waits for this process's exit
    os._exit(0)
