"""The topology side of the store: which neighbour lists are worth keeping in RAM.

A neighbour cache holds whole neighbour lists, chosen by a score until its byte budget is spent:
- `ginex_score`: Ginex §4's out-degree / in-degree ratio (lists read often relative to their size);
- `cross_partition_degree`: OUTRE §4.2's count of a node's neighbours outside its own partition
  (partition batches keep in-part lists resident already; the cross-part ones are what they miss);
- plain degree, and a random control (`neighbour_scores` has all four).
"""
from __future__ import annotations

import numba
import numpy as np

from .csrsource import CSRSource
from .direct import DirectReader
from .errors import StoreError
from .io import range_chunks


def _chunks(store):
    """(lo, hi, lists of nodes lo..hi-1) streamed from indices.bin: O(N + chunk) memory."""
    return CSRSource.of(store).chunks()


def ginex_score(store) -> np.ndarray:
    """float [N]: out-degree / in-degree (0 for a node no list contains): Ginex's neighbour-cache order.
    On a symmetric CSR every node with neighbours scores 1, so ties (broken by id) decide."""
    in_deg = np.zeros(store.num_nodes, dtype=np.int64)
    for _, _, idx in _chunks(store):
        in_deg += np.bincount(idx, minlength=store.num_nodes)
    return np.diff(store.indptr) / np.maximum(in_deg, 1)


def cross_partition_degree(store) -> np.ndarray:
    """int64 [N]: neighbours of each node that lie in another of the store's partitions (OUTRE §4.2)."""
    part_of = np.repeat(np.arange(store.num_parts, dtype=np.int32), np.diff(store.part_offsets))
    deg, out = store.degrees(), np.zeros(store.num_nodes, dtype=np.int64)
    for lo, hi, idx in _chunks(store):
        src = np.repeat(np.arange(lo, hi), deg[lo:hi])
        out[lo:hi] = np.bincount(src - lo, weights=part_of[idx] != part_of[src], minlength=hi - lo)
    return out


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


# ---- the sampler's source of neighbour lists ---------------------------------------------------
@numba.njit(nogil=True, cache=True)
def _copy_spans(src, starts, lens, out, out_starts):
    for i in range(len(starts)):
        out[out_starts[i]:out_starts[i] + lens[i]] = src[starts[i]:starts[i] + lens[i]]


LIST_READ_THREADS = 64    # lists are small and scattered: one page a request, so many in flight


def _exclusive_cumsum(a):
    out = np.zeros(len(a), np.int64)
    np.cumsum(a[:-1], out=out[1:])
    return out


