"""The embedded default operators, needing no LLM: numeric ``tweak`` and EVOLVE-BLOCK crossover.

``tweak`` perturbs a few named constants inside the EVOLVE-BLOCKs of a parent: the numbers
a top-level ``NAME = ...`` assigns (alone, negated, or in a list or tuple). Numbers inside
code (indices, ranges, axes, epsilons in a function) are structure and never change. Integers
stay integers (powers of two move to a neighbouring power of two), floats are scaled
log-uniformly, and the sign of a literal never flips. ``crossover`` takes each block from
one of two parents; where a block has the same shape in both (same code, different
numbers) it mixes the numbers literal by literal.
"""

from __future__ import annotations

import ast
import io
import math
import random
import tokenize
from dataclasses import dataclass

from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.edits import EditError, block_bodies, blocks, replace_blocks
from evolve.types import EdgeRole, Files, Proposal


@dataclass(frozen=True)
class Literal:
    """A numeric literal in a text: ``text[start:end]``."""

    start: int
    end: int
    text: str


def literals(code: str) -> list[Literal]:
    """Numeric literals (ints and floats, no complex) of a piece of Python code, in order."""
    return [lit for lit, _ in _located(code)]


def constants(code: str) -> list[Literal]:
    """The literals of named constants: numbers a top-level ``NAME = ...`` assigns (none if ``code`` does not parse)."""
    return [lit for group in constant_groups(code) for lit in group]


def constant_groups(code: str) -> list[list[Literal]]:
    """The named constants' literals as ``tweak`` changes them: one at a time, except the
    branches of ``a if cond else b`` (one value per scale of a benchmark), changed together."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    groups = []
    for statement in tree.body:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if all(isinstance(t, ast.Name) for t in targets):
                groups += _numbers(statement.value)
    at = {spot: lit for lit, spot in _located(code)}
    return [[at[spot] for spot in group] for group in groups if all(s in at for s in group)]


def _numbers(node: ast.expr) -> list[list[tuple[int, int]]]:
    """(line, byte column) of the numbers of a constant value (a number, negated, in a list or
    tuple, or the branches of a conditional), grouped as they change together."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    if isinstance(node, ast.List | ast.Tuple):
        return [group for item in node.elts for group in _numbers(item)]
    if isinstance(node, ast.IfExp):
        return [
            [spot for branch in (node.body, node.orelse) for g in _numbers(branch) for spot in g]
        ]
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return [[(node.lineno, node.col_offset)]]
    return []


def _located(code: str) -> list[tuple[Literal, tuple[int, int]]]:
    """Each numeric literal with its (line, byte column), the position ``ast`` gives it."""
    lines = io.StringIO(code).readlines()  # as the tokenizer counts them: split at "\n" only
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    found = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.NUMBER and not tok.string.lower().endswith("j"):
                row, col = tok.start
                start = offsets[row - 1] + col
                byte_col = len(lines[row - 1][:col].encode())
                found.append((Literal(start, start + len(tok.string), tok.string), (row, byte_col)))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return found


def _parse(text: str) -> int | float:
    clean = text.replace("_", "")
    try:
        return int(clean, 0)
    except ValueError:
        return float(clean)


def _is_power_of_two(value: int) -> bool:
    return value >= 2 and value & (value - 1) == 0


