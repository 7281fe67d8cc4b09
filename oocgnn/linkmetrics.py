"""Link-prediction ranking metrics with OGB's definitions (ogb/linkproppred/evaluate.py), accumulated chunk by chunk.

* `RankMetrics`: each positive ranked among its own negatives, OGB's 'mrr' evaluator (ogbl-citation2, -wikikg2,
  `_eval_mrr`). rank = 1 + (#{neg > pos} + #{neg >= pos}) / 2: a positive tied with t negatives sits in their
  middle (the mean of its optimistic and pessimistic ranks). MRR = mean(1 / rank); Hits@K = mean(rank <= K)
  (OGB's hits@K_list). Negatives may also be one set shared by a chunk of positives (MariusGNN's).
  `add_shared` ranks positives among one large shared set (OGB's shared negative pairs) by binary search.
* `SharedHits`: one set of negatives for all positives, OGB's 'hits@K' evaluator (ogbl-collab, -ppa, -ddi,
  `_eval_hits`). A positive is a hit iff its score is strictly greater than the K-th highest negative score (a
  tie with it misses); with fewer than K negatives every positive is a hit (OGB returns 1.0).

Streaming: `RankMetrics.add` takes a chunk of positives with their negatives and keeps sums (float64: OGB takes
the mean of float32 reciprocals, so the two differ in the seventh digit). `SharedHits` keeps the max(K) highest
negative scores as negatives stream in, then counts hits as positives stream in; every negative must come
before the first positive, since the thresholds are final by then. NaN scores are refused: a NaN compares false
and would rank first.

`snap_ties` conditions scores before ranking: a negative within float32 rounding of its positive (`TIE_RTOL`)
becomes a tie. One decoder can score the same two embeddings a few ulps apart in different rows of one matrix
product, and a model whose embeddings collapsed to one vector would otherwise rank every positive first (MRR 1)
or last by rounding alone, where OGB's definition ranks a tie in the middle.
"""
from __future__ import annotations

import numpy as np
import torch


def _scores(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.array(x))       # a copy: NumPy scores may be read-only (memory-mapped)
    if x.is_floating_point() and torch.isnan(x).any():
        raise ValueError("scores hold NaN")
    return x


TIE_RTOL = 1e-6        # about 8 float32 ulps: closer scores are one score computed twice


def snap_ties(pos, neg, rtol=TIE_RTOL):
    """(`neg` [B, K] with every score within `rtol` of its positive's (relative to the larger magnitude) set
    equal to it, the share of the B positives tied with all K of their negatives): the module docstring."""
    pos, neg = _scores(pos).reshape(-1, 1), _scores(neg)
    close = (neg - pos).abs() <= rtol * torch.maximum(neg.abs(), pos.abs())
    tied = float(close.all(1).float().mean()) if len(pos) else 0.0
    return torch.where(close, pos.expand_as(neg), neg), tied


def _ks(ks) -> tuple:
    ks = tuple(sorted({int(k) for k in ks}))
    if not ks or ks[0] < 1:
        raise ValueError(f"Hits@K needs K >= 1, got {ks}")
    return ks


class RankMetrics:
    """MRR and Hits@K of positives each ranked among its own negatives (OGB's 'mrr' evaluator)."""

    def __init__(self, ks=(1, 3, 10)):
        self.ks = _ks(ks)
        self.count, self.reciprocal = 0, 0.0
        self.hits = dict.fromkeys(self.ks, 0)

    def add(self, pos, neg):
        """`pos` [B] scores; `neg` [B, K] (row i: positive i's negatives) or [K] (shared by all B)."""
        pos, neg = _scores(pos).reshape(-1, 1), _scores(neg)
        if neg.ndim == 1:
            neg = neg.reshape(1, -1)
        elif neg.ndim != 2 or neg.shape[0] != pos.shape[0]:
            raise ValueError(f"negatives of shape {tuple(neg.shape)} for {pos.shape[0]} positives: "
                             "expected [B, K] or [K]")
        self._add_ranks(1 + 0.5 * ((neg > pos).sum(1) + (neg >= pos).sum(1)).to(torch.float64))

    def add_shared(self, pos, neg):
        """`pos` [B] scores ranked among one large set `neg` [K] shared by all (OGB's shared negative pairs): the
        ranks `add(pos, neg)` gives, by binary search in the sorted negatives instead of a [B, K] comparison."""
        pos = _scores(pos).reshape(-1).to(torch.float64)
        neg = torch.sort(_scores(neg).reshape(-1).to(torch.float64)).values
        greater = len(neg) - torch.searchsorted(neg, pos, right=True)
        geq = len(neg) - torch.searchsorted(neg, pos, right=False)
        self._add_ranks(1 + 0.5 * (greater + geq).to(torch.float64))

    def _add_ranks(self, rank):
        self.count += rank.shape[0]
        self.reciprocal += float((1 / rank).sum())
        for k in self.ks:
            self.hits[k] += int((rank <= k).sum())

    def totals(self) -> list:
        """[count, sum of reciprocal ranks, hits at each K]: what ranks sum (`set_totals`) to rank as one."""
        return [self.count, self.reciprocal, *self.hits.values()]

    def set_totals(self, totals):
        self.count, self.reciprocal = int(totals[0]), float(totals[1])
        self.hits = {k: int(h) for k, h in zip(self.ks, totals[2:], strict=True)}

    def result(self) -> dict:
        """{'mrr': ..., 'hits@K': ...} over every positive added."""
        if not self.count:
            raise ValueError("no positives were ranked")
        return {"mrr": self.reciprocal / self.count, **{f"hits@{k}": h / self.count for k, h in self.hits.items()}}


class SharedHits:
    """Hits@K of positives against one shared set of negatives (OGB's 'hits@K' evaluator)."""

    def __init__(self, ks=(20, 50, 100)):
        self.ks = _ks(ks)
        self.top, self.negatives, self.count = None, 0, 0
        self.hits = dict.fromkeys(self.ks, 0)

    def add_negatives(self, scores):
        """A chunk of the shared negatives' scores; all of them before any positive."""
        if self.count:
            raise ValueError("negatives after positives: the Hits@K thresholds were already used")
        scores = _scores(scores).reshape(-1)
        both = scores if self.top is None else torch.cat([self.top, scores])
        self.top = torch.topk(both, min(len(both), self.ks[-1])).values     # descending
        self.negatives += len(scores)

    def add_positives(self, scores):
        """A chunk of positives' scores, counted against the K-th highest negative."""
        if self.top is None:
            raise ValueError("positives before any negative: add every negative first")
        scores = _scores(scores).reshape(-1)
        self.count += len(scores)
        for k in self.ks:
            self.hits[k] += len(scores) if self.negatives < k else int((scores > self.top[k - 1]).sum())

    def totals(self) -> list:
        """[count, hits at each K] (the negatives' thresholds are every rank's: each scores all of them)."""
        return [self.count, *self.hits.values()]

    def set_totals(self, totals):
        self.count = int(totals[0])
        self.hits = {k: int(h) for k, h in zip(self.ks, totals[1:], strict=True)}

    def result(self) -> dict:
        """{'hits@K': ...} over every positive added."""
        if not self.count:
            raise ValueError("no positives were counted")
        return {f"hits@{k}": h / self.count for k, h in self.hits.items()}
