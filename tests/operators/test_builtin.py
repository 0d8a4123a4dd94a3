import asyncio
import random
from pathlib import Path

import pytest

from evolve.harness.fitness import Benchmark
from evolve.operators.base import OperatorRejected, OperatorRequest
from evolve.operators.builtin import BlockCrossover, Tweak, constants, literals, perturb
from evolve.operators.edits import block_bodies, check_edit
from evolve.types import Candidate, EdgeRole, Parent
from tests.fixtures.toy import Toy

CODE = """import math

SCALE = 3.0  # outside: must never change
# EVOLVE-BLOCK-START
WIDTH = 64
DEPTH = 5
LR = 0.003
DECAY = -0.5
NAME = "x1"
# EVOLVE-BLOCK-END
"""


def benchmark(editable=("m.py",)):
    return Benchmark(name="t", fitness=Toy(), seed_dir=Path("."), editable=editable)


def request(*codes, editable=("m.py",), seed=0):
    parents = [
        Parent(candidate=Candidate(id=f"p{i}", seq=i, files={"m.py": c}, operator="seed"))
        for i, c in enumerate(codes)
    ]
    return OperatorRequest(parents=parents, benchmark=benchmark(editable), rng=random.Random(seed))


def test_literals_skip_strings_and_find_floats_and_ints():
    assert [lit.text for lit in literals('A = 1\nB = 2.5e-3\nC = "7"\n')] == ["1", "2.5e-3"]


@pytest.mark.parametrize(
    "body",
    [
        "# tunables \x0c page break\nWIDTH = 100\nHEIGHT = 250\n",
        "A = 1\u2028B = 2\nC = 3\n",
        "X = 1\r\nY = 22\r\n",
    ],
    ids=["form-feed", "line-separator", "crlf"],
)
def test_literal_offsets_hold_past_characters_that_split_lines_for_python_but_not_the_tokenizer(
    body,
):
    found = literals(body)
    assert found and all(body[lit.start : lit.end] == lit.text for lit in found)


def test_perturb_keeps_types_and_powers_of_two():
    rng = random.Random(1)
    for _ in range(200):
        assert int(perturb("64", rng)) in (32, 128)
        new_int = perturb("5", rng)
        assert "." not in new_int and int(new_int) >= 1
        assert float(perturb("0.003", rng)) > 0


def test_tweak_changes_only_numbers_inside_blocks():
    seen = set()
    for seed in range(30):
        proposal = asyncio.run(Tweak().propose(request(CODE, seed=seed)))
        new = proposal.files["m.py"]
        check_edit({"m.py": CODE}, proposal.files, lambda p: p == "m.py")
        assert "SCALE = 3.0" in new and 'NAME = "x1"' in new and "DECAY = -" in new
        assert proposal.parents == (("p0", EdgeRole.MUTATION),) and proposal.operator == "tweak"
        seen.add(new)
    assert len(seen) > 20


STRUCTURE = """# EVOLVE-BLOCK-START
ROWS = [5, 6]  # circles per row
SHIFT: float = -0.25
pair = (2, 3.5)
x.attr = 7


def spread(x):
    for axis in range(2):
        x[:, axis] *= 0.9 ** 3
    return x[0] + 1e-9
# EVOLVE-BLOCK-END
"""


def test_constants_are_the_numbers_named_at_top_level_and_nothing_in_code():
    body = block_bodies(STRUCTURE)[0]
    assert [lit.text for lit in constants(body)] == ["5", "6", "0.25", "2", "3.5"]
    assert len(literals(body)) == 11
    assert constants("def f(:\n    return 1\n") == []  # does not parse: nothing to tweak


def test_tweak_leaves_indices_ranges_and_numbers_inside_functions_alone():
    code_part = STRUCTURE[STRUCTURE.index("x.attr") :]
    for seed in range(40):
        new = asyncio.run(Tweak(max_changes=5).propose(request(STRUCTURE, seed=seed))).files["m.py"]
        assert new[new.index("x.attr") :] == code_part


SCALED = """GPU = True
# EVOLVE-BLOCK-START
N_LAYER = 8 if GPU else 2
LR = 0.001
# EVOLVE-BLOCK-END
"""


def test_tweak_changes_both_scales_of_a_conditional_constant_together():
    """``8 if GPU else 2`` holds one value per scale: a tweak of it changes the one in use too."""
    assert [lit.text for lit in constants(block_bodies(SCALED)[0])] == ["8", "2", "0.001"]
    for seed in range(20):
        proposal = asyncio.run(Tweak(max_changes=1).propose(request(SCALED, seed=seed)))
        line = proposal.files["m.py"].splitlines()[2]
        if line != "N_LAYER = 8 if GPU else 2":
            gpu, cpu = line.removeprefix("N_LAYER = ").split(" if GPU else ")
            assert gpu != "8" and cpu != "2", line


def test_tweak_rejects_a_file_with_nothing_to_tweak():
    with pytest.raises(OperatorRejected, match="no numeric literal"):
        asyncio.run(Tweak().propose(request("x = 1\n")))
    with pytest.raises(OperatorRejected):
        asyncio.run(Tweak().propose(request(CODE, editable=("other.py",))))


def test_crossover_mixes_numbers_of_same_shaped_blocks():
    other = (
        CODE.replace("WIDTH = 64", "WIDTH = 256")
        .replace("DEPTH = 5", "DEPTH = 9")
        .replace("LR = 0.003", "LR = 0.01")
    )
    children = set()
    for seed in range(20):
        proposal = asyncio.run(BlockCrossover().propose(request(CODE, other, seed=seed)))
        assert proposal.parents == (("p0", EdgeRole.CROSSOVER), ("p1", EdgeRole.CROSSOVER))
        body = block_bodies(proposal.files["m.py"])[0]
        assert ("WIDTH = 64" in body) != ("WIDTH = 256" in body)
        children.add(proposal.files["m.py"])
    assert len(children) >= 3


def test_crossover_of_identical_blocks_is_rejected():
    with pytest.raises(OperatorRejected):
        asyncio.run(
            BlockCrossover().propose(request(CODE, CODE.replace("SCALE = 3.0", "SCALE = 3.0")))
        )
