"""The export begun while the candidate trains, from the code and config it declared before its clock (``client.save_initial``); used after the stop only when they are the final checkpoint's.

On a GPU (``NanochatFitness.starts_ahead``) the exporter is started when training begins.
When the training harness says the program wrote its initial checkpoint (code files and
config.json) before the clock started (``supervisor.say_initial``: the digest of its files then), ``heard`` starts a thread
that copies those files into the exporter's folder (``plaincopy``: plain files of their own,
never through a link), checks the copy against that digest and gives the exporter its job;
the graph it writes does not depend on the weights (``evolve.harness.exported``); once it
is written, a scorer is started with it (``scorer.PRELOAD``), to build and run it before the
stop. After the
stop, ``graph_for`` hands that graph to the verified final checkpoint when the early export
succeeded and the final checkpoint's code files and config.json are byte-identical to the
ones copied; otherwise (no initial save, a copy that failed its checks, changed code or
config, a failed export) the fitness exports from the final checkpoint as without it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

from evolve.harness.fitness import Started
from evolve.harness.plaincopy import copy_folder
from evolve.types import Evaluation

from .supervisor import checkpoint_digest, initial_digest, is_checkpoint_name


def code_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of the checkpoint's code files and config.json in ``folder``, by name (not model.pt)."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file() and not path.is_symlink() and is_checkpoint_name(path.name)
        and path.name != "model.pt"
    }  # fmt: skip


Export = Callable[[Path, Started], dict | Evaluation]
"""Runs the export job on the checkpoint files in a folder with an exporter started there
(the fitness's ``run_export``): its verdict."""
Preload = Callable[[Path], Started | None]
"""Starts a scorer with the graph written in a folder (the fitness's ``preloaded_scorer``)."""


class EarlyExport:
    """One evaluation's export from the initial checkpoint ``initial`` (the program's folder),
    by ``exporter`` (started ahead in ``folder``) through ``export``, then a scorer started
    with its graph through ``preload``. Its methods are called from one thread (the
    fitness's); the export runs in a thread of its own."""

    def __init__(
        self, initial: Path, folder: Path, exporter: Started, export: Export, preload: Preload
    ) -> None:
        self.initial, self.folder, self.export, self.preload = initial, folder, export, preload
        self.exporter: Started | None = exporter
        self.scorer: Started | None = None  # started with the graph once it is written
        self.code: dict[str, str] = {}  # the copied code and config, as given to the exporter
        self.verdict: dict | Evaluation | None = None
        self._thread: threading.Thread | None = None

    @property
    def began(self) -> bool:
        """Whether an initial checkpoint was announced (the exporter started ahead is then taken)."""
        return self._thread is not None

    def heard(self, line: str) -> None:
        """A line of the training harness's stdout: the first initial-checkpoint line starts the export."""
        digest = initial_digest(line)
        if digest is not None and self._thread is None and self.exporter is not None:
            self._thread = threading.Thread(target=self._run, args=(digest,), daemon=True)
            self._thread.start()

    def _run(self, digest: str) -> None:
        try:
            names = copy_folder(self.initial, self.folder, is_checkpoint_name)
            if names is None or "model.py" not in names or checkpoint_digest(self.folder) != digest:
                return  # not plain files, or changed since announced: exported after the stop
            self.code = code_digests(self.folder)
            self.verdict = self.export(self.folder, self.exporter)
            if isinstance(self.verdict, dict) and self.verdict.get("status") == "ok":
                self.scorer = self.preload(self.folder)
        except OSError:  # the program's folder went away meanwhile: exported after the stop
            return
        finally:
            self.exporter.cancel()  # ends it when it got no job (a no-op once it had one)

    def spare(self) -> Started | None:
        """The exporter, once, when no early export began (for the export after the stop, in
        ``folder``); else None."""
        if self._thread is not None:
            return None
        exporter, self.exporter = self.exporter, None
        return exporter

    def take_scorer(self) -> Started | None:
        """The scorer started with the early graph, once (else None): at its job it uses the graph
        it built only if its folder's graph files are still those bytes. Its build may still be
        running, and may fail (``scorer.AHEAD_FAILED``: the fitness then scores with another)."""
        self.join()
        scorer, self.scorer = self.scorer, None
        return scorer

    def join(self) -> None:
        """Wait for the export begun, if any (bounded by its wall limit)."""
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """End the exporter unused, or wait for the export begun; end the scorer not taken."""
        if self._thread is None and self.exporter is not None:
            self.exporter.cancel()
        self.join()
        if self.scorer is not None:
            self.scorer.cancel()

    def graph_for(self, checkpoint: Path) -> dict | None:
        """The early export's verdict when its graph serves ``checkpoint`` (a verified copy of the
        final one): it succeeded and the code files and config.json are the same; else None."""
        if self._thread is None:
            return None
        self.join()
        verdict = self.verdict
        if not isinstance(verdict, dict) or verdict.get("status") != "ok":
            return None
        if not self.code or code_digests(checkpoint) != self.code:
            return None
        return verdict
