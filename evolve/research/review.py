"""The auditor's model review: the run's model reads a candidate's change against the task's rules.

``Reviewer`` is the ``evolve.archive.referee.ReviewDiff`` a run with a model hands its auditor: it
renders ``prompts/review.md.j2`` (the task's text and the calls it prescribes, the score and
its gain over the run's best, the unified diff from the parent, what the static detectors
flagged) and asks for a first line ``VERDICT: clean`` or ``VERDICT:
suspicious`` followed by reasons. Any other answer is ``malformed`` and a call that fails or
may not be made is ``unavailable``: both are recorded and are no verdict. The call goes
through the run's LLM client like an operator's, so it is cached, recorded in ``llm_calls``,
priced and held to ``llm.max_cost_usd``; a resumed run or an offline replay gets the
recorded answer. The prompt fits the model's context (``prompting.prompt_limit``): the diff is
cut, and the prompt says so, until it does.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from evolve.archive.referee import ModelReview
from evolve.harness.audit import AuditReport
from evolve.harness.audit import render as render_report
from evolve.harness.fitness import Benchmark
from evolve.llm import LLMCallFailed, LLMClient, LLMStop
from evolve.operators.prompting import (
    files_diff,
    fitted_text,
    prompt_hash,
    task_values,
    truncate,
)
from evolve.types import Candidate, EvolveError, Files

log = logging.getLogger("evolve")

VERDICT = re.compile(r"verdict\s*:\s*(clean|suspicious)\b", re.IGNORECASE)
MARKUP = "*_`#> \t"  # emphasis or heading marks a model may wrap the verdict line in
KEPT_CHARS = 4000  # of an answer without a verdict, stored as its reasons


def parse_review(answer: str, *, model: str, prompt_hash: str) -> ModelReview:
    """The review an answer gives: its first non-blank line must be the verdict, the rest are reasons."""
    text = answer.strip()
    first, _, rest = text.partition("\n")
    match = VERDICT.fullmatch(first.strip(MARKUP))
    if match is None:
        return ModelReview(
            "malformed", truncate(text, KEPT_CHARS) or "(empty answer)", model, prompt_hash
        )
    return ModelReview(match[1].lower(), rest.strip(), model, prompt_hash)


@dataclass
class Reviewer:
    """Asks ``model`` whether a candidate's change keeps the task's rules (see the module docstring).

    Args:
        client: the run's LLM client.
        model: the model that reviews.
        benchmark: the problem (its task text holds the rules).
        diff_chars: the most characters of the diff shown (the rest is cut, and the prompt says so).
    """

    client: LLMClient
    model: str
    benchmark: Benchmark
    diff_chars: int = 40_000

    async def __call__(
        self,
        candidate: Candidate,
        parent_files: Files | None,
        report: AuditReport,
        score: float,
        best: float,
    ) -> ModelReview:
        """The model's review of ``candidate``'s change from ``parent_files`` (None: a seed),
        which scored ``score`` where the run's best was ``best``."""
        before = parent_files or {}
        diff = files_diff(before, candidate.files, sorted({*before, *candidate.files}), context=3)
        try:
            messages = fitted_text(
                "review.md.j2",
                {
                    **task_values(self.benchmark),
                    "score": f"{score:.10g}",
                    "best": f"{best:.10g}",
                    "gain": f"{score - best:+.4g}",
                    "prescribed": ", ".join(self.benchmark.prescribed),
                    "diff": truncate(diff or "(no change)", self.diff_chars),
                    "flags": render_report(report) if report.flags else "",
                },
                "diff",
                model=self.model,
                settings=self.client.settings,
            )
        except EvolveError as exc:  # the context cannot hold even the task: no review
            log.warning("#%d: the model did not review the change (%s)", candidate.seq, exc)
            return ModelReview("unavailable", str(exc), self.model, "")
        phash = prompt_hash(messages)
        try:
            completion = await self.client.complete(
                self.model, messages, sample=f"{candidate.seq}.audit", prompt_hash=phash
            )
        except (LLMCallFailed, LLMStop) as exc:
            log.warning("#%d: the model did not review the change (%s)", candidate.seq, exc)
            return ModelReview("unavailable", str(exc), self.model, phash)
        review = parse_review(completion.text, model=self.model, prompt_hash=phash)
        if review.verdict == "malformed":
            log.warning(
                "#%d: the model's review has no verdict line; recorded, not used", candidate.seq
            )
        return review
