import pytest

from evolve.operators.edits import (
    EditError,
    block_bodies,
    blocks,
    check_edit,
    normalized_hash,
    replace_blocks,
)

TEXT = "head\n# EVOLVE-BLOCK-START\nbody1\n# EVOLVE-BLOCK-END\nmiddle\n// EVOLVE-BLOCK-START\nbody2\n// EVOLVE-BLOCK-END\ntail\n"


def test_blocks_are_found_in_any_comment_syntax():
    assert block_bodies(TEXT) == ["body1\n", "body2\n"]
    assert replace_blocks(TEXT, ["new1", "new2\n"]).count("new") == 2


@pytest.mark.parametrize(
    "broken",
    ["# EVOLVE-BLOCK-START\nx\n", "x\n# EVOLVE-BLOCK-END\n", "# EVOLVE-BLOCK-START\n# EVOLVE-BLOCK-START\n# EVOLVE-BLOCK-END\n"],
)
def test_unbalanced_markers_are_errors(broken):
    with pytest.raises(EditError):
        blocks(broken)


def test_check_edit_rules():
    editable = lambda path: path == "a.py"  # noqa: E731
    old = {"a.py": TEXT, "b.py": "fixed\n"}
    check_edit(old, {"a.py": TEXT.replace("body1", "other"), "b.py": "fixed\n"}, editable)
    for new, message in [
        ({"a.py": TEXT.replace("middle", "MIDDLE"), "b.py": "fixed\n"}, "outside the EVOLVE-BLOCKs"),
        ({"a.py": TEXT, "b.py": "changed\n"}, "read-only"),
        ({"a.py": TEXT}, "removes files"),
        ({"a.py": TEXT.replace("# EVOLVE-BLOCK-END\nmiddle", "middle"), "b.py": "fixed\n"}, "EVOLVE-BLOCK"),
    ]:
        with pytest.raises(EditError, match=message):
            check_edit(old, new, editable)


def test_file_without_blocks_is_editable_as_a_whole():
    check_edit({"a.py": "x = 1\n"}, {"a.py": "y = 2\n"}, lambda p: True)


@pytest.mark.parametrize(
    "marked",
    ["# EVOLVE-BLOCK-START\nx = 2\n", "# EVOLVE-BLOCK-START\nx = 2\n# EVOLVE-BLOCK-END\n"],
)
def test_a_file_without_blocks_may_not_gain_markers(marked):
    with pytest.raises(EditError, match="adds EVOLVE-BLOCK markers to a file that has none"):
        check_edit({"a.py": "x = 1\n"}, {"a.py": marked}, lambda p: True)


def test_normalized_hash_ignores_comments_and_blank_lines_but_not_indentation():
    a = {"m.py": "x = 1  # one\nif x:\n    y = 2\n"}
    assert normalized_hash(a) == normalized_hash({"m.py": "x = 1\n\n# note\nif x:\n    y = 2\n"})
    assert normalized_hash(a) != normalized_hash({"m.py": "x = 1\nif x:\n    pass\ny = 2\n"})
