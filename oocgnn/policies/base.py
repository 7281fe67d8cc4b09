"""The plan contract every policy implements (`Plan`), and what plans share: settings, histories
declared (`HistorySpec`), the bare schedule as a plan (`SchedulePlan`)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

import numpy as np

from .. import optsteps, units
from ..errors import UserError
from ..edgeschedules import EdgeSchedule
from ..schedules import Schedule, Step, make_schedule
from ..units import format_size

_EMPTY = np.empty(0, dtype=np.int64)


def setting(default, help):
    """A configuration field with its `--help` text (the CLI and the widgets read it)."""
    return field(default=default, metadata={"help": help})


def shared(options, name):
    """Another policy's setting, the same name meaning the same thing (one flag sets both): a composed
    policy's options reuse its parts' (`config` checks that shared settings agree)."""
    f = options.__dataclass_fields__[name]
    return setting(f.default, f.metadata["help"])


REGISTRY: dict = {}          # policy name -> plan class, filled by `register` as the modules are imported


def register(cls):
    """Class decorator: list a plan as a policy under its `name` (in `POLICIES`, the run configuration, the
    CLI, the tuner, the widgets), ordered by its `listed` rank."""
    if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
        raise TypeError(f"policy {cls.name!r} is registered twice ({REGISTRY[cls.name].__qualname__}, {cls.__qualname__})")
    REGISTRY[cls.name] = cls
    return cls


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


def either(choices: list) -> str:
    """'a', 'a or b', 'a, b, or c': the remedies an error offers."""
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + ("," if len(choices) > 2 else "") + \
        f" or {choices[-1]}"


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
    tasks = ("node",)        # the store tasks it trains (a link store's steps are batches of training edges)

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

    @property
    def task(self) -> str:
        """The store's task: 'node' (classification) or 'link' (prediction)."""
        return getattr(self.store, "task", "node")

    @cached_property
    def schedule(self) -> Schedule:
        """Random batches: of training nodes, or on a link store of training edges (`EdgeSchedule`)."""
        cfg = self.cfg
        if self.task == "link":
            return EdgeSchedule(self.store, cfg.batch_size, cfg.seed, cfg.negatives, cfg.negative_chunks,
                                cfg.negative_degree_fraction)
        return make_schedule("random", self.store, batch_size=cfg.batch_size, seed=cfg.seed)

    @property
    def options(self):
        return getattr(self.cfg, self.name)

    def steps(self, epochs):
        """(epoch, batch index, Step) of `epochs` epochs, in order, each with its optimizer step (`update`,
        `optsteps`); with the topology in memory, steps move no adjacency (every list is resident from
        the setup)."""
        counter = optsteps.StepCounter(self.step_target, self.accumulate)
        for e, b, step in self.schedule.steps(epochs):
            if self.topology == "memory" and "adjacency" in step.data:
                step = replace(step, data=tuple(d for d in step.data if d != "adjacency"))
            yield e, b, replace(step, update=counter(e, step.examples))

    @property
    def batch_seeds(self) -> int:
        """Seeds of the largest batch: --batch-size, or the training set where it is smaller (its real size); on
        a link store a batch of B edges' distinct endpoints and its chunks' negatives (`EdgeSchedule.batch`), at
        most 2·B + chunks·K and every node."""
        cfg = self.cfg
        if self.task == "link":
            edges = max(1, min(int(cfg.batch_size), self.store.num_edges))
            seeds = 2 * edges + min(int(cfg.negative_chunks), edges) * int(cfg.negatives)
            return max(1, min(seeds, self.store.num_nodes))
        return max(1, min(int(cfg.batch_size), len(self.store.train_idx)))

    @property
    def examples(self) -> int:
        """What an epoch trains on: the labelled nodes (on a link store, the training edges)."""
        return self.store.num_edges // 2 if self.task == "link" else len(self.store.train_idx)

    @property
    def step_target(self) -> int:
        """Labelled nodes (on a link store, training edges) an optimizer step sees (`optsteps.step_target`)."""
        if self.cfg is None:                     # a bare schedule (analyses): a step per mini-batch
            return 1
        return optsteps.step_target(self.cfg.batch_size, self.examples, self.schedule.passes)

    @cached_property
    def accumulate(self) -> bool:
        """Whether optimizer steps accumulate mini-batches (`--accumulate`, `accumulates_on` its schedule)."""
        return self.accumulates_on(self.schedule)

    def accumulates_on(self, sched) -> bool:
        """Whether steps accumulate over `sched`'s mini-batches: --accumulate on/off, or auto: on where its
        groups hold fewer labelled nodes than a step's target; on a link store, off: no labels to balance."""
        if self.cfg is None or self.cfg.accumulate != "auto":   # on/off: no groups or labels to look at
            return self.cfg is not None and self.cfg.accumulate == "on"
        if self.task == "link":
            return False
        sizes = [len(train) for _, train in sched.groups(0)] if hasattr(sched, "groups") else []
        train = np.asarray(self.store.train_idx, dtype=np.int64)
        hist = np.bincount(self.store.compact_labels()[train], minlength=int(self.store.num_classes)) \
            if len(sizes) > 1 else None
        target = optsteps.step_target(self.cfg.batch_size, self.examples, sched.passes)
        return optsteps.accumulates("auto", sizes, target, hist)

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

    io_pattern = ""          # how its reads look on the disk, in words (benchmarks print it beside the rates)
    listed = 100.0           # where `POLICIES` lists the policy (the seed's policies first, in the papers' order)
    grid = ({},)             # the tuner's knobs to try (`oocgnn.tune`); values whose plans do not fit are dropped
    link_grid = None         # the knobs to try on a link store where they differ (None: `grid`)

    def describe(self) -> dict:
        """What the run summary says of the plan's own knobs, beside its memory (none by default)."""
        return {}

    @staticmethod
    def summary_lines(summary: dict) -> list:
        """Lines `oocgnn train` prints of what `describe()` put in a run's summary (none by default)."""
        return []

    def mixing_fix(self, more_parts: str) -> str:
        """What to change when this plan's groups mix poorly (`mixing.check`); `more_parts`: the K to prepare."""
        return "larger groups or more parts (prepare --parts K)"

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
            fixes = either(self.smaller_settings() + [f"give --memory-budget {format_size(need)} or more"])
            raise UserError(f"policy {self.name} needs {format_size(need)} resident ({parts}, topology "
                            f"{self.topology}) but --memory-budget is {format_size(self.budget)}; {fixes}")

    def smaller_settings(self) -> list:
        """What would shrink this plan's resident memory short of a larger budget (`check_budget`'s advice)."""
        return []

    def check_machine(self, available: int | None = None):
        """Refuse to execute a plan whose resident arrays exceed this machine's available memory (RAM not
        in use, reclaimable page cache included): `inmemory` on a graph larger than RAM, or a budget larger
        than the machine. Simulating such a plan needs no memory and is not refused."""
        if available is None:
            available = units.available_memory()
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


