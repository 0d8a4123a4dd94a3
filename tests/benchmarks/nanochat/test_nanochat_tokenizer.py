"""Tokenizer: the original's vocabulary rules (nanochat's prepare) through the harness's BPE trainer, round trip, token bytes."""

import numpy as np
from evolve.benchmarks.nanochat import prepare
from tokenizers import Regex, pre_tokenizers

from evolve.harness import tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog 12345 times.\n",
    "def f(x):\n    return x ** 2  # naïve café, 東京, emoji 🙂\n",
    "Numbers: 2026-11-29, 3.14159, 1000000.\n",
] * 20


def test_round_trip_specials_and_bytes(tmp_path):
    tok = prepare.train_tokenizer(TEXTS, vocab_size=300)
    assert tok.get_vocab_size() == 300
    assert tokenizer.token_id(tok, prepare.BOS_TOKEN) == tok.token_to_id("<|reserved_0|>")
    assert all(tok.token_to_id(s) is not None for s in prepare.SPECIAL_TOKENS)
    sample = "Unseen text: Zürich 987654 ✓ 🙂\n\tx = {'a': [1, 2]}"
    ids = tok.encode(sample, add_special_tokens=False).ids
    assert tok.decode(ids) == sample
    table = tokenizer.token_bytes(tok, prepare.SPECIAL_TOKENS)
    assert int(table[ids].sum()) == len(sample.encode("utf-8"))
    assert all(table[tok.token_to_id(s)] == 0 for s in prepare.SPECIAL_TOKENS)
    docs = list(
        tokenizer.encode_documents(tok, [sample, "b"], tokenizer.token_id(tok, prepare.BOS_TOKEN))
    )
    assert docs[0][0] == tokenizer.token_id(tok, prepare.BOS_TOKEN) and docs[0][1:] == ids
    tokenizer.save(tok, tmp_path, prepare.SPECIAL_TOKENS)
    again = tokenizer.load(tmp_path)
    assert again.encode(sample, add_special_tokens=False).ids == ids
    assert np.array_equal(tokenizer.load_token_bytes(tmp_path), table)


def test_split_pattern_groups_digits_by_two():
    split = pre_tokenizers.Split(Regex(prepare.SPLIT_PATTERN), behavior="isolated")
    pieces = [p for p, _ in split.pre_tokenize_str("abc 12345 it's")]
    assert pieces == ["abc", " ", "12", "34", "5", " it", "'s"]


def test_specials_last_take_the_highest_ids():
    tok = tokenizer.train_bpe(TEXTS, 300, specials=("<|endoftext|>",), specials_last=True)
    assert tok.get_vocab_size() == 300
    assert tokenizer.token_id(tok, "<|endoftext|>") == 299
