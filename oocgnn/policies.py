"""Policies as plans: what a policy does, declared before anything runs.

A plan is built from the store's metadata and its options with no I/O. It declares every
in-memory decision as part of its step stream: which batches and what enters and leaves memory
before each (its schedule's `Step`s), what is resident all run (`setup()`: static caches, or every
row), which rows keep a historical embedding and when it is refreshed (`history`), and how rows
that are not resident are read (`reader`). `memory()` follows from the plan alone, so a tuner can
ask it without opening a reader. Both back ends read the same plan: `simulate(store, plan)` counts
its I/O exactly, and the executor's runtime (`oocgnn.runtime`) does the same steps for real.

| policy | schedule | resident | reads |
|---|---|---|---|
| `inmemory` | random batches | every row (setup) | none |
| `mmap` | random batches | the OS page cache, under a cgroup cap | page faults |
| `hierbatching` | mega-batches of N_d parts, p passes, sampling inside them | static top-r_s·N rows (setup) + two mega-batch buffers | one sequential read per part, in the background |
| `outre` | macro batches of parts, micro-batches of B | static degree/frequency cache (setup) + historical embeddings | direct reads of the misses, coalesced |
| `ginex` | random batches, sampled S at a time (superbatches) | neighbour cache (setup) + a Belady feature cache following each superbatch's changesets | direct reads of the misses, coalesced |
| `macrobatch` | random batches, sampled k at a time (macrobatches) | two union buffers (+ an optional static degree cache) | one coalesced read of each macrobatch's union, in the background |
| `marius` | buffer states of c of p partitions (COMET, BETA, sequential), each training node in one; sampling inside the buffer | the buffer's partitions and the edge buckets among them | sequential reads of entering partitions and buckets, in the background |
| `composed` | hierbatching's mega-batches sampled S at a time, sampling over the graph | static rows (setup) + two mega-batch buffers + histories + a Belady cache of what chunks read outside them | mega-batches as hierbatching; the rest through the Belady cache, misses read directly |

Each policy's options are a small dataclass beside its plan (`HierBatchingPlan.Options`); the
registry `POLICIES` feeds the run configuration, the CLI, the widgets and the benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Callable

import numpy as np

from .errors import UserError
from .schedules import Schedule, Step, make_schedule
from .units import format_size

_EMPTY = np.empty(0, dtype=np.int64)


def setting(default, help):
    """A configuration field with its `--help` text (the CLI and the widgets read it)."""
    return field(default=default, metadata={"help": help})


def shared(options, name):
    """Another policy's setting, the same name meaning the same thing (one flag sets both): a composed
    policy's options reuse its parts' (`config` checks that shared settings agree)."""
    f = options.__dataclass_fields__[name]
    return setting(f.default, f.metadata["help"])


@dataclass
class HistorySpec:
    """OUTRE §4.3, declared: `count` candidate nodes each keep h^(L−1) (`dim` floats); an entry is
    reused while younger than `staleness` iterations and refreshed (pushed) when met stale or empty.
    `select()` profiles which nodes, on first use of `candidates`."""
    count: int
    dim: int
    staleness: int
    select: Callable[[], np.ndarray] = field(repr=False)

    @cached_property
    def candidates(self) -> np.ndarray:
        return np.unique(np.asarray(self.select(), dtype=np.int64))

    def nbytes(self, num_nodes) -> int:
        """Embeddings (count·dim·4) + slot table (N·4) + stamps (count·8): what `HistoryCache` holds."""
        return self.count * self.dim * 4 + int(num_nodes) * 4 + self.count * 8


class Plan:
    """A schedule walked with fanouts and a sampling seed; nothing resident but what its steps say.

    The topology is resident whole ("memory": indptr and every list, loaded at setup) or on disk
    ("disk": indptr, the lists the setup and the steps bring in, the rest read when sampled);
    `cfg.topology` "auto" takes memory when the plan fits the budget with it. Subclasses are the
    policies; `SchedulePlan` wraps a bare schedule for analyses (RR, traces)."""
    name = "schedule"
    source = ""              # the paper section it implements
    Options = None           # the policy's own options (a dataclass), or None
    reader = "direct"        # rows not resident: "direct" (O_DIRECT reads) or "mmap" (the OS page cache)
    budgeted = True          # the plan bounds its own resident bytes by the memory budget
    exact_io = True          # simulate(store, plan) predicts the executed reads exactly
    pipeline = False         # entering ranges load in the background, into the second of two buffers
    induces = False          # sampling stays inside each step's visible set (a subgraph built per group)
    lookahead = 0            # > 0: batches are sampled this many at a time before their rows are fetched
    neighbour_cache_default = 0.0   # --neighbour-cache-ratio's default for this policy (a disk topology's lists)
    partition_buffer = False  # steps hold buffer states of partitions and edge buckets (`oocgnn.buffer`)

    def __init__(self, store, cfg):
        self.store, self.cfg = store, cfg
        self.fanouts, self.seed, self.budget = cfg.fanout_list, cfg.seed, cfg.memory_budget_bytes
        self.history: HistorySpec | None = None
        self.topology = "memory" if cfg.topology == "auto" else cfg.topology
        self.lists = None        # the lists profiling samples from; a runtime lends its own
        self.dense = cfg.sampler == "dense"   # the run's sampler (`sampler.Sampler`): DENSE or per hop

    def profile_lists(self):
        """The topology source profiling samples from: the runtime's if it lent one, else the store's
        (all lists in RAM: for analyses). Samples do not depend on it."""
        return self.lists if self.lists is not None else self.store.neighbour_lists()

    def _choose_topology(self):
        """`auto`: the whole topology in memory if the plan fits the budget so, else on disk."""
        if self.cfg.topology == "auto":
            self.topology = "memory"
            if self.budgeted and self.resident_bytes() > self.budget:
                self.topology = "disk"

    @cached_property
    def schedule(self) -> Schedule:
        return make_schedule("random", self.store, batch_size=self.cfg.batch_size, seed=self.cfg.seed)

    @property
    def options(self):
        return getattr(self.cfg, self.name)

    def steps(self, epochs):
        """(epoch, batch index, Step) of `epochs` epochs, in order; with the topology in memory, steps
        move no adjacency (every list is resident from the setup)."""
        for e, b, step in self.schedule.steps(epochs):
            if self.topology == "memory" and "adjacency" in step.data:
                step = replace(step, data=tuple(d for d in step.data if d != "adjacency"))
            yield e, b, step

    def setup(self) -> list:
        """Steps of what is resident all run, loaded before the first step (outside the timed epochs),
        in order (lists before the rows a profile chooses)."""
        out = [s for s in [self.schedule.setup()] if s is not None]
        if self.topology == "memory":
            out = [replace(s, data=tuple(d for d in s.data if d != "adjacency")) for s in out]
            out.append(Step(seeds=_EMPTY, enter_ranges=[(0, self.store.num_nodes)], data=("adjacency",)))
        return [s for s in out if s.data]

    def setup_rows(self) -> int:
        """Feature rows `setup()` makes resident (from metadata: no profiling needed)."""
        return 0

    def setup_entries(self) -> int:
        """Neighbour-list entries of the lists the setup keeps (resident as such on a disk topology)."""
        return 0

    def group_rows(self) -> int:
        """Feature rows the largest group of entering ranges holds (0: the steps load no features)."""
        return 0

    def group_entries(self) -> int:
        """List entries the largest group of entering ranges holds (0: the steps load no adjacency)."""
        return 0

    def _largest(self, per_part, k) -> int:
        """The sum of the k largest of a per-part quantity: a bound for any grouping of k parts."""
        return int(np.sort(per_part)[::-1][:k].sum())

    def dynamic_rows(self) -> int:
        """Feature slots a replacement policy drives (the last of `capacity()`): a Belady cache's."""
        return 0

    def describe(self) -> dict:
        """What the run summary says of the plan's own knobs, beside its memory (none by default)."""
        return {}

    def buffers(self) -> int:
        return 2 if self.pipeline else 1

    def subgraphs(self) -> int:
        """Induced subgraphs held at once (one per buffer: the one in use and the next, built ahead)."""
        return self.buffers()

    def capacity(self) -> int:
        """Resident feature rows at most: the setup rows, then one buffer per group in flight."""
        return self.setup_rows() + self.buffers() * self.group_rows()

    def list_capacity(self) -> int:
        """Resident list entries at most: all of them in memory; on disk the setup's and the groups'."""
        if self.topology == "memory":
            return self.store.num_edges
        return self.setup_entries() + self.buffers() * self.group_entries()

    def memory(self) -> dict:
        """Bytes resident by kind, from the plan alone: feature rows and their slot table, the topology
        (indptr, the resident lists and, on disk, their offset table), the sampler's scratch, the
        subgraph sampling inside a group needs (one per buffer), histories."""
        n, isz = self.store.num_nodes, np.dtype(self.store.meta["index_dtype"]).itemsize
        out = {"feature_rows": self.capacity() * self.store.row_bytes, "slot_table": 4 * n,
               "topology": (n + 1) * 8 + self.list_capacity() * isz + (8 * n if self.topology == "disk" else 0),
               "sampler": 4 * n}                     # its relabelling scratch
        if self.induces:
            rows = self.setup_rows() + self.group_rows()
            entries = min(self.store.num_edges, self.setup_entries() + self.group_entries())
            out["induced"] = self.subgraphs() * ((rows + 1) * 8 + entries * 4)
        if self.history is not None:
            out["history"] = self.history.nbytes(n)
        return out

    def resident_bytes(self) -> int:
        """What the budget bounds: every resident graph array, the topology's included."""
        return sum(self.memory().values())

    def check_budget(self):
        need = self.resident_bytes()
        if self.budgeted and need > self.budget:
            parts = ", ".join(f"{k} {format_size(v)}" for k, v in self.memory().items())
            raise UserError(f"policy {self.name} needs {format_size(need)} resident ({parts}, topology "
                            f"{self.topology}) but --memory-budget is {format_size(self.budget)}")

    def check_machine(self, available: int | None = None):
        """Refuse to execute a plan whose resident arrays exceed this machine's available memory (RAM not
        in use, reclaimable page cache included): `inmemory` on a graph larger than RAM, or a budget larger
        than the machine. Simulating such a plan needs no memory and is not refused."""
        if available is None:
            from .units import available_memory
            available = available_memory()
        need = self.resident_bytes()
        if need > available:
            parts = ", ".join(f"{k} {format_size(v)}" for k, v in self.memory().items())
            hint = "an out-of-core policy (hierbatching, outre, ginex, macrobatch, marius, composed, mmap)" \
                if not self.budgeted else "a --memory-budget this machine holds"
            raise UserError(f"policy {self.name} needs {format_size(need)} resident ({parts}) but this machine has "
                            f"{format_size(available)} of memory available: choose {hint}")

    def __repr__(self):
        return f"{type(self).__name__}({self.schedule!r}, fanouts={self.fanouts}, seed={self.seed})"


