"""Browsing archives read-only: ``python -m evolve.browse RUN [command]`` and a local web page."""
