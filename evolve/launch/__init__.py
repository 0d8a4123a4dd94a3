"""From a config to a running search: Hydra and the typed settings (``config``), the run's assembly (``runner``)."""

from evolve.exports import lazy

__all__, __getattr__, __dir__ = lazy(
    __name__,
    {
        **dict.fromkeys(("build_settings", "compose"), "evolve.launch.config"),
        "run": "evolve.launch.runner",
    },
)
