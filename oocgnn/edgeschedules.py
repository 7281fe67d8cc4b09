"""Link prediction's schedules: steps that are batches of training edges (a `--task link` store's plans make them).

- `edges`: the training edges (the topology's, each undirected edge once) shuffled and cut into batches of B
  edges, each with its chunk-shared negatives (`negatives.batch_negatives`, MariusGNN §2.8); a step's seeds are
  its endpoints and negatives.
- `edge-buffer`: `schedules.BufferSchedule` for link prediction: each edge bucket (i, j) trains in one state
  holding both.

A step (`schedules.Step`) carries its edges and negatives in `link` (`schedules.LinkBatch`); its residency
changes follow the node schedule it extends.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from .errors import UserError
from .negatives import batch_negatives
from .orderings import epoch_states
from .schedules import BufferSchedule, LinkBatch, Schedule, Step, Visible, _cut, _ids_of_ranges


def training_edges(store) -> np.ndarray:
    """int64 [M, 2]: each undirected edge {u, v} of the store's topology once, as (u, v) with u < v, in CSR
    order (a link store's topology holds its training edges only, `linksplit`)."""
    indptr, indices = store.indptr, np.asarray(store.indices, dtype=np.int64)
    src = np.repeat(np.arange(store.num_nodes, dtype=np.int64), np.diff(indptr))
    keep = indices > src
    return np.stack([src[keep], indices[keep]], axis=1)


class EdgeSchedule(Schedule):
    """Link prediction: the training edges shuffled each epoch and cut into batches of B edges, each with
    MariusGNN's chunk-shared negatives (`negatives.batch_negatives`: `num_negatives` per chunk, `chunks`
    chunks, a `degree_fraction` of them drawn from the batch's destinations, the rest uniform over the
    nodes), keyed by (seed, epoch, batch). A step's seeds are the sorted distinct endpoints and negatives:
    the nodes whose embeddings its loss needs, sampled over the whole graph."""
    name = "edges"

    def __init__(self, store, batch_size=1024, seed=0, num_negatives=100, chunks=10, degree_fraction=0.0):
        super().__init__(store, batch_size, seed)
        self.num_negatives, self.chunks, self.degree_fraction = int(num_negatives), int(chunks), float(degree_fraction)

    @cached_property
    def edges(self) -> np.ndarray:
        return training_edges(self.store)

    def params(self):
        return {**super().params(), "num_negatives": self.num_negatives, "chunks": self.chunks,
                "degree_fraction": self.degree_fraction}

    def batch(self, edges, epoch, b, nodes=None) -> Step:
        """The step of positives `edges`, its negatives uniform over `nodes` (None: every node)."""
        negatives, filt = batch_negatives(edges, self.store.num_nodes if nodes is None else nodes, self.num_negatives,
                                          min(self.chunks, len(edges)), self.degree_fraction, self.seed, epoch, b)
        seeds = np.unique(np.concatenate([edges.ravel(), negatives.ravel()]))
        return Step(seeds=seeds, link=LinkBatch(edges, negatives, filt))

    def epoch(self, epoch):
        edges = self.edges[self.rng(epoch, 1).permutation(len(self.edges))]
        for b, lo in enumerate(range(0, len(edges), self.batch_size)):
            yield self.batch(edges[lo:lo + self.batch_size], epoch, b)


class EdgeBufferSchedule(BufferSchedule):
    """MariusGNN §5 for link prediction: the training edges in edge buckets (i, j), i <= j, of their endpoints'
    physical partitions; each bucket trains in one state holding both i and j (BETA: the first, greedy; COMET:
    one drawn uniformly, MariusGNN §5.1's deferred random assignment), its edges shuffled with the state's others
    and cut into batches of B edges (`EdgeSchedule.batch`) whose uniform negatives are the buffer's nodes (MariusGNN
    draws them from the nodes in memory), so every seed is resident and sampling stays inside the buffer.
    An ordering must bring every pair of partitions together (BETA and COMET do; sequential does not)."""
    name = "edge-buffer"

    def __init__(self, store, batch_size=1024, physical_parts=16, buffer_parts=4, ordering="comet", logical_parts=0,
                 seed=0, num_negatives=100, chunks=10, degree_fraction=0.0):
        if ordering == "sequential":
            raise UserError("link prediction trains each edge bucket (i, j) in a state holding i and j: the sequential "
                            "ordering never holds most pairs together (use comet or beta)")
        super().__init__(store, batch_size, physical_parts, buffer_parts, ordering, logical_parts, seed)
        self.edge_batches = EdgeSchedule(store, batch_size, seed, num_negatives, chunks, degree_fraction)

    def params(self):
        return {**super().params(), **{k: v for k, v in self.edge_batches.params().items()
                                       if k not in ("batch_size", "seed")}}

    @cached_property
    def bucket_of_edge(self) -> np.ndarray:
        """int64 [M]: each training edge's bucket i·p + j (i <= j: an edge (u, v) has u < v, parts are ranges)."""
        part = np.searchsorted(self.bounds, self.edge_batches.edges, side="right") - 1
        return part[:, 0] * self.p + part[:, 1]

    def groups(self, epoch):
        """[(state, training edges' positions)] of the epoch's states that hold edges, in order."""
        rng = self.rng(epoch, 0)
        states = epoch_states(self.ordering, self.p, self.c, self.l, rng)
        holding = [[] for _ in range(self.p * self.p)]
        for i, state in enumerate(states):
            for a in state:
                for b in state:
                    if a <= b:
                        holding[a * self.p + b].append(i)
        buckets = np.unique(self.bucket_of_edge)
        if self.ordering == "comet":
            pick = [h[int(rng.integers(len(h)))] for h in (holding[k] for k in buckets)]
        else:
            pick = [holding[k][0] for k in buckets]
        state_of = np.full(self.p * self.p, -1, dtype=np.int64)
        state_of[buckets] = pick
        of = state_of[self.bucket_of_edge]
        order = np.argsort(of, kind="stable")
        cut = np.searchsorted(of[order], np.arange(len(states) + 1))
        return [(tuple(sorted(states[i])), order[cut[i]:cut[i + 1]]) for i in range(len(states)) if cut[i + 1] > cut[i]]

    def epoch(self, epoch):
        rng = self.rng(epoch, 1)
        prev = self.groups(epoch - 1) if epoch > 0 else []
        held = set(prev[-1][0]) if prev else set()
        edges, b = self.edge_batches.edges, 0
        for g, (state, positions) in enumerate(self.groups(epoch)):
            ranges = self.ranges_of(state)
            visible, nodes = Visible(self.visible, ranges), _ids_of_ranges(ranges)
            for j, batch in enumerate(_cut(rng.permutation(positions), self.batch_size)):
                step = self.edge_batches.batch(edges[batch], epoch, b, nodes)
                step.group, step.data, step.group_visible, step.buffer = g, self.data, visible, state
                if j == 0:
                    step.leave_ranges = self.ranges_of(held - set(state))
                    step.enter_ranges = self.ranges_of(set(state) - held)
                    held = set(state)
                b += 1
                yield step
