"""Offline GPT-2 tokenization, a trained BPE asked for by name (never a fallback), text-to-shard preparation."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
from evolve.benchmarks.speedrun import prepare_text
from evolve.benchmarks.speedrun.data import DataSpec, TokenizerMismatch
from evolve.benchmarks.speedrun.gpt2_tokenizer import (
    EOT,
    GPT2RanksMissing,
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


def no_gpt2_ranks(monkeypatch, tmp_path):
    """A machine without GPT-2's ranks: an empty tiktoken cache and no litellm to find."""
    import importlib.util

    from evolve.benchmarks.speedrun import gpt2_tokenizer

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        gpt2_tokenizer.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "litellm" else real(name, *a),
    )


def test_without_gpt2_ranks_preparing_gpt2_tokens_is_an_error_not_another_tokenizer(
    tmp_path, monkeypatch, capsys
):
    no_gpt2_ranks(monkeypatch, tmp_path)
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": SAMPLE}) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps({"text": SAMPLE}) + "\n")
    out = tmp_path / "shards"
    with pytest.raises(GPT2RanksMissing, match="TIKTOKEN_CACHE_DIR"):
        prepare(train=[tmp_path / "train.jsonl"], val=[tmp_path / "val.jsonl"], out=out, prefix="w")
    assert not out.exists()  # nothing half-made that a later run could take for GPT-2 shards
    argv = ["--train", str(tmp_path / "train.jsonl"), "--val", str(tmp_path / "val.jsonl")]
    assert prepare_text.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no tiktoken ranks file")
    assert str(tmp_path / "empty-cache") in err[0]
    # another tokenizer only when asked for by name, and recorded
    summary = prepare(
        train=[tmp_path / "train.jsonl"], val=[tmp_path / "val.jsonl"], out=out, prefix="w",
        tokenizer_kind="bpe", bpe_vocab=300,
    )  # fmt: skip
    assert summary["tokenizer"] == "bpe"


def test_shards_of_another_tokenizer_than_the_targets_are_refused_in_one_line(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": SAMPLE * 20}) + "\n")
    (tmp_path / "val.jsonl").write_text(json.dumps({"text": SAMPLE}) + "\n")
    out = tmp_path / "shards"
    prepare(
        train=[tmp_path / "train.jsonl"], val=[tmp_path / "val.jsonl"], out=out, prefix="w",
        tokenizer_kind="bpe", bpe_vocab=300,
    )  # fmt: skip
    assert DataSpec(data_dir=str(out), tokenizer="bpe").folder() == out.resolve()
    assert DataSpec(data_dir=str(out)).folder() == out.resolve()  # not checked when not set
    with pytest.raises(TokenizerMismatch, match="tokenized with 'bpe'.*'gpt2' tokens") as caught:
        DataSpec(data_dir=str(out), tokenizer="gpt2").train_files()
    assert "\n" not in str(caught.value) and "--tokenizer gpt2" in str(caught.value)


def test_every_speedrun_config_names_the_tokenizer_its_target_was_set_on():
    from omegaconf import OmegaConf

    configs = Path(__file__).resolve().parents[3] / "configs" / "benchmark"
    kinds = {
        p.stem: OmegaConf.load(p).fitness.get("tokenizer") for p in configs.glob("speedrun*.yaml")
    }
    assert kinds == {"speedrun": "gpt2", "speedrun_1gpu": "gpt2", "speedrun_cpu": "bpe"}
