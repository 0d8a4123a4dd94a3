"""as_found: a folder left exactly as it was, whatever a run in it added, changed, linked or removed."""

from __future__ import annotations

import os
from pathlib import Path

from evolve.harness.as_found import as_found


def test_what_a_run_adds_changes_or_removes_is_put_back(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("original")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "kept.txt").write_text("kept")
    (tmp_path / "empty").mkdir()
    with as_found(tmp_path):
        (tmp_path / "train.py").write_text("changed")
        (tmp_path / "weights.pt").write_bytes(b"trained")
        (tmp_path / ".sandbox" / "home").mkdir(parents=True)
        (tmp_path / ".sandbox" / "home" / "weights.pt").write_bytes(b"trained")
        (tmp_path / "sub" / "kept.txt").unlink()
        (tmp_path / "empty").rmdir()
        os.symlink("/etc", tmp_path / "link")
    found = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert found == ["empty", "sub", "sub/kept.txt", "train.py"]
    assert (tmp_path / "train.py").read_text() == "original"
    assert (tmp_path / "sub" / "kept.txt").read_text() == "kept"
