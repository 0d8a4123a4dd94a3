"""The sandbox: untrusted code in a child process that cannot outlive its timeout, read secrets or reach the next run.

``process`` is the one entry (``run``, ``start``); the other modules are the layers it puts
around the child: ``isolation`` (namespaces, private layers, no capabilities), ``landlock``,
``channels``, ``cores``, ``environment``, ``identity`` (the unprivileged uid), ``unreadable``
and ``pagecache``.
"""

from evolve.sandbox.isolation import IsolationError, Policy
from evolve.sandbox.process import Limits, Result, Started, isolation_report, run, start

__all__ = [
    "IsolationError",
    "Limits",
    "Policy",
    "Result",
    "Started",
    "isolation_report",
    "run",
    "start",
]
