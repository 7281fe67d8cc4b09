"""Negative sampling: MariusGNN's chunk-shared training negatives and fixed per-edge evaluation negatives."""
import numpy as np
import pytest

from oocgnn.negatives import batch_negatives, eval_targets


def positives(b=50, n=1000, seed=0):
    return np.random.default_rng(seed).integers(0, n, (b, 2))


def test_batch_negatives_shapes_sources_and_seeding():
    pos = positives()
    neg, filt = batch_negatives(pos, 1000, num_negatives=40, chunks=4, degree_fraction=0.25, seed=3, epoch=1, batch=7)
    assert neg.shape == (4, 40) and neg.dtype == np.int64 and filt.shape[1] == 2
    assert set(neg[:, :10].ravel()) <= set(pos[:, 1])                  # degree share: the batch's destinations
    assert ((0 <= neg) & (neg < 1000)).all()
    again, f2 = batch_negatives(pos, 1000, num_negatives=40, chunks=4, degree_fraction=0.25, seed=3, epoch=1, batch=7)
    assert np.array_equal(neg, again) and np.array_equal(filt, f2)
    other, _ = batch_negatives(pos, 1000, num_negatives=40, chunks=4, degree_fraction=0.25, seed=3, epoch=1, batch=8)
    assert not np.array_equal(neg, other)
    cands = np.array([5, 17, 900])
    uni, none = batch_negatives(pos, cands, num_negatives=30, chunks=2, seed=1)
    assert set(uni.ravel()) <= set(cands) and none.shape == (0, 2)


def test_the_filter_lists_each_positive_scored_against_its_own_destination():
    """(positive, column) pairs where the column's degree-drawn negative came from that very positive of the
    chunk: brute force over the draws (repeating the generator's draws)."""
    pos = positives(b=10, n=50, seed=2)
    neg, filt = batch_negatives(pos, 50, num_negatives=8, chunks=3, degree_fraction=1.0, seed=4)
    edge = np.random.default_rng([4, 0, 0]).integers(0, 10, size=(3, 8))
    assert np.array_equal(neg, pos[edge, 1])
    size = 4                                                            # ceil(10 / 3)
    want = sorted((int(edge[c, j]), j) for c in range(3) for j in range(8) if edge[c, j] // size == c)
    assert sorted(map(tuple, filt.tolist())) == want and want
    for e, j in want:
        assert neg[e // size, j] == pos[e, 1]


@pytest.mark.parametrize("kw", [{"chunks": 60}, {"num_negatives": 0}, {"degree_fraction": 1.5}])
def test_batch_negatives_refuse_bad_settings(kw):
    with pytest.raises(ValueError):
        batch_negatives(positives(), 1000, **{"num_negatives": 10, **kw})


def test_eval_targets_are_a_function_of_the_edge_position():
    whole = eval_targets(0, 100, 37, 20, seed=5)
    parts = np.concatenate([eval_targets(lo, 30 if lo < 90 else 10, 37, 20, seed=5) for lo in (0, 30, 60, 90)])
    assert np.array_equal(whole, parts) and whole.dtype == np.int64 and whole.shape == (100, 20)
    assert ((0 <= whole) & (whole < 37)).all() and len(np.unique(whole)) == 37
    assert not np.array_equal(whole, eval_targets(0, 100, 37, 20, seed=6))
    counts = np.bincount(whole.ravel(), minlength=37)
    assert counts.min() > 0.5 * counts.mean()                           # roughly uniform
