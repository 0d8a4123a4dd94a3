"""Paths named in a config: ``pkg://package/relative`` inside an installed package, or on disk."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from evolve.settings import ConfigError


def resolve_path(spec: str | Path, *, base: Path | None = None) -> Path:
    """Resolve ``pkg://package.module/relative/path`` or a filesystem path (relative to ``base`` or cwd)."""
    text = str(spec)
    if text.startswith("pkg://"):
        module, _, rel = text.removeprefix("pkg://").partition("/")
        try:
            root = importlib.resources.files(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"path {text!r}: package {module!r} is not importable") from exc
        return Path(str(root.joinpath(rel))) if rel else Path(str(root))
    path = Path(text).expanduser()
    return path if path.is_absolute() else (base or Path.cwd()) / path
