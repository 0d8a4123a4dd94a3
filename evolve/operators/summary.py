"""A model's summary of the research notebook (``evolve.notebook``), made every few proposals.

The call goes through the run's LLM client like an operator's, so it is cached, recorded
in ``llm_calls``, priced and held to ``llm.max_cost_usd``; a resumed run or an offline
replay gets the recorded answer. The engine stores the summary with the proposal it was
made for, and the notebook shows the latest one to later proposals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from evolve.fitness import Benchmark
from evolve.llm import LLMCallFailed, LLMClient
from evolve.operators.prompting import prompt_hash, render

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
        objective = self.benchmark.fitness.objective
        messages = [
            {
                "role": "user",
                "content": render(
                    "summary.md.j2",
                    task=self.benchmark.task.strip() or self.benchmark.name,
                    objective=objective.name,
                    direction="higher is better"
                    if objective.direction.value == "max"
                    else "lower is better",
                    notes=notes,
                ),
            }
        ]
        phash = prompt_hash(messages)
        try:
            completion = await self.client.complete(
                self.model, messages, sample=f"{seq}.notebook", prompt_hash=phash
            )
        except LLMCallFailed as exc:
            log.warning("#%d: the notebook was not summarised (%s)", seq, exc)
            return None
        text = completion.text.strip()
        return NotebookSummary(text=text, model=self.model, prompt_hash=phash) if text else None