class SchedulePlan(Plan):
    """A bare schedule as a plan: what analyses (RR, traces, simulate by schedule name) walk."""

    def __init__(self, store, schedule, fanouts, seed=0):
        self.store, self.cfg = store, None
        self.fanouts, self.seed, self.budget = [int(f) for f in fanouts], int(seed), 0
        self.history, self.topology = None, "disk"     # lists resident only as the schedule says
        self.dense = False
        self.__dict__["schedule"] = schedule


class InMemoryPlan(Plan):
    """Every feature row resident (the NS baseline of HierBatching and Ginex); no budget applies."""
    name, source, budgeted = "inmemory", "NS baseline", False

    def setup(self):
        data = ("features", "adjacency") if self.topology == "memory" else ("features",)
        return [Step(seeds=_EMPTY, enter_ranges=[(0, self.store.num_nodes)], data=data)]

    def setup_rows(self):
        return self.store.num_nodes


class MmapPlan(Plan):
    """Features through np.memmap: the OS page cache is the only cache, bounded by a cgroup cap of
    budget + measured working set (`oocgnn.runtime`); the kernel decides what is read, so the
    simulator's count (every batch's rows, no cache) is an upper bound, not a prediction."""
    name, source, reader, budgeted, exact_io = "mmap", "PyG+/DGL over mmap", "mmap", False, False


