"""The composed policy: HierBatching's mega-batches + Ginex's Belady cache + OUTRE's histories."""
from __future__ import annotations

from copy import copy
from dataclasses import dataclass, fields

import numpy as np

from ..errors import UserError
from ..importance import history_nodes
from ..units import format_size
from .base import _EMPTY, HistorySpec, either, register, resolved_staleness, setting, shared
from .hierbatching import HierBatchingPlan
from .outre import OutrePlan
from .sampleahead import GinexPlan, SampleAheadPlan

@register
class ComposedPlan(SampleAheadPlan, HierBatchingPlan):
    """HierBatching's mega-batches (Alg. 1: N_d parts + static top-r_s·N rows, p passes, pipelined
    loads) with sampling that may leave them; the rows a chunk of S batches reads outside the mega-batch
    ∪ static set go through a Belady cache following the chunk's changesets (Ginex §3.4; chunks are keyed
    by (epoch, group, batch // S), so one never spans two mega-batches), and OUTRE's historical
    embeddings (§4.3) prune what each batch reads. The cache gets what the budget leaves after the
    mega-batch buffers, static set, histories and samples. `--induced` keeps HierBatching's sampling
    inside the mega-batch (nothing is then read outside it: histories on HierBatching)."""
    listed = 7
    name, source, size_flag = "composed", "HierBatching Alg. 1 + Ginex §3.4 + OUTRE §4.3", "superbatch"
    io_pattern = "sequential part ranges + Belady cache misses outside them, many in flight"
    tasks = ("node", "link")     # link: HierBatching's edges of a mega-batch, sampled over the graph (`--induced`: inside)
    grid = tuple({"parts_per_megabatch": n, "superbatch": 4} for n in (4, 8, 16, 32, 64, 128, 256, 512))
    change_bytes = 12             # as Ginex's: in ids, out ids and positions, int32

    @dataclass
    class Options:
        parts_per_megabatch: int = shared(HierBatchingPlan.Options, "parts_per_megabatch")
        static_ratio: float = shared(HierBatchingPlan.Options, "static_ratio")
        passes: float | str = shared(HierBatchingPlan.Options, "passes")
        static_scope: str = shared(HierBatchingPlan.Options, "static_scope")
        pipeline: bool = shared(HierBatchingPlan.Options, "pipeline")
        regroup: str = shared(HierBatchingPlan.Options, "regroup")
        negative_pool: int | str = shared(HierBatchingPlan.Options, "negative_pool")
        superbatch: int = shared(GinexPlan.Options, "superbatch")
        history_ratio: float | str = shared(OutrePlan.Options, "history_ratio")
        history_by: str = shared(OutrePlan.Options, "history_by")
        staleness: int | str = shared(OutrePlan.Options, "staleness")
        induced: bool = setting(False, "sample inside each mega-batch's induced subgraph as HierBatching does "
                                       "(off: sampling covers the graph; rows outside the mega-batch and static "
                                       "set are read through the Belady cache)")

        def __post_init__(self):            # each part's options check (and read: "1" is 1.0) their own settings
            for part in (HierBatchingPlan.Options, GinexPlan.Options, OutrePlan.Options):
                names = [f.name for f in fields(part) if f.name in self.__dataclass_fields__]
                checked = part(**{name: getattr(self, name) for name in names})
                for name in names:
                    setattr(self, name, getattr(checked, name))

    def __init__(self, store, cfg):
        self.cache_rows = 0
        self.induces = getattr(cfg, self.name).induced
        super().__init__(store, cfg)          # HierBatching's checks and buffers
        o = self.options
        self.lookahead = o.superbatch or self._default_superbatch()
        if self.history_ratio > 0:            # (its staleness once the mega-batches, and so the steps, are known)
            from ..models import hidden_width  # torch: imported when used, not with this module
            self.history = HistorySpec(int(self.history_ratio * store.num_nodes), hidden_width(cfg.model, cfg.hidden),
                                       None, self._history_nodes)
        if not o.parts_per_megabatch:         # again, with the histories and the samples of a superbatch
            self.n_d = self._most_parts(self.num_groupable)
        self._choose_topology()               # again, with the histories
        left = self.budget - self.resident_bytes()
        outside = 0 if self.induces else store.num_nodes - self.setup_rows()   # rows a batch may read outside
        self.cache_rows = int(min(outside, max(0, left) // store.row_bytes))
        from ..ahead import BeladyFetch  # torch: imported when used, not with this module
        self.fetcher = BeladyFetch(self.cache_rows)
        self._groups = (None, None)           # (epoch, its groups' ranges as (lo, hi) arrays)
        self.staleness = resolved_staleness(self, o.staleness)
        if self.history:
            self.history.staleness = self.staleness

    def _default_superbatch(self) -> int:
        """--superbatch 0: Ginex's 16, or the largest halving of it whose samples (two chunks ahead) take at
        most a quarter of the budget: the rest is the mega-batches', the histories' and the Belady cache's."""
        return next((s for s in (16, 8, 4, 2) if self.samples_bytes(s) <= self.budget // 4), 1)

    @property
    def history_ratio(self) -> float:
        """r_h: the fraction of nodes that keep a history; `auto` is OUTRE's 0.1 here (OUTRE's Eq. 5 split,
        `importance.choose_history_split`, weighs histories against a static cache, not a Belady one)."""
        r = self.options.history_ratio
        return 0.1 if r == "auto" else float(r)

    def _history_nodes(self):
        """OUTRE §4.3's choice, profiled on an epoch of this schedule's batches with another sampling seed
        (over the whole graph: a disk topology holds no mega-batch's lists while profiling)."""
        o, schedule = self.options, copy(self.schedule)
        schedule.restricted = False
        return history_nodes(self.store, self.history_ratio, by=o.history_by, fanouts=self.fanouts,
                             schedule=schedule, seed=self.seed + 1, topology=self.profile_lists())

    def capacity(self):
        """The static rows, the mega-batch buffers, then the Belady cache (the dynamic part)."""
        return self.setup_rows() + self.buffers() * self.group_rows() + self.cache_rows

    def dynamic_rows(self):
        return self.cache_rows

    def cache_bytes(self):
        return self.cache_rows * self.store.row_bytes

    def _group_bounds(self, epoch, group):
        """(lo, hi, ids): the store-id ranges of the epoch's mega-batch `group` as (lo, hi) arrays (sorted,
        disjoint) and the rows read with it (a link mega-batch's outsiders and pool under --induced; else none)."""
        if self._groups[0] != epoch:
            self._groups = (epoch, [(*np.array(g[0], np.int64).reshape(-1, 2).T, g[2] if len(g) > 2 else _EMPTY)
                                    for g in self.schedule.groups(epoch)])
        return self._groups[1][group]

    def chunk_fetch(self, items, inputs):
        """The Belady changesets of what the chunk reads outside its mega-batch ∪ static set (and the rows read
        with it); positions are made positions in each batch's sorted input rows again (what the stage gathers)."""
        _, epoch, _, step, _ = items[0]
        lo, hi, held = self._group_bounds(epoch, step.group)
        static = self.schedule._static_mask
        rows, outside = [], []
        for ids in inputs:
            ids = np.sort(ids)
            k = np.searchsorted(lo, ids, side="right") - 1
            inside = (k >= 0) & (ids < hi[np.maximum(k, 0)])
            if len(held):                                 # a link mega-batch's outsiders (--induced)
                inside |= np.isin(ids, held, assume_unique=True)
            rows.append(ids)
            outside.append(np.flatnonzero(~(inside | static[ids])))
        fetch = self.fetcher([r[o] for r, o in zip(rows, outside)])
        return fetch._replace(changes=[(a, e, o[p].astype(p.dtype)) for (a, e, p), o in zip(fetch.changes, outside)])

    def check_budget(self):
        fixed = self.fixed_bytes(self.lookahead) - self.cache_bytes()
        if fixed <= self.budget:
            return super().check_budget()
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in self.memory().items() if k != "feature_rows")
        raise UserError(
            f"policy composed needs {format_size(fixed)} resident before any Belady cache (static set "
            f"{format_size(self.setup_rows() * self.store.row_bytes)}, {self.buffers()} mega-batch buffer(s) of "
            f"{format_size(self.group_rows() * self.store.row_bytes)}, {parts}; topology {self.topology}) but "
            f"--memory-budget is {format_size(self.budget)}; {either(self.smaller_settings() + ['raise --memory-budget'])}")

    def smaller_settings(self):
        """The knobs that would shrink what `check_budget` counts, only those that are not at their least."""
        knobs = [("lower --parts-per-megabatch", self.n_d > 1), ("lower --static-ratio", self.setup_rows() > 0),
                 ("lower --history-ratio", bool(self.history_ratio)), ("lower --superbatch", self.lookahead > 1),
                 ("use --no-pipeline (one buffer)", self.buffers() > 1)]
        return [k for k, on in knobs if on]

    def describe(self):
        o = self.options
        return {"composed": {
            "megabatch": {"parts": self.n_d, "r_s": self.static_ratio, "passes": self.schedule.passes,
                          "static_scope": o.static_scope, "pipeline": self.pipeline, "induced": self.induces,
                          "buffer_rows": self.group_rows(), "static_rows": self.setup_rows()},
            "belady": {"superbatch": self.lookahead, "cache_rows": self.cache_rows},
            "history": {"ratio": self.history_ratio, "by": o.history_by, "staleness": self.staleness,
                        "nodes": self.history.count if self.history else 0}}}

    @staticmethod
    def summary_lines(s):
        m, b, h = (s["composed"][k] for k in ("megabatch", "belady", "history"))
        return [f"composed: mega-batches of {m['parts']} parts + {m['static_rows']:,} static rows"
                + (" (sampling inside them)" if m["induced"] else f", a Belady cache of {b['cache_rows']:,} rows over "
                   f"chunks of {b['superbatch']} batches") + f", {h['nodes']:,} histories (staleness {h['staleness']})"]

    def mixing_fix(self, more_parts):
        if getattr(getattr(self, "options", None), "parts_per_megabatch", 0):   # a given N_d stays N_d parts
            return f"a larger --parts-per-megabatch (now {self.n_d})"
        return f"a larger --parts-per-megabatch or more parts (prepare --parts {more_parts})"
