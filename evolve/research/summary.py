"""The research notebook (``evolve.research.notebook``) on a proposal's way: recorded, shown, summarised.

``NotebookFeed`` is the engine's one handle on it: the notebook is recorded when a proposal
is asked, read back for its operator's prompt, and every few proposals a model's summary of
it (``Summariser``) is made and stored with the proposal once it is admitted; the notebook
shows the latest summary to later proposals. The summary's call goes through the run's LLM
client like an operator's, so it is cached, recorded in ``llm_calls``, priced and held to
``llm.max_cost_usd``; a resumed run or an offline replay gets the recorded answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from evolve.harness.fitness import Benchmark
from evolve.llm import LLMCallFailed, LLMClient
from evolve.operators.prompting import fitted_text, prompt_hash, task_values
from evolve.query.notebook import note_at
from evolve.research.notebook import Notebook
from evolve.store.database import Store
from evolve.types import EvolveError

log = logging.getLogger("evolve")


@dataclass(frozen=True)
class NotebookSummary:
    """A model's summary of the notebook: its text, the model and the prompt's hash."""

    text: str
    model: str
    prompt_hash: str


@dataclass
class Summariser:
    """Asks ``model`` to summarise the notebook at every ``every``-th proposal.

    Args:
        client: the run's LLM client.
        model: the model that writes the summaries.
        benchmark: the problem (its task and objective frame the summary).
        every: summarise at proposals ``every``, ``2 * every``... (0: never).
    """

    client: LLMClient
    model: str
    benchmark: Benchmark
    every: int = 25

    def due(self, seq: int, notes: str) -> bool:
        """Whether proposal ``seq`` (shown ``notes``) comes with a new summary."""
        return bool(self.every and notes and seq > 0 and seq % self.every == 0)

    async def summarise(self, seq: int, notes: str) -> NotebookSummary | None:
        """The summary made for proposal ``seq``; None when the call failed (the run goes on).

        Raises:
            evolve.llm.LLMStop: no further call may be made (budget, offline replay, key).
        """
        try:
            messages = fitted_text(
                "summary.md.j2",
                {**task_values(self.benchmark), "notes": notes},
                "notes",
                model=self.model,
                settings=self.client.settings,
            )
            phash = prompt_hash(messages)
            completion = await self.client.complete(
                self.model, messages, sample=f"{seq}.notebook", prompt_hash=phash
            )
        except (LLMCallFailed, EvolveError) as exc:
            log.warning("#%d: the notebook was not summarised (%s)", seq, exc)
            return None
        text = completion.text.strip()
        return NotebookSummary(text=text, model=self.model, prompt_hash=phash) if text else None


@dataclass
class NotebookFeed:
    """The notebook's part in each proposal (see the module docstring); does nothing without one.

    Args:
        store: the run's archive file.
        notebook: builds the notebook's text; None: no operator asks a model, none is kept.
        summariser: writes a model's summary every few proposals; None: none.
    """

    store: Store
    notebook: Notebook | None
    summariser: Summariser | None = None
    _pending: dict[int, NotebookSummary] = field(default_factory=dict)  # seq -> summary

    def record(self, seq: int) -> None:
        """Store the notebook proposal ``seq`` is shown (inside the caller's transaction)."""
        if self.notebook is not None:
            self.notebook.record(self.store, seq)

    async def notes(self, seq: int) -> str:
        """The notebook proposal ``seq`` was shown ('' when none); makes its summary when due."""
        row = note_at(self.store, seq) if self.notebook is not None else None
        text = row["text"] if row else ""
        if self.summariser is not None and self.summariser.due(seq, text):
            summary = await self.summariser.summarise(seq, text)
            if summary is not None:
                self._pending[seq] = summary
        return text

    def admitted(self, seq: int) -> None:
        """Store the summary made for proposal ``seq``, if one was."""
        summary = self._pending.pop(seq, None)
        if summary is not None:
            with self.store.transaction():
                self.store.put_note(
                    seq,
                    "summary",
                    summary.text,
                    model=summary.model,
                    prompt_hash=summary.prompt_hash,
                )