def fraction_or_auto(name, value):
    """A setting that is a fraction in [0, 1] or "auto": the number (from the CLI's text too), or "auto"."""
    if isinstance(value, str) and value != "auto":
        try:
            value = float(value)
        except ValueError:
            raise UserError(f"{name} is a fraction in [0, 1] or auto, got {value!r}") from None
    if value != "auto" and not 0 <= value <= 1:
        raise UserError(f"{name} is a fraction in [0, 1] or auto, got {value}")
    return value


STATIC_RATIO, STATIC_SHARE = 0.05, 0.15


def static_ratio_for(budget, feature_bytes) -> float:
    """HierBatching's r_s by default (`--static-ratio auto`): STATIC_RATIO of the nodes, or less where their
    rows would take over STATIC_SHARE of the budget (a third of the feature file gives exactly 0.05).
    The paper's 0.01 (Table 5) lost 1.2 points to inmemory on cora's random 10/10/80 split at a budget of a
    third of the features (3 seeds, issue 20's protocol, `benchmarks/mixing.py`); 0.05 lost 0.7 there and
    did no worse, beyond a seed's spread, on citeseer's and amazon_photo's splits and coauthor_cs's given one.
    The cap leaves small budgets to the mega-batches (at 5 % of the features r_s = 0.0075, near the paper's)."""
    return min(STATIC_RATIO, STATIC_SHARE * budget / max(int(feature_bytes), 1))


def resolve_static_ratio(asked, budget, feature_bytes) -> float:
    """r_s for a `--static-ratio` setting: the number asked, or (auto) `static_ratio_for` the budget."""
    return static_ratio_for(budget, feature_bytes) if asked == "auto" else float(asked)


