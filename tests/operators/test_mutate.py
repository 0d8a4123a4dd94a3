"""LLM ``diff`` and ``rewrite`` through the real litellm path with a scripted model."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import jinja2
import pytest

from evolve.harness.fitness import Benchmark, EvalContext
from evolve.llm import BudgetExceeded, LLMClient, LLMSettings
from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.mutate import Diff, Rewrite
from evolve.operators.prompting import render
from evolve.store.database import Store
from evolve.types import Candidate, EdgeRole, EvalStatus, Evaluation, Objective, Parent
from tests.fixtures import scripted_provider

PROGRAM = """import math

# EVOLVE-BLOCK-START
def radii(n):
    return [0.05] * n
# EVOLVE-BLOCK-END


def main():
    print(sum(radii(26)))
"""
HARNESS = "def check(r):\n    return all(x > 0 for x in r)\n"


class SumOfRadii:
    """A real (tiny) fitness: only its objective matters to the prompts."""

    objective = Objective(name="sum_radii")
    descriptors = ()

    def evaluate(self, workdir: Path, ctx: EvalContext) -> Evaluation:
        return Evaluation(status=EvalStatus.OK, fitness=1.0)


def benchmark(tmp_path: Path) -> Benchmark:
    return Benchmark(
        name="toy",
        fitness=SumOfRadii(),
        seed_dir=tmp_path,
        editable=("main.py",),
        task="Pack 26 circles in the unit square; maximise the sum of radii.",
    )


def parent(
    files: dict[str, str], fitness: float = 1.3, cid: str = "p" * 20, **artifacts: str
) -> Parent:
    evaluation = Evaluation(
        status=EvalStatus.OK,
        fitness=fitness,
        metrics={"valid": 1, "overlap": 0.0},
        artifacts=artifacts,
    )
    return Parent(
        candidate=Candidate(id=cid, seq=1, files=files, operator="seed"),
        evaluation=evaluation,
        cell="2,3",
    )


def request(tmp_path: Path, parents: list[Parent], seq: int = 5, **kw) -> OperatorRequest:
    return OperatorRequest(
        parents=parents, benchmark=benchmark(tmp_path), rng=random.Random(7), seq=seq, **kw
    )


@pytest.fixture
def scripted():
    return scripted_provider.install()


@pytest.fixture
def client(tmp_path) -> LLMClient:
    settings = LLMSettings.from_config(
        {"model": "scripted/m", "retries": 1, "backoff_s": 0.01, "timeout_s": 5}
    )
    return LLMClient(settings, store=Store(tmp_path / "archive.db"))


FILES = {"main.py": PROGRAM, "harness.py": HARNESS}
GOOD = """Larger circles: every radius goes from 0.05 to 0.09.

main.py
<<<<<<< SEARCH
    return [0.05] * n
=======
    return [0.09] * n
