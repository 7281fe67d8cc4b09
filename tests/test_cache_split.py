"""OUTRE's automatic cache split (§4.4, Eq. 5): the prefix-sum argmax against a naive loop, the
profile's per-node savings against the simulator, and the chosen α against a brute-force α sweep."""
import math

import numpy as np
import pytest

from oocgnn.errors import UserError
from oocgnn.redundancy import Meetings, choose_history_split, history_reuse, importance, ranks, top_ids
from oocgnn.simulate import simulate, summarize


def _naive(saved_feat, saved_hist, budget, d_feat, d_embed, table_feat, table_hist, pairs):
    """Eq. 5 term by term: sort, sum the top k of each, subtract the pairs both structures hold."""
    f_order = sorted(range(len(saved_feat)), key=lambda v: (-saved_feat[v], v))
    h_order = sorted(range(len(saved_hist)), key=lambda v: (-saved_hist[v], v))
    best, curve = None, []
    for i in range(101):
        a = i / 100
        kf = min(len(f_order), max(0, math.floor((budget * (1 - a) - table_feat) / d_feat)))
        kh = min(len(h_order), max(0, math.floor((budget * a - table_hist) / d_embed)))
        cached, hist = set(f_order[:kf]), set(h_order[:kh])
        both = sum(w for u, v, w in pairs if u in hist and v in cached)
        value = sum(saved_feat[v] for v in cached) + sum(saved_hist[v] for v in hist) - both
        curve.append(value)
        if best is None or value > best[1] + 1e-9:
            best = (a, value)
    return best[0], curve


@pytest.mark.parametrize("seed", range(4))
def test_prefix_sum_argmax_equals_a_naive_loop(seed):
    rng = np.random.default_rng(seed)
    n = 60
    feat = rng.integers(0, 20, n).astype(float)
    hist = (rng.pareto(1.5, n) * 10).round()
    pairs = [(int(u), int(v), float(w)) for u, v, w in zip(rng.integers(0, n, 200), rng.integers(0, n, 200),
                                                           rng.choice([0.5, 1.0], 200))]
    budget, d_feat, d_embed, tf, th = 4000 + 500 * seed, 130, 90 + 20 * seed, 40 * seed, 120
    for overlap in (None, pairs):
        alpha, table = choose_history_split(feat, hist, budget, d_feat, d_embed, tf, th,
                                            overlap=None if overlap is None else tuple(map(np.array, zip(*pairs))))
        a, curve = _naive(feat, hist, budget, d_feat, d_embed, tf, th, overlap or [])
        assert alpha == a
        np.testing.assert_allclose(table["benefit"], curve)
        assert len(table) == 101 and table["alpha"].iloc[-1] == 1.0
        assert (np.diff(table["history_rows"]) >= 0).all() and (np.diff(table["feature_rows"]) <= 0).all()


def test_split_ranks_each_structure_by_its_own_score():
    """A cache ranked by another score (degree) holds its top k by that score, not by savings."""
    feat, score = np.array([1.0, 5, 3, 0]), np.array([4.0, 1, 2, 3])
    _, table = choose_history_split(feat, np.zeros(4), 20, 10, 10, feat_score=score)
    assert table["saved_feat"].iloc[0] == 1 + 0           # two rows, by score: ids 0 and 3
    with pytest.raises(UserError):
        choose_history_split(feat, feat, 20, 0, 10)


def test_history_reuse_follows_the_staleness_rule():
    """Meetings at batches 0, 2, 3 of 4 (and one as a seed), staleness 2, over 2 epochs: t = 0 push,
    2 stale push, 3 hit; 4 push, 6 push, 7 hit. A seed meeting pushes but never hits."""
    met = Meetings(node=np.array([5, 5, 5, 7, 7]), batch=np.array([0, 2, 3, 0, 1]),
                   seed=np.array([False, False, False, True, False]), saved=np.zeros(5, np.int64),
                   pair_meeting=np.empty(0, np.int64), pair_row=np.empty(0, np.int64), batches=4)
    np.testing.assert_allclose(history_reuse(met, 2, epochs=2), [0, 0, 1, 0, 1])
    np.testing.assert_allclose(history_reuse(met, 1, epochs=3), 0)        # staleness 1: never reused
    np.testing.assert_allclose(history_reuse(met, 100, epochs=2), [0.5, 1, 1, 0, 1])   # fresh from epoch 0 on


def test_charged_rows_are_what_ideal_histories_spare(fennel16):
    """`importance(rank=...)` charges each row to its last-ranked reacher, so the top-k histories
    spare exactly the rows charged to them: simulate's always-fresh `history=` count, for every k.
    Without a rank, the rows are OUTRE's first-discoverer forest: they sum to saved_gather."""
    store, fan = fennel16, [5, 5]
    prof, forest = importance(store, fan, schedule="random", seed=3, batch_size=64, meetings=True)
    np.testing.assert_array_equal(np.bincount(forest.node[forest.pair_meeting], minlength=store.num_nodes),
                                  prof["saved_gather"])
    score = prof["saved_gather"].to_numpy()
    _, met = importance(store, fan, schedule="random", seed=3, batch_size=64, meetings=True, rank=ranks(score))
    assert np.array_equal(np.bincount(met.pair_meeting, minlength=len(met.node)), met.saved)
    charged = np.bincount(met.node[met.pair_meeting], minlength=store.num_nodes)
    prefix = np.concatenate(([0], np.cumsum(charged[np.argsort(-score, kind="stable")])))
    for k in (0, 50, 400, 2000, store.num_nodes):
        s = summarize(simulate(store, "random", fan, seed=3, batch_size=64, history=top_ids(score, k),
                               progress=False))
        assert int(s["input_nodes"].sum() - s["input_nodes_hist"].sum()) == prefix[k]
