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
line on stdout carrying the job's nonce. A scorer started with ``PRELOAD`` once the export
begun during training wrote the graph into its folder builds that graph and runs it once on
zeros and random tokens before its job (``load_ahead``), and scores with it when the folder's
graph files are still those bytes at the job.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

import numpy as np
import torch  # imported before the job: a scorer started ahead has it ready

from evolve.harness.exported import ExportRejected, Program, load_weights
from evolve.harness.lm import BpbSums, batch_sums, make_probes, probe_diffs
from evolve.harness.protocol import EvalFailure, make_undumpable, serve_job

from .packing import pack_rows
from .tokens import Split

SPARE_ROWS = 4  # validation rows beyond the scored ones whose tokens make the probes' other futures
SHAPE = ("batch_rows", "seq_len", "vocab_size", "device")
"""The job's keys that fix the graph's build (``shape``)."""
AHEAD_MAX_BYTES = 1 << 30
"""The most bytes a scorer builds ahead (``Program.bound_bytes``: weights and constants): it
holds them on the device from the early export to the stop, beside the training."""
AHEAD_FAILED = 3
"""The exit status of a scorer whose build ahead failed, before it read its job: the fitness
then scores with the scorer started with the evaluation."""
PRELOAD = "--preload"
"""Given with the JSON of a job's ``shape``: the graph already in the folder is built ahead of
the job (``load_ahead``), for a scorer started once the early export wrote it."""


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


def shape(job: dict) -> dict:
    """What of ``job`` the graph is built for: the batch shape, the logits' width, the device."""
    return {key: job[key] for key in SHAPE}


def build(spec: dict) -> Program:
    """The exported graph in the current folder, screened and checked for ``spec`` (``shape``)."""
    return Program(
        Path.cwd(), rows=spec["batch_rows"], seq=spec["seq_len"], vocab=spec["vocab_size"],
        device=spec["device"],
    )  # fmt: skip


def load_ahead(spec: dict) -> Program | None:
    """The graph already in this folder built, bound to zeros and run once on random tokens
    before the job (``PRELOAD``): the job's forwards then find the device's context, libraries
    and kernels ready. No data is seen and nothing is kept but the program. None, with nothing
    put on the device, when the bound program would hold more than ``AHEAD_MAX_BYTES`` there
    beside the training; raises what the build or the forward raised (the caller then ends this
    process: a forward that failed on the device may leave it unusable for the job)."""
    program = build(spec)
    held = program.bound_bytes()
    if held > AHEAD_MAX_BYTES:
        print(f"scorer: nothing loaded ahead: the bound model would hold {held:,} bytes beside "
              "the training", file=sys.stderr)  # fmt: skip
        return None
    model = program.bind(program.blank())
    rows, seq, vocab, device = (spec[key] for key in SHAPE)
    with torch.inference_mode():
        tokens = torch.randint(0, vocab, (rows, seq + 1), device=device)
        logits = model(tokens[:, :-1])
        ones = torch.ones(vocab, dtype=torch.int64, device=device)
        batch_sums(logits, tokens[:, 1:], ones)
    return program


def load_model(job: dict, program: Program | None = None) -> tuple[torch.nn.Module, int]:
    """The exported graph in the current folder (``program`` when it was built ahead from the
    folder's graph files as they are now) bound to the checkpoint's tensors, and their count;
    raises EvalFailure naming why the model cannot be scored."""
    try:
        weights = load_weights(Path("model.pt"))
        program = program or build(shape(job))
        return program.bind(weights), sum(t.numel() for t in weights.values())
    except ExportRejected as exc:
        raise EvalFailure("rejected", str(exc)) from exc


def evaluate(job: dict, ahead: Program | None = None) -> dict:
    """Score the checkpoint in the current directory per ``job``; raises EvalFailure.
    ``ahead``: a program built ahead for ``job``'s shape, used only when the folder's graph
    files are still the bytes it was built from."""
    start = time.monotonic()
    seq, rows_per_batch, device = job["seq_len"], job["batch_rows"], job["device"]
    built_ahead = ahead is not None and ahead.built_from(Path.cwd())
    model, params = load_model(job, ahead if built_ahead else None)
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
        "graph_built_ahead": built_ahead,
        "eval_s": time.monotonic() - start,
        "load_s": load_s,
        "marks": {"ready": start + load_s, "forwarded": forwarded},
        **causal,
    }


def answer(job: dict, ahead: tuple[dict, Program | None] = ({}, None)) -> dict:
    """The scorer's verdict on ``job``: the sums, or the failure. ``ahead``: the shape given with
    ``PRELOAD`` and the program ``load_ahead`` built for it (used only for a job of that shape)."""
    spec, program = ahead
    try:
        return {"status": "ok", **evaluate(job, program if spec == shape(job) else None)}
    except EvalFailure as failure:
        return {"status": failure.status, "reason": failure.reason}


if __name__ == "__main__":
    spec = json.loads(sys.argv[2]) if sys.argv[1:2] == [PRELOAD] else {}
    preloaded: tuple[dict, Program | None] = ({}, None)
    if spec:
        make_undumpable()  # before anything is loaded, as ``serve_job`` does before the job
        try:
            preloaded = (spec, load_ahead(spec))
        except Exception as exc:  # noqa: BLE001 - ended unused: the fitness scores with another
            print(f"scorer: loading ahead failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            os._exit(AHEAD_FAILED)
        if spec["device"].startswith("cuda"):  # the forward's memory goes back to the training
            torch.cuda.empty_cache()
    serve_job(lambda job: answer(job, preloaded))
    # the verdict is out (flushed) and nothing else is kept: the interpreter's and CUDA's
    # teardown would only delay the evaluation that waits for this process's exit
    os._exit(0)
