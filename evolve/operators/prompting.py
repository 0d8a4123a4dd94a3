"""Renders the LLM operators' prompts from ``prompts/`` (strictly), fits them to the model's context, hashes them.

Templates are the one source of prompt text; this module only prepares the values they
show: programs with their score, metrics, cell and harness feedback (truncated to a
budget), the run's research notebook, inspirations as differences from the parent, and
what came of earlier proposals from the same parent. ``fitted`` keeps a prompt within the
model's context by cutting, lowest priority first, inspirations, the notebook, the harness
feedback, the parent's files and the task, and says in the prompt what was cut.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from evolve.archive.grid import describe_cell
from evolve.harness.fitness import Benchmark
from evolve.harness.phases import is_phase
from evolve.llm import LLMSettings
from evolve.llm._litellm import litellm
from evolve.llm.command import PROVIDER, TOKENIZER
from evolve.types import EvolveError, Files, Parent

PROMPTS = Path(__file__).parent / "prompts"
LANGUAGES = {
    ".py": "python",
    ".cu": "cuda",
    ".cpp": "cpp",
    ".c": "c",
    ".h": "c",
    ".sh": "bash",
    ".md": "markdown",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".toml": "toml",
    ".txt": "text",
}


@dataclass(frozen=True, kw_only=True)
class Budget:
    """How much text a prompt may show.

    Attributes:
        artifact_chars: per parent, all harness feedback together (the end is kept: errors are there).
        readonly_chars: per read-only file shown for context.
        inspiration_chars: per inspiration's difference from the parent.
        prompt_tokens: the most tokens a whole prompt may take (None: no limit); see
            ``prompt_limit``.
    """

    artifact_chars: int = 3000
    readonly_chars: int = 4000
    inspiration_chars: int = 2500
    prompt_tokens: int | None = None


MIN_PROMPT_TOKENS = 1000  # a context that leaves less than this for the prompt is a config error


def prompt_limit(model: str, settings: LLMSettings) -> int | None:
    """The most tokens a prompt to ``model`` may take: its context minus the answer cap.

    The context is ``llm.context_tokens`` when set, else litellm's ``max_input_tokens`` for
    the model (read from the map installed with litellm; no network); None when neither
    knows it. A window that litellm reports as shared by prompt and answer (``max_tokens``
    equal to ``max_input_tokens``), or one given in ``llm.context_tokens``, also holds the
    answer, so the answer cap is taken off it.

    Raises:
        EvolveError: the context leaves too little room for a prompt (names the settings).
    """
    if settings.context_tokens is not None:
        limit = settings.context_tokens - settings.answer_cap()
    else:
        try:
            info = litellm().get_model_info(model)
        except Exception:  # a model litellm does not know (command, local server)
            return None
        window = info.get("max_input_tokens")
        if not window:
            return None
        shared = info.get("max_tokens") == window
        limit = int(window) - (settings.answer_cap() if shared else 0)
    if limit < MIN_PROMPT_TOKENS:
        raise EvolveError(
            f"model {model}: its context leaves {limit} tokens for the prompt (at least "
            f"{MIN_PROMPT_TOKENS} needed); lower llm.max_tokens or raise llm.context_tokens"
        )
    return limit


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(PROMPTS),
        undefined=jinja2.StrictUndefined,  # a variable the code did not provide is an error
        keep_trailing_newline=True,
        autoescape=False,  # prompts are plain text, not HTML
    )


def render(template: str, **values: Any) -> str:
    """Render ``prompts/<template>``; a variable the template uses but is not given raises.

    Raises:
        jinja2.UndefinedError: a missing variable (names it).
        jinja2.TemplateNotFound: no such template.
    """
    text = _environment().get_template(template).render(**values)
    return "\n".join(line.rstrip() for line in text.strip().split("\n")) + "\n"


def prompt_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """The id of a rendered prompt (stored with the candidate and its LLM calls)."""
    payload = json.dumps(list(messages), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def truncate(text: str, limit: int, *, keep: str = "head") -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    dropped = len(text) - limit
    if keep == "tail":
        return f"[... {dropped} characters left out ...]\n" + text[-limit:]
    return text[:limit] + f"\n[... {dropped} characters left out ...]"


def _number(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return value


def program_view(
    parent: Parent, benchmark: Benchmark, budget: Budget, *, label: str
) -> dict[str, Any]:
    """What a template shows of one program."""
    evaluation = parent.evaluation
    metrics = sorted(
        (str(k), _number(v))
        for k, v in (evaluation.metrics.items() if evaluation else ())
        if (str(k) in benchmark.shown_metrics if benchmark.shown_metrics else not is_phase(str(k)))
    )
    artifacts = []
    if evaluation is not None:
        share = max(200, budget.artifact_chars // max(1, len(evaluation.artifacts)))
        artifacts = [
            (str(name), truncate(str(text).strip(), share, keep="tail"))
            for name, text in sorted(evaluation.artifacts.items())
            if str(text).strip()
        ]
    files = []
    for path, text in sorted(parent.candidate.files.items()):
        editable = benchmark.is_editable(path)
        shown = text if editable else truncate(text, budget.readonly_chars)
        files.append(
            {
                "path": path,
                "text": shown.rstrip("\n"),
                "editable": editable,
                "truncated": shown != text,
                "language": LANGUAGES.get(Path(path).suffix, ""),
            }
        )
    files.sort(key=lambda f: (not f["editable"], f["path"]))  # editable files first
    return {
        "label": label,
        "id": parent.candidate.id[:12],
        "cell": describe_cell(parent.cell, _axes(benchmark)),
        "fitness": _number(evaluation.fitness)
        if evaluation is not None and evaluation.fitness is not None
        else None,
        "status": evaluation.status.value if evaluation is not None else "not evaluated",
        "metrics": metrics,
        "artifacts": artifacts,
        "files": files,
    }


def _axes(benchmark: Benchmark) -> list[dict[str, Any]]:
    return [
        {"name": d.name, "low": d.low, "high": d.high, "bins": d.bins}
        for d in benchmark.fitness.descriptors
    ]


def files_diff(before: Files, after: Files, paths: Iterable[str], *, context: int = 2) -> str:
    """A unified diff of ``paths`` from ``before`` to ``after`` (a missing file reads as empty)."""
    lines: list[str] = []
    for path in paths:
        old = before.get(path, "").splitlines(keepends=True)
        new = after.get(path, "").splitlines(keepends=True)
        lines += difflib.unified_diff(old, new, fromfile=f"a/{path}", tofile=f"b/{path}", n=context)
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n")


def inspiration_view(
    other: Parent, parent: Parent, benchmark: Benchmark, budget: Budget
) -> dict[str, Any]:
    """An inspiration as a unified diff from ``parent``'s editable files to its own."""
    before, after = parent.candidate.files, other.candidate.files
    diff = files_diff(
        before, after, [p for p in sorted({*before, *after}) if benchmark.is_editable(p)]
    )
    evaluation = other.evaluation
    return {
        "id": other.candidate.id[:12],
        "cell": describe_cell(other.cell, _axes(benchmark)),
        "fitness": _number(evaluation.fitness)
        if evaluation is not None and evaluation.fitness is not None
        else "-",
        "diff": truncate(diff or "(same editable code)", budget.inspiration_chars),
    }


