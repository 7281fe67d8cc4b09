"""The topology side of the store: which neighbour lists are worth keeping in RAM.

A neighbour cache holds whole neighbour lists, chosen by a score until its byte budget is spent:
- `ginex_score`: Ginex §4's out-degree / in-degree ratio (lists read often relative to their size);
- `cross_partition_degree`: OUTRE §4.2's count of a node's neighbours outside its own partition
  (partition batches keep in-part lists resident already; the cross-part ones are what they miss);
- plain degree, and a random control (`neighbour_scores` has all four).
"""
from __future__ import annotations

import numpy as np


def ginex_score(store) -> np.ndarray:
    """float [N]: out-degree / in-degree (0 for a node no list contains): Ginex's neighbour-cache order.
    On a symmetric CSR every node with neighbours scores 1, so ties (broken by id) decide."""
    out_deg = np.diff(store.indptr)
    in_deg = np.bincount(store.indices, minlength=store.num_nodes)
    return out_deg / np.maximum(in_deg, 1)


def cross_partition_degree(store) -> np.ndarray:
    """int64 [N]: neighbours of each node that lie in another of the store's partitions (OUTRE §4.2)."""
    part_of = np.repeat(np.arange(store.num_parts), np.diff(store.part_offsets))
    src = np.repeat(np.arange(store.num_nodes), np.diff(store.indptr))
    return np.bincount(src, weights=part_of[store.indices] != part_of[src],
                       minlength=store.num_nodes).astype(np.int64)


def neighbour_scores(store, seed=0) -> dict:
    """The neighbour-cache scores side by side: degree, Ginex's out/in, OUTRE's cross-partition
    degree and a seeded random control (higher is cached first)."""
    return {"degree": store.degrees(), "ginex out/in": ginex_score(store),
            "outre cross-part": cross_partition_degree(store),
            "random": np.random.default_rng(seed).random(store.num_nodes)}


def neighbour_cache(store, score, budget_bytes) -> np.ndarray:
    """Ids whose lists a cache of `budget_bytes` holds: the longest prefix of the score order (ties to
    the smaller id) whose lists, at the store's index width, fit the budget."""
    index_bytes = np.dtype(store.meta["index_dtype"]).itemsize
    order = np.argsort(-np.asarray(score), kind="stable")
    sizes = np.cumsum(store.degrees()[order] * index_bytes)
    return order[:np.searchsorted(sizes, budget_bytes, side="right")]