class NeighbourLists:
    """The store's neighbour lists as the sampler sees them (the topology source).

    `indptr` is resident (int64 [N+1]). A list is resident in `buf` (the store's index width) at
    `offset[v]`, or else read from indices.bin by `lists` through a DirectReader whose rows are the
    index entries (`read_spans`: lists whose pages touch coalesce, many requests in flight; counted
    in `stats` apart from feature reads). What is resident is decided outside, as for features: a
    memory topology loads every list at setup (`offset` then is indptr itself); a disk topology holds
    a plan's setup lists and the ranges and scattered ids its steps bring in (`read_ranges`/`point_ranges`/
    `drop_ranges`, `read_ids`/`point_ids`/`drop_ids`).
    """

    def __init__(self, store, capacity=None, reader=None):
        self.store, self.num_nodes = store, store.num_nodes
        self.indptr = np.asarray(store.indptr, dtype=np.int64)
        self.dtype = np.dtype(store.meta["index_dtype"])
        self.reader = reader or self.index_reader(store)
        capacity = store.num_edges if capacity is None else int(capacity)
        self.buf = np.empty(capacity, dtype=self.dtype)
        self.offset = np.full(self.num_nodes, -1, dtype=np.int64)
        self.all_resident = False
        self.fixed = (np.empty(0, np.int64), np.empty(0, np.int64))   # (sorted ids, offsets) placed for the run

    def degree(self, nodes):
        """The list lengths of `nodes` (from indptr: no N-sized degree array is kept)."""
        return self.indptr[nodes + 1] - self.indptr[nodes]

    @property
    def stats(self):
        return self.reader.stats

    @property
    def nbytes(self) -> int:
        """Resident bytes: indptr, the list buffer and (unless every list is resident) the offset table."""
        return self.indptr.nbytes + self.buf.nbytes + (0 if self.all_resident else self.offset.nbytes)

    @staticmethod
    def index_reader(store):
        """A DirectReader whose rows are indices.bin's entries, with many small reads in flight."""
        dtype = np.dtype(store.meta["index_dtype"])
        return DirectReader(store.path / "indices.bin", store.num_edges, 1, dtype=dtype, row_stride=dtype.itemsize,
                            threads=LIST_READ_THREADS)

    @classmethod
    def resident(cls, store, indices=None):
        """Every list resident, from `indices` (the store's whole neighbour array; default its own cached
        copy, `Store.indices`), no reads counted."""
        lists = cls(store, capacity=0)
        lists.buf = store.indices if indices is None else indices
        lists.offset, lists.all_resident = lists.indptr[:-1], True
        return lists

    def view(self, reader):
        """The same resident lists (the arrays are shared, and placing lists fills them in place) with
        another reader: evaluation's and profiling's reads are not the run's."""
        other = object.__new__(NeighbourLists)
        other.__dict__.update(self.__dict__, reader=reader)
        return other

    # -- residency (the runtime applies a plan's steps) -----------------------------------------
    def read_ranges(self, ranges, base, reader=None) -> int:
        """Read the lists of nodes [lo, hi) of each range into buf[base:], sequentially (range by range,
        in `io.range_chunks` of entries), through `reader` (default this source's: a loader thread
        passes its own); returns the entries written."""
        reader = reader or self.reader
        pos = base
        for lo, hi in ranges:
            a, b = int(self.indptr[lo]), int(self.indptr[hi])
            for c, d in range_chunks(a, b, self.dtype.itemsize):
                self.buf[pos:pos + d - c] = self._checked(reader.read_range(c, d)[:, 0], c)
                pos += d - c
        return pos - base

    def range_offsets(self, ranges, base):
        """(nodes, offsets) the lists of `ranges` get when read at `base` (what `point_ranges` sets)."""
        nodes = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges]) if ranges else \
            np.empty(0, np.int64)
        return nodes, base + _exclusive_cumsum(self.degree(nodes)) if len(nodes) else nodes

    def point_ranges(self, ranges, base):
        if not self.all_resident:
            nodes, offsets = self.range_offsets(ranges, base)
            self.offset[nodes] = offsets

    def drop_ranges(self, ranges):
        """Drop the lists of nodes in `ranges`, but those resident for the run."""
        if not self.all_resident:
            for lo, hi in ranges:
                self.offset[lo:hi] = -1
            self.offset[self.fixed[0]] = self.fixed[1]

    def read_ids(self, ids, base, reader=None) -> int:
        """Read the lists of scattered sorted `ids` (one coalesced gather, through `reader`: default this
        source's) into buf[base:], for a step (`point_ids` then points at them); returns the entries written."""
        ids = np.asarray(ids, dtype=np.int64)
        n = int(self.degree(ids).sum())
        if n:
            self.buf[base:base + n] = self._read(ids, reader)
        return n

    def id_offsets(self, ids, base):
        """(ids, offsets) the lists of sorted `ids` get when read at `base` (what `point_ids` sets)."""
        ids = np.asarray(ids, dtype=np.int64)
        return ids, base + _exclusive_cumsum(self.degree(ids)) if len(ids) else ids

    def point_ids(self, ids, base):
        if not self.all_resident and len(ids):
            ids, offsets = self.id_offsets(ids, base)
            self.offset[ids] = offsets

    def drop_ids(self, ids):
        """Drop the lists of scattered `ids` a step brought, but those resident for the run."""
        if not self.all_resident and len(ids):
            self.offset[np.asarray(ids, dtype=np.int64)] = -1
            self.offset[self.fixed[0]] = self.fixed[1]

    def place_ids(self, ids, base) -> int:
        """Read the lists of scattered sorted `ids` (one coalesced gather) into buf[base:], resident for
        the run (`fixed`: steps dropping ranges never drop them); returns the entries written."""
        ids = np.asarray(ids, dtype=np.int64)
        lens = self.degree(ids)
        self.buf[base:base + lens.sum()] = self._read(ids)
        self.offset[ids] = base + _exclusive_cumsum(lens)
        ids, offsets = np.concatenate([self.fixed[0], ids]), np.concatenate([self.fixed[1], self.offset[ids]])
        order = np.argsort(ids, kind="stable")
        self.fixed = (ids[order], offsets[order])
        return int(lens.sum())

    def place_all(self):
        """Every list resident (a memory topology): indices.bin read sequentially into buf."""
        self.read_ranges([(0, self.num_nodes)], 0)
        self.offset, self.all_resident = self.indptr[:-1], True

    def _read(self, nodes, reader=None) -> np.ndarray:
        """The lists of `nodes`, concatenated in that order, read from indices.bin in one call."""
        return self._checked((reader or self.reader).read_spans(self.indptr[nodes], self.indptr[nodes + 1])[:, 0])

    def _checked(self, ids, at=None):
        """`ids` as read, refused if one is not a node (a store damaged after it was opened must not
        send the sampler out of bounds); one pass over what was read, small beside the read itself."""
        if len(ids) and (int(ids.max()) >= self.num_nodes or (self.dtype.kind == "i" and int(ids.min()) < 0)):
            where = f" (entries from {at})" if at is not None else ""
            raise StoreError(f"store {self.store.path}: indices.bin holds a node id outside 0..{self.num_nodes - 1}"
                             f"{where}; the file is damaged (run `oocgnn info --verify`)")
        return ids

    # -- what the sampler asks ------------------------------------------------------------------
    def group_spans(self, nodes, ranges, base, ids=(), ids_base=0):
        """spans(nodes) as they will be once `ranges` (read at `base`) and scattered `ids` (read at
        `ids_base`) are pointed at: what a loader building the next group's subgraph sees before the main
        thread points them."""
        if self.all_resident:
            return self.spans(nodes)
        starts = np.full(len(nodes), -1, np.int64)
        for held, offsets in (self.fixed, self.range_offsets(ranges, base),
                              self.id_offsets(ids, ids_base)):      # the group's copy wins
            pos = np.minimum(np.searchsorted(held, nodes), max(len(held) - 1, 0))
            inside = (held[pos] == nodes) if len(held) else np.zeros(len(nodes), bool)
            starts[inside] = offsets[pos[inside]]
        if ((starts < 0) & (self.degree(nodes) > 0)).any():
            raise ValueError("a visible node's list is neither in the group nor resident")
        starts = np.where(starts < 0, 0, starts)
        return starts, starts + self.degree(nodes)

    def spans(self, nodes):
        """(starts, ends) of resident `nodes`' lists in buf (every one must be resident or empty)."""
        off = self.offset[nodes]
        if (off < 0).any() and (self.degree(nodes[off < 0]) > 0).any():
            raise ValueError("a list asked for as resident is not")
        starts = np.where(off < 0, 0, off)
        return starts, starts + self.degree(nodes)

    def lists(self, nodes, known=0, prev=None):
        """(starts, ends, buffer): the lists of `nodes` are buffer[starts[i]:ends[i]]. The first `known`
        nodes are those of the previous call of the same batch (`prev`, its result): they are not read
        again. Missing lists are read in one coalesced call; if there are none and every list is in
        `buf`, `buf` itself is the buffer (no copy)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        new = nodes[known:]
        lens = self.degree(new)
        off = self.offset[new]
        missing = (off < 0) & (lens > 0)
        off = np.where(off < 0, 0, off)
        in_buf = prev is None or prev[2] is self.buf
        if not missing.any() and in_buf:
            starts = off if prev is None else np.concatenate([prev[0][:known], off])
            return starts, starts + self.degree(nodes), self.buf
        read = self._read(new[missing])                       # the batch's I/O of this layer
        all_lens = self.degree(nodes)
        out_starts = _exclusive_cumsum(all_lens)
        out = np.empty(int(all_lens.sum()), self.dtype)
        if known:
            _copy_spans(prev[2], prev[0][:known], all_lens[:known], out, out_starts[:known])
        here = ~missing
        _copy_spans(self.buf, off[here], lens[here], out, out_starts[known:][here])
        _copy_spans(read, _exclusive_cumsum(lens[missing]), lens[missing], out, out_starts[known:][missing])
        return out_starts, out_starts + all_lens, out

    def close(self):
        self.reader.close()
