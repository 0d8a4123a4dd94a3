"""The run's archive file: the SQLite store, its schema migrations, stored LLM calls and the one-writer lock."""

from evolve.exports import lazy

__all__, __getattr__, __dir__ = lazy(
    __name__,
    {
        "Store": "evolve.store.database",
        "ArchiveFileError": "evolve.store.database",
        "migrate": "evolve.store.database",
        "MIGRATIONS": "evolve.store.schema",
        "SCHEMA_VERSION": "evolve.store.schema",
        "PromptPacker": "evolve.store.calls",
        "RunDirectoryBusy": "evolve.store.runlock",
        "hold": "evolve.store.runlock",
        "check_free": "evolve.store.runlock",
    },
)
