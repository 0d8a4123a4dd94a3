"""Processes held to their time: untrusted code in a child that cannot outlive its timeout or keep secrets, and nothing a run starts outliving the run.

``process`` is the one entry (``run``, ``start``); the other modules are the layers it puts
around the child: ``isolation`` (namespaces, private layers, no capabilities), ``landlock``,
``channels``, ``cores``, ``environment``, ``identity`` (the unprivileged uid), ``unreadable``
and ``pagecache``. ``lifetime`` holds every process a run starts (workers, provider commands)
to the run's life: nothing outlives it, SIGKILL of the run included.
"""

from evolve.exports import lazy

__all__, __getattr__, __dir__ = lazy(
    __name__,
    {
        **dict.fromkeys(
            ("Limits", "Result", "Started", "isolation_report", "run", "start"),
            "evolve.sandbox.process",
        ),
        "IsolationError": "evolve.sandbox.isolation",
        "Policy": "evolve.sandbox.isolation",
    },
)
