"""From a config to a running search: ``config`` (Hydra, typed settings) and ``runner`` (assembles the run).

Each loads on demand (``from evolve.launch import runner``): the runner imports every layer.
"""

__all__ = ["config", "runner"]
