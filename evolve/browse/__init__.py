"""Browsing archives read-only: ``python -m evolve.browse RUN [command]`` and a local web page."""

__all__ = ["cli"]  # the command, ``python -m evolve.browse``