def task_values(benchmark: Benchmark) -> dict[str, str]:
    """``task`` (the benchmark's text, else its name), ``objective`` and its ``direction``, as
    the templates show them."""
    objective = benchmark.fitness.objective
    return {
        "task": benchmark.task.strip() or benchmark.name,
        "objective": objective.name,
        "direction": "higher is better"
        if objective.direction.value == "max"
        else "lower is better",
    }


def context_values(
    benchmark: Benchmark,
    parent: Parent,
    inspirations: Sequence[Parent],
    failures: Sequence[str],
    budget: Budget,
    notes: str = "",
) -> dict[str, Any]:
    """The values every operator's prompt uses: task, objective, notebook, inspirations, and
    what came of earlier proposals from this parent (``failures``)."""
    editable = sorted(p for p in parent.candidate.files if benchmark.is_editable(p))
    example = editable[0] if editable else "main.py"
    return {
        **task_values(benchmark),
        "task": benchmark.task.strip() or f"Improve the program of benchmark {benchmark.name}.",
        "editable": editable,
        "example_path": example,
        "example_language": LANGUAGES.get(Path(example).suffix, ""),
        "inspirations": [
            inspiration_view(other, parent, benchmark, budget)
            for other in inspirations
            if other.candidate.id != parent.candidate.id
        ],
        "notes": notes.strip(),
        # one line each, runs of spaces kept: a quoted line of code must stay copyable
        "failures": [truncate(" / ".join(note.strip().splitlines()), 600) for note in failures],
        "cuts": [],
    }


def messages_for(template: str, values: Mapping[str, Any]) -> list[dict[str, str]]:
    """System and user messages of an operator's prompt."""
    return [
        {"role": "system", "content": render("system.md.j2", **values)},
        {"role": "user", "content": render(template, **values)},
    ]


def prompt_tokens(model: str, messages: Sequence[Mapping[str, str]]) -> int:
    """How many tokens ``messages`` take for ``model``, counted as its calls are recorded
    (litellm's counter, no network; a command model's with ``command.TOKENIZER``)."""
    counted = TOKENIZER if model.startswith(f"{PROVIDER}/") else model
    return int(litellm().token_counter(model=counted, messages=list(messages)))


