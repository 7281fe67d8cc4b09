"""Feature-cache policies replayed on access traces, all against Belady's optimum.

One contract for every policy (`CACHE_POLICIES[name](capacity, num_nodes, **kw)`), one
iteration-granular protocol (Ginex §3.4): hits_i = |ids_i ∩ C_i|; C_{i+1} ⊆ C_i ∪ ids_i;
|C_{i+1}| ≤ capacity. Evictions happen after the iteration's hits are counted.

- `static-degree` (PaGraph: top degrees, prefetched), `static-frequency` (OUTRE §2.7: top
  profiled counts, filled lazily: a first access is a miss), `lru`, `fifo`, `clock`, `random`,
  `s3fifo` (Yang et al., SOSP'23: small FIFO 10 %, main FIFO with a 2-bit counter, ghost FIFO
  of the main's size), `sieve` (Zhang et al., NSDI'24: one FIFO queue with a visited bit, a hand
  from the oldest evicts the first unvisited; GraphBolt's CPU feature cache default), `belady`
  (Ginex: over a horizon of S iterations with a prefetched init per superbatch, or the whole
  trace; `prefetch=False` starts cold), and `page-lru`: an LRU over 4 KiB pages whose capacity
  is in pages, the OS page cache under mmap.
- A byte budget buys `capacity_from_budget` rows: the N × 4-byte slot table is paid first
  (Ginex and OUTRE count it); `page-lru` gets budget // 4096 pages.
- Rows missed in an iteration are read as their distinct 4 KiB pages (store layout from the
  trace); prefetches (Belady's init, PaGraph's fill) are reported apart as init_rows/pages.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from .belady import BeladyReplay
from .errors import UserError
from .evictions import lru_replay, s3fifo_replay, sieve_replay, slots_replay, static_replay
from .io import PAGE
from .ranking import top_ids
from .trace import Trace, count_pages


def capacity_from_budget(budget_bytes, row_bytes, num_nodes, table_bytes=4) -> int:
    """Rows a budget holds after its address table (num_nodes × table_bytes): Ginex §3.3."""
    return max(0, (int(budget_bytes) - int(num_nodes) * int(table_bytes)) // int(row_bytes))


@dataclasses.dataclass
class CacheResult:
    """Totals of one replay. rows_read = misses; bytes_read = pages × 4096 (what the device moves)."""
    policy: str
    capacity: int
    iterations: int
    accesses: int
    hits: int
    misses: int
    pages_read: int
    bytes_requested: int          # rows_read × row_bytes: useful bytes
    bytes_read: int
    init_rows: int                # prefetched outside the iterations (Belady init, static fill)
    init_pages: int
    seconds: float
    per_iteration: pd.DataFrame | None = None

    @property
    def rows_read(self):
        return self.misses

    @property
    def hit_ratio(self):
        return self.hits / max(1, self.accesses)

    def summary(self, row_bytes) -> dict:
        """One row of a cache comparison: miss ratio (Ginex's metric: the initial fill free), rows read per
        row requested with the fill, pages read with the fill, and read amplification (bytes the device
        moves per useful byte, `row_bytes` a row)."""
        pages = self.pages_read + self.init_pages
        return {"policy": self.policy, "capacity": self.capacity, "miss_ratio": self.misses / self.accesses,
                "read_ratio": (self.misses + self.init_rows) / self.accesses, "pages_read": pages,
                "amplification": pages * PAGE / (self.accesses * row_bytes)}

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "per_iteration"}
        return {**d, "rows_read": self.misses, "hit_ratio": self.hit_ratio, "init_bytes": self.init_pages * PAGE,
                "total_rows": self.misses + self.init_rows, "total_pages": self.pages_read + self.init_pages}


class CachePolicy:
    """Base: `begin(trace)` resets the state, `run(lo, hi)` replays iterations lo..hi-1 and returns
    per-iteration (hits, missed pages, init rows, init pages); `contents()` -> sorted cached ids."""
    name, unit = "base", "row"

    def __init__(self, capacity, num_nodes):
        self.capacity, self.num_nodes = int(capacity), int(num_nodes)
        if self.capacity < 0 or self.num_nodes < 1:
            raise UserError(f"cache capacity must be >= 0 and num_nodes >= 1, got {capacity}, {num_nodes}")
        self.trace = None

    @classmethod
    def from_budget(cls, budget_bytes, row_bytes, num_nodes, table_bytes=4, **kw):
        """The policy that a byte budget buys (`capacity_from_budget` rows)."""
        return cls(capacity_from_budget(budget_bytes, row_bytes, num_nodes, table_bytes), num_nodes, **kw)

    def begin(self, trace: Trace):
        if trace.num_nodes != self.num_nodes:
            raise UserError(f"trace has {trace.num_nodes} nodes, the cache was built for {self.num_nodes}")
        self.trace = trace
        self.offsets = np.ascontiguousarray(trace.offsets, dtype=np.int64)
        self.ids = np.ascontiguousarray(trace.ids)
        self.layout = (trace.row_stride, trace.row_bytes)
        self.prefetched = np.empty(0, np.int64)     # ids of the latest prefetch (init): the whole cache
        self.prefetch_at = -1                       # the iteration it was made before
        self.reset()

    def run(self, lo, hi):
        k = hi - lo
        hits, pages, init = np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros((2, k), np.int64)
        self._run(lo, hi, hits, pages, init)
        return hits, pages, init[0], init[1]

    def __repr__(self):
        return f"{type(self).__name__}({self.capacity}, {self.num_nodes})"


# ---- LRU, FIFO over rows, LRU over pages ----------------------------------------------------
class LRUCache(CachePolicy):
    """Least recently used at iteration granularity; within an iteration, ids in id order."""
    name, move, paged = "lru", True, False

    def reset(self):
        stride, rbytes = self.layout
        n = ((self.num_nodes - 1) * stride + rbytes - 1) // PAGE + 1 if self.paged else self.num_nodes
        self.stamp, self.st = np.full(n, -1, np.int32), np.array([0, 0, -1, 0], np.int64)

    def _run(self, lo, hi, hits, pages, init):
        lru_replay(self.offsets, self.ids, lo, hi, self.stamp, self.st, self.capacity, self.move, self.paged,
             *self.layout, hits, pages)

    def contents(self):
        return np.flatnonzero(self.stamp >= 0)


class FIFOCache(LRUCache):
    """First in, first out: hits do not reorder."""
    name, move = "fifo", False


class PageLRUCache(LRUCache):
    """LRU over 4 KiB pages (the OS page cache under mmap): capacity in pages, a miss loads whole
    pages; a row hits when all its pages are resident. `contents()` are page ids."""
    name, paged, unit = "page-lru", True, "page"

    @classmethod
    def from_budget(cls, budget_bytes, row_bytes, num_nodes, table_bytes=0, **kw):
        return cls(int(budget_bytes) // PAGE, num_nodes, **kw)


# ---- slot-array policies: CLOCK, random ----------------------------------------------------
class ClockCache(CachePolicy):
    """CLOCK: a hand sweeps the slots, clearing reference bits, and replaces the first unreferenced."""
    name, clock = "clock", True

    def __init__(self, capacity, num_nodes, seed=0):
        super().__init__(capacity, num_nodes)
        self.seed = int(seed)

    def reset(self):
        self.slot, self.where = np.zeros(self.capacity, np.int64), np.full(self.num_nodes, -1, np.int32)
        self.ref = np.zeros(self.num_nodes, np.uint8)
        self.st = np.array([0, 0, (self.seed * 0x9E3779B97F4A7C15 + 1) % (1 << 63) or 1], np.int64)

    def _run(self, lo, hi, hits, pages, init):
        slots_replay(self.offsets, self.ids, lo, hi, self.slot, self.where, self.ref, self.st, self.capacity,
               self.clock, *self.layout, hits, pages)

    def contents(self):
        return np.sort(self.slot[:self.st[0]])


class RandomCache(ClockCache):
    """Random replacement (seeded): a miss replaces a uniformly chosen slot once full."""
    name, clock = "random", False


# ---- S3-FIFO ---------------------------------------------------------------------------------
class S3FIFOCache(CachePolicy):
    name = "s3fifo"

    def reset(self):
        n = self.num_nodes
        self.nxt = np.concatenate([np.zeros(n, np.int32), np.arange(n, n + 3, dtype=np.int32)])
        self.prv = self.nxt.copy()
        self.where, self.freq = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        self.st = np.zeros(3, np.int64)

    def _run(self, lo, hi, hits, pages, init):
        s3fifo_replay(self.offsets, self.ids, lo, hi, self.nxt, self.prv, self.where, self.freq, self.st,
                self.capacity, *self.layout, hits, pages)

    def contents(self):
        return np.flatnonzero((self.where == 1) | (self.where == 2))


# ---- SIEVE ---------------------------------------------------------------------------------
class SieveCache(CachePolicy):
    """SIEVE: FIFO order with lazy promotion (a visited bit, no move on a hit) and quick demotion (new
    objects meet the hand before the survivors behind it)."""
    name = "sieve"

    def reset(self):
        n = self.num_nodes
        self.nxt = np.full(n + 1, n, np.int32)         # the sentinel n linked to itself: an empty queue
        self.prv = self.nxt.copy()
        self.held, self.visited = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        self.st = np.array([0, n], np.int64)           # size, hand (at the sentinel: start at the tail)

    def _run(self, lo, hi, hits, pages, init):
        sieve_replay(self.offsets, self.ids, lo, hi, self.nxt, self.prv, self.held, self.visited, self.st,
               self.capacity, *self.layout, hits, pages)

    def contents(self):
        return np.flatnonzero(self.held)


# ---- static caches -------------------------------------------------------------------------
class StaticCache(CachePolicy):
    """The `capacity` highest-scoring nodes (ties to the smaller id), never replaced.
    fill="prefetch" loads them before iteration 0 (reported as init); "lazy" on first miss."""
    name, fill, score_kw = "static", "prefetch", "score"

    def __init__(self, capacity, num_nodes, fill=None, **kw):
        super().__init__(capacity, num_nodes)
        score = kw.get(self.score_kw)
        if score is None or len(score) != num_nodes:
            raise UserError(f"{self.name} needs {self.score_kw}= (an array of {num_nodes} values)")
        self.fill = fill or self.fill
        if self.fill not in ("prefetch", "lazy"):
            raise UserError(f"fill must be 'prefetch' or 'lazy', got {self.fill!r}")
        self.static_ids = top_ids(score, self.capacity)

    def reset(self):
        self.member, self.inc = np.zeros(self.num_nodes, np.uint8), np.zeros(self.num_nodes, np.uint8)
        self.member[self.static_ids] = 1
        if self.fill == "prefetch":
            self.inc[self.static_ids] = 1

    def _run(self, lo, hi, hits, pages, init):
        if lo == 0 and hi > 0 and self.fill == "prefetch":
            self.prefetched, self.prefetch_at = self.static_ids, 0
            init[:, 0] = len(self.static_ids), count_pages(self.static_ids, *self.layout)
        static_replay(self.offsets, self.ids, lo, hi, self.member, self.inc, *self.layout, hits, pages)

    def contents(self):
        return np.flatnonzero(self.inc)


class DegreeCache(StaticCache):
    """PaGraph: the highest-degree nodes, prefetched. Needs degrees=."""
    name, score_kw = "static-degree", "degrees"


class FrequencyCache(StaticCache):
    """OUTRE: the most accessed nodes of a profiling run (`Trace.counts()`), filled lazily. Needs counts=."""
    name, fill, score_kw = "static-frequency", "lazy", "counts"


# ---- Belady --------------------------------------------------------------------------------
class BeladyCache(CachePolicy):
    """Belady over a horizon of `horizon` iterations (a superbatch; None = the whole trace).
    prefetch=True: each superbatch starts from Ginex's init (first `capacity` distinct ids); the rows
    of it not cached already are read before it and reported as init; prefetch=False: cold start,
    and rows cached at a superbatch's end stay, re-keyed by their first access in the next one."""
    name = "belady"

    def __init__(self, capacity, num_nodes, horizon=None, prefetch=True):
        super().__init__(capacity, num_nodes)
        self.horizon, self.prefetch = (None if horizon is None else int(horizon)), bool(prefetch)
        if self.horizon is not None and self.horizon < 1:
            raise UserError(f"Belady horizon must be >= 1 iterations, got {horizon}")

    def reset(self):
        self.sim = BeladyReplay(self.trace, self.capacity, self.prefetch)
        self.sb_end = 0

    def _run(self, lo, hi, hits, pages, init):
        s = self.horizon or max(1, len(self.trace))
        i = lo
        while i < hi:
            if i == self.sb_end:                    # superbatch start: index it, prefetch init
                self.sb_end = min(len(self.trace), i + s)
                held = self.sim.contents()
                first = self.sim.start(i, self.sb_end)
                if self.prefetch:
                    self.prefetched, self.prefetch_at = first, i
                new = np.setdiff1d(first, held, assume_unique=True)
                if len(new):
                    init[:, i - lo] = len(new), count_pages(new, *self.layout)
            j = min(hi, self.sb_end)
            hits[i - lo:j - lo], pages[i - lo:j - lo] = self.sim.run(i, j)
            i = j

    def contents(self):
        return self.sim.contents()


CACHE_POLICIES = {c.name: c for c in (DegreeCache, FrequencyCache, LRUCache, FIFOCache, ClockCache,
                                      S3FIFOCache, SieveCache, RandomCache, BeladyCache, PageLRUCache)}


def make_cache(name, capacity, num_nodes, **kw) -> CachePolicy:
    if name not in CACHE_POLICIES:
        raise UserError(f"unknown cache policy {name!r}; choose from {', '.join(CACHE_POLICIES)}")
    return CACHE_POLICIES[name](capacity, num_nodes, **kw)


def cache_for_budget(name, budget_bytes, store, counts=None, **kw) -> CachePolicy:
    """The policy `name` that `budget_bytes` buy on `store` (its slot table paid first): a degree cache ranks
    by the store's degrees, a frequency cache by `counts` (a profiled epoch's, `Trace.counts`)."""
    if name not in CACHE_POLICIES:
        raise UserError(f"unknown cache policy {name!r}; choose from {', '.join(CACHE_POLICIES)}")
    if name == "static-degree":
        kw["degrees"] = store.degrees()
    if name == "static-frequency":
        kw["counts"] = counts
    return CACHE_POLICIES[name].from_budget(budget_bytes, store.row_bytes, store.num_nodes, **kw)


def replay(trace: Trace, policy: CachePolicy, per_iteration=False, stream="features") -> CacheResult:
    """Replay a trace (stream "features" or "neighbours") through a policy from an empty state."""
    trace = trace.stream(stream)
    t = time.perf_counter()
    policy.begin(trace)
    hits, pages, irows, ipages = policy.run(0, len(trace))
    seconds = time.perf_counter() - t
    sizes = trace.sizes()
    misses = int(sizes.sum() - hits.sum())
    df = None
    if per_iteration:
        df = pd.DataFrame({"accesses": sizes, "hits": hits, "misses": sizes - hits, "pages_read": pages,
                           "init_rows": irows, "init_pages": ipages})
    return CacheResult(policy.name, policy.capacity, len(trace), trace.accesses, int(hits.sum()), misses,
                       int(pages.sum()), misses * trace.row_bytes, int(pages.sum()) * PAGE,
                       int(irows.sum()), int(ipages.sum()), seconds, df)
