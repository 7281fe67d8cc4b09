"""`ranking`: the selection equals a stable descending argsort's first k (the oracle it replaced)."""
import numpy as np
import pytest

from oocgnn.ranking import top_ids, top_ordered


def _oracle(score, k):
    return np.argsort(-np.asarray(score, np.float64), kind="stable")[:k]


@pytest.mark.parametrize("dtype", [np.int64, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("seed", range(4))
def test_top_k_equals_a_stable_descending_argsort(dtype, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    score = rng.integers(0, 6, n).astype(dtype)          # many ties
    for k in (0, 1, n // 3, n - 1, n, n + 5):
        want = _oracle(score, k)
        assert np.array_equal(top_ordered(score, k), want), k
        got = top_ids(score, k)
        assert got.dtype == np.int64 and np.array_equal(got, np.sort(want)), k


def test_top_k_of_distinct_floats():
    score = np.random.default_rng(9).random(10_000)
    assert np.array_equal(top_ids(score, 777), np.sort(_oracle(score, 777)))
