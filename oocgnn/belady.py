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

`BeladyReplay` (the `belady` cache policy) counts the same hits faster: a reverse scan gives
each access the position of the next access of its id, a cached row is the bit of its next
access position in a two-level bitmap (a hit tests the bit of the current position, eviction
takes the highest set bit), so a replay touches no per-node array.
"""
from __future__ import annotations

import numba
import numpy as np

from .trace import Trace, new_pages

MSB, LOW, DUMMY = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0xFFFFFFFF)
INF = 0x7FFFFFFF                      # DUMMY with its MSB masked: "not accessed again"


@numba.njit(cache=True)
def _index(offsets, ids, s, e, count, ptr):
    """Passes 1–2 over iterations [s, e): (iters, nodes in first-access order); ptr[v] = v's start.
    `count` must be zero on entry."""
    first = np.empty(min(len(count), offsets[e] - offsets[s]), np.int64)
    n = 0
    for p in range(offsets[s], offsets[e]):          # pass 1: count appearances
        v = ids[p]
        if count[v] == 0:
            first[n] = v
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
def _init_heap(iters, first, ptr, hk, hn, pos, size):
    """Ginex's init, the first `size` distinct nodes, keyed by their first access. The marker-bit
    fix: that entry is a segment start, so its MSB is masked."""
    for j in range(size):
        v = first[j]
        hk[j], hn[j], pos[v] = np.int64(iters[ptr[v]] & LOW), v, j
    for j in range(size // 2 - 1, -1, -1):
        _sift_down(hk, hn, pos, j, size)


@numba.njit(cache=True)
def _pass3(offsets, ids, lo, hi, iters, ptr, hk, hn, pos, st, cap, hits, rin, rpos, rout, oin, oout):
    """Pass 3 over iterations [lo, hi): hits and the changesets (in, positions, out) as CSR."""
    dummy, size, ni, no = len(iters) - 1, st[0], 0, 0
    ins = np.full(len(pos), -1, np.int64)            # iteration that admitted a node
    width = 0
    for i in range(lo, hi):
        width = max(width, offsets[i + 1] - offsets[i])
    mv, mk, mp = np.empty(width, np.int64), np.empty(width, np.int64), np.empty(width, np.int64)
    for i in range(lo, hi):
        a, nm, h = offsets[i], 0, 0
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
                mv[nm], mk[nm], mp[nm] = v, nk, p - a
                nm += 1
        hits[i - lo] = h
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
                if ins[old] != i:                     # evicted from C_i (not admitted just now)
                    rout[no] = old
                    no += 1
                hk[0], hn[0] = nk, v
                _sift_down(hk, hn, pos, 0, size)
            else:
                continue
            ins[v] = i
        for m in range(nm):
            if pos[mv[m]] >= 0:
                rin[ni], rpos[ni] = mv[m], mp[m]
                ni += 1
        oin[i - lo + 1], oout[i - lo + 1] = ni, no
    st[0] = size


def belady_changesets(trace: Trace, capacity: int, start=0, stop=None, prefetch=True):
    """Ginex's changesets for the superbatch of iterations [start, stop) in O(S) passes.

    Returns (initial_cache_ids, [(in_ids, out_ids, positions) per iteration]): after iteration i
    the cache drops `out_ids` and admits `in_ids`, found at `positions` in `trace[i]` (sorted
    ids: the executor maps them to its own batch order). |in| != |out| while the cache is not
    full (Ginex's update assumes a full cache; use a free-slot list). `prefetch=False`: cold start.
    """
    stop, n, cap = len(trace) if stop is None else stop, trace.num_nodes, int(capacity)
    offsets, ids = np.ascontiguousarray(trace.offsets, np.int64), np.ascontiguousarray(trace.ids)
    ptr, pos = np.empty(n, np.int64), np.full(n, -1, np.int64)      # ptr: set for every id seen
    hk, hn = np.zeros(cap, np.int64), np.zeros(cap, np.int64)         # max-heap on next use
    iters, first = _index(offsets, ids, start, stop, np.zeros(n, np.int64), ptr)
    st = np.array([min(cap, len(first)) if prefetch else 0])
    _init_heap(iters, first, ptr, hk, hn, pos, st[0])
    k, acc = stop - start, int(offsets[stop] - offsets[start])
    rin, rpos, rout = np.empty(acc, np.int64), np.empty(acc, np.int64), np.empty(acc + cap, np.int64)
    oin, oout, hits = np.zeros(k + 1, np.int64), np.zeros(k + 1, np.int64), np.zeros(k, np.int64)
    _pass3(offsets, ids, start, stop, iters, ptr, hk, hn, pos, st, cap, hits, rin, rpos, rout, oin, oout)
    init = np.sort(first[:cap]) if prefetch else np.empty(0, np.int64)
    return init, [(rin[oin[j]:oin[j + 1]], np.sort(rout[oout[j]:oout[j + 1]]), rpos[oin[j]:oin[j + 1]])
                  for j in range(k)]


# ---- fast replay: next-access positions + a two-level bitmap --------------------------------
@numba.njit(cache=True)
def _next_positions(ids, base, end, last):
    """nxt[p - base]: position (from base) of the next access of ids[p] before `end`, else INF.
    last[v] (absolute positions) ends as v's first position if v occurs in [base, end)."""
    nxt = np.empty(end - base, np.int32)
    for p in range(end - 1, base - 1, -1):
        v = ids[p]
        nxt[p - base] = last[v] - base if last[v] > p else INF
        last[v] = p
    return nxt


@numba.njit(cache=True, inline="always")
def _bit(x):
    return np.uint64(1) << np.uint64(x & 63)


@numba.njit(cache=True, inline="always")
def _bset(words, summ, x):
    words[x >> 6] |= _bit(x)
    summ[x >> 12] |= _bit(x >> 6)


@numba.njit(cache=True, inline="always")
def _bclear(words, summ, x):
    words[x >> 6] &= ~_bit(x)
    if words[x >> 6] == 0:
        summ[x >> 12] &= ~_bit(x >> 6)


@numba.njit(cache=True, inline="always")
def _msb(x):
    r = 0
    for s in (32, 16, 8, 4, 2, 1):
        if x >> np.uint64(s):
            x >>= np.uint64(s)
            r += s
    return r


@numba.njit(cache=True)
def _bmax(words, summ, m):
    """Highest set bit <= m (one exists)."""
    w = m >> 6
    x = words[w] & ((np.uint64(2) << np.uint64(m & 63)) - np.uint64(1))
    if x:
        return (w << 6) + _msb(x)
    sw = w >> 6
    y = summ[sw] & (_bit(w) - np.uint64(1))
    while not y:
        sw -= 1
        y = summ[sw]
    w = (sw << 6) + _msb(y)
    return (w << 6) + _msb(words[w])


@numba.njit(cache=True)
def _fast_start(ids, base, end, last, words, summ, st, infs, cap, prefetch):
    """Ginex's init (first `cap` distinct ids) or the carried-over rows keyed by first access."""
    nb, ninf, top = 0, st[1], -1
    if prefetch:
        ninf = 0
        init = np.empty(min(cap, end - base), np.int64)
        for p in range(base, end):
            if nb == cap:
                break
            if last[ids[p]] == p:
                _bset(words, summ, p - base)
                init[nb], top = ids[p], p - base
                nb += 1
        st[0], st[1], st[2] = nb, 0, top
        return init[:nb]
    k = 0
    for j in range(ninf):
        v = infs[j]
        if last[v] >= base:
            _bset(words, summ, last[v] - base)
            top = max(top, last[v] - base)
            nb += 1
        else:
            infs[k] = v
            k += 1
    st[0], st[1], st[2] = nb, k, top
    return infs[:0]


@numba.njit(cache=True)
def _fast_run(offsets, ids, base, lo, hi, nxt, words, summ, st, infs, cap, stride, rbytes, hits, pages):
    """Iterations [lo, hi): hits first (keys move to the next access), then admit the misses."""
    nb, ninf, top = st[0], st[1], st[2]
    width = 0
    for i in range(lo, hi):
        width = max(width, offsets[i + 1] - offsets[i])
    miss = np.empty(width, np.int64)
    for i in range(lo, hi):
        h, pg, last, nm = 0, 0, -1, 0
        for p in range(offsets[i], offsets[i + 1]):
            r = p - base
            if words[r >> 6] & _bit(r):
                h += 1
                _bclear(words, summ, r)
                n = nxt[r]
                if n != INF:
                    _bset(words, summ, n)
                    top = max(top, n)
                else:                                 # kept while there is room, evicted first
                    infs[ninf] = ids[p]
                    ninf += 1
                    nb -= 1
            else:
                k, last = new_pages(np.int64(ids[p]), last, stride, rbytes)
                pg += k
                miss[nm] = r
                nm += 1
        hits[i - lo], pages[i - lo] = h, pg
        for m in range(nm):
            r = miss[m]
            n = nxt[r]
            if nb + ninf < cap:
                if n == INF:
                    infs[ninf] = ids[r + base]
                    ninf += 1
                else:
                    _bset(words, summ, n)
                    top = max(top, n)
                    nb += 1
            elif n == INF:
                continue
            elif ninf > 0:
                ninf -= 1
                _bset(words, summ, n)
                top = max(top, n)
                nb += 1
            elif nb > 0:
                top = _bmax(words, summ, top)
                if n < top:
                    _bclear(words, summ, top)
                    _bset(words, summ, n)
    st[0], st[1], st[2] = nb, ninf, top


class BeladyReplay:
    """Belady replay state over one trace: `start(s, e)` opens a superbatch (returns its init
    prefetch), `run(lo, hi)` -> (hits, missed pages) of iterations inside it."""

    def __init__(self, trace: Trace, capacity: int, prefetch=True):
        self.trace, self.cap, self.prefetch = trace, int(capacity), bool(prefetch)
        self.offsets = np.ascontiguousarray(trace.offsets, dtype=np.int64)
        self.ids = np.ascontiguousarray(trace.ids)
        self.last = np.full(trace.num_nodes, -1, np.int64)
        self.infs, self.st = np.zeros(self.cap, np.int64), np.zeros(3, np.int64)
        self.base, self.words = 0, np.zeros(1, np.uint64)               # no superbatch opened yet

    def start(self, s: int, e: int) -> np.ndarray:
        self.base, end = int(self.offsets[s]), int(self.offsets[e])
        if end - self.base >= INF:
            raise ValueError(f"a superbatch must hold < {INF} accesses; use a shorter horizon")
        self.nxt = _next_positions(self.ids, self.base, end, self.last)
        words = (end - self.base + 63) // 64 + 1
        self.words, self.summ = np.zeros(words, np.uint64), np.zeros(words // 64 + 1, np.uint64)
        init = _fast_start(self.ids, self.base, end, self.last, self.words, self.summ, self.st, self.infs,
                           self.cap, self.prefetch)
        return np.sort(init)

    def run(self, lo: int, hi: int):
        hits, pages = np.zeros(hi - lo, np.int64), np.zeros(hi - lo, np.int64)
        _fast_run(self.offsets, self.ids, self.base, lo, hi, self.nxt, self.words, self.summ, self.st,
                  self.infs, self.cap, self.trace.row_stride, self.trace.row_bytes, hits, pages)
        return hits, pages

    def contents(self) -> np.ndarray:
        bits = np.flatnonzero(np.unpackbits(self.words.view(np.uint8), bitorder="little"))
        return np.sort(np.concatenate([self.ids[self.base + bits], self.infs[:self.st[1]]]))


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
