"""Shard format: round trip, header validation with clear errors, the shard writer."""

from __future__ import annotations

import numpy as np
import pytest
from evolve.benchmarks.speedrun.shards import (
    EOT,
    HEADER_BYTES,
    MAGIC,
    ShardError,
    ShardWriter,
    encode_header,
    read_header,
    read_shard,
    write_shard,
)


def test_round_trip_keeps_every_token_and_the_header_layout(tmp_path):
    tokens = np.array([EOT, 0, 1, 65535, 50255, EOT, 7], dtype=np.int64)
    path = tmp_path / "a.bin"
    assert write_shard(path, tokens) == tokens.size
    raw = path.read_bytes()
    header = np.frombuffer(raw[:HEADER_BYTES], dtype="<i4")
    assert (header[0], header[1], header[2]) == (MAGIC, 1, tokens.size)
    assert not header[3:].any()
    assert len(raw) == HEADER_BYTES + 2 * tokens.size
    assert (
        np.frombuffer(raw[HEADER_BYTES:], dtype="<u2").tolist() == tokens.tolist()
    )  # little-endian uint16
    assert read_shard(path).tolist() == tokens.tolist()
    assert read_shard(path, mmap=False).tolist() == tokens.tolist()


def test_empty_shard_round_trips(tmp_path):
    write_shard(tmp_path / "e.bin", [])
    assert read_shard(tmp_path / "e.bin").size == 0


def test_wrong_magic_is_named(tmp_path):
    path = tmp_path / "bad.bin"
    header = np.frombuffer(encode_header(3), dtype="<i4").copy()
    header[0] = 12345
    path.write_bytes(header.tobytes() + b"\0" * 6)
    with pytest.raises(ShardError, match=r"magic number 12345, expected 20240520"):
        read_shard(path)


def test_wrong_version_is_named(tmp_path):
    path = tmp_path / "v.bin"
    header = np.frombuffer(encode_header(0), dtype="<i4").copy()
    header[1] = 7
    path.write_bytes(header.tobytes())
    with pytest.raises(ShardError, match="version 7"):
        read_header(path)


def test_truncated_body_says_truncated_and_how_to_fix(tmp_path):
    path = tmp_path / "t.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(
        ShardError, match=r"announces 100 tokens .* truncated \(download or write it again\)"
    ):
        read_shard(path)


def test_truncated_header_says_truncated(tmp_path):
    path = tmp_path / "h.bin"
    path.write_bytes(encode_header(5)[:100])
    with pytest.raises(ShardError, match="shorter than the 1024-byte shard header"):
        read_header(path)


def test_extra_bytes_are_refused(tmp_path):
    path = tmp_path / "x.bin"
    write_shard(path, [1, 2])
    path.write_bytes(path.read_bytes() + b"\0\0")
    with pytest.raises(ShardError, match="longer than its header says"):
        read_header(path)


def test_tokens_that_do_not_fit_uint16_are_refused(tmp_path):
    with pytest.raises(ShardError, match="fit uint16"):
        write_shard(tmp_path / "big.bin", [1, 70000])


def test_writer_spills_documents_across_numbered_shards(tmp_path):
    writer = ShardWriter(tmp_path, prefix="demo", split="train", first_index=1, tokens_per_shard=5)
    docs = [[EOT, 1, 2], [EOT, 3, 4, 5, 6], [EOT]]
    for doc in docs:
        writer.add(doc)
    paths = writer.close()
    assert [p.name for p in paths] == ["demo_train_000001.bin", "demo_train_000002.bin"]
    assert np.concatenate([read_shard(p) for p in paths]).tolist() == sum(docs, [])
    assert writer.total == 9
