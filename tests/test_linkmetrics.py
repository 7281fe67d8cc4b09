"""MRR and Hits@K against brute force and OGB's own formulas, on scores with many ties, streamed in chunks."""
import numpy as np
import pytest
import torch

from oocgnn.linkmetrics import RankMetrics, SharedHits


def tied_scores(seed, shape, levels=6):
    """Integer-valued scores: ties everywhere."""
    return np.random.default_rng(seed).integers(0, levels, shape).astype(np.float32)


def brute_rank(pos, negs):
    """A positive tied with t negatives may sit anywhere among them: the mean of its best and worst places."""
    best = 1 + sum(1 for x in negs if x > pos)
    worst = 1 + sum(1 for x in negs if x >= pos)
    return (best + worst) / 2


def ogb_mrr(y_pred_pos, y_pred_neg):
    """ogb/linkproppred/evaluate.py, Evaluator._eval_mrr (torch branch), as OGB computes it."""
    y_pred_pos = y_pred_pos.view(-1, 1)
    optimistic_rank = (y_pred_neg > y_pred_pos).sum(dim=1)
    pessimistic_rank = (y_pred_neg >= y_pred_pos).sum(dim=1)
    ranking_list = 0.5 * (optimistic_rank + pessimistic_rank) + 1
    return {"mrr": (1. / ranking_list.to(torch.float)).mean().item(),
            **{f"hits@{k}": (ranking_list <= k).to(torch.float).mean().item() for k in (1, 3, 10)}}


def ogb_hits(y_pred_pos, y_pred_neg, k):
    """ogb/linkproppred/evaluate.py, Evaluator._eval_hits (torch branch)."""
    if len(y_pred_neg) < k:
        return 1.
    kth_score_in_negative_edges = torch.topk(y_pred_neg, k)[0][-1]
    return float(torch.sum(y_pred_pos > kth_score_in_negative_edges).cpu()) / len(y_pred_pos)


def test_rank_metrics_equal_brute_force_and_ogb_when_streamed_in_chunks():
    pos, neg = tied_scores(0, 257), tied_scores(1, (257, 40))
    whole, chunked = RankMetrics(), RankMetrics(ks=(10, 3, 1, 3))
    whole.add(pos, neg)
    for lo in range(0, 257, 50):
        chunked.add(torch.from_numpy(pos[lo:lo + 50]), torch.from_numpy(neg[lo:lo + 50]))
    ranks = [brute_rank(p, n) for p, n in zip(pos.tolist(), neg.tolist())]
    want = {"mrr": np.mean([1 / r for r in ranks]), **{f"hits@{k}": np.mean([r <= k for r in ranks]) for k in (1, 3, 10)}}
    ogb = ogb_mrr(torch.from_numpy(pos), torch.from_numpy(neg))
    assert any(r != int(r) for r in ranks)                        # ties were split in half
    for got in (whole.result(), chunked.result()):
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], abs=1e-12) and got[k] == pytest.approx(ogb[k], abs=1e-6), k


def test_rank_metrics_with_negatives_shared_by_a_chunk():
    pos, shared = tied_scores(2, 30), tied_scores(3, 25)
    a, b = RankMetrics(), RankMetrics()
    a.add(pos, shared)
    b.add(pos, np.broadcast_to(shared, (30, 25)))
    assert a.result() == b.result()


def test_rank_metrics_by_hand():
    m = RankMetrics(ks=(1, 2))
    m.add([3.0, 1.0, 2.0], [[1, 2, 3], [1, 1, 1], [5, 4, 0]])    # ranks 1.5, 2.5, 3
    assert m.result() == pytest.approx({"mrr": (1 / 1.5 + 1 / 2.5 + 1 / 3) / 3, "hits@1": 0.0, "hits@2": 1 / 3})


@pytest.mark.parametrize("num_neg", [300, 30, 7])
def test_shared_hits_equal_brute_force_and_ogb_when_streamed(num_neg):
    pos, neg = tied_scores(4, 200, levels=40), tied_scores(5, num_neg, levels=40)
    whole, chunked = SharedHits(), SharedHits(ks=(100, 20, 50))
    whole.add_negatives(neg)
    whole.add_positives(pos)
    for lo in range(0, num_neg, 13):
        chunked.add_negatives(torch.from_numpy(neg[lo:lo + 13]))
    for lo in range(0, 200, 64):
        chunked.add_positives(torch.from_numpy(pos[lo:lo + 64]))
    desc = sorted(neg.tolist(), reverse=True)
    for k in (20, 50, 100):
        want = 1.0 if num_neg < k else np.mean([p > desc[k - 1] for p in pos.tolist()])
        for got in (whole.result(), chunked.result()):
            assert got[f"hits@{k}"] == pytest.approx(want, abs=1e-12)
            assert got[f"hits@{k}"] == pytest.approx(ogb_hits(torch.from_numpy(pos), torch.from_numpy(neg), k), abs=1e-12)


def test_shared_hits_a_tie_with_the_kth_negative_misses():
    h = SharedHits(ks=(2,))
    h.add_negatives([5.0, 3.0, 1.0])
    h.add_positives([3.0, 3.5, 5.0])
    assert h.result() == {"hits@2": 2 / 3}


def test_misuse_is_refused():
    h = SharedHits()
    with pytest.raises(ValueError, match="before any negative"):
        h.add_positives([1.0])
    h.add_negatives([1.0, 2.0])
    h.add_positives([1.5])
    with pytest.raises(ValueError, match="negatives after positives"):
        h.add_negatives([0.0])
    with pytest.raises(ValueError, match="NaN"):
        RankMetrics().add([float("nan")], [[1.0]])
    with pytest.raises(ValueError, match="expected"):
        RankMetrics().add([1.0, 2.0], np.zeros((3, 4)))
    with pytest.raises(ValueError, match="K >= 1"):
        RankMetrics(ks=(0, 1))
    with pytest.raises(ValueError, match="no positives"):
        RankMetrics().result()


def test_ranks_among_a_large_shared_set_by_binary_search_equal_the_comparison():
    pos, neg = tied_scores(6, 300, levels=30), tied_scores(7, 1000, levels=30)
    a, b = RankMetrics(), RankMetrics()
    a.add(pos, neg)
    b.add_shared(torch.from_numpy(pos), neg)
    assert b.result() == pytest.approx(a.result(), abs=1e-12) and a.count == b.count == 300
