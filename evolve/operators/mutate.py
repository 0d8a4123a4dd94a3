"""LLM mutation operators: ``diff`` (SEARCH/REPLACE edits) and ``rewrite`` (whole files).

Each operator instance is bound to one model, so the emitter's arms are model x operator.
An answer that yields no usable edit raises OperatorRejected with the reason (the engine
records it and shows it to the model next time; the engine also checks every child's edit
stays inside the EVOLVE-BLOCKs); no evaluation is spent on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from evolve.llm import LLMCallFailed, LLMClient, preflight
from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.edits import EditError
from evolve.operators.prompting import (
    Budget,
    context_values,
    fitted,
    program_view,
    prompt_hash,
    prompt_limit,
)
from evolve.operators.search_replace import (
    apply_search_replace,
    fenced_blocks,
    parse_search_replace,
    splice_rewrite,
)
from evolve.types import EdgeRole, EvolveError, Parent, Proposal

_EDIT_START = re.compile(r"^[ \t]*(<{5,9}[ \t]*SEARCH|```|~~~)", re.M)
_FILE_LINE = re.compile(r"^\W*(file:?\s*)?[\w./\\-]+\.\w+\W*$", re.I)
FRAGMENT_RATIO = 0.3  # a "whole file" this much shorter than the original is taken for a fragment


def explanation(answer: str, limit: int = 600) -> str:
    """The model's own words before its first edit, on one line (the candidate's description)."""
    match = _EDIT_START.search(answer)
    lines = (answer[: match.start()] if match else answer).rstrip().split("\n")
    while lines and _FILE_LINE.match(lines[-1]):  # the file name put before the first edit
        lines.pop()
    return " ".join(" ".join(lines).split())[:limit]


class LLMOperator:
    """Shared plumbing: render the prompt, ask the model, turn the answer into a child.

    Args:
        client: the run's LLM client (cache, budget, recording).
        model: the litellm model string this instance uses.
        budget: how much text prompts may show (default: ``llm.artifact_chars`` and the
            model's context, ``prompt_limit``).
    """

    name = ""
    arity = 1
    template = ""

    def __init__(self, *, client: LLMClient, model: str, budget: Budget | None = None) -> None:
        self.client = client
        self.model = model
        self.budget = budget or Budget(
            artifact_chars=client.settings.artifact_chars,
            prompt_tokens=prompt_limit(model, client.settings),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"

    async def preflight(self) -> list[str]:
        """Check this operator's model can be called (see evolve.llm.preflight); returns warnings."""
        from dataclasses import replace

        return await preflight(replace(self.client.settings, models=((self.model, 1.0),)))

    # --- hooks for subclasses ---------------------------------------------------------------------

    def parents(self, request: OperatorRequest) -> Sequence[Parent]:
        return request.parents[:1]

    def values(self, request: OperatorRequest, parents: Sequence[Parent]) -> dict:
        values = context_values(
            request.benchmark,
            parents[0],
            request.inspirations,
            request.failures,
            self.budget,
            request.notes,
        )
        values["program"] = program_view(
            parents[0], request.benchmark, self.budget, label="Program"
        )
        return values

    def edit(
        self, request: OperatorRequest, parents: Sequence[Parent], answer: str
    ) -> dict[str, str]:
        """The child's files: the answer's SEARCH/REPLACE blocks applied to the first parent."""
        return apply_blocks(dict(parents[0].candidate.files), answer, request)

    def edges(self, parents: Sequence[Parent]) -> tuple[tuple[str, EdgeRole], ...]:
        return ((parents[0].candidate.id, EdgeRole.MUTATION),)

    # --- the protocol -----------------------------------------------------------------------------

    async def propose(self, request: OperatorRequest) -> Proposal:
        parents = self.parents(request)
        try:
            messages = fitted(
                self.template,
                self.values(request, parents),
                model=self.model,
                limit=self.budget.prompt_tokens,
            )
        except EvolveError as exc:
            raise OperatorRejected(str(exc), model=self.model) from exc
        phash = prompt_hash(messages)
        sample = f"{request.seq}.{request.rng.getrandbits(32):08x}"
        try:
            completion = await self.client.complete(
                self.model, messages, sample=sample, prompt_hash=phash
            )
        except LLMCallFailed as exc:
            raise OperatorRejected(
                f"the model call failed: {exc}", model=self.model, prompt_hash=phash
            ) from exc
        answer = completion.text
        try:
            files = self._child(request, parents, answer)
        except OperatorRejected as problem:
            raise OperatorRejected(
                problem.reason,
                answer=problem.answer or answer,
                model=self.model,
                prompt_hash=phash,
                files=problem.files,
            ) from problem
        return Proposal(
            files=files,
            parents=self.edges(parents),
            operator=self.name,
            model=self.model,
            description=explanation(answer) or f"{self.name} by {self.model}",
            prompt_hash=phash,
        )

    def _child(
        self, request: OperatorRequest, parents: Sequence[Parent], answer: str
    ) -> dict[str, str]:
        """The child's files from ``answer`` (the engine checks the edit is allowed)."""
        if not answer.strip():
            raise OperatorRejected("the answer was empty")
        files = self.edit(request, parents, answer)
        if files == dict(parents[0].candidate.files):
            raise OperatorRejected("the answer changes nothing in the program")
        return files


def apply_blocks(base: dict[str, str], answer: str, request: OperatorRequest) -> dict[str, str]:
    """The files after every SEARCH/REPLACE block of ``answer``; raises OperatorRejected if any fails."""
    result = apply_search_replace(base, answer, request.benchmark.is_editable)
    if result.problems:
        total = result.applied + len(result.problems)
        raise OperatorRejected(
            f"{len(result.problems)} of {total} SEARCH/REPLACE blocks did not apply: "
            + "; ".join(result.problems),
            answer=answer,
        )
    if result.applied == 0:
        raise OperatorRejected(
            "the answer has no SEARCH/REPLACE block (<<<<<<< SEARCH / ======= / >>>>>>> REPLACE)",
            answer=answer,
        )
    return result.files


class Diff(LLMOperator):
    """Asks for a focused improvement as SEARCH/REPLACE blocks on one parent."""

    name = "diff"
    template = "diff.md.j2"


class Rewrite(LLMOperator):
    """Asks for whole new editable files; text outside EVOLVE-BLOCKs must come back unchanged."""

    name = "rewrite"
    template = "rewrite.md.j2"

    def edit(
        self, request: OperatorRequest, parents: Sequence[Parent], answer: str
    ) -> dict[str, str]:
        base = dict(parents[0].candidate.files)
        editable = sorted(p for p in base if request.benchmark.is_editable(p))
        if parse_search_replace(answer, list(base))[0]:  # SEARCH/REPLACE blocks, fenced or not
            return apply_blocks(base, answer, request)
        code_blocks = fenced_blocks(answer)
        if not code_blocks:
            raise OperatorRejected(
                "the answer has no fenced code block with a new file", answer=answer
            )
        files = dict(base)
        unnamed = [code for hint, code in code_blocks if _match(hint, base) is None]
        longest: dict[str, str] = {}  # a file named twice: the whole file, not a snippet of it
        for hint, code in code_blocks:
            path = _match(hint, base)
            if path is not None and len(code) > len(longest.get(path, "")):
                longest[path] = code
        named = list(longest.items())
        if not named and len(editable) == 1 and unnamed:
            named = [(editable[0], max(unnamed, key=len))]
        if not named:
            raise OperatorRejected(
                f"no code block is named after an editable file ({', '.join(editable)}); put the file name "
                "on the line before each fence",
                answer=answer,
            )
        for path, code in named:
            if not request.benchmark.is_editable(path):
                raise OperatorRejected(
                    f"{path} is read-only; rewrite only {', '.join(editable)}", answer=answer
                )
            old = base[path]
            if (
                "EVOLVE-BLOCK" not in old
                and len(old) > 400
                and len(code) < FRAGMENT_RATIO * len(old)
            ):
                raise OperatorRejected(
                    f"the code given for {path} ({len(code)} characters) looks like a fragment of the "
                    f"{len(old)}-character file; give the whole file",
                    answer=answer,
                )
            try:
                files[path] = splice_rewrite(
                    path, old, code if code.endswith("\n") else code + "\n"
                )
            except EditError as exc:
                raise OperatorRejected(str(exc), answer=answer) from exc
        return files


def _match(hint: str | None, files: dict[str, str]) -> str | None:
    if not hint:
        return None
    hint = hint.replace("\\", "/").removeprefix("./")
    for path in files:
        if hint == path or path.endswith("/" + hint) or hint.endswith("/" + path):
            return path
    return None