>>>>>>> REPLACE
"""


def propose(operator, req):
    return asyncio.run(operator.propose(req))


def test_diff_makes_a_child_with_lineage_prompt_hash_and_description(
    scripted, client, tmp_path
) -> None:
    scripted.queue("m", GOOD)
    p = parent(FILES, stdout="sum 1.3", error="")
    inspiration = parent(
        {"main.py": PROGRAM.replace("0.05", "0.07"), "harness.py": HARNESS}, 1.8, cid="i" * 20
    )
    req = request(
        tmp_path,
        [p],
        inspirations=[inspiration],
        failures=["abc (diff, rejected): grew radii -> overlap"],
    )
    proposal = propose(Diff(client=client, model="scripted/m"), req)
    assert (
        "return [0.09] * n" in proposal.files["main.py"] and proposal.files["harness.py"] == HARNESS
    )
    assert proposal.parents == (("p" * 20, EdgeRole.MUTATION),)
    assert (proposal.operator, proposal.model) == ("diff", "scripted/m")
    assert proposal.description == "Larger circles: every radius goes from 0.05 to 0.09."
    row = next(client.ledger.store.db.query("SELECT prompt_hash FROM llm_calls"))
    assert proposal.prompt_hash == row["prompt_hash"]
    _, messages, _ = scripted.requests[0]
    system, user = messages[0]["content"], messages[1]["content"]
    assert "sum_radii (higher is better)" in system and "main.py" in system
    for shown in (
        "Pack 26 circles",
        "sum_radii: 1.3",
        "overlap: 0",
        "sum 1.3",
        "cell 2,3",
        "grew radii -> overlap",
        "+    return [0.07] * n",
        "harness.py (read-only)",
        "<<<<<<< SEARCH",
    ):
        assert shown in user, shown


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("", "the answer was empty"),
        ("I would make the circles bigger.", "no SEARCH/REPLACE block"),
        ("<<<<<<< SEARCH\n    return [0.05] * n\n", "divider"),
        (
            "<<<<<<< SEARCH\n    return [0.06] * n\n=======\n    return [0.09] * n\n>>>>>>> REPLACE",
            "not found",
        ),
        (
            "harness.py\n<<<<<<< SEARCH\n    return all(x > 0 for x in r)\n=======\n    return True\n>>>>>>> REPLACE",
            "read-only",
        ),
        (
            "<<<<<<< SEARCH\n    return [0.05] * n\n=======\n    return [0.05] * n\n>>>>>>> REPLACE",
            "changes nothing",
        ),
    ],
)
def test_unusable_answers_are_rejected_with_the_reason(
    scripted, client, tmp_path, answer, reason
) -> None:
    scripted.queue("m", answer)
    with pytest.raises(OperatorRejected, match=reason) as caught:
        propose(Diff(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)]))
    assert (
        caught.value.answer == answer
        and caught.value.model == "scripted/m"
        and caught.value.prompt_hash
    )


def test_a_huge_answer_is_rejected_quickly(scripted, client, tmp_path) -> None:
    scripted.queue("m", "blah " * 400_000)
    with pytest.raises(OperatorRejected, match="no SEARCH/REPLACE block"):
        propose(Diff(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)]))


def test_a_failed_call_becomes_a_rejection_and_the_budget_stop_passes_through(
    scripted, tmp_path
) -> None:
    scripted.queue("m", {"rate_limit": 0}, {"rate_limit": 0})
    settings = LLMSettings.from_config({"model": "scripted/m", "retries": 1, "backoff_s": 0.01})
    client = LLMClient(settings, store=Store(tmp_path / "a.db"))
    with pytest.raises(OperatorRejected, match="the model call failed.*RateLimitError"):
        propose(Diff(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)]))
    broke = LLMClient(
        LLMSettings.from_config({"model": "scripted/m", "max_cost_usd": 0}),
        store=Store(tmp_path / "b.db"),
    )
    with pytest.raises(BudgetExceeded):
        propose(Diff(client=broke, model="scripted/m"), request(tmp_path, [parent(FILES)]))


def test_artifacts_are_truncated_to_the_budget_keeping_the_end(scripted, client, tmp_path) -> None:
    scripted.queue("m", GOOD)
    log = "noise line\n" * 5000 + "Traceback: ZeroDivisionError at the end"
    propose(Diff(client=client, model="scripted/m"), request(tmp_path, [parent(FILES, stderr=log)]))
    user = scripted.requests[0][1][1]["content"]
    assert "ZeroDivisionError at the end" in user and "characters left out" in user
    assert len(user) < len(log) // 5


def test_rewrite_splices_the_new_blocks_into_the_file(scripted, client, tmp_path) -> None:
    new = PROGRAM.replace(
        "    return [0.05] * n", "    base = 0.08\n    return [base] * n"
    ).replace("\n\n\ndef", "\n\ndef")
    scripted.queue("m", f"Use a named base radius.\n\nmain.py\n```python\n{new}```\n")
    proposal = propose(
        Rewrite(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)])
    )
    assert proposal.files["main.py"] == PROGRAM.replace(
        "    return [0.05] * n", "    base = 0.08\n    return [base] * n"
    )
    assert proposal.operator == "rewrite"


def test_rewrite_rejects_changes_outside_blocks_and_unnamed_blocks(
    scripted, client, tmp_path
) -> None:
    scripted.queue("m", "main.py\n```python\n" + PROGRAM.replace("sum(radii(26))", "42") + "```")
    with pytest.raises(OperatorRejected, match="outside the EVOLVE-BLOCKs"):
        propose(Rewrite(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)]))
    scripted.queue("m", "no code at all")
    with pytest.raises(OperatorRejected, match="no fenced code block"):
        propose(
            Rewrite(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)], seq=6)
        )


def test_rewrite_accepts_search_replace_blocks_too(scripted, client, tmp_path) -> None:
    scripted.queue("m", GOOD)
    proposal = propose(
        Rewrite(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)])
    )
    assert "0.09" in proposal.files["main.py"]


def test_rewrite_takes_fenced_search_replace_blocks_as_blocks(scripted, client, tmp_path) -> None:
    scripted.queue("m", "I make them bigger.\n\nmain.py\n```python\n" + GOOD.strip() + "\n```\n")
    proposal = propose(
        Rewrite(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)])
    )
    assert "0.09" in proposal.files["main.py"] and "SEARCH" not in proposal.files["main.py"]


def test_rewrite_of_a_file_named_twice_takes_the_whole_file_not_the_snippet(
    scripted, client, tmp_path
) -> None:
    new = PROGRAM.replace("    return [0.05] * n", "    return [0.07] * n")
    snippet = "    return [0.07] * n\n"
    scripted.queue("m", f"main.py\n```python\n{new}```\n\nThe key change in main.py:\n```python\n{snippet}```\n")
    proposal = propose(
        Rewrite(client=client, model="scripted/m"), request(tmp_path, [parent(FILES)])
    )
    assert proposal.files["main.py"] == new


def test_templates_render_strictly() -> None:
    with pytest.raises(jinja2.UndefinedError, match="objective"):
        render("system.md.j2", direction="higher is better", editable=["main.py"])