class HierBatchingPlan(Plan):
    """HierBatching (Alg. 1): mega-batches of N_d parts + static cache, p passes, pipelined loads.
    On a disk topology a mega-batch's lists load with its features (sequential reads of its parts'
    slices of indices.bin) and the static nodes' lists stay with theirs."""
    name, source, induces = "hierbatching", "HierBatching Alg. 1", True

    @dataclass
    class Options:
        parts_per_megabatch: int = setting(0, "N_d: parts per mega-batch (r_d = N_d / parts); 0: the most the "
                                              "budget holds, the prefetch buffer included")
        static_ratio: float | str = setting("auto", "r_s: fraction of nodes (top degree) resident all run; auto: "
                                                  f"{STATIC_RATIO}, or less where those rows would take more than "
                                                  f"{STATIC_SHARE} of the budget (static_ratio_for)")
        passes: float = setting(2.0, "p: passes over each mega-batch's training nodes (fractions allowed)")
        static_scope: str = setting("adjacent", "static nodes a mega-batch may sample: adjacent to it | all")
        pipeline: bool = setting(True, "load the next mega-batch in the background while training on this one")
        regroup: str = setting("", "METHOD:PARTS: mega-batches from this partition instead of the store's "
                                   "parts; on an unpartitioned store this is HB- (scattered loads)")

        def __post_init__(self):
            if self.parts_per_megabatch < 0:
                raise UserError(f"parts_per_megabatch must be >= 1 (0: the most the budget holds), "
                                f"got {self.parts_per_megabatch}")
            self.static_ratio = fraction_or_auto("static_ratio", self.static_ratio)
            if self.passes < 1:
                raise UserError(f"passes must be >= 1 (every training node at least once), got {self.passes}")
            if self.static_scope not in ("adjacent", "all"):
                raise UserError(f"static_scope must be adjacent or all, got {self.static_scope!r}")
            if self.regroup:
                method, _, parts = self.regroup.partition(":")
                if not method or not parts.isdigit() or int(parts) < 1:
                    raise UserError(f"--regroup takes METHOD:PARTS, e.g. metis:256; got {self.regroup!r}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        o = self.options
        self.pipeline = o.pipeline
        parts = int(o.regroup.partition(":")[2]) if o.regroup else store.num_parts
        if parts < max(2, o.parts_per_megabatch):
            raise UserError(f"{self.name} needs a partitioned store with at least "
                            f"{max(2, o.parts_per_megabatch)} parts; {store.path} has {parts} "
                            "(prepare it with --partitioner metis|fennel --parts K, or --regroup metis:K)")
        self.num_groupable = parts              # the parts mega-batches group (the store's, or --regroup's)
        self.n_d = o.parts_per_megabatch or self._most_parts(parts)
        self._choose_topology()

    def _most_parts(self, parts) -> int:
        """N_d = 0: the most parts whose mega-batch (twice, with the prefetch buffer) fits the budget
        beside the rest of the plan, then evened out (as few mega-batches, of equal parts); a topology
        left to auto is the one that holds more parts (memory on a tie). At least 1 (`check_budget` then
        says what the budget lacks)."""
        best = (0, self.topology)
        for topology in (("memory", "disk") if self.cfg.topology == "auto" else (self.topology,)):
            self.topology, lo, hi = topology, 0, parts          # the largest fitting N_d in [lo, hi]
            while lo < hi:
                self.n_d = (lo + hi + 1) // 2
                lo, hi = (self.n_d, hi) if self.resident_bytes() <= self.budget else (lo, self.n_d - 1)
            best = max(best, (lo, topology), key=lambda b: b[0])
        most = max(1, best[0])
        groups = -(-parts // most)               # as few mega-batches, of equal parts (no small last one)
        self.topology, self.n_d = best[1], -(-parts // groups)
        if "schedule" in self.__dict__ and self.schedule.parts_per_megabatch != self.n_d:
            del self.__dict__["schedule"]      # built while searching (a disk topology's static lists)
        return self.n_d

    def _choose_topology(self):
        """auto: memory if the plan fits so, else disk (an automatic N_d chose its topology already)."""
        if not self.options.parts_per_megabatch and self.cfg.topology == "auto":
            return
        super()._choose_topology()

    @cached_property
    def schedule(self):
        o, assignment = self.options, None
        if o.regroup:              # HB−: computed (and cached) on first use, never by the constructor
            from .partition import partition
            method, _, parts = o.regroup.partition(":")
            assignment = partition(self.store, method, int(parts), seed=self.seed)[0]
        return make_schedule("megabatch", self.store, batch_size=self.cfg.batch_size, seed=self.seed,
                             parts_per_megabatch=self.n_d, static_ratio=self.static_ratio,
                             passes=o.passes, static_scope=o.static_scope, assignment=assignment,
                             restricted=self.induces)

    @property
    def static_ratio(self) -> float:
        """r_s: --static-ratio, or (auto) `static_ratio_for` this budget and feature file."""
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
        """The N_d largest parts: a bound for any permutation of the parts."""
        return self._largest(self._parts()[0], self.n_d)

    def group_entries(self):
        return self._largest(self._parts()[1], self.n_d)

    def rule(self) -> dict:
        """HierBatching App. B: 2(r_s + r_d)(A + B) <= C, with A, B the feature and topology bytes."""
        a, b = self.store.num_nodes * self.store.row_stride, self.store.topology_nbytes
        r_d = self.n_d / self.schedule.num_parts
        need = (2 if self.pipeline else 1) * (self.static_ratio + r_d) * (a + b)
        return {"r_s": self.static_ratio, "r_d": r_d, "A": a, "B": b, "need": int(need),
                "budget": self.budget, "holds": need <= self.budget}

    def describe(self):
        return {"hierbatching_rule": self.rule(), "parts_per_megabatch": self.n_d}


class OutrePlan(Plan):
    """OUTRE (§4.2–4.4): partition micro-batches, static feature cache + direct reads, histories.

    `--history-ratio auto` (the default) splits what the budget leaves for the feature cache and the
    histories by OUTRE Eq. 5 (`redundancy.choose_history_split`) from a profiling epoch of this plan's
    schedule (sampling seed + 1), run when the plan is built: it samples, reading lists but no rows."""
    name, source, neighbour_cache_default = "outre", "OUTRE §4.2-4.4", 0.1

    @dataclass
    class Options:
        parts_per_macro: int = setting(20, "parts per macro batch")
        feature_cache: str = setting("degree", "static feature cache: degree | frequency (a profiled epoch)")
        history_ratio: float | str = setting("auto", "fraction of nodes with a historical layer-(L-1) embedding "
                                                     "(0: none), or auto: the split of the budget between "
                                                     "histories and the feature cache that a profiling epoch "
                                                     "predicts saves the most reads (OUTRE Eq. 5)")
        history_by: str = setting("importance", "history nodes by importance (OUTRE's pruned-subtree size) | degree")
        staleness: int = setting(100, "reuse a history while younger than this many iterations (1: never)")

        def __post_init__(self):
            if self.parts_per_macro < 1:
                raise UserError(f"parts_per_macro must be >= 1, got {self.parts_per_macro}")
            if self.feature_cache not in ("degree", "frequency"):
                raise UserError(f"feature_cache must be degree or frequency, got {self.feature_cache!r}")
            self.history_ratio = fraction_or_auto("history_ratio", self.history_ratio)
            if self.history_by not in ("importance", "degree"):
                raise UserError(f"history_by must be importance or degree, got {self.history_by!r}")
            if self.staleness < 1:
                raise UserError(f"staleness must be >= 1 iteration (1 disables reuse), got {self.staleness}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        o, n = self.options, store.num_nodes
        if store.num_parts < 2:
            raise UserError(f"outre needs a partitioned store; {store.path} has 1 part "
                            "(prepare it with --partitioner metis|fennel --parts K)")
        self.split_table = None       # auto: Eq. 5's predicted benefit per α (`choose_history_split`)
        if o.history_ratio != "auto" and o.history_ratio > 0:
            self.history = HistorySpec(int(o.history_ratio * n), self._history_dim(), o.staleness,
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

    @property
    def cache_split(self) -> float:
        """α: the share of `split["split_budget"]` the histories get (auto: Eq. 5's argmax)."""
        return self.split["cache_split"]

    def _history_dim(self) -> int:
        from .models import hidden_width
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
        from .redundancy import choose_history_split, history_reuse
        o, n = self.options, self.store.num_nodes
        if self.cfg.model == "mlp" or len(self.fanouts) < 2 or share <= 4 * n:
            return 0.0
        prof, (held, met) = self.profile, self.held_out
        reuse = history_reuse(met, o.staleness, self.cfg.epochs)[met.pair_meeting]   # per spared read
        owner = met.node[met.pair_meeting]
        dim = self._history_dim()
        alpha, self.split_table = choose_history_split(
            held["accesses"].to_numpy(), np.bincount(owner, reuse, n), share, self.store.row_bytes, dim * 4 + 8,
            table_hist=4 * n,
            feat_score=self.store.degrees() if o.feature_cache == "degree" else prof["accesses"].to_numpy(),
            hist_score=prof["history_score"].to_numpy(), overlap=(owner, met.pair_row, reuse))
        count = int(self.split_table.loc[self.split_table["alpha"] == alpha, "history_rows"].iloc[0])
        if count > 0:
            self.history = HistorySpec(count, dim, o.staleness, self._history_nodes)
        return alpha

    @cached_property
    def profile(self):
        """OUTRE's profiling epoch (`redundancy.importance`) of this schedule, sampling seed + 1: per node
        its accesses (saved_I/O_feat, what a frequency cache ranks by), pruned-subtree reads
        (saved_gather) and `history_score` (what histories are ranked by: saved_gather or degree)."""
        from .redundancy import importance
        prof = importance(self.store, self.fanouts, schedule=self.schedule, seed=self.seed + 1,
                          topology=self._profiling_lists())
        prof["history_score"] = self.store.degrees() if self.options.history_by == "degree" \
            else prof["saved_gather"]               # a column added in place: no copy of the frame
        return prof

    @cached_property
    def held_out(self):
        """(profile, `redundancy.Meetings`) of another epoch (sampling seed + 2): accesses, and the rows
        each hop-1 meeting spares given the histories' ranking, to count the savings of caches chosen
        on `profile` where they were not chosen."""
        from .redundancy import importance, ranks
        return importance(self.store, self.fanouts, schedule=self.schedule, seed=self.seed + 2, meetings=True,
                          rank=ranks(self.profile["history_score"].to_numpy()), topology=self._profiling_lists())

    def _profiling_lists(self):
        """The runtime's lists when it lent them, else all in memory on a memory topology, else read
        from disk as sampled (none kept)."""
        from .topology import NeighbourLists
        if self.lists is not None or self.topology == "memory":
            return self.profile_lists()
        return NeighbourLists(self.store, capacity=0)

    @cached_property
    def schedule(self):
        return make_schedule("partition", self.store, batch_size=self.cfg.batch_size, seed=self.seed,
                             n_per_macro=self.options.parts_per_macro)

    def _history_nodes(self):
        """Importance is profiled on an epoch of this schedule with another sampling seed."""
        from .ranking import top_ids
        from .redundancy import history_nodes
        o = self.options
        if o.history_ratio == "auto":
            return top_ids(self.profile["history_score"].to_numpy(), self.history.count)
        return history_nodes(self.store, o.history_ratio, by=o.history_by, fanouts=self.fanouts,
                             schedule=self.schedule, seed=self.seed + 1, topology=self.profile_lists())

    @cached_property
    def cache_ids(self) -> np.ndarray:
        """The static feature cache: top `cache_rows` by degree (PaGraph) or by accesses in a profiling
        epoch (OUTRE §4.4), chosen by the replay policies' own code (`oocgnn.cache`)."""
        from .cache import make_cache
        if self.cache_rows <= 0:
            return _EMPTY
        if self.options.feature_cache == "degree":
            policy = make_cache("static-degree", self.cache_rows, self.store.num_nodes,
                                degrees=self.store.degrees())
        else:
            from .trace import record_trace
            counts = self.profile["accesses"].to_numpy() if "profile" in self.__dict__ else \
                record_trace(self.store, self.schedule, self.fanouts, seed=self.seed + 1,
                             cache_dir=False, topology=self.profile_lists()).counts()
            policy = make_cache("static-frequency", self.cache_rows, self.store.num_nodes, counts=counts)
        return policy.static_ids.astype(np.int64)

    @cached_property
    def neighbour_ids(self) -> np.ndarray:
        """The static neighbour cache of a disk topology: lists by cross-partition degree (OUTRE §4.2)
        while they fit `neighbour_cache_ratio` of the budget."""
        from .topology import cross_partition_degree, neighbour_cache
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
        return self._largest(np.diff(self.store.indptr[self.store.part_offsets]), self.options.parts_per_macro)


class SampleAheadPlan(Plan):
    """Random batches sampled `lookahead` at a time, then fetched for the chunk at once
    (`oocgnn.ahead`): the samples of two chunks (the one training, the one sampled ahead; and the next
    one's first sample) and their changesets are resident, counted here at their bound from the
    fanouts; the scratch that computes a chunk's fetch is working memory, like the sampler's per batch."""
    lookahead = 1
    fetch_reads_ahead = False     # the chunk's rows are read by the stage's thread, ahead of its steps
    change_bytes = 0              # bytes per sampled input row of a chunk's changesets
    size_flag = ""

    def _neighbour_entries(self):
        isz = np.dtype(self.store.meta["index_dtype"]).itemsize
        return int(self.cfg.neighbour_cache_ratio_of(self.name) * self.budget) // isz

    def sample_rows(self) -> int:
        """Input rows one sampled batch holds at most (`ahead.sample_bound`)."""
        from .ahead import sample_bound
        return sample_bound(self.cfg.batch_size, self.fanouts, self.store.num_nodes, self.store.num_edges,
                            self.dense)[0]

    def samples_bytes(self, size=None) -> int:
        """Two chunks of `size` (default the plan's) samples and their changesets, and the sample that ends
        the second (`ahead.chunks` sees a chunk end at the next one's first batch), at their bound."""
        from .ahead import sample_bound
        rows, nbytes = sample_bound(self.cfg.batch_size, self.fanouts, self.store.num_nodes, self.store.num_edges,
                                    self.dense)
        return (2 * (self.lookahead if size is None else size) + 1) * (nbytes + self.change_bytes * rows)

    def memory(self) -> dict:
        return {**super().memory(), "samples": self.samples_bytes()}

    def chunk_fetch(self, items, inputs):
        """The `ChunkFetch` of a chunk's (i, epoch, batch, step, sample) items, from the input rows each
        batch gathers (`inputs`: all of its input rows, or those its history plan needs)."""
        return self.fetcher(inputs)

    def fixed_bytes(self, size) -> int:
        """What the plan needs whatever its caches get, with chunks of `size`."""
        return self.resident_bytes() - self.samples_bytes() + self.samples_bytes(size)

    def check_budget(self):
        if self.fixed_bytes(self.lookahead) - self.cache_bytes() <= self.budget:
            return super().check_budget()
        fits = next((s for s in (self.lookahead // 2 ** k for k in range(1, 40)) if s >= 1
                     and self.fixed_bytes(s) - self.cache_bytes() <= self.budget), 0)
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


class GinexPlan(SampleAheadPlan):
    """Ginex (§3-4): superbatches of S sampled mini-batches; the neighbour cache (Ginex's out/in-degree
    score, §4) holds lists on a disk topology; a feature cache of what the budget leaves follows the
    Belady changesets of each superbatch (§3.4), executed: switch to its init, then per batch gather
    (misses read, coalesced) and apply its changeset."""
    name, source, size_flag = "ginex", "Ginex §3-4", "superbatch"
    neighbour_cache_default = 0.5   # the artifact README's run gives both caches the same size
    change_bytes = 12             # in ids, out ids and positions, int32, at most one each per input row

    @dataclass
    class Options:
        superbatch: int = setting(16, "S: mini-batches sampled ahead of each superbatch's gather (Ginex's "
                                      "artifact default is 1000, its samples on SSD; here they are in RAM)")

        def __post_init__(self):
            if self.superbatch < 1:
                raise UserError(f"superbatch must be >= 1 mini-batch, got {self.superbatch}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.lookahead = self.options.superbatch
        self.neighbour_entries = self._neighbour_entries()
        self.cache_rows = 0
        self._choose_topology()
        left = self.budget - self.resident_bytes()
        self.cache_rows = int(min(store.num_nodes, max(0, left) // store.row_bytes))
        from .ahead import BeladyFetch
        self.fetcher = BeladyFetch(self.cache_rows)

    def cache_bytes(self):
        return self.cache_rows * self.store.row_bytes

    @cached_property
    def neighbour_ids(self) -> np.ndarray:
        """Ginex's neighbour cache: lists by out-degree / in-degree while they fit its share of the budget."""
        from .topology import ginex_score, neighbour_cache
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


class MacrobatchPlan(SampleAheadPlan):
    """BatchGNN (§4): macrobatches of k sampled mini-batches share one deduplicated, coalesced fetch of
    their input rows' union (into one of two buffers: the next macrobatch is sampled and fetched while
    this one trains); optionally the budget's remainder holds a static cache of the highest-degree rows
    (PaGraph's), which the fetches skip."""
    name, source, size_flag = "macrobatch", "BatchGNN §4", "macrobatch"
    fetch_reads_ahead, pipeline = True, True

    @dataclass
    class Options:
        macrobatch: int = setting(4, "k: mini-batches per macrobatch, whose input rows are fetched once")
        static_cache: bool = setting(False, "spend the budget the union buffers leave on a static cache of the "
                                            "highest-degree rows, which fetches skip")
        union_rows: int = setting(0, "rows each of the two union buffers holds (0: the bound k x the most input "
                                     "rows a batch can have; a smaller one, e.g. the largest union `simulate` "
                                     "finds, must hold every macrobatch's union or the run stops)")

        def __post_init__(self):
            if self.macrobatch < 1:
                raise UserError(f"macrobatch must be >= 1 mini-batch, got {self.macrobatch}")
            if self.union_rows < 0:
                raise UserError(f"union_rows must be >= 0 (0: the bound), got {self.union_rows}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.lookahead = self.options.macrobatch
        self.cache_rows = 0
        self._choose_topology()
        if self.options.static_cache:
            left = self.budget - self.resident_bytes()
            self.cache_rows = int(min(store.num_nodes, max(0, left) // store.row_bytes))
        from .ahead import UnionFetch
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
        from .cache import make_cache
        if self.cache_rows <= 0:
            return _EMPTY
        return make_cache("static-degree", self.cache_rows, self.store.num_nodes,
                          degrees=self.store.degrees()).static_ids.astype(np.int64)

    def setup(self):
        return [*super().setup(), *([Step(seeds=_EMPTY, enter_ids=self.cache_ids, data=("features",))]
                                    if self.cache_rows else [])]

    def setup_rows(self):
        return self.cache_rows


class MariusPlan(Plan):
    """MariusGNN (§3, §5): a buffer of c of p physical partitions holding their features and the edge
    buckets among them (`oocgnn.buckets`), in the states of an ordering (`oocgnn.orderings`: COMET by
    default, BETA, sequential); each training node trains in one state, sampling only over the edges
    inside the buffer. Swaps read whole partitions and buckets sequentially, the next state's in the
    background (`oocgnn.buffer`). The topology is on disk: the buckets are all the run reads of it
    (evaluation reads lists as every policy's does). c defaults to the most partitions the budget holds."""
    name, source, induces, partition_buffer = "marius", "MariusGNN §3, §5", True, True

    @dataclass
    class Options:
        physical_parts: int = setting(16, "p: physical partitions, consecutive store parts grouped (at most the "
                                          "store's parts)")
        buffer_parts: int = setting(0, "c: physical partitions in the buffer (0: the most the budget holds)")
        ordering: str = setting("comet", "buffer states: comet (MariusGNN) | beta (Marius) | sequential (control)")
        logical_parts: int = setting(0, "l: COMET's logical partitions (0: MariusGNN's rule l = 2p/c)")
        prefetch: bool = setting(True, "load the next state's partitions and buckets while this one trains")

        def __post_init__(self):
            from .orderings import ORDERINGS
            if self.physical_parts < 1 or self.buffer_parts < 0 or self.logical_parts < 0:
                raise UserError("physical_parts must be >= 1, buffer_parts and logical_parts >= 0 (0: automatic)")
            if self.ordering not in ORDERINGS:
                raise UserError(f"ordering must be one of {', '.join(ORDERINGS)}, got {self.ordering!r}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        o = self.options
        if cfg.topology == "memory":
            raise UserError("marius keeps only its buffer's edge buckets in memory: use --topology disk or auto")
        self.topology, self.pipeline = "disk", o.prefetch
        self.p = min(o.physical_parts, store.num_parts)
        if self.p < 2:
            raise UserError(f"marius needs a partitioned store; {store.path} has 1 part "
                            "(prepare it with --partitioner metis|fennel|random --parts K)")
        from .buckets import physical_offsets
        bounds = physical_offsets(store, self.p)
        self.part_rows, self.part_entries = np.diff(bounds), np.diff(np.asarray(store.indptr)[bounds])
        self.c = o.buffer_parts or self._most_that_fit()
        if self.c > self.p:
            raise UserError(f"--buffer-parts {self.c} exceeds the {self.p} physical partitions")
        self.l = o.logical_parts
        if o.ordering == "comet":
            from .orderings import auto_logical, comet_shape
            comet_shape(self.p, self.c, self.l or auto_logical(self.p, self.c))

    def describe(self):
        return {"buffer": self.buffer()}

    def buffer(self) -> dict:
        """The buffer this plan runs (c from the budget when not given): for run summaries."""
        sch = self.schedule
        return {"ordering": self.options.ordering, "p": self.p, "c": self.c, "l": sch.l,
                "states_per_epoch": len(sch.states(0)[0]), "states_loaded": len(sch.groups(0))}

    def valid_c(self) -> list:
        """Buffer sizes the ordering accepts at p (COMET: those giving whole r and c_l >= 2 at l)."""
        from .orderings import auto_logical, comet_shape
        o, out = self.options, []
        for c in range(1 if o.ordering == "sequential" else 2, self.p + 1):
            if o.ordering == "comet":
                l = o.logical_parts or auto_logical(self.p, c)
                try:
                    comet_shape(self.p, c, l)
                except UserError:
                    continue
            out.append(c)
        return out

    def _most_that_fit(self) -> int:
        fits = [c for c in self.valid_c() if sum(self._memory(c, self._swap(c)).values()) <= self.budget]
        if not fits:
            c = min(self.valid_c(), default=2)
            need = sum(self._memory(c, self._swap(c)).values())
            raise UserError(f"policy marius needs {format_size(need)} for its smallest buffer (c={c} of p={self.p} "
                            f"partitions) but --memory-budget is {format_size(self.budget)}; raise the budget or "
                            "--physical-parts (smaller partitions)")
        return max(fits)

    def _swap(self, c) -> int:
        from .orderings import swap_size
        return swap_size(self.options.ordering, self.p, c, self.options.logical_parts)

    @cached_property
    def schedule(self):
        return make_schedule("buffer", self.store, batch_size=self.cfg.batch_size, seed=self.seed,
                             physical_parts=self.p, buffer_parts=self.c, ordering=self.options.ordering,
                             logical_parts=self.l)

    def buffers(self) -> int:
        """Feature slots, one partition each: c, and room for one swap when prefetching."""
        return self.c + (self._swap(self.c) if self.pipeline else 0)

    def subgraphs(self):
        """The subgraph sampling uses and the next state's, built while it is in use (or, without
        prefetching, before the old one goes)."""
        return 2

    def group_rows(self):
        """A slot: the largest physical partition."""
        return int(self.part_rows.max())

    def _memory(self, c, swap):
        n, isz = self.store.num_nodes, np.dtype(self.store.meta["index_dtype"]).itemsize
        slots = c + (swap if self.pipeline else 0)
        rows_c, entries_c = self._largest(self.part_rows, c), self._largest(self.part_entries, c)
        return {"feature_rows": slots * int(self.part_rows.max()) * self.store.row_bytes, "slot_table": 4 * n,
                "topology": (n + 1) * 8 + 8 * n, "sampler": 4 * n,
                # the held buckets (and, while a swap is read, the entering partitions'): pairs of ids
                "buckets": self._largest(self.part_entries, slots) * 2 * isz,
                "induced": self.subgraphs() * ((rows_c + 1) * 8 + entries_c * 4)}

    def memory(self):
        return self._memory(self.c, self._swap(self.c))


class ComposedPlan(SampleAheadPlan, HierBatchingPlan):
    """HierBatching's mega-batches (Alg. 1: N_d parts + static top-r_s·N rows, p passes, pipelined
    loads) with sampling that may leave them; the rows a chunk of S batches reads outside the mega-batch
    ∪ static set go through a Belady cache following the chunk's changesets (Ginex §3.4; chunks are keyed
    by (epoch, group, batch // S), so one never spans two mega-batches), and OUTRE's historical
    embeddings (§4.3) prune what each batch reads. The cache gets what the budget leaves after the
    mega-batch buffers, static set, histories and samples. `--induced` keeps HierBatching's sampling
    inside the mega-batch (nothing is then read outside it: histories on HierBatching)."""
    name, source, size_flag = "composed", "HierBatching Alg. 1 + Ginex §3.4 + OUTRE §4.3", "superbatch"
    change_bytes = 12             # as Ginex's: in ids, out ids and positions, int32

    @dataclass
    class Options:
        parts_per_megabatch: int = shared(HierBatchingPlan.Options, "parts_per_megabatch")
        static_ratio: float = shared(HierBatchingPlan.Options, "static_ratio")
        passes: float = shared(HierBatchingPlan.Options, "passes")
        static_scope: str = shared(HierBatchingPlan.Options, "static_scope")
        pipeline: bool = shared(HierBatchingPlan.Options, "pipeline")
        regroup: str = shared(HierBatchingPlan.Options, "regroup")
        superbatch: int = shared(GinexPlan.Options, "superbatch")
        history_ratio: float | str = shared(OutrePlan.Options, "history_ratio")
        history_by: str = shared(OutrePlan.Options, "history_by")
        staleness: int = shared(OutrePlan.Options, "staleness")
        induced: bool = setting(False, "sample inside each mega-batch's induced subgraph as HierBatching does "
                                       "(off: sampling covers the graph; rows outside the mega-batch and static "
                                       "set are read through the Belady cache)")

        def __post_init__(self):            # each part's options check their own settings
            for part in (HierBatchingPlan.Options, GinexPlan.Options, OutrePlan.Options):
                part(**{f.name: getattr(self, f.name) for f in fields(part) if f.name in self.__dataclass_fields__})

    def __init__(self, store, cfg):
        self.cache_rows = 0
        self.induces = getattr(cfg, self.name).induced
        super().__init__(store, cfg)          # HierBatching's checks and buffers
        o = self.options
        self.lookahead = o.superbatch
        if self.history_ratio > 0:
            from .models import hidden_width
            self.history = HistorySpec(int(self.history_ratio * store.num_nodes), hidden_width(cfg.model, cfg.hidden),
                                       o.staleness, self._history_nodes)
        if not o.parts_per_megabatch:         # again, with the histories and the samples of a superbatch
            self.n_d = self._most_parts(self.num_groupable)
        self._choose_topology()               # again, with the histories
        left = self.budget - self.resident_bytes()
        outside = 0 if self.induces else store.num_nodes - self.setup_rows()   # rows a batch may read outside
        self.cache_rows = int(min(outside, max(0, left) // store.row_bytes))
        from .ahead import BeladyFetch
        self.fetcher = BeladyFetch(self.cache_rows)
        self._groups = (None, None)           # (epoch, its groups' ranges as (lo, hi) arrays)

    @property
    def history_ratio(self) -> float:
        """r_h: the fraction of nodes that keep a history; `auto` is OUTRE's 0.1 here (OUTRE's Eq. 5 split,
        `redundancy.choose_history_split`, weighs histories against a static cache, not a Belady one)."""
        r = self.options.history_ratio
        return 0.1 if r == "auto" else float(r)

    def _history_nodes(self):
        """OUTRE §4.3's choice, profiled on an epoch of this schedule's batches with another sampling seed
        (over the whole graph: a disk topology holds no mega-batch's lists while profiling)."""
        from copy import copy
        from .redundancy import history_nodes
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
        """(lo, hi) arrays of the store-id ranges of the epoch's mega-batch `group` (sorted, disjoint)."""
        if self._groups[0] != epoch:
            self._groups = (epoch, [tuple(np.array(r, np.int64).reshape(-1, 2).T) for r, _ in
                                    self.schedule.groups(epoch)])
        return self._groups[1][group]

    def chunk_fetch(self, items, inputs):
        """The Belady changesets of what the chunk reads outside its mega-batch ∪ static set; positions
        are made positions in each batch's sorted input rows again (what the stage gathers)."""
        _, epoch, _, step, _ = items[0]
        lo, hi = self._group_bounds(epoch, step.group)
        static = self.schedule._static_mask
        rows, outside = [], []
        for ids in inputs:
            ids = np.sort(ids)
            k = np.searchsorted(lo, ids, side="right") - 1
            inside = (k >= 0) & (ids < hi[np.maximum(k, 0)])
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
            f"--memory-budget is {format_size(self.budget)}; lower --parts-per-megabatch, --static-ratio, "
            f"--history-ratio or --superbatch, use --no-pipeline (one buffer), or raise --memory-budget")

    def describe(self):
        o = self.options
        return {"composed": {
            "megabatch": {"parts": self.n_d, "r_s": self.static_ratio, "passes": o.passes,
                          "static_scope": o.static_scope, "pipeline": self.pipeline, "induced": self.induces,
                          "buffer_rows": self.group_rows(), "static_rows": self.setup_rows()},
            "belady": {"superbatch": self.lookahead, "cache_rows": self.cache_rows},
            "history": {"ratio": self.history_ratio, "by": o.history_by, "staleness": o.staleness,
                        "nodes": self.history.count if self.history else 0}}}


POLICIES = {p.name: p for p in (InMemoryPlan, MmapPlan, HierBatchingPlan, OutrePlan, GinexPlan, MacrobatchPlan,
                                MariusPlan, ComposedPlan)}


def make_plan(store, cfg) -> Plan:
    """The plan of `cfg.policy` over `store`, checked against the memory budget."""
    if cfg.policy not in POLICIES:
        raise UserError(f"unknown policy {cfg.policy!r}; choose from {', '.join(POLICIES)}")
    plan = POLICIES[cfg.policy](store, cfg)
    plan.check_budget()
    return plan


def as_plan(store, plan, fanouts=None, seed=0, **schedule_params) -> Plan:
    """A plan as is, or a schedule (object or name + parameters) walked with `fanouts` and `seed`."""
    if isinstance(plan, Plan):
        if fanouts is not None or schedule_params:
            raise UserError("a plan carries its own fanouts and schedule; pass neither with it")
        return plan
    if fanouts is None:
        raise UserError("simulating a schedule needs its fanouts")
    if isinstance(plan, str):
        plan = make_schedule(plan, store, **({"seed": seed} | schedule_params))
    elif schedule_params:
        raise UserError("schedule parameters go with a schedule name, not a Schedule object")
    return SchedulePlan(store, plan, fanouts, seed)
