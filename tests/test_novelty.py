"""Novelty beyond identical text: rename-only and constant-only twins, and near-identical code by embedding."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path

import pytest
from evolve.benchmarks.circle_packing import fitness as circle_packing

from evolve.launch import runner
from evolve.llm import LLMClient, LLMSettings
from evolve.llm.ledger import text_hash
from evolve.search.engine import Rejection
from evolve.search.novelty import Novelty, structure_hash
from evolve.settings import NoveltySettings
from evolve.store.calls import unpack_vector
from evolve.store.database import Store
from evolve.types import AddStatus, CandidateStatus, EdgeRole, Proposal
from tests.conftest import composed
from tests.fixtures.mock_openai import MockServer, trigram_vector
from tests.test_engine import SEED, evaluation, make_engine
from tests.test_llm_search import local_toy

PACKING = (Path(circle_packing.__file__).parent / "seed" / "packing.py").read_text()
RENAMED = (
    PACKING.replace("moments", "firsts")  # locals of optimise_centres
    .replace("squares", "seconds")
    .replace("m_hat", "mean")
    .replace('"""The packing: centres and radii of N circles."""', '"""Where the circles go."""')
)


def test_a_rename_only_rewrite_has_the_same_structure_and_a_real_change_does_not():
    assert RENAMED != PACKING and "firsts[i]" in RENAMED
    files = {"packing.py": PACKING}
    assert structure_hash({"packing.py": RENAMED}) == structure_hash(files)
    changed = PACKING.replace("moments[i] = 0.9 *", "moments[i] = 0.8 *")
    parameter = PACKING.replace("weight", "strength")  # a parameter: callers may name it
    assert structure_hash({"packing.py": parameter}) != structure_hash(files)
    top_level = PACKING.replace("best_radii", "largest_radii")  # a module-level name
    assert structure_hash({"packing.py": top_level}) != structure_hash(files)
    assert structure_hash({"packing.py": changed}) != structure_hash(files)
    assert structure_hash({"packing.py": changed}, constants=True) == structure_hash(
        files, constants=True
    )
    swapped = PACKING.replace(
        "np.minimum(x[:, 0]", "np.maximum(x[:, 0]"
    )  # an attribute, not a name
    assert structure_hash({"packing.py": swapped}) != structure_hash(files)


def same(a: str, b: str) -> bool:
    return structure_hash({"m.py": a}) == structure_hash({"m.py": b})


def test_only_a_functions_own_locals_are_renamed_never_names_another_scope_binds():
    assert same("def f(v):\n    a = v\n    return a\n", "def f(v):\n    b = v\n    return b\n")
    assert not same("def f(v):\n    return v\n", "def f(w):\n    return w\n")  # a parameter
    # a comprehension's variable is its own scope: outside it, x and y are different globals
    assert not same(
        "def f(s):\n    t = [x for x in s]\n    return x\n",
        "def f(s):\n    t = [y for y in s]\n    return y\n",
    )
    # a class body binds attributes (C.a vs C.b), whatever the enclosing function's locals
    assert not same(
        "def f():\n    a = 1\n    class C:\n        a = 2\n    return C.a\n",
        "def f():\n    b = 1\n    class C:\n        b = 2\n    return C.a\n",
    )
    # a nested function's locals are renamed in its own scope, the outer's stay the outer's
    assert same(
        "def f():\n    a = 1\n    def g():\n        c = a\n        return c\n    return g\n",
        "def f():\n    b = 1\n    def g():\n        d = b\n        return d\n    return g\n",
    )


WITH_FUNCTION = SEED.replace(
    "# EVOLVE-BLOCK-END",
    "\n\ndef scale(x):\n    doubled = x * 2\n    return doubled\n# EVOLVE-BLOCK-END",
)


def test_a_rename_only_rewrite_of_an_elite_is_refused_before_evaluation_naming_its_twin(tmp_path):
    engine = make_engine(tmp_path, seed_text=WITH_FUNCTION)
    (ask,) = engine.ask()
    seed_id = ask.parents[0][0]
    renamed = WITH_FUNCTION.replace("doubled", "twice")
    rejected = engine.admit(
        ask,
        Proposal(
            files={"params.py": renamed},
            operator="diff",
            model="m",
            parents=((seed_id, EdgeRole.MUTATION),),
        ),
    )
    assert isinstance(rejected, Rejection) and rejected.duplicate_of == seed_id
    assert rejected.reason.startswith(
        f"behaviourally identical to {seed_id}: the same program up to local names"
    )
    row = engine.store.conn.execute(
        "SELECT id FROM candidates WHERE seq=? AND status='rejected'", (ask.seq,)
    ).fetchone()
    artifacts = engine.store.evaluation(row[0]).artifacts
    assert artifacts["twin"] == seed_id and artifacts["error"] == rejected.reason


def test_a_constant_only_rewrite_that_scores_identically_is_kept_out_of_the_archive(tmp_path):
    engine = make_engine(tmp_path)
    seed_id = engine.store.seed_candidate().id
    (ask,) = engine.ask()
    first = engine.admit(
        ask,
        Proposal(
            files={"params.py": SEED.replace("A = 1.0", "A = 2.0")},
            operator="tweak",
            parents=((seed_id, EdgeRole.MUTATION),),
        ),
    )
    engine.start_evaluation(first)
    assert engine.tell(first, evaluation(-3.0, a=2.0)).status == AddStatus.NEW
    # C = 0.5 and C = 0.0 are equally far from the toy's target 0.25: the same score, the same cell
    (ask,) = engine.ask()
    twin = engine.admit(
        ask,
        Proposal(
            files={"params.py": SEED.replace("A = 1.0", "A = 2.0").replace("C = 0.5", "C = 0.0")},
            operator="tweak",
            parents=((first.id, EdgeRole.MUTATION),),
        ),
    )
    engine.start_evaluation(twin)
    result = engine.tell(twin, evaluation(-3.0, a=2.0))
    assert result.status == AddStatus.NOT_ADDED
    stored = engine.store.evaluation(twin.id)
    assert (
        stored.artifacts["twin"] == first.id
        and "behaviourally identical" in stored.artifacts["novelty"]
    )
    assert engine.store.candidate(twin.id).status == CandidateStatus.DONE
    assert twin.id not in {elite.candidate_id for _, _, elite in engine.archive.elites()}


def test_the_checks_can_be_turned_off(tmp_path):
    off = NoveltySettings(names=False, behaviour=False)
    store = Store(tmp_path / "archive.db")
    novelty = Novelty(
        store=store, settings=off, editable=lambda p: True, objective="f", descriptors=["a"]
    )
    assert novelty.structural_twin({"x.py": "a = 1\n"}) is None
    assert novelty.behavioural_twin("c", evaluation(1.0)) is None
    assert asyncio.run(novelty.embedding_twin({"x.py": "a = 1\n"})) is None


def embedding_novelty(store: Store, settings: NoveltySettings) -> Novelty:
    """The novelty checks of a run over ``store``, with its own LLM client."""
    client = LLMClient(LLMSettings(), store=store)
    return Novelty(
        store=store,
        settings=settings,
        editable=lambda p: True,
        objective="f",
        descriptors=[],
        client=client,
    )


def test_an_embedding_server_refuses_near_identical_code_and_lets_a_new_program_through(tmp_path):
    server = MockServer().start()
    try:
        store = Store(tmp_path / "archive.db")
        store.add_candidate(Proposal(files={"packing.py": PACKING}, operator="seed"), seq=0)
        settings = NoveltySettings(
            embedding_model="openai/trigrams",
            embedding_api_base=server.api_base,
            embedding_threshold=0.99,
        )
        novelty = embedding_novelty(store, settings)
        near = PACKING.replace("STEPS = 400", "STEPS = 450")
        twin = asyncio.run(novelty.embedding_twin({"packing.py": near}))
        assert twin.id == Proposal(files={"packing.py": PACKING}, operator="seed").id
        similarity = re.search(r"cosine similarity (\S+) \(threshold 0.99\)", twin.reason)
        assert similarity and float(similarity[1]) >= 0.99
        other = "import random\nprint(sorted(random.random() for _ in range(26)))\n"
        assert asyncio.run(novelty.embedding_twin({"packing.py": other})) is None
        assert len(server.embedded) == 3  # the stored candidate once, then each proposal
        assert asyncio.run(novelty.embedding_twin({"packing.py": near})).id == twin.id
        assert len(server.embedded) == 3  # the same code again: its recorded embedding
        resumed = embedding_novelty(store, settings)  # a resumed run: a new client, same archive
        assert asyncio.run(resumed.embedding_twin({"packing.py": near})).id == twin.id
        assert len(server.embedded) == 3
    finally:
        server.stop()


EMBEDDING = "openai/trigrams"  # litellm has no price for it: tokens only


def test_the_same_text_asked_twice_at_once_is_embedded_by_one_call(tmp_path):
    server = MockServer().start()
    try:
        client = LLMClient(LLMSettings(), store=Store(tmp_path / "archive.db"))

        async def twice() -> list[tuple[float, ...]]:
            ask = client.embed(EMBEDDING, "x = 1\n", api_base=server.api_base)
            again = client.embed(EMBEDDING, "x = 1\n", api_base=server.api_base)
            return await asyncio.gather(ask, again)

        first, second = asyncio.run(twice())
    finally:
        server.stop()
    assert server.embedded == ["x = 1\n"] and first == second
    assert first == pytest.approx(trigram_vector("x = 1\n"))


def embedding_overrides(
    server: MockServer, model: str = EMBEDDING, threshold: float = 0.95
) -> list[str]:
    return [
        f"archive.novelty.embedding_model={model}",
        f"archive.novelty.embedding_api_base={server.api_base}",
        f"archive.novelty.embedding_threshold={threshold}",
    ]


def near_refusals(db: Path) -> list[tuple[int, dict]]:
    """(seq, artifacts) of each proposal refused as a near-duplicate by embedding."""
    with sqlite3.connect(db) as conn:
        refused = conn.execute(
            "SELECT c.seq, e.artifacts FROM candidates c JOIN evaluations e ON e.candidate = c.id "
            "WHERE c.status = 'rejected' ORDER BY c.seq"
        ).fetchall()
    return [(seq, json.loads(a)) for seq, a in refused if "embeds at cosine similarity" in a]


def embedding_calls(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT prompt_hash, response, prompt, tokens_in, cost, status FROM llm_calls "
            "WHERE model = ? ORDER BY id",
            (EMBEDDING,),
        ).fetchall()


def test_a_search_records_each_distinct_embedding_once_and_an_offline_replay_refuses_the_same(
    tmp_path,
):
    server = MockServer().start()
    try:
        cfg = local_toy(server, "search.max_candidates=8", *embedding_overrides(server))
        runner.run(cfg, tmp_path / "first")
        sent, chats = list(server.embedded), server.requests
        # the replay is served from the first run's archive: the server must not be asked again
        replay = local_toy(server, "search.max_candidates=8", *embedding_overrides(server))
        replay["llm"].update(offline=True, replay_from=str(tmp_path / "first"))
        runner.run(replay, tmp_path / "replay")
        assert server.embedded == sent and server.requests == chats
    finally:
        server.stop()
    first = tmp_path / "first" / "archive.db"
    near = near_refusals(first)
    assert near, "no near-duplicate was refused: the test shows nothing"
    with sqlite3.connect(first) as conn:
        stored = {
            cid for (cid,) in conn.execute("SELECT id FROM candidates WHERE status != 'rejected'")
        }
    assert all(a["twin"] in stored for _, a in near)
    # each distinct code embedded once (a stored proposal is not embedded again when indexed)
    assert len(sent) == len(set(sent))
    calls = {h: rest for h, *rest in embedding_calls(first)}  # concurrent: recorded in any order
    assert sorted(calls) == sorted(text_hash(text) for text in sent)
    for text in sent:
        response, prompt, tokens, cost, status = calls[text_hash(text)]
        assert status == "ok" and prompt is None and tokens == len(text) // 4 and cost is None
        assert unpack_vector(response) == pytest.approx(trigram_vector(text))
    assert near_refusals(tmp_path / "replay" / "archive.db") == near
    replayed = embedding_calls(tmp_path / "replay" / "archive.db")
    assert {h for h, *_ in replayed} == set(calls)
    assert all(cost == 0 and status == "ok" for *_, cost, status in replayed)


def test_a_budget_too_small_stops_embedding_calls_like_other_calls(tmp_path):
    server = MockServer().start()
    try:
        # built-in operators only: the embeddings are the run's only paid calls
        # ($0.02 per million tokens at litellm's price; the toy program is ~40 tokens)
        cfg = composed(
            [
                "search.max_candidates=40",
                "llm.max_cost_usd=0.000004",
                *embedding_overrides(server, "openai/text-embedding-3-small", threshold=1.0),
            ]
        )
        summary = runner.run(cfg, tmp_path)
    finally:
        server.stop()
    assert "LLM budget reached" in summary.reason and "raise llm.max_cost_usd" in summary.reason
    assert "the next call of openai/text-embedding-3-small is expected to cost" in summary.reason
    with sqlite3.connect(tmp_path / "archive.db") as conn:
        calls, spent = conn.execute(
            "SELECT COUNT(*), SUM(cost) FROM llm_calls WHERE model = 'openai/text-embedding-3-small'"
        ).fetchone()
    assert calls == len(server.embedded) >= 2 and 0 < spent <= 0.000004
    assert summary.evaluated < 40


def test_a_run_makes_its_chat_and_embedding_calls_through_one_client(tmp_path, monkeypatch):
    """The runner builds the one client and hands it to the operators and the novelty check:
    one budget, one response cache, one record (issue 34)."""
    made: list[LLMClient] = []

    class Counted(LLMClient):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(runner, "LLMClient", Counted)
    server = MockServer().start()
    try:
        runner.run(
            local_toy(server, "search.max_candidates=4", *embedding_overrides(server)), tmp_path
        )
    finally:
        server.stop()
    assert len(made) == 1 and server.requests and server.embedded
    with sqlite3.connect(tmp_path / "archive.db") as conn:
        models = {m for (m,) in conn.execute("SELECT DISTINCT model FROM llm_calls")}
    assert EMBEDDING in models and len(models) >= 2  # both kinds of call, in one record
