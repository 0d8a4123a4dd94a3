"""A synthetic archive written through the real Store API: for tests, timing and demos.

It imitates a MAP-Elites run (islands, a 2-D grid, built-in and LLM operators, failures,
rejections, LLM calls, a stats time series) without running any candidate, so browsing,
lineage and plots can be exercised on archives of any size, including 100k candidates.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

from evolve.store import Store
from evolve.types import CandidateStatus, EdgeRole, EvalStatus, Evaluation, Proposal

GRID = (
    {"name": "spread", "low": 0.0, "high": 1.0, "bins": 8},
    {"name": "symmetry", "low": 0.0, "high": 1.0, "bins": 8},
)
OPERATORS = (
    ("tweak", None),
    ("crossover", None),
    ("diff", "anthropic/claude-sonnet-4-5"),
    ("diff", "openai/gpt-5-mini"),
    ("rewrite", "anthropic/claude-sonnet-4-5"),
)

_PROGRAM = '''"""Place 26 circles in the unit square; the harness scores the sum of radii."""

import math

# EVOLVE-BLOCK-START
RINGS = {rings}
INNER_RADIUS = {inner:.6f}
OUTER_RADIUS = {outer:.6f}
JITTER = {jitter:.6f}
ITERATIONS = {iterations}


def construct(n: int = 26) -> list[tuple[float, float, float]]:
    """Return (x, y, r) for each circle."""
    circles = []
    per_ring = max(1, n // RINGS)
    for k in range(n):
        ring, slot = divmod(k, per_ring)
        angle = 2 * math.pi * slot / per_ring + JITTER * ring
        radius = INNER_RADIUS + (OUTER_RADIUS - INNER_RADIUS) * ring / max(1, RINGS - 1)
        x = 0.5 + radius * math.cos(angle)
        y = 0.5 + radius * math.sin(angle)
        circles.append((x, y, 0.05))
    return circles
# EVOLVE-BLOCK-END
'''

_HELPERS = '''"""Helpers shared by every candidate (not editable)."""


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))
'''


def _program(rng: random.Random) -> dict[str, str]:
    text = _PROGRAM.format(
        rings=rng.randint(2, 6),
        inner=rng.random() * 0.2,
        outer=0.2 + rng.random() * 0.3,
        jitter=rng.random(),
        iterations=rng.choice((100, 200, 400, 800)),
    )
    return {"main.py": text, "helpers.py": _HELPERS}


def _mutate(files: dict[str, str], rng: random.Random, line: int) -> dict[str, str]:
    """Change one constant line of main.py (a stand-in for an operator's edit)."""
    lines = files["main.py"].splitlines(keepends=True)
    index = next(i for i, text in enumerate(lines) if text.startswith("RINGS")) + line % 5
    name = lines[index].split("=")[0].strip()
    value = f"{rng.randint(2, 9)}" if name in ("RINGS", "ITERATIONS") else f"{rng.random():.6f}"
    lines[index] = f"{name} = {value}\n"
    return {**files, "main.py": "".join(lines)}


def _cell(spread: float, symmetry: float) -> str:
    bins = [
        min(g["bins"] - 1, int(v * g["bins"]))
        for g, v in zip(GRID, (spread, symmetry), strict=True)
    ]
    return ",".join(str(b) for b in bins)


def write_sample_archive(
    path: Path | str, *, candidates: int = 200, islands: int = 2, seed: int = 0, batch: int = 500
) -> Path:
    """Write a synthetic run of ``candidates`` candidates into a new archive file.

    Args:
        path: the archive file to create (must not exist yet).
        candidates: how many candidates, the seed program included.
        islands: number of islands; each has its own grid.
        seed: random seed; the same seed gives the same archive.
        batch: candidates written per transaction (speed only).

    Returns:
        The archive's path.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; remove it or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    store = Store(path)
    run_id = store.start_run(
        config={"benchmark": {"name": "sample"}, "seed": seed},
        harness_hash="sample",
        seed=seed,
        hardware="synthetic",
    )
    store.set_state("objective", {"name": "sum_radii", "direction": "max"})
    store.set_state("grid", {"descriptors": list(GRID), "islands": islands})
    elites: list[dict[str, tuple[str, float]]] = [{} for _ in range(islands)]
    fitness: dict[str, float] = {}
    files_of: dict[str, dict[str, str]] = {}
    evaluated = failures = 0
    cost = 0.0
    seq = 0
    while seq < candidates:
        with store.transaction():
            for _ in range(min(batch, candidates - seq)):
                evaluated, failures, cost = _one(
                    store, rng, seq, islands, elites, fitness, files_of, (evaluated, failures, cost)
                )
                if seq % 10 == 9:
                    filled = [v for grid in elites for v in grid.values()]
                    seed_value = next(iter(fitness.values()))  # as Archive.stats: gains over the seed
                    store.add_stats(
                        evaluated=evaluated,
                        failures=failures,
                        cost=cost,
                        best=max((v for _, v in filled), default=float("nan")),
                        coverage=len(filled) / (64 * islands),
                        qd_score=sum(max(0.0, v - seed_value) for _, v in filled),
                    )
                seq += 1
    store.finish_run(run_id, status="finished", reason="budget reached")
    store.close()
    return path


def _one(
    store: Store,
    rng: random.Random,
    seq: int,
    islands: int,
    elites: list,
    fitness: dict,
    files_of: dict,
    totals: tuple[int, int, float],
) -> tuple[int, int, float]:
    evaluated, failures, cost = totals
    island = seq % islands
    pool = [cid for grid in (elites[island], *elites) for cid, _ in grid.values()]
    if not pool:  # the seed program
        files, parents, operator, model = _program(rng), (), "seed", None
    else:
        operator, model = rng.choice(OPERATORS)
        first = rng.choice(pool)
        files = _mutate(files_of[first], rng, seq)
        parents = ((first, EdgeRole.MUTATION),)
        if operator == "crossover":
            second = rng.choice(pool)
            if second != first:
                parents = ((first, EdgeRole.CROSSOVER), (second, EdgeRole.CROSSOVER))
        if model:
            parents += tuple(
                (cid, EdgeRole.INSPIRATION)
                for cid in rng.sample(pool, min(2, len(pool)))
                if cid != first
            )
    proposal = Proposal(
        files=files,
        parents=parents,
        operator=operator,
        model=model,
        island=island,
        description=f"{operator}: adjust constants of the ring layout (step {seq})",
        prompt_hash=f"p{seq:08x}" if model else None,
    )
    if store.has_candidate(proposal.id):
        files = {**files, "main.py": files["main.py"] + f"# variant {seq}\n"}
        proposal = Proposal(
            files=files,
            parents=parents,
            operator=operator,
            model=model,
            island=island,
            description=proposal.description,
            prompt_hash=proposal.prompt_hash,
        )
    cid = proposal.id
    roll = rng.random() if operator != "seed" else 1.0
    status = (
        CandidateStatus.REJECTED
        if roll < 0.05
        else CandidateStatus.FAILED
        if roll < 0.2
        else CandidateStatus.DONE
    )
    if status == CandidateStatus.REJECTED:
        proposal = Proposal(
            files=files,
            parents=parents,
            operator=operator,
            model=model,
            island=island,
            description="edit rejected: SEARCH block not found in main.py",
            prompt_hash=proposal.prompt_hash,
        )
    store.add_candidate(proposal, seq=seq, status=status)
    if model:
        _llm_call(store, rng, cid, model, proposal.prompt_hash, files)
        cost += 0.004
    if status == CandidateStatus.REJECTED:
        return evaluated, failures, cost
    evaluated += 1
    if status == CandidateStatus.FAILED:
        failures += 1
        store.add_evaluation(
            cid,
            Evaluation(
                status=rng.choice((EvalStatus.ERROR, EvalStatus.INVALID, EvalStatus.TIMEOUT)),
                wall_s=rng.random() * 3,
                artifacts={
                    "error": "circles 3 and 17 overlap by 0.0021",
                    "traceback": 'Traceback (most recent call last):\n  File "main.py", line 20, in construct\n'
                    "ValueError: overlap",
                },
            ),
        )
        return evaluated, failures, cost
    base = max(
        (fitness.get(p, 1.0) for p, role in parents if role != EdgeRole.INSPIRATION), default=1.0
    )
    value = round(base + rng.gauss(0.002, 0.02), 6)
    spread, symmetry = rng.random(), rng.random()
    fitness[cid] = value
    files_of[cid] = dict(files)
    store.add_evaluation(
        cid,
        Evaluation(
            status=EvalStatus.OK,
            fitness=value,
            wall_s=0.5 + rng.random(),
            metrics={"sum_radii": value, "min_gap": rng.random() * 1e-3, "eval_s": 0.8},
            descriptors={"spread": spread, "symmetry": symmetry},
            artifacts={"stdout": f"placed 26 circles, sum of radii {value:.6f}"},
            seeds=(seq,),
            hardware="cpu",
        ),
    )
    cell = _cell(spread, symmetry)
    incumbent = elites[island].get(cell)
    if incumbent is None or value > incumbent[1]:
        elites[island][cell] = (cid, value)
        store.put_elite(island, cell, cid, value)
    return evaluated, failures, cost


def _llm_call(
    store: Store,
    rng: random.Random,
    cid: str,
    model: str,
    prompt_hash: str | None,
    files: dict[str, str],
) -> None:
    messages = [
        {"role": "system", "content": "You improve programs. Answer with SEARCH/REPLACE blocks."},
        {
            "role": "user",
            "content": "# Task\nPack 26 circles.\n\n# Parent program\n" + files["main.py"],
        },
    ]
    response = "I will change one constant.\n<<<<<<< SEARCH\nJITTER = 0.1\n=======\nJITTER = 0.2\n>>>>>>> REPLACE\n"
    store.conn.execute(
        "INSERT INTO llm_calls (candidate, model, prompt_hash, cache_key, prompt, response, answer_chars, "
        "tokens_in, tokens_out, cost, latency_s, error, status, created_at) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,'ok',strftime('%s','now'))",
        (
            cid,
            model,
            prompt_hash,
            f"k{cid}",
            zlib.compress(json.dumps(messages).encode()),
            response,
            len(response),
            900 + rng.randint(0, 300),
            120 + rng.randint(0, 80),
            0.004,
            2 + rng.random() * 5,
            None,
        ),
    )