def perturb(text: str, rng: random.Random, *, scale: float = 0.5) -> str:
    """A new literal near ``text``: ints stay ints, powers of two stay powers of two."""
    value = _parse(text)
    if isinstance(value, int):
        if _is_power_of_two(value):
            return str(value * 2 if rng.random() < 0.5 else value // 2)
        if value == 0:
            return str(rng.choice([1, 2]))
        step = max(1, round(abs(value) * scale * rng.uniform(0.1, 1.0)))
        new = value + rng.choice([-step, step])
        return str(max(new, 1) if value > 0 else new)
    if value == 0.0:
        return repr(round(rng.uniform(0.0, 0.1), 4))
    return f"{value * math.exp(rng.uniform(-scale, scale)):.4g}"


def _ensure_float_syntax(new: str, old: str) -> str:
    """Keep a float a float: '3' from '%.4g' of 3.0 becomes '3.0'."""
    if isinstance(_parse(old), float) and isinstance(_parse(new), int):
        return new + ".0"
    return new


def _splice(code: str, replacements: dict[int, str], found: list[Literal]) -> str:
    pieces, cursor = [], 0
    for index, lit in enumerate(found):
        if index in replacements:
            pieces += [code[cursor : lit.start], replacements[index]]
            cursor = lit.end
    pieces.append(code[cursor:])
    return "".join(pieces)


def _editable_blocks(files: Files, request: OperatorRequest) -> list[tuple[str, int]]:
    """(path, block index) of every EVOLVE-BLOCK in the editable files."""
    spots = []
    for path, text in sorted(files.items()):
        if request.benchmark.is_editable(path):
            try:
                spots += [(path, index) for index in range(len(blocks(text)))]
            except EditError:
                continue
    return spots


class Tweak:
    """Perturb 1 to ``max_changes`` named constants inside EVOLVE-BLOCKs (see the module docstring)."""

    name = "tweak"
    arity = 1

    def __init__(self, *, max_changes: int = 3, scale: float = 0.5) -> None:
        self.max_changes = max_changes
        self.scale = scale

    async def propose(self, request: OperatorRequest) -> Proposal:
        parent = request.parents[0].candidate
        rng = request.rng
        sites = []  # (path, block index, indices of the literals changed together)
        bodies = {
            path: block_bodies(text)
            for path, text in parent.files.items()
            if request.benchmark.is_editable(path)
        }
        found: dict[tuple[str, int], list[Literal]] = {}  # each block's named constants
        for path, index in _editable_blocks(parent.files, request):
            found[path, index] = []
            for group in constant_groups(bodies[path][index]):
                first = len(found[path, index])
                found[path, index] += group
                if group:
                    sites.append((path, index, tuple(range(first, first + len(group)))))
        if not sites:
            raise OperatorRejected(
                "tweak: no numeric literal of a named constant (NAME = number) inside an "
                "EVOLVE-BLOCK of an editable file"
            )
        chosen = rng.sample(sites, min(len(sites), rng.randint(1, self.max_changes)))
        changes: dict[tuple[str, int], dict[int, str]] = {}
        notes = []
        for path, index, group in sorted(chosen):
            for k in group:
                old = found[path, index][k].text
                new = _ensure_float_syntax(perturb(old, rng, scale=self.scale), old)
                changes.setdefault((path, index), {})[k] = new
                notes.append(f"{old}->{new}")
        files = dict(parent.files)
        for (path, index), replacements in changes.items():
            bodies[path][index] = _splice(bodies[path][index], replacements, found[path, index])
        for path in {p for p, _ in changes}:
            files[path] = replace_blocks(parent.files[path], bodies[path])
        return Proposal(
            files=files,
            parents=((parent.id, EdgeRole.MUTATION),),
            operator=self.name,
            description="tweak " + ", ".join(notes),
        )


class BlockCrossover:
    """Child takes each EVOLVE-BLOCK from one of two parents, mixing numbers where shapes match."""

    name = "crossover"
    arity = 2

    attempts = 8  # mixes drawn before concluding the parents allow no new combination

    async def propose(self, request: OperatorRequest) -> Proposal:
        first, second = (p.candidate for p in request.parents[:2])
        if first.id == second.id:
            raise OperatorRejected("crossover: both parents are the same candidate")
        for _ in range(self.attempts):
            taken = {"first": 0, "second": 0}
            files = self._child(first.files, second.files, request, taken)
            if files not in (dict(first.files), dict(second.files)):
                return Proposal(
                    files=files,
                    parents=((first.id, EdgeRole.CROSSOVER), (second.id, EdgeRole.CROSSOVER)),
                    operator=self.name,
                    description=f"crossover of {first.id[:8]} and {second.id[:8]} "
                    f"({taken['first']}/{taken['second']} parts)",
                )
        raise OperatorRejected("crossover: the parents' EVOLVE-BLOCKs gave no new combination")

    def _child(
        self, first: Files, second: Files, request: OperatorRequest, taken: dict[str, int]
    ) -> dict[str, str]:
        files = dict(first)
        for path, text in sorted(first.items()):
            other = second.get(path)
            if other is None or not request.benchmark.is_editable(path):
                continue
            try:
                mine, theirs = block_bodies(text), block_bodies(other)
            except EditError:
                continue
            if len(mine) == len(theirs):
                bodies = [
                    self._mix(a, b, request.rng, taken) for a, b in zip(mine, theirs, strict=True)
                ]
                files[path] = replace_blocks(text, bodies)
        return files

    @staticmethod
    def _mix(a: str, b: str, rng: random.Random, taken: dict[str, int]) -> str:
        lits_a, lits_b = literals(a), literals(b)
        same_shape = len(lits_a) == len(lits_b) and _splice(
            a, {i: "0" for i in range(len(lits_a))}, lits_a
        ) == _splice(b, {i: "0" for i in range(len(lits_b))}, lits_b)
        if same_shape and lits_a:
            replacements = {}
            for index, (_, lb) in enumerate(zip(lits_a, lits_b, strict=True)):
                if rng.random() < 0.5:
                    replacements[index] = lb.text
                    taken["second"] += 1
                else:
                    taken["first"] += 1
            return _splice(a, replacements, lits_a)
        if rng.random() < 0.5:
            taken["second"] += 1
            return b
        taken["first"] += 1
        return a
