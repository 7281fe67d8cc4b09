"""HierBatching (Alg. 1): mega-batches of partitions, a static cache, passes."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..edgeschedules import EdgeMegabatchSchedule
from ..errors import UserError
from ..partition import partition
from ..schedules import make_schedule
from .base import Plan, fraction_or_auto, passes_or_auto, register, setting, whole_or_auto

STATIC_RATIO, STATIC_SHARE = 0.15, 0.45
PAPER_PASSES = 2.0        # HierBatching's p in its accuracy runs (§4, App. B)


def static_ratio_for(budget, feature_bytes) -> float:
    """HierBatching's r_s by default (`--static-ratio auto`): STATIC_RATIO of the nodes, or less where their
    rows would take over STATIC_SHARE of the budget (a third of the feature file gives exactly 0.15).
    A mega-batch loses its edges to the rest of the graph and the static cache gives them back (HB §3.2);
    on graphs whose parts hold a few dozen nodes, static rows retain more of a training node's neighbours
    per byte than wider mega-batches do. Issue 37's protocol (a third of the features, 7 seeds, given
    splits, label-balanced steps): r_s 0.05 lost 1.6 points to inmemory on citeseer (its sampling confined
    to mega-batches: one mega-batch of every part lost none), 0.15 lost 0.2; on cora 0.15 was +0.6, on
    amazon_photo +0.8 (0.05: +0.1 and +2.0). The paper's 0.01 (Table 5) lost 1.2 on cora's random split.
    The cap leaves small budgets to the mega-batches (at 5 % of the features r_s = 0.0225)."""
    return min(STATIC_RATIO, STATIC_SHARE * budget / max(int(feature_bytes), 1))


def resolve_static_ratio(asked, budget, feature_bytes) -> float:
    """r_s for a `--static-ratio` setting: the number asked, or (auto) `static_ratio_for` the budget."""
    return static_ratio_for(budget, feature_bytes) if asked == "auto" else float(asked)


def passes_for(batch_size, num_train, accumulating) -> float:
    """HierBatching's p by default (`--passes auto`): the paper's 2, or 1 where steps accumulate and
    2·|train| <= B. Passes reuse a loaded mega-batch for more updates (App. B); with label-balanced steps
    (`optsteps`) over a training set that small, an epoch is one optimizer step at p = 1 as at p = 2, so a
    second pass only doubles the step's samples and compute. Issue 37's protocol (README): every row within
    its seeds' spread of p = 2's but cora's random split, +0.4 for HierBatching (paired, 6 of 7 seeds up)
    and +0.5 for composed (7 of 7), in half the epoch."""
    return 1.0 if accumulating and PAPER_PASSES * int(num_train) <= int(batch_size) else PAPER_PASSES


def lowered_until(fits, r_s) -> float:
    """r_s auto where a budget holds no mega-batch beside it: halved until `fits(r_s)` (0 at the end): the
    static rows give way to the mega-batch they serve."""
    while r_s > 0 and not fits(r_s):
        r_s = r_s / 2 if r_s > 1e-3 else 0.0
    return r_s


def fitting_parts(parts, fits) -> int:
    """The most of `parts` parts n with `fits(n)` (monotone: if n parts fit, fewer do); 0 when none does.
    HierBatching's automatic N_d is this, `evened` (the plan's rule, and a rank plan's on its parts)."""
    lo, hi = 0, parts                              # the largest fitting n in [lo, hi]
    while lo < hi:
        n = (lo + hi + 1) // 2
        lo, hi = (n, hi) if fits(n) else (lo, n - 1)
    return lo


