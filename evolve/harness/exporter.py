"""The export process: the candidate's model code, built in a sandbox of its own without any trained weights and written out as a graph.

Started by the fitness as ``python -P -s -m evolve.harness.exporter`` in a folder holding
only the candidate's model code and config (no weights of the run, no data of any split) and
given its job on stdin (``evolve.harness.protocol``):

- ``source``: the file defining ``build_model`` (``model.py``, ``train.py``);
- ``config``: a JSON file whose contents are ``build_model``'s argument, or null (no argument);
- ``reference``: optional ``{"weights": path, "seed": n}``: say where that checkpoint differs
  from ``torch.manual_seed(n); build_model()`` (the initial-weights check; candidate code
  runs in this process, so this answer is only as trustworthy as that code);
- ``rows``, ``seq``, ``vocab``, ``device``: the scored batch shape, logits width, device.

It exports ``torch.manual_seed(0); build_model(config)`` as built: the graph takes its weights
as inputs, so the scorer binds it to any checkpoint of that model (``exported.Program``), and
the trained weights never enter this process. So the tensor constants and non-persistent
buffers it writes (the only tensors of the scored model that do not come from the checkpoint)
are a function of the code and config alone: code run here, with no clock, cannot turn what
the training left in the checkpoint into more training. It writes the graph and constants to
its folder and answers one verdict line; the scorer trusts none of it until
``exported.Program`` has checked it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch  # imported before the job: an exporter started ahead has it ready

from evolve.harness.exported import ExportRejected, export_model, load_weights
from evolve.harness.protocol import serve_job


def build(source: str, config: str | None):
    """``build_model`` of the candidate's ``source`` file in the current folder, called with
    the contents of ``config`` (or nothing)."""
    sys.path.insert(0, os.getcwd())
    name = Path(source).stem
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(source))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "build_model"):
        raise ExportRejected(
            f"{source} defines no build_model(); the harness builds the model with it"
        )
    if config is None:
        return lambda: module.build_model()
    arguments = json.loads(Path(config).read_text())
    return lambda: module.build_model(arguments)


def reference_diff(state: dict, reference: dict) -> str:
    """Where ``state`` differs from ``reference`` (a freshly built model's state); "" when it does not."""
    if sorted(reference) != sorted(state):
        return f"its tensors are {sorted(state)[:5]}..., build_model() gives {sorted(reference)[:5]}..."
    for name, tensor in reference.items():
        got = state[name]
        if got.shape != tensor.shape or not torch.equal(got, tensor.to(got.dtype)):
            return f"first difference in {name!r}"
    return ""


def run(job: dict) -> dict:
    """Build and export the model per ``job``; the verdict."""
    try:
        make = build(job["source"], job.get("config"))
        answer: dict = {"status": "ok"}
        if job.get("reference"):
            torch.manual_seed(int(job["reference"]["seed"]))
            fresh = make().state_dict()
            answer["reference_diff"] = reference_diff(
                load_weights(Path(job["reference"]["weights"])), fresh
            )
        # as the scorer does: CUDA where asked for and present (a GPU slot on a machine without
        # one takes the GPU path of the harness on the CPU)
        device = job["device"] if torch.cuda.is_available() else "cpu"
        torch.manual_seed(0)
        model = make().to(device)
        answer["ops"] = export_model(
            model, Path.cwd(), rows=job["rows"], seq=job["seq"], vocab=job["vocab"], device=device
        )
        return answer
    except ExportRejected as exc:
        return {"status": "rejected", "reason": str(exc)}
    except Exception as exc:  # the candidate's code failed to build
        return {
            "status": "error",
            "reason": f"building the model with build_model(config) failed: "
            f"{type(exc).__name__}: {str(exc)[:1500]}",
        }


if __name__ == "__main__":
    serve_job(run)
    # the graph's files are closed and the verdict flushed: the interpreter's and CUDA's
    # teardown would only delay the evaluation that waits for this process's exit
    os._exit(0)
