"""SEARCH/REPLACE parsing and applying: exact edits, formatting noise, and the reasons for failures."""

from __future__ import annotations

import pytest

from evolve.operators.edits import EditError, check_edit
from evolve.operators.search_replace import (
    apply_one,
    apply_search_replace,
    fenced_blocks,
    parse_search_replace,
    splice_rewrite,
)

PROGRAM = """import math

# EVOLVE-BLOCK-START
def radius(i):
    if i > 3:
        return 0.1
    return 0.05
# EVOLVE-BLOCK-END

def score():
    return sum(radius(i) for i in range(5))
"""


def block(search: str, replace: str, head: str = "") -> str:
    return f"{head}<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def everything(path: str) -> bool:
    return True


def test_exact_block_applies() -> None:
    answer = "Make far circles bigger.\n" + block("        return 0.1", "        return 0.2")
    result = apply_search_replace({"main.py": PROGRAM}, answer, everything)
    assert result.applied == 1 and not result.problems
    assert "return 0.2" in result.files["main.py"] and "return 0.1" not in result.files["main.py"]


def test_fences_crlf_and_trailing_spaces_are_tolerated() -> None:
    answer = (
        "```python\r\n<<<<<<< SEARCH\r\n    if i > 3:   \r\n        return 0.1\r\n=======\r\n"
        "    if i > 2:\r\n        return 0.1\r\n>>>>>>> REPLACE\r\n```\r\n"
    )
    result = apply_search_replace({"main.py": PROGRAM}, answer, everything)
    assert not result.problems
    assert "    if i > 2:\n        return 0.1\n" in result.files["main.py"]


def test_fences_inside_sections_are_dropped() -> None:
    answer = "<<<<<<< SEARCH\n```python\n    return 0.05\n```\n=======\n```python\n    return 0.06\n```\n>>>>>>> REPLACE"
    result = apply_search_replace({"main.py": PROGRAM}, answer, everything)
    assert not result.problems and "return 0.06" in result.files["main.py"]


def test_indentation_drift_reindents_the_replacement() -> None:
    answer = block("if i > 3:\n    return 0.1", "if i > 4:\n    return 0.3\nprint(i)")
    result = apply_search_replace({"main.py": PROGRAM}, answer, everything)
    assert not result.problems, result.problems
    assert "    if i > 4:\n        return 0.3\n    print(i)\n" in result.files["main.py"]


def test_over_indented_search_is_shifted_back() -> None:
    text = "def f():\n    return 1\n"
    assert (
        apply_one(text, "        return 1", "        return 2\n        # two")
        == "def f():\n    return 2\n    # two\n"
    )


def test_several_blocks_apply_in_order() -> None:
    answer = (
        block("        return 0.1", "        return 0.2")
        + "and\n"
        + block("    return 0.05", "    return 0.07")
    )
    result = apply_search_replace({"main.py": PROGRAM}, answer, everything)
    assert result.applied == 2 and not result.problems
    assert "0.2" in result.files["main.py"] and "0.07" in result.files["main.py"]


def test_crlf_file_keeps_crlf() -> None:
    text = PROGRAM.replace("\n", "\r\n")
    result = apply_search_replace(
        {"main.py": text}, block("    return 0.05", "    return 0.04"), everything
    )
    assert not result.problems and "    return 0.04\r\n" in result.files["main.py"]
    assert "\n" not in result.files["main.py"].replace("\r\n", "")


def test_missing_text_reports_the_closest_line() -> None:
    result = apply_search_replace(
        {"main.py": PROGRAM}, block("        return 0.15", "        return 0.2"), everything
    )
    assert result.applied == 0
    (problem,) = result.problems
    assert "block 1 (main.py)" in problem and "not found" in problem and "return 0.1" in problem


def test_ambiguous_search_is_refused() -> None:
    text = "x = 1\ny = 2\nx = 1\n"
    with pytest.raises(EditError, match="occurs 2 times"):
        apply_one(text, "x = 1", "x = 3")


def test_empty_search_is_refused() -> None:
    result = apply_search_replace({"main.py": PROGRAM}, block("", "print(1)"), everything)
    assert result.applied == 0 and "SEARCH section is empty" in result.problems[0]