def fitted(
    template: str, values: Mapping[str, Any], *, model: str, limit: int | None
) -> list[dict[str, str]]:
    """``messages_for``, cut until it takes at most ``limit`` tokens, lowest priority first:
    inspirations, the notebook (earlier proposals from this parent, then the run's notes),
    the harness feedback, the parent's files (read-only ones first), the task. Each cut is
    named in the prompt's ``cuts``.

    Raises:
        EvolveError: even with all of that cut the prompt is too long (names the fix).
    """
    values = {**values, "cuts": []}
    messages = messages_for(template, values)
    if limit is None or prompt_tokens(model, messages) <= limit:
        return messages
    for _ in _cuts(values):
        messages = messages_for(template, values)
        if prompt_tokens(model, messages) <= limit:
            return messages
    raise EvolveError(
        f"the prompt for {model} does not fit in {limit} tokens even with everything optional "
        "left out; use a model with a larger context, lower llm.max_tokens or raise llm.context_tokens"
    )


def fitted_text(
    template: str, values: Mapping[str, Any], cut: str, *, model: str, settings: LLMSettings
) -> list[dict[str, str]]:
    """A one-message prompt rendered from ``template`` with ``values``, its long part
    ``values[cut]`` cut (halved, the cut said in it) until it fits ``model``'s context
    (``prompt_limit``): the auditor's review (a diff) and the notebook's summary.

    Raises:
        EvolveError: it does not fit even with ``values[cut]`` left out (names the fix).
    """
    limit = prompt_limit(model, settings)
    text, chars = values[cut], len(values[cut])
    while True:
        content = render(template, **{**values, cut: truncate(text, chars)})
        messages = [{"role": "user", "content": content}]
        if limit is None or prompt_tokens(model, messages) <= limit:
            return messages
        if chars == 0:
            raise EvolveError(
                f"the {template} prompt for {model} does not fit in {limit} tokens even without "
                f"its {cut}; lower llm.max_tokens or raise llm.context_tokens"
            )
        chars //= 2


def _cuts(values: dict[str, Any]) -> Iterator[None]:
    """Shrink ``values`` step by step in reverse priority, yielding after each step."""
    cuts: dict[str, str] = {}

    def note(key: str, text: str) -> None:
        cuts[key] = text
        values["cuts"] = list(cuts.values())

    shown = list(values["inspirations"])
    while values["inspirations"]:
        values["inspirations"] = values["inspirations"][:-1]
        gone = len(shown) - len(values["inspirations"])
        note("inspirations", f"{gone} of {len(shown)} other good programs (inspirations)")
        yield
    attempts = list(values["failures"])
    while values["failures"]:
        values["failures"] = values["failures"][:-1]
        gone = len(attempts) - len(values["failures"])
        note(
            "attempts", f"the oldest {gone} of {len(attempts)} earlier proposals from this program"
        )
        yield
    notes = values["notes"]
    for text in _halves(notes):
        values["notes"] = text
        note(
            "notes",
            f"the research notebook's last {len(notes) - len(text)} of {len(notes)} characters",
        )
        yield
    views = [v for v in values.values() if isinstance(v, dict) and "files" in v]
    for view in views:
        full = [(name, text) for name, text in view["artifacts"]]
        for share in _shares(max((len(t) for _, t in full), default=0)):
            view["artifacts"] = [
                (name, truncate(text, share, keep="tail")) for name, text in full if share
            ]
            dropped = sum(len(t) for _, t in full) - sum(min(len(t), share) for _, t in full)
            note(
                f"feedback {view['id']}",
                f"{dropped} characters of the harness feedback on `{view['id']}` (its start)",
            )
            yield
    for editable in (False, True):
        for view in views:
            for file in view["files"]:
                if file["editable"] != editable:
                    continue
                full = file["text"]
                for text in _halves(full):
                    file["text"], file["truncated"] = text, True
                    note(
                        f"file {view['id']} {file['path']}",
                        f"the end of {file['path']} of `{view['id']}` ({len(full) - len(text)} characters)",
                    )
                    yield
    task = values["task"]
    for text in _halves(task):
        values["task"] = text
        note("task", f"the end of the task text ({len(task) - len(text)} characters)")
        yield


def _halves(text: str) -> Iterator[str]:
    """``text`` cut at line ends to about half, a quarter... then nothing."""
    while text:
        keep = text[: len(text) // 2]
        text = keep[: keep.rfind("\n") + 1] if "\n" in keep else keep if len(keep) > 40 else ""
        yield text


def _shares(longest: int) -> Iterator[int]:
    """Halves of ``longest`` down to 100 characters, then 0."""
    share = longest
    while share > 0:
        share = share // 2 if share > 100 else 0
        yield share
