"""Edge buckets (MariusGNN §3): the store's edges grouped by (source partition, destination partition).

With p physical partitions (each a contiguous range of store ids), bucket (i, j) holds the edges
(u, w), w in u's neighbour list, with u in partition i and w in partition j, as pairs of store ids
sorted by u then w. Buckets lie in one file in (i, j) order, so a buffer of c partitions reads the
c² buckets among them, and a swap only those that pair the entering partitions with the buffer,
each bucket one sequential read (adjacent ones coalesced). Since every neighbour list is sorted and
partitions are id ranges, a node's entries across buckets (i, 0), (i, 1), ... are its list in order:
`buffer_csc` rebuilds the subgraph a buffer induces exactly as `sampler.induced_csc` cuts it from
the whole lists (a test).

The file is derived data: written once per (store, p) beside the store (`<store>.buckets-p<P>/`),
atomically, and checked against the store's checksum and partition bounds when opened.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numba
import numpy as np

from .atomicdir import swap_in, temp_path, writing
from .csrsource import CSRSource
from .direct import DirectReader
from .errors import UserError
from .io import page_span, range_chunks, range_requests

VERSION = 1


def physical_offsets(store, p: int) -> np.ndarray:
    """int64 [p+1]: store ids where each of `p` physical partitions starts, grouping consecutive store
    parts (p = the store's parts keeps them; fewer groups them as evenly as their count allows)."""
    k = store.num_parts
    if not 1 <= p <= k:
        raise UserError(f"physical partitions must be between 1 and the store's {k} parts, got {p} "
                        "(prepare the store with more parts: --partitioner metis|fennel|random --parts K)")
    bounds = np.round(np.linspace(0, k, p + 1)).astype(np.int64)
    return np.asarray(store.part_offsets, dtype=np.int64)[bounds]


@numba.njit(nogil=True, cache=True)
def _scatter(keys, src, dst, out, cursor):
    for e in range(len(keys)):
        k = keys[e]
        out[cursor[k], 0] = src[e]
        out[cursor[k], 1] = dst[e]
        cursor[k] += 1


@numba.njit(nogil=True, cache=True)
def _bucket_keys(lo, deg, idx, part_of, bounds, p, out):
    """out[e] = part(u)·p + part(w) for the entries of rows lo, lo+1, ... (their lengths `deg`)."""
    part_u, e = part_of[lo], 0
    for r in range(len(deg)):
        while lo + r >= bounds[part_u + 1]:
            part_u += 1
        for _ in range(deg[r]):
            out[e] = part_u * p + part_of[idx[e]]
            e += 1


class EdgeBuckets:
    """The bucket file of a store at `p` physical partitions: `offsets` int64 [p·p + 1] (bucket (i, j) is
    edges offsets[i·p + j] .. offsets[i·p + j + 1]) and `path` (pairs of the store's index dtype)."""

    def __init__(self, store, p, path, offsets):
        self.store, self.p, self.path = store, int(p), Path(path)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.bounds = physical_offsets(store, p)
        self.dtype = np.dtype(store.meta["index_dtype"])
        self.row_bytes = 2 * self.dtype.itemsize

    @staticmethod
    def location(store, p) -> Path:
        return store.path.parent / f"{store.path.name}.buckets-p{int(p)}"

    @classmethod
    def of(cls, store, p, progress=False) -> "EdgeBuckets":
        """The store's buckets at `p` partitions, written on first use (one pass over indices.bin to
        count, one to place; O(N + chunk) memory besides the output)."""
        where = cls.location(store, p)
        found = cls._open(store, p, where)
        if found is not None:
            return found
        with writing(where, "edge buckets", wait=True):      # two runs on a fresh store: one writes
            found = cls._open(store, p, where)
            if found is not None:
                return found
            tmp = temp_path(where)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            offsets = cls._write(store, p, tmp, progress)
            meta = {"format": "oocgnn-buckets", "version": VERSION, "p": int(p),
                    "store_checksum": store.meta["checksum"], "num_edges": int(store.num_edges),
                    "bounds": physical_offsets(store, p).tolist()}
            np.save(tmp / "offsets.npy", offsets)
            (tmp / "meta.json").write_text(json.dumps(meta))
            swap_in(tmp, where)
        return cls(store, p, where / "edges.bin", offsets)

    @classmethod
    def _open(cls, store, p, where):
        """The buckets at `where` if they were written for this very store and p, else None."""
        try:
            meta = json.loads((where / "meta.json").read_text())
            offsets = np.load(where / "offsets.npy")
        except (OSError, ValueError):
            return None
        isz = np.dtype(store.meta["index_dtype"]).itemsize
        if (meta.get("format") != "oocgnn-buckets" or meta.get("version") != VERSION or meta.get("p") != p
                or meta.get("store_checksum") != store.meta["checksum"]
                or meta.get("bounds") != physical_offsets(store, p).tolist()
                or len(offsets) != p * p + 1 or offsets[-1] != store.num_edges
                or os.path.getsize(where / "edges.bin") != store.num_edges * 2 * isz):
            return None
        return cls(store, p, where / "edges.bin", offsets)

    @staticmethod
    def _write(store, p, tmp, progress):
        from tqdm.auto import tqdm
        bounds = physical_offsets(store, p)
        part_of = np.repeat(np.arange(p, dtype=np.int64), np.diff(bounds))
        csr, indptr = CSRSource.of(store), np.asarray(store.indptr, dtype=np.int64)
        dtype = np.dtype(store.meta["index_dtype"])

        def keyed():
            for lo, hi, idx in csr.chunks():
                keys = np.empty(len(idx), np.int64)
                _bucket_keys(lo, np.diff(indptr[lo:hi + 1]), idx, part_of, bounds, p, keys)
                yield lo, hi, idx, keys

        counts = np.zeros(p * p, np.int64)
        for _, _, _, keys in keyed():
            counts += np.bincount(keys, minlength=p * p)
        offsets = np.concatenate(([0], np.cumsum(counts)))
        out = np.lib.format.open_memmap(tmp / "edges.npy", mode="w+", dtype=dtype, shape=(max(1, store.num_edges), 2))
        cursor = offsets[:-1].copy()
        bar = tqdm(total=store.num_edges, desc=f"edge buckets p={p}", unit="edge", disable=not progress, leave=False)
        for lo, hi, idx, keys in keyed():
            src = np.repeat(np.arange(lo, hi, dtype=dtype), np.diff(indptr[lo:hi + 1]))
            _scatter(keys, src, idx, out, cursor)
            bar.update(len(idx))
        bar.close()
        out.flush()
        header = out.offset
        del out
        with open(tmp / "edges.npy", "rb") as f, open(tmp / "edges.bin", "wb") as g:   # headerless, for O_DIRECT
            f.seek(header)
            shutil.copyfileobj(f, g, 16 << 20)
        os.remove(tmp / "edges.npy")
        return offsets

    # -- what a buffer reads ----------------------------------------------------------------------
    def pairs(self, state, held=()) -> list:
        """Buckets (i, j) among the partitions `state` that a buffer holding `held` lacks, in file order."""
        new = set(state) - set(held)
        return sorted((i, j) for i in state for j in state if i in new or j in new)

    def ranges(self, pairs) -> list:
        """[(lo, hi)] edge ranges reading `pairs` (in file order) needs: adjacent buckets coalesced,
        empty ones skipped."""
        out = []
        for i, j in sorted(pairs):
            lo, hi = int(self.offsets[i * self.p + j]), int(self.offsets[i * self.p + j + 1])
            if hi == lo:
                continue
            if out and out[-1][1] == lo:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out

    def reads(self, pairs) -> tuple[int, int, int]:
        """(edges, pages, requests) of reading `pairs` as `read` does (`io.range_chunks` of each range)."""
        edges = pages = requests = 0
        for lo, hi in self.ranges(pairs):
            edges += hi - lo
            for a, b in range_chunks(lo, hi, self.row_bytes):
                first, last = page_span(a * self.row_bytes, (b - a) * self.row_bytes)
                pages += int(last - first + 1)
                requests += range_requests(int(last - first + 1))
        return edges, pages, requests

    def reader(self):
        """A DirectReader whose rows are the file's (u, w) pairs."""
        return DirectReader(self.path, self.store.num_edges, 2, dtype=self.dtype, row_stride=self.row_bytes)

    def read(self, pairs, reader) -> dict:
        """{(i, j): int [m, 2] pairs} of `pairs`, read sequentially range by range through `reader`."""
        got = {}
        for lo, hi in self.ranges(pairs):
            data = np.concatenate([reader.read_range(a, b) for a, b in range_chunks(lo, hi, self.row_bytes)])
            for i, j in pairs:
                a, b = int(self.offsets[i * self.p + j]), int(self.offsets[i * self.p + j + 1])
                if lo <= a and b <= hi:
                    got[i, j] = data[a - lo:b - lo]
        empty = np.empty((0, 2), self.dtype)
        return {pair: got.get(pair, empty) for pair in pairs}

    def nbytes_of(self, buckets) -> int:
        return sum(b.nbytes for b in buckets.values())


@numba.njit(nogil=True, cache=True)
def _count(pairs, shift, counts):
    for e in range(len(pairs)):
        counts[pairs[e, 0] - shift + 1] += 1


@numba.njit(nogil=True, cache=True)
def _fill(pairs, src_shift, dst_shift, cursor, indices):
    for e in range(len(pairs)):                  # stable: a node's entries keep the buckets' order
        v = pairs[e, 0] - src_shift
        indices[cursor[v]] = pairs[e, 1] - dst_shift
        cursor[v] += 1


def buffer_csc(buckets: EdgeBuckets, state, held: dict) -> tuple:
    """(visible, (indptr int64, indices int32)): the sorted ids of the partitions `state` and the
    subgraph they induce in local ids, from the buckets `held` ({(i, j): pairs}) among them, taken
    in (i, j) order: each node's list filtered to the buffer, in its order (`sampler.induced_csc`'s).
    Bucket by bucket, in place: the result is all it allocates (a concatenation of the buckets and its
    int64 columns were three times the buckets' bytes, on every state change)."""
    state = sorted(state)
    bounds = buckets.bounds
    lo, hi = bounds[state], bounds[np.asarray(state) + 1]
    base = np.concatenate(([0], np.cumsum(hi - lo))).astype(np.int64)
    visible = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo, hi)]) if state else \
        np.empty(0, np.int64)
    shift = {k: int(lo[a]) - int(base[a]) for a, k in enumerate(state)}   # global id - shift = local id
    n = int(base[-1])
    indptr = np.zeros(n + 1, np.int64)
    for i in state:
        for j in state:
            if len(held[i, j]):
                _count(held[i, j], shift[i], indptr)
    np.cumsum(indptr, out=indptr)
    indices, cursor = np.empty(int(indptr[-1]), np.int32), indptr[:-1].copy()
    for i in state:
        for j in state:
            if len(held[i, j]):
                _fill(held[i, j], shift[i], shift[j], cursor, indices)
    return visible, (indptr, indices)