def test_unterminated_blocks_are_reported() -> None:
    blocks, problems = parse_search_replace("<<<<<<< SEARCH\nx\n=======\ny\n")
    assert not blocks and "REPLACE" in problems[0]
    blocks, problems = parse_search_replace("<<<<<<< SEARCH\nx\n")
    assert not blocks and "divider" in problems[0]


def test_an_indented_heading_underline_in_the_code_is_not_the_divider() -> None:
    program = 'def solve(n):\n    """Solve it.\n\n    Notes\n    =======\n    greedy\n    """\n    return n * 2\n'
    answer = block('    Notes\n    =======\n    greedy\n    """\n    return n * 2', '    Notes\n    =======\n    greedy\n    """\n    return n * 3')
    result = apply_search_replace({"main.py": program}, answer, everything)
    assert result.applied == 1 and not result.problems
    assert result.files["main.py"] == program.replace("n * 2", "n * 3")


def test_several_unindented_dividers_are_refused_as_ambiguous() -> None:
    blocks, problems = parse_search_replace(block("x = 1\n=======\ny = 2", "x = 3"))
    assert not blocks and "several ======= lines" in problems[0]


def test_the_file_named_before_a_block_is_used() -> None:
    files = {"a.py": "v = 1\n", "b.py": "v = 1\n"}
    answer = "### File: `b.py`\n" + block("v = 1", "v = 2")
    result = apply_search_replace(files, answer, everything)
    assert not result.problems and result.files == {"a.py": "v = 1\n", "b.py": "v = 2\n"}


def test_unnamed_block_goes_to_the_one_file_that_holds_it() -> None:
    files = {"a.py": "v = 1\n", "b.py": "w = 1\n"}
    result = apply_search_replace(files, block("w = 1", "w = 5"), everything)
    assert not result.problems and result.files["b.py"] == "w = 5\n"
    ambiguous = apply_search_replace(
        {"a.py": "v = 1\n", "b.py": "v = 1\n"}, block("v = 1", "v = 2"), everything
    )
    assert "name the file" in ambiguous.problems[0]


def test_read_only_file_is_reported() -> None:
    files = {"main.py": "v = 1\n", "harness.py": "h = 1\n"}
    result = apply_search_replace(
        files, "harness.py\n" + block("h = 1", "h = 2"), lambda p: p == "main.py"
    )
    assert "read-only" in result.problems[0] and result.files["harness.py"] == "h = 1\n"


def test_an_edit_outside_the_blocks_is_caught_by_check_edit() -> None:
    result = apply_search_replace(
        {"main.py": PROGRAM}, block("import math", "import os"), everything
    )
    assert not result.problems
    with pytest.raises(EditError, match="outside the EVOLVE-BLOCKs"):
        check_edit({"main.py": PROGRAM}, result.files, everything)


def test_fenced_blocks_carry_the_file_name() -> None:
    answer = "Here:\n\nmain.py\n```python\nprint(1)\n```\n\n```python title=util.py\nx = 2\n```\n"
    assert fenced_blocks(answer) == [("main.py", "print(1)\n"), ("util.py", "x = 2\n")]


def test_splice_rewrite_keeps_the_immutable_text_verbatim() -> None:
    rewritten = PROGRAM.replace("return 0.05", "return 0.09").replace(
        "import math\n", "import math   \n\n"
    )
    spliced = splice_rewrite("main.py", PROGRAM, rewritten)
    assert spliced == PROGRAM.replace("return 0.05", "return 0.09")
    with pytest.raises(EditError, match="outside the EVOLVE-BLOCKs"):
        splice_rewrite("main.py", PROGRAM, PROGRAM.replace("range(5)", "range(6)"))
    with pytest.raises(EditError, match="markers"):
        splice_rewrite("main.py", PROGRAM, PROGRAM.replace("# EVOLVE-BLOCK-END\n", ""))


def test_the_closest_line_is_quoted_whole_so_it_can_be_copied() -> None:
    text = "def f():\n    x = [1,   2,    3]  # aligned\n    return x\n"
    result = apply_search_replace(
        {"main.py": text}, block("    x = [1,   2,    4]  # aligned", "    x = 0"), everything
    )
    (problem,) = result.problems
    assert "(closest, line 2: '    x = [1,   2,    3]  # aligned')" in problem
