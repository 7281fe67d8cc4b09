"""The sampler every consumer shares, and the one loop that pairs each step of a plan with its sample.

`Sampler(topology, fanouts, seed)` draws a batch's blocks with our own uniform neighbour sampler
(`oocgnn.blocks`: numba, parallel, no Python per node), per hop (every layer draws its frontier
anew, DGL's) or `dense` (MariusGNN's DENSE, §4.1: a node drawn for an outer layer keeps that draw in
the inner ones; only each layer's new nodes are drawn). Its random streams are counter-based and
keyed by (seed, epoch, batch, layer, node), so a batch's sample depends on nothing that ran before
it and is the same at any thread count. Neighbour lists come from a topology source
(`oocgnn.topology.NeighbourLists`): all resident, or read from disk through what a plan keeps
resident, counted apart from feature reads. A step's `visible` set restricts sampling to the
subgraph it induces (HierBatching: sampling never leaves the resident mega-batch ∪ static nodes);
the sampler keeps that subgraph while the same set is passed, and a loader may hand it one built
ahead (`prepare`). Nodes keep their random keys inside it, so a node whose list the subgraph keeps
whole draws the same neighbours as on the whole graph.

`sampled_steps(plan, sampler, epochs)` is how the simulator, the executor, traces, the redundancy
ratio and profiling all walk a run: (i, epoch, batch, step, sample) in order.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from .blocks import dense_layer, sample_layer
from .errors import UserError


class Sample(NamedTuple):
    """One sampled batch: store ids of the input rows (blocks[0]'s sources) and of the seeds, and the
    blocks (`oocgnn.blocks.Block`, outermost layer first, global ids in `src_nodes`)."""
    input_nodes: np.ndarray     # int64 [blocks[0].num_src]
    output_nodes: np.ndarray    # int64 [blocks[-1].num_dst]
    blocks: list


class Sampler:
    """Neighbour sampling with `fanouts` (fanouts[i] for blocks[i]; -1 = all) over a topology source
    (`NeighbourLists`, or anything with `num_nodes`, `indptr` and `lists`). Owns its caches: the
    relabelling scratch and the subgraph induced by the last `visible` set."""

    def __init__(self, topology, fanouts, seed=0, dense=False):
        self.topology, self.fanouts, self.seed = topology, [int(f) for f in fanouts], int(seed)
        self.dense = bool(dense)    # MariusGNN's DENSE: a node's draw is reused by every inner layer
        self.scratch = np.full(topology.num_nodes, -1, dtype=np.int32)
        self._visible = self._subgraph = None

    def __repr__(self):
        return f"Sampler(fanouts={self.fanouts}, seed={self.seed}{', dense' if self.dense else ''})"

    def prepare(self, visible, induced):
        """Use `induced` (the CSC `induced_csc` builds for `visible`, e.g. in a loader thread)."""
        self._visible, self._subgraph = visible, induced

    def sample(self, seeds, epoch=0, batch=0, visible=None) -> Sample:
        """The blocks of `seeds`, sampled inside the sorted ids `visible` (None: the whole graph)."""
        seeds = np.asarray(seeds, dtype=np.int64)
        if visible is None:
            blocks = self._walk(seeds, epoch, batch, self.topology.lists)
            return Sample(blocks[0].src_nodes, seeds, blocks)
        if self._visible is not visible:
            self.prepare(visible, induced_csc(self.topology, visible))
        local = np.minimum(np.searchsorted(visible, seeds), len(visible) - 1)
        if not np.array_equal(visible[local], seeds):
            raise UserError("Sampler.sample: every seed must be in `visible`")
        indptr, indices = self._subgraph

        def lists(nodes, known=0, prev=None):            # the induced CSC: resident, local ids
            return indptr[nodes], indptr[nodes + 1], indices
        blocks = self._walk(local, epoch, batch, lists, keys=visible)
        for b in blocks:
            b.src_nodes = visible[b.src_nodes]
        return Sample(blocks[0].src_nodes, seeds, blocks)

    def sample_many(self, seed_sets, epoch, batches, before_layer=None) -> list:
        """The samples of several batches (no `visible`: the whole graph) walked in lockstep, layer by
        layer: before each layer, `before_layer(nodes)` gets the frontier nodes whose lists that layer
        reads for the first time, over all the batches (BatchGNN's macrobatch: one fetch of the remote
        lists a layer needs, `distributed.RankLists`). Each sample equals `sample(seeds, epoch, batch)`."""
        seed_sets = [np.asarray(s, dtype=np.int64) for s in seed_sets]
        walks = self._walk_many(seed_sets, epoch, list(batches), self.topology.lists, before_layer=before_layer)
        return [Sample(blocks[0].src_nodes, seeds, blocks) for seeds, blocks in zip(seed_sets, walks)]

    def _walk(self, seeds, epoch, batch, lists, keys=None):
        return self._walk_many([seeds], epoch, [batch], lists, keys)[0]

    def _walk_many(self, seed_sets, epoch, batches, lists, keys=None, before_layer=None):
        """Layer by layer from the seeds outwards, every batch a layer at a time; each layer's frontier
        is the previous block's sources, whose first `known` lists the previous call already brought."""
        depth = len(self.fanouts)
        walks = [[[None] * depth, seeds, 0, None] for seeds in seed_sets]      # blocks, frontier, known, prev
        for layer in range(depth - 1, -1, -1):
            if before_layer is not None:
                new = [w[1][w[2]:] for w in walks]
                before_layer(np.unique(np.concatenate(new)) if new else np.empty(0, np.int64))
            for w, batch in zip(walks, batches):
                blocks, frontier, known, prev = w
                prev = lists(frontier, known, prev)
                key_ids = None if keys is None else keys[frontier]
                if self.dense and known:              # only the delta is drawn; the rest is reused
                    blocks[layer] = dense_layer(frontier, known, blocks[layer + 1], prev[0][known:], prev[1][known:],
                                                prev[2], self.fanouts[layer], self.seed, epoch, batch, layer,
                                                self.scratch, key_ids)
                else:
                    blocks[layer] = sample_layer(frontier, *prev, self.fanouts[layer], self.seed, epoch, batch,
                                                 layer, self.scratch, key_ids)
                w[1:] = [blocks[layer].src_nodes, len(frontier), prev]
        return [w[0] for w in walks]


def sampled_steps(plan, sampler: Sampler, epochs=1, before=None, start=0):
    """(i, epoch, batch, step, sample) of a run, in order: `plan` is a plan or a schedule (walked for
    `epochs` epochs) or a list of (epoch, batch, step). `before(i, step)`, when given, runs before the
    step is sampled (the executor applies its residency change there). `start`: skip the steps before
    it (a resumed run; the samples of the others do not depend on them)."""
    steps = plan.steps(epochs) if hasattr(plan, "steps") else plan
    for i, (epoch, b, step) in enumerate(steps):
        if i < start:
            continue
        if before is not None:
            before(i, step)
        yield i, epoch, b, step, sampler.sample(step.seeds, epoch, b, step.visible)


# ---- the subgraph a visible set induces ------------------------------------------------------
@numba.njit(nogil=True, cache=True)
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@numba.njit(nogil=True, cache=True)
def _induced_csc(starts, ends, indices, visible, num_nodes):
    # membership is a bitmap (N/8 bytes, cache-resident) and a node's local id its rank in it
    words = (num_nodes + 63) // 64
    bits = np.zeros(words, dtype=np.uint64)
    for v in visible:
        bits[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
    rank = np.empty(words, dtype=np.int64)
    r = 0
    for w in range(words):
        rank[w] = r
        r += _popcount(bits[w])
    n = len(visible)
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        c = 0
        for k in range(starts[i], ends[i]):
            u = indices[k]
            c += (bits[u >> 6] >> np.uint64(u & 63)) & np.uint64(1)
        out_ptr[i + 1] = out_ptr[i] + c
    out = np.empty(out_ptr[n], dtype=np.int32)
    for i in range(n):
        pos = out_ptr[i]
        for k in range(starts[i], ends[i]):
            u = indices[k]
            word, shift = bits[u >> 6], np.uint64(u & 63)
            if (word >> shift) & np.uint64(1):
                out[pos] = rank[u >> 6] + _popcount(word & ((np.uint64(1) << shift) - np.uint64(1)))
                pos += 1
    return out_ptr, out


def induced_csc(topology, visible, spans=None) -> tuple:
    """(indptr int64, indices int32) of the subgraph induced by sorted ids `visible`, in local ids with
    every list's order kept (the CSC `dgl.node_subgraph` builds). Every visible node's list must be
    resident in `topology` (`spans`: their (starts, ends) in its buffer, when a loader knows them before
    they are pointed at). Without the GIL, so a loader thread can build the next group's (HierBatching §3.3)."""
    visible = np.asarray(visible, dtype=np.int64)
    starts, ends = topology.spans(visible) if spans is None else spans
    return _induced_csc(starts, ends, topology.buf, visible, topology.num_nodes)
