"""Negative edges for link prediction: shared within a training batch (MariusGNN), fixed per evaluated edge.

Training, `batch_negatives`: MariusGNN's CorruptNodeNegativeSampler (src/cpp/src/data/samplers/negative.cpp;
the digest's §2.8). A batch's positives are cut into `chunks` consecutive chunks of ceil(B / chunks) edges, and
each chunk shares one set of `num_negatives` nodes that replace the destination of every positive in it: a
[chunk, num_negatives] score matrix a chunk instead of separate draws per positive. Of each set the first
int(num_negatives · degree_fraction) are the destinations of random positives of the batch, so a node appears
in proportion to its degree in the batch (MariusGNN's approximation of degree-based sampling); the rest are
uniform over `nodes` (MariusGNN draws them from the nodes in memory). A degree-drawn negative taken from a
positive of its own chunk is that positive's true destination: `filter` lists those (positive, column) pairs,
whose scores a trainer masks (MariusGNN's DEG local filter). The generator is keyed by (seed, epoch, batch):
a batch's negatives depend on nothing else, neither thread counts nor the batches drawn before it.

Evaluation, `eval_targets`: k corrupted destinations for each held-out edge, the form of OGB's ogbl-citation2
(each positive ranked among its own negatives: `linkmetrics.RankMetrics`). Node j of edge i is
mix64(mix64(i xor s) + (j + 1)·φ) mod N, s the seed's word: a pure function of the edge's position, so an
evaluation in chunks draws what a whole one draws, and every evaluation of a run ranks against the same set.
Unfiltered, like OGB's random negatives: a negative may be a true edge (probability about degree / N).
"""
from __future__ import annotations

import numpy as np

from .linksplit import GOLDEN, mix64, seed_word


def batch_negatives(pos, nodes, num_negatives: int, chunks: int = 1, degree_fraction: float = 0.0, seed: int = 0,
                    epoch: int = 0, batch: int = 0):
    """(negatives int64 [chunks, num_negatives], filter int64 [F, 2]) for the positives `pos` (int64 [B, 2],
    source and destination): chunk c's negatives corrupt positives c·ceil(B/chunks) .. (c+1)·ceil(B/chunks) − 1;
    `nodes` is N (uniform over 0..N−1) or the candidate ids; `filter` rows are (positive, column) to mask."""
    pos = np.asarray(pos, dtype=np.int64)
    b = len(pos)
    if pos.ndim != 2 or pos.shape[1] != 2 or not b:
        raise ValueError(f"positives must be [B, 2] with B >= 1, got shape {pos.shape}")
    if not 1 <= chunks <= b or num_negatives < 1 or not 0.0 <= degree_fraction <= 1.0:
        raise ValueError(f"need 1 <= chunks ({chunks}) <= B ({b}), num_negatives >= 1 ({num_negatives}) and "
                         f"degree_fraction in [0, 1] ({degree_fraction})")
    rng = np.random.default_rng([seed, epoch, batch])
    n_deg = int(num_negatives * degree_fraction)
    edge = rng.integers(0, b, size=(chunks, n_deg))                 # positives whose destinations are drawn
    if isinstance(nodes, (int, np.integer)):
        uniform = rng.integers(0, int(nodes), size=(chunks, num_negatives - n_deg))
    else:
        nodes = np.asarray(nodes, dtype=np.int64)
        uniform = nodes[rng.integers(0, len(nodes), size=(chunks, num_negatives - n_deg))]
    negatives = np.concatenate([pos[edge, 1], uniform], axis=1)
    size = -(-b // chunks)
    c, j = np.nonzero(edge // size == np.arange(chunks)[:, None])   # drawn from a positive of its own chunk
    return negatives, np.stack([edge[c, j], j], axis=1).astype(np.int64)


def eval_targets(first: int, count: int, num_nodes: int, k: int, seed: int = 0) -> np.ndarray:
    """int64 [count, k]: the negative destinations of held-out edges first .. first + count − 1."""
    return eval_targets_at(np.arange(first, first + count), num_nodes, k, seed)


def eval_targets_at(positions, num_nodes: int, k: int, seed: int = 0) -> np.ndarray:
    """int64 [len(positions), k]: the negative destinations of the held-out edges at `positions`."""
    i = np.asarray(positions, dtype=np.int64).astype(np.uint64)[:, None] ^ seed_word(seed)
    j = (np.arange(k, dtype=np.uint64)[None, :] + np.uint64(1)) * np.uint64(GOLDEN)
    return (mix64(mix64(i) + j) % np.uint64(num_nodes)).astype(np.int64)
