"""Our own uniform multi-hop neighbour sampler (numba), replacing DGL's NeighborSampler +
sample_neighbors + to_block, and the `Block` it produces.

* `Block`: a message-flow graph in CSC form, DGL's block convention (dst nodes first among the
  src nodes); `to_dgl()` makes a DGL block, importing DGL lazily (this module works without it).
* Randomness is counter-based: a dst node's picks depend only on (seed, epoch, batch, layer, its
  key id), mixed into a 64-bit state with splitmix64 (Steele, Lea & Flood, OOPSLA 2014); bounded
  draws by Lemire's multiply-shift (ACM TOMACS 2019). Thread count and call order do not matter.
* `sample_layer`: min(fanout, degree) list positions per dst node, uniform without replacement, by
  Floyd's algorithm (Bentley & Floyd, CACM 1987), in list order; then a relabel to local ids in
  order of first appearance (DGL's to_block order). `sample_blocks`: multi-hop over a CSR.

Threading: the kernels release the GIL; the pick runs under `numba.prange`. The `workqueue`
layer (set by `oocgnn/__init__.py`) aborts the process if two threads launch parallel kernels at
once, so the sampler launches one only while holding `_PAR_LOCK` and otherwise runs the serial
twin (same picks). The layers' kernels (`oocgnn.aggregate`) take the same lock.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numba
import numpy as np

__all__ = ["Block", "sample_layer", "dense_layer", "sample_blocks", "SAMPLER_VERSION"]

# what samples a key gives: cached traces recorded by another version of the sampler are not reused
SAMPLER_VERSION = "oocgnn-1"


@dataclass(eq=False)
class Block:
    """A message-flow graph (one GNN layer) in CSC form; dst nodes are the first src nodes."""
    indptr: np.ndarray      # int64 [num_dst + 1]; in-edges of local dst j: indices[indptr[j]:indptr[j+1]]
    indices: np.ndarray     # int64 [num_edges], local src ids (into src_nodes)
    src_nodes: np.ndarray   # int64 [num_src], global ids; src_nodes[:num_dst] are the dst nodes
    num_dst: int

    def __repr__(self):
        return f"Block(num_src={self.num_src}, num_dst={self.num_dst}, num_edges={self.num_edges})"

    @property
    def num_src(self) -> int:
        return len(self.src_nodes)

    @property
    def num_edges(self) -> int:
        return len(self.indices)

    @property
    def dst_nodes(self) -> np.ndarray:
        """int64 [num_dst] global ids of the dst nodes (a view of src_nodes)."""
        return self.src_nodes[:self.num_dst]

    def edges(self):
        """(src_local int64 [E], dst_local int64 [E]) in CSC order (DGL's edge-id order)."""
        dst = np.repeat(np.arange(self.num_dst, dtype=np.int64), np.diff(self.indptr))
        return self.indices, dst

    def to_dgl(self):
        """The DGL block of this graph, global ids in srcdata/dstdata[dgl.NID] (imports DGL)."""
        import dgl
        import torch
        eids = torch.arange(self.num_edges, dtype=torch.int64)   # explicit: DGL's SpMM kernels need them
        block = dgl.create_block(
            ("csc", (torch.from_numpy(np.ascontiguousarray(self.indptr, dtype=np.int64)),
                     torch.from_numpy(np.ascontiguousarray(self.indices, dtype=np.int64)), eids)),
            num_src_nodes=self.num_src, num_dst_nodes=self.num_dst)
        src = torch.from_numpy(np.ascontiguousarray(self.src_nodes, dtype=np.int64))
        block.srcdata[dgl.NID] = src
        block.dstdata[dgl.NID] = src[:self.num_dst]
        return block


# ---------------------------------------------------------------------------------------------
# Counter-based random stream. All arithmetic stays in uint64: numba would turn a uint64 mixed
# with a (signed) Python int into float64, so every constant is an np.uint64.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S27, _S30, _S31, _S32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)


@numba.njit(cache=True, inline="always")
def _mix(z):
    """splitmix64's finaliser: a bijection of uint64 with full avalanche."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True, inline="always")
def _key(seed, epoch, batch, layer, node):
    """The 64-bit stream state of one dst node: the five integers mixed in turn."""
    h = _mix(np.uint64(seed) + _GOLDEN)
    h = _mix(h ^ (np.uint64(epoch) + _GOLDEN))
    h = _mix(h ^ (np.uint64(batch) + _GOLDEN))
    h = _mix(h ^ (np.uint64(layer) + _GOLDEN))
    return _mix(h ^ (np.uint64(node) + _GOLDEN))


@numba.njit(cache=True, inline="always")
def _below(state, n):
    """(next state, a draw in [0, n)) for 0 < n < 2**32: Lemire's multiply-shift on 32 high bits."""
    state = state + _GOLDEN
    r = _mix(state) >> _S32
    return state, np.int64((r * np.uint64(n)) >> _S32)


# ---------------------------------------------------------------------------------------------
# Floyd's algorithm: for j = d-k..d-1 draw t in [0, j]; take t, or j if t is taken already. This
# yields a uniform k-subset of range(d) in k draws.

_SMALL = 64       # up to this k, sort the k picks by rank (branch-free O(k^2)), else np.sort
_CHUNK = 64       # dst nodes per parallel work item (one Floyd buffer each)


@numba.njit(cache=True, inline="always")
def _floyd(state, d, k, chosen, out):
    """k uniform distinct positions of range(d), increasing, into out [k]; chosen [>= k]: work."""
    for m in range(k):
        j = d - k + m
        state, t = _below(state, j + 1)
        taken = False
        for c in range(m):                           # no branches: vectorises, nothing to mispredict
            taken |= chosen[c] == t
        chosen[m] = j if taken else t
    if k > _SMALL:
        out[:] = np.sort(chosen[:k])
        return
    for c in range(k):                               # place each by its rank (all distinct)
        x, r = chosen[c], 0
        for c2 in range(k):
            r += chosen[c2] < x
        out[r] = x


# ---------------------------------------------------------------------------------------------
# The kernels: count -> prefix sum -> pick (parallel over chunks of dst nodes) -> relabel. Only
# the pick runs in parallel: a parallel launch costs ~0.1 ms under workqueue, the rest is cheap.

_PAR_MIN = 16384  # picks below which one thread is faster than paying for a parallel launch
_PAR_LOCK = threading.Lock()   # one parallel launch at a time (see the module docstring)
_BACKGROUND = threading.local()


def background_thread():
    """Mark the calling thread as sampling in the background (`oocgnn.ahead`): it runs the serial pick
    (the same picks) and never holds `_PAR_LOCK`, so the trainer's kernels, which pick their parallel
    or serial twin by that lock, choose the same way whatever the background does (fastmath twins may
    round differently: a run must not depend on timing)."""
    _BACKGROUND.serial = True


@numba.njit(cache=True, nogil=True)
def _count(starts, ends, fanout):
    """indptr int64 [F+1] of the block: min(fanout, degree) picks per dst (all for -1)."""
    nf = len(starts)
    indptr = np.empty(nf + 1, dtype=np.int64)
    indptr[0] = 0
    for i in range(nf):
        d = ends[i] - starts[i]
        indptr[i + 1] = indptr[i] + (d if fanout < 0 or d < fanout else fanout)
    return indptr


@numba.njit(cache=True, nogil=True)
def _count_csr(csr_indptr, frontier, fanout):
    """(starts, ends int64 [F], block indptr int64 [F+1]) of frontier over a whole CSR; ends[0]
    is -1 if a frontier id lies outside the CSR."""
    nf, n = len(frontier), len(csr_indptr) - 1
    starts = np.empty(nf, dtype=np.int64)
    ends = np.empty(nf, dtype=np.int64)
    for i in range(nf):
        v = frontier[i]
        if v < 0 or v >= n:
            ends[0] = -1
            return starts, ends, np.zeros(1, dtype=np.int64)
        starts[i], ends[i] = csr_indptr[v], csr_indptr[v + 1]
    return starts, ends, _count(starts, ends, fanout)


@numba.njit(cache=True, inline="always")
def _pick_chunk(ch, key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer,
                picks):
    """The picks (global ids) of dst nodes ch*_CHUNK.. into picks[indptr[i]:indptr[i+1]]."""
    a, b = ch * _CHUNK, min(len(starts), (ch + 1) * _CHUNK)
    chosen = np.empty(max(fanout, 0), dtype=np.int64)    # [fanout] Floyd's picks, unsorted
    for i in range(a, b):                            # list positions, increasing
        lo, hi = indptr[i], indptr[i + 1]
        k, d = hi - lo, ends[i] - starts[i]
        if k == d:                                   # whole list: no randomness
            for t in range(k):
                picks[lo + t] = t
        else:
            _floyd(_key(seed, epoch, batch, layer, key_ids[i]), d, k, chosen, picks[lo:hi])
    for i in range(a, b):                            # then the gather: independent loads, so
        s = starts[i]                                # many cache misses are in flight at once
        for t in range(indptr[i], indptr[i + 1]):
            picks[t] = indices[s + picks[t]]


@numba.njit(cache=True, nogil=True)
def _pick_seq(key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer, picks):
    for ch in range((len(starts) + _CHUNK - 1) // _CHUNK):
        _pick_chunk(ch, key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer,
                    picks)


@numba.njit(cache=True, nogil=True, parallel=True)
def _pick_par(key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer, picks):
    for ch in numba.prange((len(starts) + _CHUNK - 1) // _CHUNK):
        _pick_chunk(ch, key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer,
                    picks)


@numba.njit(cache=True, nogil=True)
def _relabel(frontier, picks, scratch):
    """Global picks -> local ids in place; (src_nodes int64 [S], status < 0 on a bad id).
    src_nodes: the frontier, then new ids in order of first appearance in picks (CSC order)."""
    n, nf = len(scratch), len(frontier)
    src_nodes = np.empty(nf + len(picks), dtype=np.int64)   # [S <= F + E], trimmed below
    ns, status = 0, 0
    for i in range(nf):
        v = frontier[i]
        if v < 0 or v >= n or scratch[v] != -1:
            status = -1 if v < 0 or v >= n else -2  # out of range / duplicate in the frontier
            break
        scratch[v] = ns
        src_nodes[ns] = v
        ns += 1
    if status == 0:
        for e in range(len(picks)):
            v = picks[e]
            if v < 0 or v >= n:
                status = -3                          # a neighbour id outside scratch
                break
            u = scratch[v]
            if u == -1:
                u = ns
                scratch[v] = ns
                src_nodes[ns] = v
                ns += 1
            picks[e] = u
    for i in range(ns):                              # reset only the touched entries
        scratch[src_nodes[i]] = -1
    if 2 * ns < len(src_nodes):                      # do not pin a mostly unused buffer
        return src_nodes[:ns].copy(), status
    return src_nodes[:ns], status


_ERRORS = {-1: "a frontier id lies outside scratch", -2: "the frontier holds a duplicate id",
           -3: "a neighbour id lies outside scratch"}


def sample_layer(frontier, starts, ends, indices, fanout, seed, epoch, batch, layer, scratch,
                 key_ids=None) -> Block:
    """One layer: up to `fanout` (-1: all) uniform picks without replacement from the neighbour
    list `indices[starts[i]:ends[i]]` of each dst node `frontier[i]`, relabelled into a `Block`.

    frontier, starts, ends, key_ids: int64 [F] (frontier unique; key_ids default frontier, the ids
    the random keys use). indices: int32/int64 node ids, same id space as frontier. scratch:
    int32/int64 [num_nodes], all -1 on entry and again on return.
    """
    frontier, starts, ends = (np.ascontiguousarray(a, dtype=np.int64) for a in (frontier, starts, ends))
    key_ids = frontier if key_ids is None else np.ascontiguousarray(key_ids, dtype=np.int64)
    if not len(frontier) == len(starts) == len(ends) == len(key_ids):
        raise ValueError("frontier, starts, ends and key_ids differ in length")
    if len(starts) and (starts.min() < 0 or ends.max() > len(indices) or (ends < starts).any()):
        raise ValueError("starts/ends do not delimit lists inside indices")
    _check(fanout, scratch)
    return _sample(frontier, key_ids, starts, ends, _count(starts, ends, int(fanout)), indices,
                   fanout, seed, epoch, batch, layer, scratch)


def dense_layer(frontier, known, inner: Block, starts, ends, indices, fanout, seed, epoch, batch, layer,
                scratch, key_ids=None) -> Block:
    """A DENSE layer (MariusGNN §4.1, Alg. 1): the first `known` frontier nodes are `inner`'s dst nodes,
    whose draws it holds: they are reused as they are (their edges copied, local ids unchanged, since
    this block's sources start with `inner`'s); only the rest, the delta, is drawn (`fanout`, layer key
    `layer`) and relabelled after them. starts/ends delimit the delta's lists (`frontier[known:]`)."""
    frontier = np.ascontiguousarray(frontier, dtype=np.int64)
    delta = frontier[known:]
    keys = delta if key_ids is None else np.ascontiguousarray(key_ids, dtype=np.int64)[known:]
    starts, ends = (np.ascontiguousarray(a, dtype=np.int64) for a in (starts, ends))
    _check(fanout, scratch)
    dptr = _count(starts, ends, int(fanout))
    picks = _pick(keys, starts, ends, indices, dptr, fanout, seed, epoch, batch, layer)
    src_nodes, status = _relabel(frontier, picks, scratch)
    if status:
        raise IndexError(f"{_ERRORS[status]} (size {len(scratch)})")
    reused = inner.indptr[-1]
    return Block(np.concatenate([inner.indptr, reused + dptr[1:]]), np.concatenate([inner.indices, picks]),
                 src_nodes, len(frontier))


def sample_blocks(indptr, indices, seeds, fanouts, seed, epoch, batch, scratch) -> list[Block]:
    """Multi-hop blocks of `seeds` over the CSR (indptr int64 [N+1], indices [E]), DGL
    NeighborSampler's convention: fanouts[i] for blocks[i], outermost first (blocks[0]'s sources
    are the input nodes, blocks[-1]'s dst nodes are the seeds). blocks[i] uses layer key i."""
    frontier = np.ascontiguousarray(seeds, dtype=np.int64)
    for fanout in fanouts:
        _check(fanout, scratch)
    blocks = [None] * len(fanouts)
    for layer in range(len(fanouts) - 1, -1, -1):
        starts, ends, bptr = _count_csr(indptr, frontier, int(fanouts[layer]))
        if len(frontier) and ends[0] < 0:
            raise IndexError(f"a frontier id lies outside the CSR ({len(indptr) - 1} nodes)")
        blocks[layer] = _sample(frontier, frontier, starts, ends, bptr, indices, fanouts[layer],
                                seed, epoch, batch, layer, scratch)
        frontier = blocks[layer].src_nodes
    return blocks


def _check(fanout, scratch):
    if int(fanout) < -1:
        raise ValueError(f"fanout must be >= 0 or -1 (all), got {fanout}")
    if not (isinstance(scratch, np.ndarray) and scratch.ndim == 1 and scratch.dtype in (np.int32, np.int64)):
        raise TypeError("scratch must be a 1-d int32/int64 array of -1s, size num_nodes")


def _pick(key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer) -> np.ndarray:
    """The picks (global ids, int64 [indptr[-1]]) of every dst node: the parallel kernel when there are
    enough of them and the lock is free (not from a background thread), else its serial twin."""
    picks = np.empty(indptr[-1], dtype=np.int64)
    args = (key_ids, starts, ends, indices, indptr, int(fanout), int(seed), int(epoch),
            int(batch), int(layer), picks)
    if len(picks) >= _PAR_MIN and numba.get_num_threads() > 1 and not getattr(_BACKGROUND, "serial", False) \
            and _PAR_LOCK.acquire(blocking=False):
        try:
            _pick_par(*args)
        finally:
            _PAR_LOCK.release()
    else:
        _pick_seq(*args)
    return picks


def _sample(frontier, key_ids, starts, ends, indptr, indices, fanout, seed, epoch, batch, layer,
            scratch) -> Block:
    """Pick (into picks int64 [E]) and relabel; indptr int64 [F+1] comes from _count."""
    picks = _pick(key_ids, starts, ends, indices, indptr, fanout, seed, epoch, batch, layer)
    src_nodes, status = _relabel(frontier, picks, scratch)                   # picks -> local
    if status:
        raise IndexError(f"{_ERRORS[status]} (size {len(scratch)})")
    return Block(indptr, picks, src_nodes, len(frontier))
