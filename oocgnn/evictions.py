"""The cache policies' replay kernels (numba), one per eviction rule, over a trace's iterations lo..hi-1: each
counts an iteration's hits against the cache as it was, its missed rows' new 4 KiB pages, then admits and evicts
(`cache` holds the policies that call them and their contract)."""
import numba
import numpy as np

from .io import page_span
from .trace import new_pages

@numba.njit(cache=True, inline="always")
def _span(v, paged, stride, rbytes):
    """Keys of row v: itself, or its first and last 4 KiB page."""
    if paged:
        return page_span(v * stride, rbytes)
    return v, v


@numba.njit(cache=True)
def lru_replay(offsets, ids, lo, hi, stamp, st, cap, move, paged, stride, rbytes, hits, pages):
    """stamp[q]: iteration of the last access (LRU, `move`) or of the admission (FIFO) of row q,
    or of page q (`paged`); -1 when not cached. The eviction cursor walks the trace from the oldest
    iteration: an entry whose stamp is still its iteration is the oldest cached (ties in id order,
    as a linked list fed in id order would give), so eviction costs O(1) amortised per access."""
    size, ep, eq, et = st[0], st[1], st[2], st[3]
    for i in range(lo, hi):
        h, pg, last, lastq, last_ok = 0, 0, -1, -1, True
        for p in range(offsets[i], offsets[i + 1]):
            v, ok = np.int64(ids[p]), True
            first, end = _span(v, paged, stride, rbytes)
            for q in range(first, end + 1):
                if q == lastq:                      # rows are sorted: a shared page is the last one
                    ok = ok and last_ok
                    continue
                hit = stamp[q] >= 0
                if not hit:
                    size += 1
                if move or not hit:
                    stamp[q] = i
                if paged:
                    pg += not hit
                    lastq, last_ok = q, hit
                ok = ok and hit
            h += ok
            if not ok and not paged:
                n, last = new_pages(v, last, stride, rbytes)
                pg += n
        hits[i - lo], pages[i - lo] = h, pg
        while size > cap:                           # evict after counting: hits are against C_i
            while ep >= offsets[et + 1]:
                et += 1
            first, end = _span(np.int64(ids[ep]), paged, stride, rbytes)
            q = max(first, eq)
            if stamp[q] == et:
                stamp[q] = -1
                size -= 1
            eq = q + 1
            if eq > end:
                ep, eq = ep + 1, -1
    st[0], st[1], st[2], st[3] = size, ep, eq, et


@numba.njit(cache=True)
def slots_replay(offsets, ids, lo, hi, slot, where, ref, st, cap, clock, stride, rbytes, hits, pages):
    """CLOCK (second chance, hits set a reference bit) or random replacement over `cap` slots."""
    size, hand, rng = st[0], st[1], np.uint64(st[2])
    miss = np.empty(0 if hi <= lo else np.max(offsets[lo + 1:hi + 1] - offsets[lo:hi]), np.int64)
    for i in range(lo, hi):
        h, pg, last, nm = 0, 0, -1, 0
        for p in range(offsets[i], offsets[i + 1]):
            v = np.int64(ids[p])
            if where[v] >= 0:
                h += 1
                ref[v] = 1
            else:
                n, last = new_pages(v, last, stride, rbytes)
                pg += n
                miss[nm] = v
                nm += 1
        hits[i - lo], pages[i - lo] = h, pg
        for m in range(nm if cap > 0 else 0):
            v = miss[m]
            if size < cap:
                j = size
                size += 1
            else:
                if clock:
                    while ref[slot[hand]]:
                        ref[slot[hand]] = 0
                        hand = (hand + 1) % cap
                    j = hand
                    hand = (hand + 1) % cap
                else:                              # xorshift64*: a seeded, self-contained stream
                    rng ^= rng >> np.uint64(12)
                    rng ^= rng << np.uint64(25)
                    rng ^= rng >> np.uint64(27)
                    j = np.int64((rng * np.uint64(2685821657736338717)) % np.uint64(cap))
                where[slot[j]] = -1
            slot[j], where[v], ref[v] = v, j, 0
    st[0], st[1], st[2] = size, hand, np.int64(rng)


@numba.njit(cache=True, inline="always")
def _unlink(nxt, prv, v):
    nxt[prv[v]], prv[nxt[v]] = nxt[v], prv[v]


@numba.njit(cache=True, inline="always")
def _push(nxt, prv, head, v):
    nxt[v], prv[v] = nxt[head], head
    prv[nxt[head]] = v
    nxt[head] = v


@numba.njit(cache=True)
def _evict_main(nxt, prv, where, freq, hm):
    """Main FIFO as a 2-bit CLOCK: reinsert the tail while its counter is > 0 (decrementing it)."""
    while True:
        u = prv[hm]
        _unlink(nxt, prv, u)
        if freq[u] == 0:
            where[u] = 0
            return
        freq[u] -= 1
        _push(nxt, prv, hm, u)


