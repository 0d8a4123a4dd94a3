"""The run's archive file: the SQLite store, its schema migrations, stored LLM calls and the one-writer lock."""

from evolve.store.calls import PromptPacker
from evolve.store.database import ArchiveFileError, Store, migrate
from evolve.store.runlock import RunDirectoryBusy, check_free, hold
from evolve.store.schema import MIGRATIONS, SCHEMA_VERSION

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "ArchiveFileError",
    "PromptPacker",
    "RunDirectoryBusy",
    "Store",
    "check_free",
    "hold",
    "migrate",
]
