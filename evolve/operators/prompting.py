"""Renders the LLM operators' prompts from ``prompts/`` (strictly) and hashes them.

Templates are the one source of prompt text; this module only prepares the values they
show: programs with their score, metrics and harness feedback (truncated to a budget),
inspirations as differences from the parent, and recent failures.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from evolve.fitness import Benchmark
from evolve.types import Parent

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
    """

    artifact_chars: int = 3000
    readonly_chars: int = 4000
    inspiration_chars: int = 2500


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
        (str(k), _number(v)) for k, v in (evaluation.metrics.items() if evaluation else ())
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
        "cell": parent.cell,
        "fitness": _number(evaluation.fitness)
        if evaluation is not None and evaluation.fitness is not None
        else None,
        "status": evaluation.status.value if evaluation is not None else "not evaluated",
        "metrics": metrics,
        "artifacts": artifacts,
        "files": files,
    }


def inspiration_view(
    other: Parent, parent: Parent, benchmark: Benchmark, budget: Budget
) -> dict[str, Any]:
    """An inspiration as a unified diff from ``parent``'s editable files to its own."""
    lines: list[str] = []
    for path in sorted(set(parent.candidate.files) | set(other.candidate.files)):
        if not benchmark.is_editable(path):
            continue
        before = parent.candidate.files.get(path, "").splitlines(keepends=True)
        after = other.candidate.files.get(path, "").splitlines(keepends=True)
        lines += difflib.unified_diff(before, after, fromfile=f"a/{path}", tofile=f"b/{path}", n=2)
    diff = "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n")
    evaluation = other.evaluation
    return {
        "id": other.candidate.id[:12],
        "cell": other.cell,
        "fitness": _number(evaluation.fitness)
        if evaluation is not None and evaluation.fitness is not None
        else "-",
        "diff": truncate(diff or "(same editable code)", budget.inspiration_chars),
    }


def context_values(
    benchmark: Benchmark,
    parent: Parent,
    inspirations: Sequence[Parent],
    failures: Sequence[str],
    budget: Budget,
) -> dict[str, Any]:
    """The values every operator's prompt uses: task, objective, inspirations, failures."""
    objective = benchmark.fitness.objective
    editable = sorted(p for p in parent.candidate.files if benchmark.is_editable(p))
    example = editable[0] if editable else "main.py"
    return {
        "task": benchmark.task.strip() or f"Improve the program of benchmark {benchmark.name}.",
        "objective": objective.name,
        "direction": "higher is better"
        if objective.direction.value == "max"
        else "lower is better",
        "editable": editable,
        "example_path": example,
        "example_language": LANGUAGES.get(Path(example).suffix, ""),
        "inspirations": [
            inspiration_view(other, parent, benchmark, budget)
            for other in inspirations
            if other.candidate.id != parent.candidate.id
        ],
        "failures": [truncate(" ".join(note.split()), 600) for note in failures],
    }


def messages_for(template: str, values: Mapping[str, Any]) -> list[dict[str, str]]:
    """System and user messages of an operator's prompt."""
    return [
        {"role": "system", "content": render("system.md.j2", **values)},
        {"role": "user", "content": render(template, **values)},
    ]
