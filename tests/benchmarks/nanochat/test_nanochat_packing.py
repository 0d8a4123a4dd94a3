"""BOS-aligned best-fit packing: the original's rule on hand-made documents."""

import numpy as np
import pytest
from evolve.benchmarks.nanochat.packing import pack_batches, pack_rows

BOS = 0


def doc(length: int, tag: int) -> np.ndarray:
    """A document of ``length`` tokens: BOS then ``tag`` repeated."""
    return np.array([BOS] + [tag] * (length - 1))


def test_largest_fitting_document_first_then_crop_the_shortest():
    docs = [doc(6, 1), doc(3, 2), doc(5, 3), doc(2, 4)]
    rows = list(pack_rows(iter(docs), row_len=8, buffer_size=10))
    # row 1: space 8 -> largest that fits is 6 (tag 1); space 2 -> doc of 2 (tag 4); full.
    assert rows[0].tolist() == [0, 1, 1, 1, 1, 1, 0, 4]
    # row 2: space 8 -> 5 (tag 3); space 3 -> 3 (tag 2); full.
    assert rows[1].tolist() == [0, 3, 3, 3, 3, 0, 2, 2]
    assert len(rows) == 2


def test_crop_when_nothing_fits_and_rows_start_with_bos():
    docs = [doc(10, 1), doc(12, 2), doc(4, 3)]
    rows = list(pack_rows(iter(docs), row_len=7, buffer_size=10))
    # row 1: 4 fits (tag 3), space 3 -> nothing fits -> crop the shortest (10, tag 1) to 3.
    assert rows[0].tolist() == [0, 3, 3, 3, 0, 1, 1]
    # row 2: only 12 left -> cropped to 7; its rest is dropped.
    assert rows[1].tolist() == [0, 2, 2, 2, 2, 2, 2]
    assert len(rows) == 2
    assert all(row[0] == BOS for row in rows)


def test_no_padding_and_every_token_comes_from_a_document():
    rng = np.random.default_rng(0)
    docs = [doc(int(n), i + 1) for i, n in enumerate(rng.integers(2, 40, size=300))]
    rows = list(pack_rows(iter(docs), row_len=33, buffer_size=50))
    assert rows and all(len(r) == 33 and r[0] == BOS for r in rows)
    tags = {int(t) for r in rows for t in r} - {BOS}
    assert tags <= set(range(1, 301))


def test_batches_have_seq_len_plus_one_columns():
    docs = [doc(5, i + 1) for i in range(100)]
    batch = next(pack_batches(iter(docs), batch_size=4, seq_len=9))
    assert batch.shape == (4, 10)


def test_row_len_must_hold_a_target():
    with pytest.raises(ValueError):
        list(pack_rows(iter([doc(3, 1)]), row_len=1))
