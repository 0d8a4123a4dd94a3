"""Document readers: every supported file type, folders searched, unsupported files refused."""

import gzip
import json
import lzma

import pytest

from evolve.harness import documents


def test_every_supported_type_is_read_in_order(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    lines = "".join(json.dumps({"text": t}) + "\n" for t in ("a", "b"))
    (folder / "1.jsonl").write_text(lines)
    (folder / "2.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    (folder / "3.jsonl.xz").write_bytes(lzma.compress(lines.encode()))
    (folder / "4.txt").write_text("whole file")
    (folder / "5.txt.gz").write_bytes(gzip.compress(b"zipped file"))
    (folder / "ignored.csv").write_text("x")
    texts = list(documents.iter_texts([folder]))
    assert texts == ["a", "b"] * 3 + ["whole file", "zipped file"]
    assert list(documents.iter_texts([folder], max_chars=3)) == ["a", "b", "a"]


def test_a_record_without_text_and_an_unknown_file_name_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: JSON record has no 'text'"):
        list(documents.read_texts(bad))
    with pytest.raises(FileNotFoundError, match="not a file of a supported type"):
        documents.expand([tmp_path / "missing.csv"])
