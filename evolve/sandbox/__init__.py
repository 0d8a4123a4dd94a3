"""The sandbox: untrusted code in a child process that cannot outlive its timeout, keep secrets or reach the next run.

``process`` is the one entry (``run``, ``start``); the other modules are the layers it puts
around the child: ``isolation`` (namespaces, private layers, no capabilities), ``landlock``,
``channels``, ``cores``, ``environment``, ``identity`` (the unprivileged uid), ``unreadable``
and ``pagecache``.
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
