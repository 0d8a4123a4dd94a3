"""Novelty beyond identical text: the stored candidate a new one is a twin of, by structure, embedding or behaviour.

Three checks, each configured in ``archive.novelty`` (``evolve.settings.NoveltySettings``):

- *structure*, before evaluation: the same program up to its functions' local variable names
  and its docstrings, and, where a benchmark's numbers do not change what it computes, up to
  its numeric constants. Compared as the syntax tree with each local renamed by its order of
  first binding. Parameters and module-level names are never renamed: a caller or the
  harness may use them by name.
- *embedding*, before evaluation, when an embedding model is configured: the cosine
  similarity of the code's embedding to a stored candidate's at or above a threshold. The
  embeddings come from the run's LLM client (``LLMClient.embed``): recorded in ``llm_calls``,
  each distinct code embedded once per run (resumes included), held to ``llm.max_cost_usd``
  and served again by an offline replay.
- *behaviour*, after evaluation: the same objective value and the same descriptor values,
  bit for bit, as a stored candidate; such a candidate is kept out of the archive.

Each check answers with a ``Twin`` (the stored candidate's id and the reason, worded for the
model that sees it) or None; the engine only acts on it. Stored candidates are indexed
lazily and incrementally (by ``seq``), so a resumed run checks against everything its
archive holds. Candidates refused before evaluation are never indexed.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from evolve.llm import LLMCallFailed, LLMClient
from evolve.settings import NoveltySettings
from evolve.store.database import Store
from evolve.types import Evaluation, Files

log = logging.getLogger("evolve")

EMBED_CHARS = 20_000  # code embedded per candidate (its editable files, head kept)


class _Canonical(ast.NodeTransformer):
    """Renames each function's local variables by order of first binding; drops docstrings; optionally numbers.

    Only a function's own locals are renamed: parameters (callers may pass them by keyword)
    and module-level or class-level names (a harness or another file may read them) are
    part of what a program does.
    """

    def __init__(self, constants: bool) -> None:
        self.constants = constants
        self.names: dict[str, str] = {}  # the enclosing functions' locals -> canonical names

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> ast.AST:
        outer = self.names
        if not isinstance(node, ast.Lambda):
            node.decorator_list = [self.visit(d) for d in node.decorator_list]
            node.returns = None
        node.args = self.visit(node.args)  # defaults belong to the enclosing scope
        params = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        body = node.body if isinstance(node.body, list) else [node.body]
        own = [child for stmt in body for child in _scope(stmt)]
        declared = {n for c in own if isinstance(c, ast.Global | ast.Nonlocal) for n in c.names}
        local: dict[str, str] = {}
        for child in own:
            if (
                isinstance(child, ast.Name)
                and isinstance(child.ctx, ast.Store)
                and child.id not in params | declared
            ):
                local.setdefault(child.id, f"_{len(outer) + len(local)}")
        self.names = {k: v for k, v in outer.items() if k not in params} | local
        try:
            if isinstance(node.body, list):
                node.body = [new for stmt in node.body if (new := self.visit(stmt)) is not None]
            else:
                node.body = self.visit(node.body)
        finally:
            self.names = outer
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:  # noqa: N802
        outer, self.names = self.names, {}  # a class body binds attributes, never renamed
        try:
            return self.generic_visit(node)
        finally:
            self.names = outer

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None  # type hints change nothing a program computes
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:  # noqa: N802
        if self.constants and type(node.value) in (int, float, complex):
            return ast.Constant(value=type(node.value).__name__)
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:  # noqa: N802
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None  # a docstring or a bare string: no behaviour
        return self.generic_visit(node)


NESTED_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _scope(node: ast.AST) -> list[ast.AST]:
    """``node`` and its descendants in its scope (inside nested functions, classes and comprehensions: none)."""
    if isinstance(node, NESTED_SCOPES):
        return [node]
    return [node, *(found for child in ast.iter_child_nodes(node) for found in _scope(child))]


@dataclass(frozen=True)
class Twin:
    """The stored candidate a new one is a twin of (``id``), and why it counts as one (``reason``)."""

    id: str
    reason: str

    def mark(self, evaluation: Evaluation) -> Evaluation:
        """``evaluation`` with the twin and the reason in its artifacts (``twin``, ``novelty``)."""
        return replace(
            evaluation, artifacts={**evaluation.artifacts, "novelty": self.reason, "twin": self.id}
        )


def structure_hash(files: Files, *, constants: bool = False) -> str:
    """A hash equal for programs that differ only in local names and docstrings (and numbers, with ``constants``)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        text = files[path]
        digest.update(path.encode() + b"\0")
        try:
            tree = ast.parse(text) if path.endswith(".py") else None
        except (SyntaxError, ValueError):
            tree = None
        if tree is None:
            digest.update(" ".join(text.split()).encode())
            continue
        tree = _Canonical(constants).visit(tree)
        digest.update(ast.dump(tree, annotate_fields=False).encode())
    return digest.hexdigest()[:20]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (0 when either is zero)."""
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


class Novelty:
    """Finds a new candidate's twin among the stored ones (see the module docstring).

    Args:
        store: the run's archive file (read only here).
        settings: which checks run, and the embedding model and threshold.
        editable: whether a path is editable (only editable files are embedded).
        objective: the objective's name (named in a behavioural twin's reason).
        descriptors: the names of the grid's descriptors (compared for behaviour).
        client: the run's LLM client, which makes the embedding calls (needed when an
            embedding model is configured).
    """

    def __init__(
        self,
        *,
        store: Store,
        settings: NoveltySettings,
        editable: Callable[[str], bool],
        objective: str,
        descriptors: Sequence[str],
        client: LLMClient | None = None,
    ) -> None:
        if settings.embedding_model is not None and client is None:
            raise ValueError(
                "archive.novelty.embedding_model is set: pass the run's LLMClient "
                "(Novelty(client=...), Engine(llm=...)) to make the embedding calls"
            )
        self.store, self.settings, self.editable = store, settings, editable
        self.client = client
        self.objective = objective
        self.descriptors = tuple(descriptors)
        self._structures: dict[str, str] = {}  # structure hash -> candidate id
        self._behaviours: dict[str, str] = {}  # behaviour fingerprint -> candidate id
        self._embeddings: dict[str, Sequence[float]] = {}  # candidate id -> embedding
        self._seen_seq = -1  # stored candidates up to this seq are indexed (structure)
        self._embedded_seq = -1  # ... and embedded
        self._seen_eval = 0  # evaluations up to this row id are indexed (behaviour)

    # --- structure --------------------------------------------------------------------------------

    def structural_twin(self, files: Files) -> Twin | None:
        """The stored candidate with the same program up to names (and constants), if any."""
        if not self.settings.names:
            return None
        self._index_structures()
        twin = self._structures.get(structure_hash(files, constants=self.settings.constants))
        ignored = "local names and docstrings" + (
            " and numeric constants" if self.settings.constants else ""
        )
        reason = f"the same program up to {ignored}; propose a change to what it computes"
        return Twin(twin, f"behaviourally identical to {twin}: {reason}") if twin else None

    def _index_structures(self) -> None:
        rows = self.store.conn.execute(
            "SELECT seq, id, files FROM candidates WHERE seq > ? AND status != 'rejected' ORDER BY seq",
            (self._seen_seq,),
        ).fetchall()
        for seq, cid, files in rows:
            key = structure_hash(json.loads(files), constants=self.settings.constants)
            self._structures.setdefault(key, cid)
            self._seen_seq = seq

    # --- embedding --------------------------------------------------------------------------------

    async def embedding_twin(self, files: Files) -> Twin | None:
        """The most similar stored candidate, when its code embeds at or above the threshold."""
        if self.settings.embedding_model is None:
            return None
        try:
            await self._index_embeddings()
            if not self._embeddings:
                return None
            vector = await self._embed(self._code(files))
        except LLMCallFailed as exc:  # every attempt is recorded; the proposal goes on unchecked
            log.warning("the embedding check was skipped: %s", exc)
            return None
        twin, similarity = max(
            ((cid, cosine(vector, other)) for cid, other in self._embeddings.items()),
            key=lambda pair: pair[1],
        )
        threshold = self.settings.embedding_threshold
        if similarity < threshold:
            return None
        return Twin(
            twin,
            f"near-duplicate of {twin}: its code embeds at cosine similarity {similarity:.4f} "
            f"(threshold {threshold:g}); propose a different idea",
        )

    async def _index_embeddings(self) -> None:
        rows = self.store.conn.execute(
            "SELECT seq, id, files FROM candidates WHERE seq > ? AND status != 'rejected' ORDER BY seq",
            (self._embedded_seq,),
        ).fetchall()
        if not rows:
            return
        # at once: the client keeps to the provider's limits; recorded codes cost nothing
        vectors = await asyncio.gather(
            *(self._embed(self._code(json.loads(f))) for _, _, f in rows)
        )
        self._embeddings.update((cid, v) for (_, cid, _), v in zip(rows, vectors, strict=True))
        self._embedded_seq = rows[-1][0]

    def _code(self, files: Files) -> str:
        shown = [f"{path}\n{text}" for path, text in sorted(files.items()) if self.editable(path)]
        return "\n\n".join(shown)[:EMBED_CHARS]

    async def _embed(self, text: str) -> Sequence[float]:
        assert self.client is not None and self.settings.embedding_model is not None
        return await self.client.embed(
            self.settings.embedding_model,
            text,
            api_base=self.settings.embedding_api_base,
            api_key_env=self.settings.embedding_api_key_env,
        )

    # --- behaviour --------------------------------------------------------------------------------

    def behavioural_twin(self, candidate_id: str, evaluation: Evaluation) -> Twin | None:
        """Another stored candidate whose evaluation has the same value and descriptors bit for bit
        (the candidate is scored, but kept out of the archive)."""
        if not self.settings.behaviour or not evaluation.ok:
            return None
        self._index_behaviours()
        twin = self._behaviours.get(self._fingerprint(evaluation.fitness, evaluation.descriptors))
        if twin is None or twin == candidate_id:
            return None
        return Twin(
            twin,
            f"behaviourally identical to {twin}: the same {self.objective} and descriptors "
            "bit for bit; not offered to the archive",
        )

    def _index_behaviours(self) -> None:
        rows = self.store.conn.execute(
            "SELECT id, candidate, fitness, descriptors FROM evaluations "
            "WHERE id > ? AND status = 'ok' AND stage = 'full' ORDER BY id",
            (self._seen_eval,),
        ).fetchall()
        for row_id, cid, fitness, descriptors in rows:
            self._behaviours.setdefault(self._fingerprint(fitness, json.loads(descriptors)), cid)
            self._seen_eval = row_id

    def _fingerprint(self, fitness: float | None, descriptors: Mapping[str, float]) -> str:
        values = [fitness, *(descriptors.get(name) for name in self.descriptors)]
        return json.dumps([float(v).hex() if v is not None else None for v in values])