@numba.njit(cache=True)
def s3fifo_replay(offsets, ids, lo, hi, nxt, prv, where, freq, st, cap, stride, rbytes, hits, pages):
    """S3-FIFO (Yang et al. SOSP'23, Alg. 1). where: 0 out, 1 small, 2 main, 3 ghost."""
    n = len(where)
    hs, hm, hg = n, n + 1, n + 2                    # list heads of S, M, G in one intrusive list
    ss, sm, sg = st[0], st[1], st[2]
    mcap = cap - int(0.1 * cap)                     # main's size, and the ghost's
    miss = np.empty(0 if hi <= lo else np.max(offsets[lo + 1:hi + 1] - offsets[lo:hi]), np.int64)
    for i in range(lo, hi):
        h, pg, last, nm = 0, 0, -1, 0
        for p in range(offsets[i], offsets[i + 1]):
            v = np.int64(ids[p])
            if where[v] == 1 or where[v] == 2:
                h += 1
                freq[v] = min(freq[v] + 1, 3)
            else:
                k, last = new_pages(v, last, stride, rbytes)
                pg += k
                miss[nm] = v
                nm += 1
        hits[i - lo], pages[i - lo] = h, pg
        for m in range(nm if cap > 0 else 0):
            v = miss[m]
            while ss + sm >= cap:                   # evict()
                if ss == 0 or ss < 0.1 * cap:
                    _evict_main(nxt, prv, where, freq, hm)
                    sm -= 1
                    continue
                while ss > 0:                       # evictS: promote if re-used, else to the ghost
                    t = prv[hs]
                    _unlink(nxt, prv, t)
                    ss -= 1
                    if freq[t] > 1:
                        _push(nxt, prv, hm, t)
                        where[t], freq[t] = 2, 0
                        sm += 1
                        if sm > mcap:
                            _evict_main(nxt, prv, where, freq, hm)
                            sm -= 1
                        continue
                    _push(nxt, prv, hg, t)
                    where[t] = 3
                    sg += 1
                    if sg > mcap:
                        u = prv[hg]
                        _unlink(nxt, prv, u)
                        where[u] = 0
                        sg -= 1
                    break
            if where[v] == 3:                       # ghost hit: straight into main
                _unlink(nxt, prv, v)
                sg -= 1
                _push(nxt, prv, hm, v)
                where[v] = 2
                sm += 1
            else:
                _push(nxt, prv, hs, v)
                where[v] = 1
                ss += 1
            freq[v] = 0
    st[0], st[1], st[2] = ss, sm, sg


@numba.njit(cache=True)
def sieve_replay(offsets, ids, lo, hi, nxt, prv, held, visited, st, cap, stride, rbytes, hits, pages):
    """SIEVE (Zhang et al. NSDI'24, Fig. 3): a hit sets the visited bit, a miss enters at the head. To
    evict, the hand walks from the tail (oldest) toward the head, wrapping, clearing visited bits; the
    first unvisited object goes, the hand stays at its newer neighbour. One intrusive list with the
    sentinel len(held): nxt runs from it to the newest, prv to the oldest; a hand at it starts at the tail."""
    sentinel = len(held)
    size, hand = st[0], st[1]
    miss = np.empty(0 if hi <= lo else np.max(offsets[lo + 1:hi + 1] - offsets[lo:hi]), np.int64)
    for i in range(lo, hi):
        h, pg, last, nm = 0, 0, -1, 0
        for p in range(offsets[i], offsets[i + 1]):
            v = np.int64(ids[p])
            if held[v]:
                h += 1
                visited[v] = 1
            else:
                k, last = new_pages(v, last, stride, rbytes)
                pg += k
                miss[nm] = v
                nm += 1
        hits[i - lo], pages[i - lo] = h, pg
        for m in range(nm if cap > 0 else 0):
            v = miss[m]
            if size < cap:
                size += 1
            else:
                u = np.int64(prv[sentinel] if hand == sentinel else hand)
                while visited[u]:
                    visited[u] = 0
                    u = prv[u]
                    if u == sentinel:
                        u = prv[sentinel]
                hand = prv[u]
                _unlink(nxt, prv, u)
                held[u] = 0
            _push(nxt, prv, sentinel, v)
            held[v], visited[v] = 1, 0
    st[0], st[1] = size, hand


@numba.njit(cache=True)
def static_replay(offsets, ids, lo, hi, member, inc, stride, rbytes, hits, pages):
    for i in range(lo, hi):
        h, pg, last = 0, 0, -1
        for p in range(offsets[i], offsets[i + 1]):
            v = np.int64(ids[p])
            if inc[v]:
                h += 1
            else:
                n, last = new_pages(v, last, stride, rbytes)
                pg += n
                inc[v] = member[v]                  # lazy fill: admitted on its first miss
        hits[i - lo], pages[i - lo] = h, pg