STALENESS = 100              # OUTRE's staleness, in iterations (§4.3)
PAPER_STEPS_PER_EPOCH = 1500   # papers100M's iterations an epoch in OUTRE's runs: its 100 is ~1/15 of an epoch


def whole_or_auto(name, value, minimum=1, meaning=""):
    """A setting that is a whole number >= `minimum` or "auto": the number (from the CLI's text too), or "auto".
    `meaning` follows the bound in the refusal (e.g. " (0: the mega-batch's own nodes)")."""
    if value == "auto":
        return value
    number = int(value) if isinstance(value, int) or str(value).strip().isdigit() else None
    if number is None or number < minimum:
        raise UserError(f"{name} must be >= {minimum}{meaning} or auto, got {value!r}")
    return number


def resolved_staleness(plan, value) -> int:
    """--staleness auto: OUTRE's 100 iterations as the share of an epoch they are on papers100M (~1/15, OUTRE
    §6; 1.7 % and 0.17 % of an epoch on its larger graphs), in this plan's optimizer steps an epoch, at most
    100: on a graph of few steps an epoch, 100 steps are many epochs, and histories that old cost accuracy
    (cora's given split, one label-balanced step an epoch: a history pushed at epoch 3 was reused until the
    last, -1.1 pt against inmemory over 7 seeds; +0.3 at staleness 1). 1 (no reuse across optimizer steps)
    below 23 steps an epoch."""
    if value != "auto":
        return int(value)
    per_epoch = len({step.update for _, _, step in plan.steps(1)})
    return max(1, min(STALENESS, round(per_epoch * STALENESS / PAPER_STEPS_PER_EPOCH)))


def passes_or_auto(value):
    """HierBatching's p: a number >= 1 (from the CLI's text too) or "auto"."""
    if value == "auto":
        return value
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UserError(f"passes is a number >= 1 or auto, got {value!r}") from None
    if not 1 <= value < float("inf"):
        raise UserError(f"passes must be >= 1 (every training node at least once), got {value}")
    return value


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
