"""Belady's optimal feature cache over a known future, and Ginex's changeset precomputation (§3.4).

Iteration-granular protocol (Ginex §3.4): hits_i = |ids_i ∩ C_i|, then
C_{i+1} = f_Belady(C_i ∪ ids_i): the `capacity` candidates used earliest in the future (a missed
row is in memory during its iteration, so admitting it costs no I/O; bypass is allowed).

`belady_changesets` follows the digest (papers/ginex.md §2.5) on the CPU:
- passes 1–2 build `iters`, the CSR of the node × iteration access matrix of a superbatch, with
  the MSB of each node's first entry set as a segment marker and a DUMMY ("never again") at the
  end. Segments are laid out in first-access order, so no O(N) prefix sum is needed and
  `init` (the first `capacity` distinct nodes, Ginex's `pass_1_and_2`) falls out of pass 1;
- pass 3 advances ptr[v] for each accessed node (onto DUMMY when it steps onto a marker) and keeps
  the cache in a max-heap on next use (digest §8.1 item 5: O(|ids| log N) per iteration).
  The marker-bit fix: next-use values are read with the MSB masked (a cached node not yet
  accessed still points at its marked first entry).
`belady_naive` is the O(S²) reference that rescans the future at every step.
"""
from __future__ import annotations

import numba
import numpy as np

from .trace import Trace, new_pages

MSB, LOW, DUMMY = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0xFFFFFFFF)
INF = 0x7FFFFFFF                      # DUMMY with its MSB masked: "not accessed again"


@numba.njit(cache=True)
def _index(offsets, ids, s, e, stamp, sb, count, ptr):
    """Passes 1–2 over iterations [s, e): (iters, nodes in first-access order); ptr[v] = v's start."""
    first = np.empty(min(len(stamp), offsets[e] - offsets[s]), np.int64)
    n = 0
    for p in range(offsets[s], offsets[e]):          # pass 1: count appearances
        v = ids[p]
        if stamp[v] != sb:
            stamp[v], count[v], first[n] = sb, 0, v
            n += 1
        count[v] += 1
    total = 0
    for j in range(n):                                # exclusive prefix sum, first-access order
        v = first[j]
        ptr[v] = total
        total += count[v]
    iters = np.empty(total + 1, np.uint32)
    for i in range(s, e):                             # pass 2: fill
        for p in range(offsets[i], offsets[i + 1]):
            v = ids[p]
            iters[ptr[v]] = i - s
            ptr[v] += 1
    for j in range(n):                                # restore segment starts, mark them
        v = first[j]
        ptr[v] -= count[v]
        iters[ptr[v]] |= MSB
    iters[total] = DUMMY
    return iters, first[:n]


@numba.njit(cache=True)
def _sift_up(hk, hn, pos, j):
    k, v = hk[j], hn[j]
    while j > 0:
        up = (j - 1) >> 1
        if hk[up] >= k:
            break
        hk[j], hn[j] = hk[up], hn[up]
        pos[hn[j]] = j
        j = up
    hk[j], hn[j], pos[v] = k, v, j


@numba.njit(cache=True)
def _sift_down(hk, hn, pos, j, size):
    k, v = hk[j], hn[j]
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and hk[c + 1] > hk[c]:
            c += 1
        if hk[c] <= k:
            break
        hk[j], hn[j] = hk[c], hn[c]
        pos[hn[j]] = j
        j = c
    hk[j], hn[j], pos[v] = k, v, j


