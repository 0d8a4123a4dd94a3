"""GPU placement: which GPUs a process may use, the slots of an evaluation backend, and running jobs one per slot.

The local backend's slots (``gpu_groups``) and every benchmark's GPU measurement scripts
place work through these functions, so a GPU id means the same everywhere: an index into
the GPUs this process may use (``CUDA_VISIBLE_DEVICES``, else all that torch sees).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any


def visible_gpus() -> list[str]:
    """GPU ids this process may use (CUDA_VISIBLE_DEVICES, else all that torch sees)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g for g in listed.split(",") if g.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch, or a broken CUDA: evaluate on CPU
        return []


def gpu_groups(gpus_per_eval: int, workers: int | None) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES value of each slot; None entries are CPU slots."""
    if gpus_per_eval <= 0:
        return [None] * (workers or max(1, os.cpu_count() or 1))
    gpus = visible_gpus()
    groups = [
        ",".join(gpus[i : i + gpus_per_eval])
        for i in range(0, len(gpus) - gpus_per_eval + 1, gpus_per_eval)
    ]
    if not groups:
        raise RuntimeError(
            f"this benchmark needs {gpus_per_eval} GPU(s) per evaluation but none are visible; "
            "run it on a machine with a CUDA GPU or choose a CPU scale of the benchmark"
        )
    return groups[:workers] if workers else groups


def chosen(indices: str | Sequence[str | int] | None, gpus_per_job: int = 1) -> list[str]:
    """Slots for the GPUs named by ``indices`` (into ``visible_gpus()``), ``gpus_per_job`` each.

    ``None``: every visible GPU. Raises ValueError naming the visible GPUs when an index is not one.
    """
    visible = visible_gpus()
    if indices is None:
        picked = visible
    else:
        items = indices.split(",") if isinstance(indices, str) else list(indices)
        wanted = [int(str(i).strip()) for i in items if str(i).strip()]
        bad = [i for i in wanted if not 0 <= i < len(visible)]
        if bad:
            raise ValueError(
                f"GPU indices {bad} are not visible; this process sees {len(visible)}: {visible}"
            )
        picked = [visible[i] for i in wanted]
    return [
        ",".join(picked[i : i + gpus_per_job])
        for i in range(0, len(picked) - gpus_per_job + 1, gpus_per_job)
    ]


def run_on_slots(
    work: Callable[..., Any], jobs: Sequence[tuple], slots: Sequence[str | None]
) -> list[Any]:
    """``work(*job, slot)`` for each job, in parallel, one spawned process per slot (job i on slot i).

    Spawned, not forked: the caller may hold a CUDA context.
    """
    if len(jobs) != len(slots):
        raise ValueError(f"{len(jobs)} jobs for {len(slots)} slots: one job per slot")
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, len(slots)), mp_context=spawn) as pool:
        futures = [pool.submit(work, *job, slot) for job, slot in zip(jobs, slots, strict=True)]
        return [future.result() for future in futures]
