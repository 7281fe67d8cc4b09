"""The k highest-scoring ids, ties to the smaller id: what every static cache and history choice keeps.

One selection (`np.partition`, linear) instead of a full stable argsort of N scores: on a 28M-node graph
the argsort held four N-long arrays at once (a float copy, its negation, the order and the sort's buffer),
0.9 GB of setup temporaries that no plan budgets; the selection holds one copy of the scores."""
from __future__ import annotations

import numpy as np


def top_ids(score, k) -> np.ndarray:
    """Sorted int64 ids of the k highest scores, ties broken by the smaller id (as a stable descending
    argsort's first k, without sorting all of them)."""
    score = np.asarray(score)
    n, k = len(score), int(min(max(int(k), 0), len(score)))
    if k == 0:
        return np.empty(0, np.int64)
    if k == n:
        return np.arange(n, dtype=np.int64)
    kth = np.partition(score, n - k)[n - k]            # the k-th highest value
    above = np.flatnonzero(score > kth)
    ties = np.flatnonzero(score == kth)[:k - len(above)]
    return np.sort(np.concatenate((above, ties))).astype(np.int64, copy=False)


def top_ordered(score, k) -> np.ndarray:
    """The ids of `top_ids`, highest score first (ties: smaller id first)."""
    ids = top_ids(score, k)
    return ids[np.lexsort((ids, -np.asarray(score)[ids].astype(np.float64)))]
