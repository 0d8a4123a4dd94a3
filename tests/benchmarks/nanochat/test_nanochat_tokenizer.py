"""Tokenizer: the original's vocabulary rules, round trip, and the token-bytes table."""

import numpy as np
from evolve.benchmarks.nanochat import tokenizer
from tokenizers import Regex, pre_tokenizers

TEXTS = [
    "The quick brown fox jumps over the lazy dog 12345 times.\n",
    "def f(x):\n    return x ** 2  # naïve café, 東京, emoji 🙂\n",
    "Numbers: 2026-11-29, 3.14159, 1000000.\n",
] * 20


def test_round_trip_specials_and_bytes(tmp_path):
    tok = tokenizer.train_tokenizer(TEXTS, vocab_size=300)
    assert tok.get_vocab_size() == 300
    assert tokenizer.bos_id(tok) == tok.token_to_id("<|reserved_0|>")
    assert all(tok.token_to_id(s) is not None for s in tokenizer.SPECIAL_TOKENS)
    sample = "Unseen text: Zürich 987654 ✓ 🙂\n\tx = {'a': [1, 2]}"
    ids = tok.encode(sample, add_special_tokens=False).ids
    assert tok.decode(ids) == sample
    table = tokenizer.token_bytes(tok)
    assert int(table[ids].sum()) == len(sample.encode("utf-8"))
    assert all(table[tok.token_to_id(s)] == 0 for s in tokenizer.SPECIAL_TOKENS)
    docs = tokenizer.encode_documents(tok, [sample, "b"])
    assert docs[0][0] == tokenizer.bos_id(tok) and docs[0][1:] == ids
    tokenizer.save(tok, tmp_path)
    again = tokenizer.load(tmp_path)
    assert again.encode(sample, add_special_tokens=False).ids == ids
    assert np.array_equal(tokenizer.load_token_bytes(tmp_path), table)


def test_split_pattern_groups_digits_by_two():
    split = pre_tokenizers.Split(Regex(tokenizer.SPLIT_PATTERN), behavior="isolated")
    pieces = [p for p, _ in split.pre_tokenize_str("abc 12345 it's")]
    assert pieces == ["abc", " ", "12", "34", "5", " it", "'s"]
