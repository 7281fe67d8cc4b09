"""OUTRE (§4.2-4.4): partition micro-batches, a static feature cache, historical embeddings."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..cache import make_cache
from ..edgeschedules import EdgePartitionSchedule
from ..errors import UserError
from ..importance import choose_history_split, history_nodes, history_reuse, importance, ranks
from ..ranking import top_ids
from ..schedules import Step, make_schedule
from ..topology import NeighbourLists, cross_partition_degree, neighbour_cache
from ..trace import record_trace
from .base import (_EMPTY, HistorySpec, Plan, fraction_or_auto, register, resolved_staleness, setting,
                   whole_or_auto)

@register
class OutrePlan(Plan):
    """OUTRE (§4.2–4.4): partition micro-batches, static feature cache + direct reads, histories.

    `--history-ratio auto` (the default) splits what the budget leaves for the feature cache and the
    histories by OUTRE Eq. 5 (`importance.choose_history_split`) from a profiling epoch of this plan's
    schedule (sampling seed + 1), run when the plan is built: it samples, reading lists but no rows."""
    listed = 3
    name, source, neighbour_cache_default = "outre", "OUTRE §4.2-4.4", 0.1
    io_pattern = "scattered cache misses, many in flight"
    grid = tuple({"parts_per_macro": k} for k in (10, 20, 40))
    link_grid = ({},)            # auto, one macro batch: grouping a link store's edges read no less and lost MRR
    tasks = ("node", "link")     # link: an edge trains in the macro batch of one endpoint's part, sampled over the graph

    @dataclass
    class Options:
        parts_per_macro: int | str = setting("auto", "parts per macro batch, or auto: OUTRE's 20 on a node store; "
                                                     "on a link store every part (one macro batch, random batches "
                                                     "of edges: grouping a link store's edges by part read no less "
                                                     "and lost 3 points of MRR on amazon_photo in 64 METIS parts)")
        feature_cache: str = setting("degree", "static feature cache: degree | frequency (a profiled epoch)")
        history_ratio: float | str = setting("auto", "fraction of nodes with a historical layer-(L-1) embedding "
                                                     "(0: none), or auto: the split of the budget between "
                                                     "histories and the feature cache that a profiling epoch "
                                                     "predicts saves the most reads (OUTRE Eq. 5)")
        history_by: str = setting("importance", "history nodes by importance (OUTRE's pruned-subtree size) | degree")
        staleness: int | str = setting("auto", "reuse a history while younger than this many optimizer steps (1: "
                                               "only within the step that pushed it, whose weights are the "
                                               "same: never where a step is one mini-batch), or auto: OUTRE's "
                                               "100 as the share of an epoch it is on papers100M (1/15), at "
                                               "most 100 (resolved_staleness)")

        def __post_init__(self):
            self.parts_per_macro = whole_or_auto("parts_per_macro", self.parts_per_macro)
            if self.feature_cache not in ("degree", "frequency"):
                raise UserError(f"feature_cache must be degree or frequency, got {self.feature_cache!r}")
            self.history_ratio = fraction_or_auto("history_ratio", self.history_ratio)
            if self.history_by not in ("importance", "degree"):
                raise UserError(f"history_by must be importance or degree, got {self.history_by!r}")
            self.staleness = whole_or_auto("staleness", self.staleness, meaning=" iteration (1 disables reuse)")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        o, n = self.options, store.num_nodes
        if store.num_parts < 2:
            raise UserError(f"outre needs a partitioned store; {store.path} has 1 part "
                            "(prepare it with --partitioner metis|fennel --parts K)")
        self.split_table = None       # auto: Eq. 5's predicted benefit per α (`choose_history_split`)
        self.staleness = resolved_staleness(self, o.staleness)
        if o.history_ratio != "auto" and o.history_ratio > 0:
            self.history = HistorySpec(int(o.history_ratio * n), self._history_dim(), self.staleness,
                                       self._history_nodes)
        isz = np.dtype(store.meta["index_dtype"]).itemsize
        self.neighbour_entries = int(cfg.neighbour_cache_ratio_of(self.name) * self.budget) // isz
        # the feature cache gets what the budget leaves after the topology, histories and its slot table
        self.cache_rows = 0
        self._choose_topology()
        # B of Eq. 5: what the feature cache and the histories share (the cache's slot table, counted by
        # `memory()` whatever the split, is paid already)
        share = self.budget - self.resident_bytes() + (self.history.nbytes(n) if self.history else 0)
        alpha = self._auto_split(share) if o.history_ratio == "auto" else \
            (self.history.nbytes(n) / share if self.history and share > 0 else 0.0)
        left = self.budget - self.resident_bytes()
        self.cache_rows = int(min(n, max(0, left) // store.row_bytes))
        self.split = {"cache_split": round(float(alpha), 4), "auto": o.history_ratio == "auto",
                      "split_budget": int(share), "history_rows": self.history.count if self.history else 0,
                      "cache_rows": self.cache_rows}
        self._forget_profiles()

    @property
    def cache_split(self) -> float:
        """α: the share of `split["split_budget"]` the histories get (auto: Eq. 5's argmax)."""
        return self.split["cache_split"]

    def _history_dim(self) -> int:
        from ..models import hidden_width  # torch: imported when used, not with this module
        return hidden_width(self.cfg.model, self.cfg.hidden)

    def _auto_split(self, share) -> float:
        """α* of OUTRE Eq. 5 over `share` bytes, and the histories it buys (none with the MLP, one layer,
        or no room). The caches are chosen on `profile` (sampling seed + 1) and their savings counted on
        `held_out` (seed + 2: on the epoch that chose them they look ~10% better than they are), each
        ranked as the plan ranks it (the feature cache by degree or accesses, histories by importance
        or degree): saved_feat = accesses; saved_hist = the rows the top-k histories would spare (each
        row charged to its last-ranked reacher, not to OUTRE's first discoverer, which counts rows other
        hop-1 nodes still need), at the meetings that would hit over the run's epochs (`history_reuse`:
        OUTRE counts every meeting, but the first in a staleness window pushes and spares nothing); rows
        both would save count once (`overlap`). d_embed counts a slot's stamp and size_tab the
        histories' slot table (N·4), as `memory()` does."""
        o, n = self.options, self.store.num_nodes
        if self.cfg.model == "mlp" or len(self.fanouts) < 2 or share <= 4 * n:
            return 0.0
        prof, (held, met) = self.profile, self.held_out
        reuse = history_reuse(met, self.staleness, self.cfg.epochs)[met.pair_meeting]   # per spared read
        owner = met.node[met.pair_meeting]
        dim = self._history_dim()
        alpha, self.split_table = choose_history_split(
            held["accesses"].to_numpy(), np.bincount(owner, reuse, n), share, self.store.row_bytes, dim * 4 + 8,
            table_hist=4 * n,
            feat_score=self.store.degrees() if o.feature_cache == "degree" else prof["accesses"].to_numpy(),
            hist_score=prof["history_score"].to_numpy(), overlap=(owner, met.pair_row, reuse))
        count = int(self.split_table.loc[self.split_table["alpha"] == alpha, "history_rows"].iloc[0])
        if count > 0:
            self.history = HistorySpec(count, dim, self.staleness, self._history_nodes)
        return alpha

    @cached_property
    def profile(self):
        """OUTRE's profiling epoch (`importance.importance`) of this schedule, sampling seed + 1: per node
        its accesses (saved_I/O_feat, what a frequency cache ranks by), pruned-subtree reads
        (saved_gather) and `history_score` (what histories are ranked by: saved_gather or degree)."""
        prof = importance(self.store, self.fanouts, schedule=self.schedule, seed=self.seed + 1,
                          topology=self._profiling_lists())
        prof["history_score"] = self.store.degrees() if self.options.history_by == "degree" \
            else prof["saved_gather"]               # a column added in place: no copy of the frame
        return prof[["accesses", "saved_gather", "history_score"]]   # what the plan ranks by (N-long each)

    @cached_property
    def held_out(self):
        """(profile, `importance.Meetings`) of another epoch (sampling seed + 2): accesses, and the rows
        each hop-1 meeting spares given the histories' ranking, to count the savings of caches chosen
        on `profile` where they were not chosen."""
        held, met = importance(self.store, self.fanouts, schedule=self.schedule, seed=self.seed + 2, meetings=True,
                               rank=ranks(self.profile["history_score"].to_numpy()), topology=self._profiling_lists())
        return held[["accesses"]], met               # what the split counts savings on

    def _profiling_lists(self):
        """The runtime's lists when it lent them, else all in memory on a memory topology (read for this
        profiling epoch alone and freed with it: the store's cached copy would stay beside the runtime's
        own), else read from disk as sampled (none kept)."""
        if self.lists is not None:
            return self.lists
        if self.topology == "memory":
            return NeighbourLists.resident(self.store, self.store.index_slice(0, self.store.num_edges))
        return NeighbourLists(self.store, capacity=0)

    def _forget_profiles(self):
        """Keep what the auto split chose (the histories' nodes; a frequency cache's rows) and free its two
        profiling epochs before any resident is loaded: on xlarge they and their lists held 2.6 GiB beside
        the runtime's own topology all run long (OUTRE's peak 9.3 GiB at a 3.7 GiB budget)."""
        if "profile" in self.__dict__:
            if self.history is not None:
                self.history.candidates                # noqa: B018  (chosen from the profile, then cached)
            if self.options.feature_cache == "frequency":
                self.cache_ids                         # noqa: B018
        self.__dict__.pop("profile", None)
        self.__dict__.pop("held_out", None)

    @property
    def parts_per_macro(self) -> int:
        """--parts-per-macro, auto resolved: OUTRE's 20 (§6.1) on a node store. On a link store every part: a batch's
        uniform negatives and their neighbourhoods span the graph, so macro batches of parts save little reading
        (amazon_photo in 64 METIS parts at a third of the features, simulated: 1,494 MiB an epoch in macro batches of
        20 parts, 1,496 in one; coauthor_cs 12,621 and 13,315) while each one trains on a third of the communities
        for a third of the epoch: test MRR 3.25 points under in-memory training (30 epochs, 3 seeds), 0.1 in one."""
        n = self.options.parts_per_macro
        if n != "auto":
            return n
        return 20 if self.task == "node" else self.store.num_parts

    @cached_property
    def schedule(self):
        """Macro batches of --parts-per-macro random parts; on a link store of training edges, each in the macro
        batch of one endpoint's part (`edgeschedules.EdgePartitionSchedule`)."""
        cfg = self.cfg
        if self.task == "link":
            return EdgePartitionSchedule(self.store, cfg.batch_size, self.parts_per_macro, self.seed,
                                         cfg.negatives, cfg.negative_chunks, cfg.negative_degree_fraction)
        return make_schedule("partition", self.store, batch_size=cfg.batch_size, seed=self.seed,
                             n_per_macro=self.parts_per_macro)

    def _history_nodes(self):
        """Importance is profiled on an epoch of this schedule with another sampling seed."""
        o = self.options
        if o.history_ratio == "auto":
            return top_ids(self.profile["history_score"].to_numpy(), self.history.count)
        return history_nodes(self.store, o.history_ratio, by=o.history_by, fanouts=self.fanouts,
                             schedule=self.schedule, seed=self.seed + 1, topology=self.profile_lists())

    @cached_property
    def cache_ids(self) -> np.ndarray:
        """The static feature cache: top `cache_rows` by degree (PaGraph) or by accesses in a profiling
        epoch (OUTRE §4.4), chosen by the replay policies' own code (`oocgnn.cache`)."""
        if self.cache_rows <= 0:
            return _EMPTY
        if self.options.feature_cache == "degree":
            policy = make_cache("static-degree", self.cache_rows, self.store.num_nodes,
                                degrees=self.store.degrees())
        else:
            counts = self.profile["accesses"].to_numpy() if "profile" in self.__dict__ else \
                record_trace(self.store, self.schedule, self.fanouts, seed=self.seed + 1,
                             cache_dir=False, topology=self.profile_lists()).counts()
            policy = make_cache("static-frequency", self.cache_rows, self.store.num_nodes, counts=counts)
        return policy.static_ids.astype(np.int64)

    @cached_property
    def neighbour_ids(self) -> np.ndarray:
        """The static neighbour cache of a disk topology: lists by cross-partition degree (OUTRE §4.2)
        while they fit `neighbour_cache_ratio` of the budget."""
        isz = np.dtype(self.store.meta["index_dtype"]).itemsize
        return np.sort(neighbour_cache(self.store, cross_partition_degree(self.store), self.neighbour_entries * isz))

    def setup(self):
        """The lists first, then the feature cache: a frequency cache is profiled (when this generator
        is resumed) by sampling through whatever lists a runtime placed by then."""
        if self.topology == "memory":
            yield Step(seeds=_EMPTY, enter_ranges=[(0, self.store.num_nodes)], data=("adjacency",))
        elif self.neighbour_entries:
            yield Step(seeds=_EMPTY, enter_ids=self.neighbour_ids, data=("adjacency",))
        yield Step(seeds=_EMPTY, enter_ids=self.cache_ids, data=("features",))

    def setup_rows(self):
        return self.cache_rows

    def setup_entries(self):
        return self.neighbour_entries

    def group_entries(self):
        """A macro batch's lists (OUTRE's batch-specific neighbour cache): the largest parts' lists."""
        return self._largest(np.diff(self.store.indptr[self.store.part_offsets]), self.parts_per_macro)

    def describe(self):
        """OUTRE §4.4: the budget's split, auto or from --history-ratio."""
        return {"cache_split": self.split["cache_split"], "cache_split_auto": self.split["auto"],
                "history_rows": self.split["history_rows"], "cache_rows": self.split["cache_rows"],
                "staleness": self.staleness}

    @staticmethod
    def summary_lines(s):
        return [f"cache split: alpha {s['cache_split']:.2f}{' (auto, OUTRE Eq. 5)' if s['cache_split_auto'] else ''}: "
                f"{s['history_rows']:,} history rows, {s['cache_rows']:,} feature cache rows"
                + (f", staleness {s['staleness']}" if "staleness" in s else "")]

    def mixing_fix(self, more_parts):
        """A macro batch is --parts-per-macro parts whatever K is (more, smaller parts would shrink it): the
        remedy is more parts per macro batch."""
        n = self.parts_per_macro
        return f"a larger --parts-per-macro (now {n}; {2 * n} halves the macro batches and doubles each one's parts)"
