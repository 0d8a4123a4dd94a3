"""Offline GPT-2 tokenization, the trained-BPE fallback and text-to-shard preparation."""

from __future__ import annotations

import json
import lzma

import pytest
from evolve.benchmarks.speedrun.data import DataSpec
from evolve.benchmarks.speedrun.gpt2_tokenizer import (
    EOT,
    eot_id,
    gpt2_tokenizer,
    load_gpt2_ranks,
    train_bpe,
)
from evolve.benchmarks.speedrun.prepare_text import prepare, stdlib_documents
from evolve.benchmarks.speedrun.shards import read_shard

SAMPLE = (
    "Hello world! It's 2015:  spaces   and\ttabs, ünïcödé — and numbers 12345.\n\nNew paragraph."
)


@pytest.fixture(scope="module")
def gpt2():
    try:
        return gpt2_tokenizer()
    except FileNotFoundError as exc:
        pytest.skip(f"no GPT-2 ranks on this machine: {exc}")


def test_gpt2_ids_match_known_values(gpt2):
    assert gpt2.encode("Hello world", add_special_tokens=False).ids == [15496, 995]
    assert eot_id(gpt2) == EOT
    assert gpt2.decode(gpt2.encode(SAMPLE).ids) == SAMPLE


def test_gpt2_ids_match_tiktoken_on_real_text(gpt2):
    tiktoken = pytest.importorskip("tiktoken")
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    reference = tiktoken.Encoding(
        "gpt2-offline",
        pat_str=pattern,
        mergeable_ranks=load_gpt2_ranks(),
        special_tokens={"<|endoftext|>": EOT},
    )
    texts = [SAMPLE, *stdlib_documents(every=40, limit_bytes=200_000)]
    for text in texts:
        assert gpt2.encode(text, add_special_tokens=False).ids == reference.encode_ordinary(text)


def test_trained_bpe_puts_eot_last_and_round_trips():
    tokenizer = train_bpe(
        [SAMPLE] * 50 + list(stdlib_documents(every=50, limit_bytes=100_000)), vocab_size=400
    )
    assert eot_id(tokenizer) == 399
    assert tokenizer.decode(tokenizer.encode(SAMPLE).ids) == SAMPLE
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe([SAMPLE], vocab_size=60000)


def test_prepare_writes_shards_whose_documents_start_with_eot(tmp_path, gpt2):
    with lzma.open(tmp_path / "train.jsonl.xz", "wt") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"Article {i}. " + SAMPLE}) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps({"text": SAMPLE}) + "\n")
    out = tmp_path / "shards"
    summary = prepare(
        train=[tmp_path / "train.jsonl.xz"],
        val=[tmp_path / "val.jsonl"],
        out=out,
        prefix="wiki",
        tokens_per_shard=300,
    )
    assert summary["tokenizer"] == "gpt2" and summary["eot"] == EOT
    val = read_shard(out / "wiki_val_000000.bin")
    assert val[0] == EOT and val[1:].tolist() == gpt2.encode(SAMPLE, add_special_tokens=False).ids
    train_paths = sorted(out.glob("wiki_train_*.bin"))
    assert (
        train_paths[0].name == "wiki_train_000001.bin"
        and len(train_paths) == summary["train"]["tokens"] // 300 + 1
    )
    train = [t for p in train_paths for t in read_shard(p).tolist()]
    assert train.count(EOT) == 30 and train[0] == EOT
    assert json.loads((out / "prepared.json").read_text())["train"]["documents"] == 30
    # the candidate may read neither the shards nor the text they were made from
    hidden = DataSpec(data_dir=str(out), train_glob="wiki_train_*.bin").hidden()
    assert set(hidden) == {
        out.resolve(),
        (tmp_path / "train.jsonl.xz").resolve(),
        (tmp_path / "val.jsonl").resolve(),
    }