def evened(parts, most) -> int:
    """At most `most` (>= 1) parts a mega-batch, as few mega-batches, of equal parts (no small last one)."""
    return -(-parts // -(-parts // most))


@register
class HierBatchingPlan(Plan):
    """HierBatching (Alg. 1): mega-batches of N_d parts + static cache, p passes, pipelined loads.
    On a disk topology a mega-batch's lists load with its features (sequential reads of its parts'
    slices of indices.bin) and the static nodes' lists stay with theirs.
    On a link store the examples are the training edges, each in one mega-batch a pass
    (`edgeschedules.EdgeMegabatchSchedule`); a mega-batch's outsiders and negative pool come with it, their
    lists too on a disk topology (one gather after the parts' sequential reads)."""
    listed = 2
    name, source, induces = "hierbatching", "HierBatching Alg. 1", True
    tasks = ("node", "link")     # link: an edge trains in the mega-batch holding its endpoints (or its source's)
    io_pattern = "sequential part ranges (+ static ids once)"
    grid = tuple({"parts_per_megabatch": n, "passes": p} for n in (4, 8, 16, 32, 64, 128, 256, 512) for p in (1.0, 2.0))

    @dataclass
    class Options:
        parts_per_megabatch: int = setting(0, "N_d: parts per mega-batch (r_d = N_d / parts); 0: the most the "
                                              "budget holds, the prefetch buffer included")
        static_ratio: float | str = setting("auto", "r_s: fraction of nodes (top degree) resident all run; auto: "
                                                  f"{STATIC_RATIO}, or less where those rows would take more than "
                                                  f"{STATIC_SHARE} of the budget (static_ratio_for)")
        passes: float | str = setting("auto", "p: passes over each mega-batch's training nodes (fractions "
                                              "allowed); auto: 1 where label-balanced steps make an epoch one "
                                              "optimizer step at any p (--accumulate on or auto's on, and 2 x "
                                              "training nodes <= --batch-size), else the paper's 2 (passes_for)")
        static_scope: str = setting("adjacent", "static nodes a mega-batch may sample: adjacent to it | all")
        pipeline: bool = setting(True, "load the next mega-batch in the background while training on this one")
        regroup: str = setting("", "METHOD:PARTS: mega-batches from this partition instead of the store's "
                                   "parts; on an unpartitioned store this is HB- (scattered loads)")
        negative_pool: int | str = setting("auto", "link stores: nodes drawn uniformly over the graph for each "
                                                   "mega-batch and read with it, its batches' uniform negatives drawn "
                                                   "among them (0: among the mega-batch's own nodes, MariusGNN's rule); "
                                                   "auto: --negatives x --negative-chunks, halved while the budget "
                                                   "then holds no mega-batch; composed uses one only with "
                                                   "--induced, else it draws over the graph)")

        def __post_init__(self):
            if self.parts_per_megabatch < 0:
                raise UserError(f"parts_per_megabatch must be >= 1 (0: the most the budget holds), "
                                f"got {self.parts_per_megabatch}")
            self.static_ratio = fraction_or_auto("static_ratio", self.static_ratio)
            self.passes = passes_or_auto(self.passes)
            if self.static_scope not in ("adjacent", "all"):
                raise UserError(f"static_scope must be adjacent or all, got {self.static_scope!r}")
            self.negative_pool = whole_or_auto("negative_pool", self.negative_pool, 0,
                                               " nodes (0: the mega-batch's own nodes)")
            if self.regroup:
                method, _, parts = self.regroup.partition(":")
                if not method or not parts.isdigit() or int(parts) < 1:
                    raise UserError(f"--regroup takes METHOD:PARTS, e.g. metis:256; got {self.regroup!r}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        o = self.options
        self.pipeline = o.pipeline
        pool = self._pool_option = o.negative_pool
        if self.task != "link" and pool not in (0, "auto"):
            raise UserError("--negative-pool draws a link store's negatives; this is a node store (no negatives)")
        if not self.induces and pool not in (0, "auto"):
            raise UserError("--negative-pool draws negatives for mega-batches that sample inside themselves "
                            "(--induced); without it negatives are drawn over the whole graph")
        self._pool = 0 if self.task != "link" or not self.induces else \
            min(store.num_nodes, cfg.negatives * cfg.negative_chunks) if pool == "auto" else min(store.num_nodes, pool)
        parts = int(o.regroup.partition(":")[2]) if o.regroup else store.num_parts
        if parts < max(2, o.parts_per_megabatch):
            raise UserError(f"{self.name} needs a partitioned store with at least "
                            f"{max(2, o.parts_per_megabatch)} parts; {store.path} has {parts} "
                            "(prepare it with --partitioner metis|fennel --parts K, or --regroup metis:K)")
        self.num_groupable = parts              # the parts mega-batches group (the store's, or --regroup's)
        self.n_d = o.parts_per_megabatch or self._most_parts(parts)
        if o.parts_per_megabatch and self._pool_option == "auto":
            self._pool_gives_way(lambda: self._fits_any_topology(o.parts_per_megabatch))
        if o.parts_per_megabatch and o.static_ratio == "auto":
            self._static_gives_way(lambda: self._fits_any_topology(o.parts_per_megabatch))
        self._choose_topology()

    def _static_gives_way(self, holds):
        """r_s auto where the budget then holds no mega-batch: halved until `holds()` (`lowered_until`): the
        static rows give way to the mega-batch they serve."""
        def with_ratio(r_s):
            self._static_ratio = r_s
            return holds()
        self._static_ratio = lowered_until(with_ratio, self.static_ratio)
        self.__dict__.pop("schedule", None)

    def _pool_gives_way(self, holds):
        """A link store's negative pool auto where the budget then holds no mega-batch: halved until `holds()`
        (0 at the end), before the static rows give way."""
        while self._pool and not holds():
            self._pool //= 2
            self.__dict__.pop("schedule", None)

    def _fits_any_topology(self, n) -> bool:
        """Whether a mega-batch of `n` parts fits the budget on some topology the run may take."""
        self.n_d = n
        for topology in self._topologies():
            self.topology = topology
            self.__dict__.pop("schedule", None)
            if self.resident_bytes() <= self.budget:
                return True
        return False

    def _most_parts(self, parts) -> int:
        """N_d = 0: the most parts whose mega-batch (twice, with the prefetch buffer) fits the budget
        beside the rest of the plan, then evened out (as few mega-batches, of equal parts); a topology
        left to auto is the one that holds more parts (memory on a tie). At least 1 (`check_budget` then
        says what the budget lacks)."""
        def fits(n):
            self.n_d = n
            return self.resident_bytes() <= self.budget

        def most():
            best = (0, self.topology)
            for topology in self._topologies():
                self.topology = topology
                self.__dict__.pop("schedule", None)      # built while searching (a disk topology's static lists)
                best = max(best, (fitting_parts(parts, fits), topology), key=lambda b: b[0])
            return best

        best = most()
        if not best[0] and self._pool and self._pool_option == "auto":
            self._pool_gives_way(lambda: most()[0] > 0)
            best = most()
        if not best[0] and self.options.static_ratio == "auto":
            self._static_gives_way(lambda: most()[0] > 0)
            best = most()
        self.topology, self.n_d = best[1], evened(parts, max(1, best[0]))
        self.__dict__.pop("schedule", None)
        return self.n_d

    def _topologies(self) -> tuple:
        """The topologies the run may take: memory and disk for auto (memory only on a link store), else the one
        given."""
        if self.cfg.topology != "auto":
            return (self.topology,)
        return ("memory", "disk")

    def _choose_topology(self):
        """auto: memory if the plan fits so, else disk (an automatic N_d chose its topology already; a link
        store's stays in memory, and `check_budget` says what the budget lacks)."""
        if not self.options.parts_per_megabatch and self.cfg.topology == "auto":
            return
        super()._choose_topology()

    @cached_property
    def schedule(self):
        o, assignment = self.options, None
        if o.regroup:              # HB−: computed (and cached) on first use, never by the constructor
            method, _, parts = o.regroup.partition(":")
            assignment = partition(self.store, method, int(parts), seed=self.seed)[0]
        params = dict(batch_size=self.cfg.batch_size, seed=self.seed, parts_per_megabatch=self.n_d,
                      static_ratio=self.static_ratio, passes=PAPER_PASSES if o.passes == "auto" else o.passes,
                      static_scope=o.static_scope, assignment=assignment, restricted=self.induces)
        if self.task == "link":
            cfg = self.cfg
            sched = EdgeMegabatchSchedule(self.store, num_negatives=cfg.negatives, chunks=cfg.negative_chunks,
                                          degree_fraction=cfg.negative_degree_fraction,
                                          negative_pool=self._pool, **params)
        else:
            sched = make_schedule("megabatch", self.store, **params)
        if o.passes == "auto":    # p from whether its steps accumulate (which reads its groups: p changes none)
            sched.passes = passes_for(self.cfg.batch_size, self.examples, self.accumulates_on(sched))
        return sched

    @property
    def static_ratio(self) -> float:
        """r_s: --static-ratio, or (auto) `static_ratio_for` this budget and feature file, lowered where the
        budget then holds no mega-batch (`_most_parts`)."""
        if getattr(self, "_static_ratio", None) is not None:
            return self._static_ratio
        feature_bytes = self.store.num_nodes * self.store.row_stride
        return resolve_static_ratio(self.options.static_ratio, self.budget, feature_bytes)

    def setup_rows(self):
        return int(self.static_ratio * self.store.num_nodes)

    def setup_entries(self):
        return int(self.store.degrees()[self.schedule.static_ids].sum())

    def _parts(self):
        """(rows, list entries) of each part the mega-batches group."""
        if not self.options.regroup:
            off = self.store.part_offsets
            return np.diff(off), np.diff(self.store.indptr[off])
        sch = self.schedule
        assignment = np.empty(self.store.num_nodes, np.int64)
        assignment[sch._order] = np.repeat(np.arange(sch.num_parts), np.diff(sch.offsets))
        return np.diff(sch.offsets), np.bincount(assignment, self.store.degrees(), sch.num_parts).astype(np.int64)

    def group_rows(self):
        """The N_d largest parts: a bound for any permutation of the parts; on a link store with the most
        outsiders such parts may bring (`EdgeMegabatchSchedule.outsiders_by_part`)."""
        rows = self._largest(self._parts()[0], self.n_d)
        if self.task == "link":
            rows = min(self.store.num_nodes, rows + int(self._outsiders[0][:self.n_d].sum()) + self._pool)
        return rows

    def group_entries(self):
        """The N_d largest parts' list entries; on a link store with a disk topology also the lists of the most
        outsiders such parts may bring and of the pool's highest-degree nodes (read with the mega-batch)."""
        entries = self._largest(self._parts()[1], self.n_d)
        if self.task == "link" and self.topology == "disk":
            entries += int(self._outsiders[1][:self.n_d].sum()) + int(self._top_degrees[self._pool])
        return min(entries, self.store.num_edges)

    @cached_property
    def _outsiders(self):
        """A link store's per-part outsider counts (`EdgeMegabatchSchedule.outsiders_by_part`), kept across the
        schedules an automatic N_d or r_s tries."""
        return self.schedule.outsiders_by_part

    @cached_property
    def _top_degrees(self) -> np.ndarray:
        """int64 [N + 1]: the list entries of the n highest-degree nodes at n, a bound for a negative pool of n
        (computed once: the N_d and pool searches ask for many n)."""
        return np.concatenate([[0], np.cumsum(np.sort(self.store.degrees())[::-1])])

    def memory(self) -> dict:
        """`Plan.memory`; on a link store a mega-batch's induced subgraph also holds its outsiders' lists (rows
        in `group_rows`; entries at most the N_d largest parts', `EdgeMegabatchSchedule.outsiders_by_part`)."""
        out = super().memory()
        if self.task == "link" and self.topology == "memory" and self.induces:   # on disk, `group_entries` has them
            held = min(self.store.num_edges, self.setup_entries() + self.group_entries())
            pool = int(self._top_degrees[self._pool])
            entries = min(self.store.num_edges, held + int(self._outsiders[1][:self.n_d].sum()) + pool) - held
            out["induced"] += self.subgraphs() * entries * 4
        return out

    def rule(self) -> dict:
        """HierBatching App. B: 2(r_s + r_d)(A + B) <= C, with A, B the feature and topology bytes."""
        a, b = self.store.num_nodes * self.store.row_stride, self.store.topology_nbytes
        r_d = self.n_d / self.schedule.num_parts
        need = (2 if self.pipeline else 1) * (self.static_ratio + r_d) * (a + b)
        return {"r_s": self.static_ratio, "r_d": r_d, "A": a, "B": b, "need": int(need),
                "budget": self.budget, "holds": need <= self.budget}

    def describe(self):
        pool = {"negative_pool": self._pool} if self.task == "link" else {}
        return {"hierbatching_rule": self.rule(), "parts_per_megabatch": self.n_d, "passes": self.schedule.passes,
                **pool}

    def smaller_settings(self):
        return ["lower --parts-per-megabatch"] * (self.n_d > 1) + ["lower --static-ratio"] * (self.setup_rows() > 0)

    def mixing_fix(self, more_parts):
        """More parts help only where N_d follows the budget (smaller parts, more of them in a mega-batch); a
        given --parts-per-megabatch stays N_d parts, smaller ones."""
        if getattr(getattr(self, "options", None), "parts_per_megabatch", 0):
            return f"a larger --parts-per-megabatch (now {self.n_d}) or fewer --passes over each"
        return (f"a larger --parts-per-megabatch, more parts (prepare --parts {more_parts}) so that a mega-batch "
                "holds more of them, or fewer --passes over each")
