"""Evaluation backends: where a candidate's fitness is computed (this machine, or a Ray cluster).

``local`` runs worker processes on this machine; ``ray`` (``evolve.backends.ray``, needs
``pip install 'evolve[ray]'``) runs each evaluation as a task on a Ray cluster. Importing
this package never imports Ray.
"""

from evolve.backends.base import HARNESS_GRACE_S, Backend, Job, run_job
from evolve.backends.local import LocalBackend
from evolve.harness.gpus import gpu_groups, visible_gpus

__all__ = [
    "HARNESS_GRACE_S",
    "Backend",
    "Job",
    "LocalBackend",
    "gpu_groups",
    "run_job",
    "visible_gpus",
]
