"""The sampler every consumer shares, and the one loop that pairs each step of a plan with its sample.

`Sampler(graph, fanouts, seed)` draws the blocks of a batch with DGL's NeighborSampler, reseeded
per batch from (seed, epoch, batch), so a batch's sample does not depend on what ran before it.
A step's `visible` set restricts sampling to the subgraph it induces (HierBatching: sampling never
leaves the resident mega-batch ∪ static nodes); the sampler keeps that subgraph while the same
set is passed, and a loader may hand it one built ahead (`prepare`).

`sampled_steps(plan, sampler, epochs)` is how the simulator, the executor, traces, the redundancy
ratio and profiling all walk a run: (i, epoch, batch, step, sample) in order.
"""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from .errors import UserError


def batch_seed(seed, epoch, batch) -> int:
    """DGL seed of one batch: sampling is reproducible per batch, whatever ran in between."""
    state = np.random.SeedSequence([int(seed), int(epoch), int(batch)]).generate_state(1)[0]
    return int(state >> 1)                       # dgl.seed takes a non-negative int32


class Sample(NamedTuple):
    """One sampled batch: store ids of the input rows (blocks[0]'s sources) and of the seeds, and the
    blocks (message-flow graphs, outermost layer first; global ids in srcdata/dstdata[dgl.NID])."""
    input_nodes: np.ndarray     # int64 [blocks[0].num_src]
    output_nodes: np.ndarray    # int64 [blocks[-1].num_dst]
    blocks: list


class Sampler:
    """Neighbour sampling with `fanouts` (fanouts[i] for blocks[i]; -1 = all) on `graph`, seeded per
    batch by `batch_seed(seed, epoch, batch)`. Owns its caches: DGL's sampler object and the subgraph
    induced by the last `visible` set (one residency group at a time)."""

    def __init__(self, graph, fanouts, seed=0):
        import dgl
        self.graph, self.fanouts, self.seed = graph, [int(f) for f in fanouts], int(seed)
        self._dgl = dgl.dataloading.NeighborSampler(list(self.fanouts))
        self._visible = self._subgraph = None

    def __repr__(self):
        return f"Sampler(fanouts={self.fanouts}, seed={self.seed})"

    def prepare(self, visible, induced):
        """Use `induced` (the `induced_csc` of `visible`, e.g. built by a loader thread) for `visible`."""
        self._visible, self._subgraph = visible, _dgl_csc(induced)

    def sample(self, seeds, epoch=0, batch=0, visible=None, *, dgl_seed=None) -> Sample:
        """The blocks of `seeds`, sampled inside the sorted ids `visible` (None: the whole graph).
        `dgl_seed` overrides the per-batch seed (evaluation seeds its batches its own way)."""
        import dgl
        import torch
        seeds = np.asarray(seeds, dtype=np.int64)
        dgl.seed(batch_seed(self.seed, epoch, batch) if dgl_seed is None else int(dgl_seed))
        if visible is None:
            inp, out, blocks = self._dgl.sample(self.graph, torch.from_numpy(seeds))
            return Sample(inp.numpy(), out.numpy(), blocks)
        if self._visible is not visible:
            self.prepare(visible, induced_csc(self.graph, visible))
        local = np.minimum(np.searchsorted(visible, seeds), len(visible) - 1)
        if not np.array_equal(visible[local], seeds):
            raise UserError("Sampler.sample: every seed must be in `visible`")
        vis = torch.from_numpy(visible)
        inp, out, blocks = self._dgl.sample(self._subgraph, torch.from_numpy(local))
        for b in blocks:
            b.srcdata[dgl.NID] = vis[b.srcdata[dgl.NID]]
            b.dstdata[dgl.NID] = vis[b.dstdata[dgl.NID]]
        return Sample(vis[inp].numpy(), vis[out].numpy(), blocks)


def sampled_steps(plan, sampler: Sampler, epochs=1, before=None):
    """(i, epoch, batch, step, sample) of a run, in order: `plan` is a plan or a schedule (walked for
    `epochs` epochs) or a list of (epoch, batch, step). `before(i, step)`, when given, runs before the
    step is sampled (the executor applies its residency change there)."""
    steps = plan.steps(epochs) if hasattr(plan, "steps") else plan
    for i, (epoch, b, step) in enumerate(steps):
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
def _induced_csc(indptr, indices, visible, num_nodes):
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
        for k in range(indptr[visible[i]], indptr[visible[i] + 1]):
            u = indices[k]
            c += (bits[u >> 6] >> np.uint64(u & 63)) & np.uint64(1)
        out_ptr[i + 1] = out_ptr[i] + c
    out = np.empty(out_ptr[n], dtype=np.int64)
    for i in range(n):
        pos = out_ptr[i]
        for k in range(indptr[visible[i]], indptr[visible[i] + 1]):
            u = indices[k]
            word, shift = bits[u >> 6], np.uint64(u & 63)
            if (word >> shift) & np.uint64(1):
                out[pos] = rank[u >> 6] + _popcount(word & ((np.uint64(1) << shift) - np.uint64(1)))
                pos += 1
    return out_ptr, out


def induced_csc(g, visible) -> tuple:
    """(indptr, indices) of the subgraph of DGL graph `g` induced by sorted ids `visible`, in local
    ids with every neighbour list's order kept: the CSC `dgl.node_subgraph` builds, about 2.5x
    faster, and without the GIL, so a loader thread can build the next group's (HierBatching §3.3)."""
    indptr, indices, _ = g.adj_tensors("csc")
    return _induced_csc(indptr.numpy(), indices.numpy(), np.asarray(visible, dtype=np.int64), g.num_nodes())


def _dgl_csc(csc):
    import dgl
    import torch
    indptr, indices = (torch.from_numpy(a) for a in csc)
    return dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))),
                     num_nodes=len(indptr) - 1).formats("csc")
