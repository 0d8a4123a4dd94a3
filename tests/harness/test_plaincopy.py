"""Copies of a sandboxed program's files: plain files of their own only, never through a link."""

import os
from pathlib import Path

from evolve.harness.plaincopy import copy_folder, copy_plain


def test_a_plain_file_is_copied(tmp_path):
    (tmp_path / "a").write_bytes(b"weights")
    assert copy_plain(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == b"weights"


def test_a_symlink_or_a_hard_link_or_a_folder_is_not_copied(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.write_bytes(b"validation")
    (tmp_path / "sym").symlink_to(hidden)
    os.link(hidden, tmp_path / "hard")
    (tmp_path / "dir").mkdir()
    for name in ("sym", "hard", "dir", "missing"):
        assert not copy_plain(tmp_path / name, tmp_path / f"copy-{name}")
        assert not (tmp_path / f"copy-{name}").exists()


def test_the_file_checked_is_the_file_copied_whatever_the_name_points_to_later(tmp_path):
    # the descriptor is opened once: a swap of the name after the open changes nothing copied
    source = tmp_path / "model.pt"
    source.write_bytes(b"first")
    handle = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert copy_plain(Path("model.pt"), tmp_path / "copy", dir_fd=handle)
    finally:
        os.close(handle)
    source.unlink()
    source.symlink_to(tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"first"


def test_a_folder_is_copied_by_the_names_kept_and_refused_whole_for_one_link(tmp_path):
    folder = tmp_path / "initial"
    folder.mkdir()
    for name in ("model.py", "config.json", "model.pt", "notes.txt"):
        (folder / name).write_text(name)
    keep = lambda name: name != "notes.txt"  # noqa: E731
    assert copy_folder(folder, tmp_path / "out", keep) == ["config.json", "model.pt", "model.py"]
    assert not (tmp_path / "out" / "notes.txt").exists()
    (tmp_path / "link").symlink_to(folder)
    assert copy_folder(tmp_path / "link", tmp_path / "out2", keep) is None
    (folder / "other.py").symlink_to(folder / "model.py")
    assert copy_folder(folder, tmp_path / "out3", keep) is None
