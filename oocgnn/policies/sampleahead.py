"""Sampling ahead: Ginex's superbatches (a Belady cache) and BatchGNN's macrobatches (unions)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..cache import make_cache
from ..errors import UserError
from ..schedules import Step
from ..topology import ginex_score, neighbour_cache
from ..units import format_size
from .base import _EMPTY, Plan, register, setting

class SampleAheadPlan(Plan):
    """Random batches sampled `lookahead` at a time, then fetched for the chunk at once
    (`oocgnn.ahead`): the samples of two chunks (the one training, the one sampled ahead; and the next
    one's first sample) and their changesets are resident, counted here at their bound from the
    fanouts; the scratch that computes a chunk's fetch is working memory, like the sampler's per batch.
    On a link store the batches are of training edges (`edgeschedules.EdgeSchedule`): a batch's seeds are its
    edges' endpoints and negatives, their neighbourhoods sampled and fetched as a node batch's (`batch_seeds`
    bounds them)."""
    lookahead = 1
    default_size = 1              # the chunk size that --superbatch/--macrobatch 0 starts from (`fit_lookahead`)
    fetch_reads_ahead = False     # the chunk's rows are read by the stage's thread, ahead of its steps
    change_bytes = 0              # bytes per sampled input row of a chunk's changesets
    size_flag = ""

    def _neighbour_entries(self):
        isz = np.dtype(self.store.meta["index_dtype"]).itemsize
        return int(self.cfg.neighbour_cache_ratio_of(self.name) * self.budget) // isz

    def sample_rows(self) -> int:
        """Input rows one sampled batch holds at most (`ahead.sample_bound`)."""
        from ..ahead import sample_bound  # torch: imported when used, not with this module
        return sample_bound(self.batch_seeds, self.fanouts, self.store.num_nodes, self.store.num_edges,
                            self.dense)[0]

    def samples_bytes(self, size=None) -> int:
        """Two chunks of `size` (default the plan's) samples and their changesets, and the sample that ends
        the second (`ahead.chunks` sees a chunk end at the next one's first batch), at their bound."""
        from ..ahead import sample_bound  # torch: imported when used, not with this module
        rows, nbytes = sample_bound(self.batch_seeds, self.fanouts, self.store.num_nodes, self.store.num_edges,
                                    self.dense)
        return (2 * (self.lookahead if size is None else size) + 1) * (nbytes + self.change_bytes * rows)

    def memory(self) -> dict:
        return {**super().memory(), "samples": self.samples_bytes()}

    def chunk_fetch(self, items, inputs):
        """The `ChunkFetch` of a chunk's (i, epoch, batch, step, sample) items, from the input rows each
        batch gathers (`inputs`: all of its input rows, or those its history plan needs)."""
        return self.fetcher(inputs)

    def fetch_reader(self, store):
        """The reader that chunks' fetches read through (`fetch_reads_ahead`): its own, so that what fetches
        read is known exactly."""
        return store.reader("direct")

    def fixed_bytes(self, size) -> int:
        """What the plan needs whatever its caches get, with chunks of `size`."""
        return self.resident_bytes() - self.samples_bytes() + self.samples_bytes(size)

    def fitting_size(self) -> int:
        """The chunk size (--superbatch, --macrobatch) the budget holds: the plan's own if it fits, else the
        largest of it halved that does (0: none)."""
        return next((s for s in (self.lookahead // 2 ** k for k in range(0, 40)) if s >= 1
                     and self.fixed_bytes(s) - self.cache_bytes() <= self.budget), 0)

    def fit_lookahead(self, given: int):
        """The chunk size: `given`, or for 0 (the default) `default_size` or the largest halving of it that
        the budget holds (as HierBatching's N_d and Marius's c default to what fits; `describe` reports it)."""
        self.lookahead = given or self.default_size
        if not given:
            self.lookahead = self.fitting_size() or self.default_size   # nothing fits: check_budget says so

    def describe(self):
        return {self.size_flag: self.lookahead}

    def check_budget(self):
        if self.fixed_bytes(self.lookahead) - self.cache_bytes() <= self.budget:
            return super().check_budget()
        fits = self.fitting_size()
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in self.memory().items())
        if not fits:    # the neighbour cache grows with the budget: solve for the budget that holds the rest
            ratio = self.cfg.neighbour_cache_ratio_of(self.name) if self.topology == "disk" else 0.0
            isz = np.dtype(self.store.meta["index_dtype"]).itemsize
            rest = self.fixed_bytes(1) - self.cache_bytes() - self.setup_entries() * isz * (self.topology == "disk")
            need = int(rest / (1 - ratio)) + 1 if ratio < 1 else None
        what = (f"--{self.size_flag} {fits} would fit" if fits else
                f"no {self.size_flag} fits: --memory-budget {format_size(need)} would hold one of 1"
                if need else f"no {self.size_flag} fits: lower --neighbour-cache-ratio")
        raise UserError(f"policy {self.name} with --{self.size_flag} {self.lookahead} needs "
                        f"{format_size(self.fixed_bytes(self.lookahead) - self.cache_bytes())} resident before any "
                        f"feature cache ({parts}, topology {self.topology}) but --memory-budget is "
                        f"{format_size(self.budget)}; {what}")

    def cache_bytes(self) -> int:
        """Bytes of the optional feature cache the budget's remainder buys (0 if none)."""
        return 0


@register
class GinexPlan(SampleAheadPlan):
    """Ginex (§3-4): superbatches of S sampled mini-batches; the neighbour cache (Ginex's out/in-degree
    score, §4) holds lists on a disk topology; a feature cache of what the budget leaves follows the
    Belady changesets of each superbatch (§3.4), executed: switch to its init, then per batch gather
    (misses read, coalesced) and apply its changeset."""
    listed = 4
    tasks = ("node", "link")     # link: batches of training edges, their endpoints' and negatives' samples
    name, source, size_flag = "ginex", "Ginex §3-4", "superbatch"
    io_pattern = "Belady cache misses + superbatch switches, many in flight"
    grid = tuple({"superbatch": s} for s in (2, 4, 16))
    neighbour_cache_default = 0.5   # the artifact README's run gives both caches the same size
    change_bytes = 12             # in ids, out ids and positions, int32, at most one each per input row
    default_size = 16

    @dataclass
    class Options:
        superbatch: int = setting(0, "S: mini-batches sampled ahead of each superbatch's gather (Ginex's "
                                     "artifact default is 1000, its samples on SSD; here they are in RAM); "
                                     "0: 16, or the largest halving of 16 the budget holds (composed: whose "
                                     "samples take at most a quarter of the budget)")

        def __post_init__(self):
            if self.superbatch < 0:
                raise UserError(f"superbatch must be >= 1 mini-batch (0: what fits), got {self.superbatch}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.neighbour_entries = self._neighbour_entries()
        self.cache_rows = 0
        self.lookahead = self.options.superbatch or self.default_size
        self._choose_topology()
        self.fit_lookahead(self.options.superbatch)
        left = self.budget - self.resident_bytes()
        self.cache_rows = int(min(store.num_nodes, max(0, left) // store.row_bytes))
        from ..ahead import BeladyFetch  # torch: imported when used, not with this module
        self.fetcher = BeladyFetch(self.cache_rows)

    def cache_bytes(self):
        return self.cache_rows * self.store.row_bytes

    @cached_property
    def neighbour_ids(self) -> np.ndarray:
        """Ginex's neighbour cache: lists by out-degree / in-degree while they fit its share of the budget."""
        isz = np.dtype(self.store.meta["index_dtype"]).itemsize
        return np.sort(neighbour_cache(self.store, ginex_score(self.store), self.neighbour_entries * isz))

    def setup(self):
        if self.topology == "memory":
            return [Step(seeds=_EMPTY, enter_ranges=[(0, self.store.num_nodes)], data=("adjacency",))]
        return [Step(seeds=_EMPTY, enter_ids=self.neighbour_ids, data=("adjacency",))] if self.neighbour_entries else []

    def setup_entries(self):
        return self.neighbour_entries

    def capacity(self):
        return self.cache_rows

    def dynamic_rows(self):
        return self.cache_rows


@register
class MacrobatchPlan(SampleAheadPlan):
    """BatchGNN (§4): macrobatches of k sampled mini-batches share one deduplicated, coalesced fetch of
    their input rows' union (into one of two buffers: the next macrobatch is sampled and fetched while
    this one trains); optionally the budget's remainder holds a static cache of the highest-degree rows
    (PaGraph's), which the fetches skip."""
    listed = 5
    tasks = ("node", "link")     # link: a macrobatch fetches the union of its edge batches' samples
    name, source, size_flag = "macrobatch", "BatchGNN §4", "macrobatch"
    io_pattern = "one coalesced union read per macrobatch, in the background"
    grid = tuple({"macrobatch": k} for k in (1, 2, 4, 8))
    fetch_reads_ahead, pipeline = True, True
    default_size = 4

    @dataclass
    class Options:
        macrobatch: int = setting(0, "k: mini-batches per macrobatch, whose input rows are fetched once; 0: 4, or "
                                     "the largest halving of 4 the budget holds")
        static_cache: bool = setting(False, "spend the budget the union buffers leave on a static cache of the "
                                            "highest-degree rows, which fetches skip")
        union_rows: int = setting(0, "rows each of the two union buffers holds (0: the bound k x the most input "
                                     "rows a batch can have; a smaller one, e.g. the largest union `simulate` "
                                     "finds, must hold every macrobatch's union or the run stops)")

        def __post_init__(self):
            if self.macrobatch < 0:
                raise UserError(f"macrobatch must be >= 1 mini-batch (0: what fits), got {self.macrobatch}")
            if self.union_rows < 0:
                raise UserError(f"union_rows must be >= 0 (0: the bound), got {self.union_rows}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.cache_rows = 0
        self.lookahead = self.options.macrobatch or self.default_size
        self._choose_topology()
        self.fit_lookahead(self.options.macrobatch)
        if self.options.static_cache:
            left = self.budget - self.resident_bytes()
            self.cache_rows = int(min(store.num_nodes, max(0, left) // store.row_bytes))
        from ..ahead import UnionFetch  # torch: imported when used, not with this module
        static = np.zeros(store.num_nodes, bool)
        static[self.cache_ids] = True
        self.fetcher = UnionFetch(static, self.group_rows())

    def _union_bound(self, size):
        return min(self.store.num_nodes, size * self.sample_rows())

    def group_rows(self):
        """A macrobatch's union: --union-rows, or at most k batches' input rows (and at most every node)."""
        return self.options.union_rows or self._union_bound(self.lookahead)

    def fixed_bytes(self, size):
        rows = self.options.union_rows or self._union_bound(size)
        return super().fixed_bytes(size) + self.buffers() * (rows - self.group_rows()) * self.store.row_bytes

    def cache_bytes(self):
        return self.cache_rows * self.store.row_bytes

    @cached_property
    def cache_ids(self) -> np.ndarray:
        """The static cache: the `cache_rows` highest-degree rows (`oocgnn.cache`'s static-degree)."""
        if self.cache_rows <= 0:
            return _EMPTY
        return make_cache("static-degree", self.cache_rows, self.store.num_nodes,
                          degrees=self.store.degrees()).static_ids.astype(np.int64)

    def setup(self):
        return [*super().setup(), *([Step(seeds=_EMPTY, enter_ids=self.cache_ids, data=("features",))]
                                    if self.cache_rows else [])]

    def setup_rows(self):
        return self.cache_rows