@numba.njit(cache=True)
def _start(iters, first, stamp, sb, ptr, hk, hn, pos, st, cap, prefetch):
    """Cache at a superbatch start: Ginex's init (prefetch) or the carried-over cache re-keyed."""
    size = st[0]
    if prefetch:
        for j in range(size):
            pos[hn[j]] = -1
        size = min(cap, len(first))
        for j in range(size):
            hn[j] = first[j]
    for j in range(size):                             # marker-bit fix: mask the MSB
        v = hn[j]
        hk[j] = np.int64(iters[ptr[v]] & LOW) if stamp[v] == sb else INF
        pos[v] = j
    for j in range(size // 2 - 1, -1, -1):
        _sift_down(hk, hn, pos, j, size)
    st[0] = size


@numba.njit(cache=True)
def _pass3(offsets, ids, lo, hi, iters, ptr, hk, hn, pos, st, cap, stride, rbytes, hits, pages,
           record, ins, rin, rpos, rout, oin, oout):
    """Iterations [lo, hi) of a superbatch: hits and missed pages; with `record`, the changesets."""
    dummy, size, ni, no = len(iters) - 1, st[0], 0, 0
    width = 0
    for i in range(lo, hi):
        width = max(width, offsets[i + 1] - offsets[i])
    mv, mk, mp = np.empty(width, np.int64), np.empty(width, np.int64), np.empty(width, np.int64)
    for i in range(lo, hi):
        a, nm, h, pg, last = offsets[i], 0, 0, 0, -1
        for p in range(a, offsets[i + 1]):
            v = ids[p]
            q = ptr[v] + 1
            if iters[q] & MSB:                        # stepped into the next node's segment
                q = dummy
            ptr[v] = q
            nk = np.int64(iters[q] & LOW)
            j = pos[v]
            if j >= 0:                                # hit: its next use moves later
                h += 1
                hk[j] = nk
                _sift_up(hk, hn, pos, j)
            else:
                n, last = new_pages(np.int64(v), last, stride, rbytes)
                pg += n
                mv[nm], mk[nm], mp[nm] = v, nk, p - a
                nm += 1
        hits[i - lo], pages[i - lo] = h, pg
        for m in range(nm):                           # admit misses used before the farthest cached
            nk, v = mk[m], mv[m]
            if nk == INF:
                continue
            if size < cap:
                hk[size], hn[size] = nk, v
                _sift_up(hk, hn, pos, size)
                size += 1
            elif size > 0 and nk < hk[0]:
                old = hn[0]
                pos[old] = -1
                if record and ins[old] != i + 1:      # evicted from C_i (not admitted just now)
                    rout[no] = old
                    no += 1
                hk[0], hn[0] = nk, v
                _sift_down(hk, hn, pos, 0, size)
            else:
                continue
            if record:
                ins[v] = i + 1
        if record:
            for m in range(nm):
                if pos[mv[m]] >= 0:
                    rin[ni], rpos[ni] = mv[m], mp[m]
                    ni += 1
            oin[i - lo + 1], oout[i - lo + 1] = ni, no
    st[0] = size


class BeladySim:
    """Belady state over one trace: `start(s, e)` opens a superbatch, `run(lo, hi)` replays part of it."""

    def __init__(self, trace: Trace, capacity: int, prefetch=True):
        n = trace.num_nodes
        self.trace, self.cap, self.prefetch = trace, int(capacity), bool(prefetch)
        self.offsets = np.ascontiguousarray(trace.offsets, dtype=np.int64)
        self.ids = np.ascontiguousarray(trace.ids)
        self.stamp, self.count = np.full(n, -1, np.int64), np.zeros(n, np.int32)
        self.ptr, self.pos = np.zeros(n, np.int64), np.full(n, -1, np.int32)
        self.hk, self.hn = np.zeros(self.cap, np.int64), np.zeros(self.cap, np.int64)
        self.st, self.sb, self.iters, self.ins = np.zeros(1, np.int64), -1, None, None

    def start(self, s: int, e: int) -> np.ndarray:
        """Index iterations [s, e); returns the (sorted) initial cache to prefetch, empty if cold."""
        self.sb += 1
        self.iters, first = _index(self.offsets, self.ids, s, e, self.stamp, self.sb, self.count, self.ptr)
        _start(self.iters, first, self.stamp, self.sb, self.ptr, self.hk, self.hn, self.pos, self.st,
               self.cap, self.prefetch)
        return np.sort(first[:self.st[0]]) if self.prefetch else np.empty(0, np.int64)

    def run(self, lo: int, hi: int, record=False):
        """(hits, pages) of iterations [lo, hi), plus the changesets when `record`."""
        k, acc = hi - lo, int(self.offsets[hi] - self.offsets[lo])
        hits, pages = np.zeros(k, np.int64), np.zeros(k, np.int64)
        if record and self.ins is None:
            self.ins = np.zeros(len(self.pos), np.int64)
        z = np.zeros(0, np.int64)
        rin, rpos, rout = (np.empty(acc, np.int64), np.empty(acc, np.int64),
                           np.empty(acc + self.cap, np.int64)) if record else (z, z, z)
        oin, oout = (np.zeros(k + 1, np.int64), np.zeros(k + 1, np.int64)) if record else (z, z)
        _pass3(self.offsets, self.ids, lo, hi, self.iters, self.ptr, self.hk, self.hn, self.pos, self.st,
               self.cap, self.trace.row_stride, self.trace.row_bytes, hits, pages, record,
               self.ins if record else z, rin, rpos, rout, oin, oout)
        if not record:
            return hits, pages
        sets = [(rin[oin[j]:oin[j + 1]], np.sort(rout[oout[j]:oout[j + 1]]), rpos[oin[j]:oin[j + 1]])
                for j in range(k)]
        return hits, pages, sets

    def contents(self) -> np.ndarray:
        return np.sort(self.hn[:self.st[0]])


def belady_changesets(trace: Trace, capacity: int, start=0, stop=None, prefetch=True):
    """Ginex's changesets for the superbatch of iterations [start, stop) in O(S) passes.

    Returns (initial_cache_ids, [(in_ids, out_ids, positions) per iteration]): after iteration i
    the cache drops `out_ids` and admits `in_ids`, found at `positions` in `trace[i]` (sorted
    ids: the executor maps them to its own batch order). |in| != |out| while the cache is not
    full (Ginex's update assumes a full cache; use a free-slot list). `prefetch=False`: cold start.
    """
    stop = len(trace) if stop is None else stop
    sim = BeladySim(trace, capacity, prefetch)
    init = sim.start(start, stop)
    return init, sim.run(start, stop, record=True)[2]


def belady_naive(trace: Trace, capacity: int, start=0, stop=None, prefetch=True):
    """Reference simulation, same output as `belady_changesets`: every step rescans the future."""
    stop = len(trace) if stop is None else stop
    its = [np.asarray(trace[i], dtype=np.int64) for i in range(start, stop)]
    flat = np.concatenate(its) if its else np.empty(0, np.int64)
    _, first = np.unique(flat, return_index=True)
    init = np.sort(flat[np.sort(first)][:capacity]) if prefetch else np.empty(0, np.int64)
    cache, sets = init, []
    for r, inc in enumerate(its):
        cand = np.union1d(cache, inc)
        nxt, todo = np.full(len(cand), INF, np.int64), np.ones(len(cand), bool)
        for j in range(r + 1, len(its)):              # next use: scan the future, O(S) per step
            found = todo & np.isin(cand, its[j], assume_unique=True)
            nxt[found], todo = j, todo & ~found
            if not todo.any():
                break
        order = np.lexsort((cand, nxt))[:capacity]
        new = np.sort(cand[order][nxt[order] < INF])
        add = np.setdiff1d(new, cache, assume_unique=True)
        sets.append((add, np.setdiff1d(cache, new, assume_unique=True), np.searchsorted(inc, add)))
        cache = new
    return init, sets


def changeset_hits(trace: Trace, init, changesets, capacity: int, start=0) -> np.ndarray:
    """Hits per iteration of applying changesets from `init`; raises if one breaks the protocol."""
    cached = np.zeros(trace.num_nodes, bool)
    cached[np.asarray(init, dtype=np.int64)] = True
    if cached.sum() != len(init) or len(init) > capacity:
        raise ValueError("initial cache has duplicates or exceeds the capacity")
    hits = np.zeros(len(changesets), np.int64)
    for r, (add, out, pos) in enumerate(changesets):
        inc = trace[start + r]
        hits[r] = cached[inc].sum()
        if not np.array_equal(inc[pos], add) or cached[add].any() or not cached[out].all():
            raise ValueError(f"iteration {start + r}: in_ids must be new rows of ids_i, out_ids cached")
        cached[out], cached[add] = False, True
        if cached.sum() > capacity:
            raise ValueError(f"iteration {start + r}: cache exceeds its capacity")
    return hits
