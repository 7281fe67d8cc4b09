"""Batch schedules: which batches, and what enters and leaves memory before each (the plans' step streams).

A schedule yields, per epoch, `Step`s: one mini-batch of seed nodes plus the residency change
that happens *before* it, and `setup()`: what is resident all run, loaded once before the first
step. Three schedules, one contract (`schedule.epoch(e)`, deterministic from (seed, e)):

- `random`: shuffled training nodes cut into batches of B (PyG / DGL / Ginex).
- `partition`: OUTRE §4.2: macro batches of `n_per_macro` random parts, their training nodes
  shuffled and cut into micro batches of B; the parts' adjacency (not features) is the
  batch-specific dynamic neighbour cache; sampling still covers the full graph.
- `buffer`: MariusGNN §5: a buffer of c of p physical partitions, state after state of an ordering
  (`oocgnn.orderings`: COMET, BETA, sequential); each training node trains in the one state it is
  assigned to; a state's partitions (features) and the edge buckets among them (`oocgnn.buckets`)
  are resident, and sampling stays inside them.
- link prediction (`--task link` stores): their plans' edge schedules (`oocgnn.edgeschedules`), whose steps
  are batches of training edges.
- `megabatch`: HierBatching Alg. 1: groups of N_d random parts (features + adjacency
  resident) plus a static cache of the ⌊r_s·N⌋ highest-degree nodes (features + adjacency,
  resident for the whole run); p passes over the group's training nodes; sampling only
  inside the resident subgraph (`visible`), or over the whole graph with `restricted=False`.

Residency is two independent sets: store-id *ranges* (a part is `[off[k], off[k+1])`, one
sequential read of features.bin and of its CSR slice of indices.bin) and scattered *ids*
(the static cache). Leaving a range never evicts an id. Apply `leave_*` before `enter_*`.
Epochs are meant to run in order from 0, after `setup()`: an epoch's first step evicts the
previous epoch's last group. A group without training
nodes yields no step and is not loaded. The static cache's neighbour lists are read once with
its features (HierBatching re-reads a static copy's slices per mega-batch instead; with a
symmetric CSR a group's own slice already holds every group–static edge, only the
static–static edges must stay in RAM).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from .buckets import EdgeBuckets, physical_offsets
from .errors import UserError
from .orderings import (PLACEMENTS, ORDERINGS, assign, assign_by_neighbours, auto_logical, comet_shape, epoch_states,
                        neighbour_parts)

_EMPTY = np.empty(0, dtype=np.int64)


class LinkBatch(NamedTuple):
    """A link-prediction step's examples (store ids): the positives and their chunk-shared negatives
    (`negatives.batch_negatives`: chunk c's set corrupts the destinations of its consecutive positives)."""
    edges: np.ndarray          # int64 [B, 2] training edges (source, destination)
    negatives: np.ndarray      # int64 [chunks, K] each chunk's negative destinations
    filter: np.ndarray         # int64 [F, 2] (positive, column) pairs whose negative is that positive's own edge


@dataclass
class Step:
    """One mini-batch and the residency change that precedes it (store ids throughout).

    Apply leave_ranges/leave_ids, then enter_ranges/enter_ids; `data` says what entering
    ranges and ids bring into RAM ("features" rows, "adjacency" = their full neighbour lists).
    """
    seeds: np.ndarray                                   # int64 [B] the batch's training nodes
    group: int = 0                                      # macro / mega-batch number in the epoch (random: 0)
    enter_ranges: list = field(default_factory=list)    # [(lo, hi)] loaded, one sequential read each
    enter_ids: np.ndarray = field(default_factory=lambda: _EMPTY)  # sorted scattered ids loaded
    leave_ranges: list = field(default_factory=list)    # [(lo, hi)] dropped
    leave_ids: np.ndarray = field(default_factory=lambda: _EMPTY)  # sorted scattered ids dropped
    data: tuple = ()                                    # ("features", "adjacency") or a subset
    group_visible: "Visible | None" = field(default=None, repr=False)   # the group's, if restricted
    scattered: bool = False                             # entering ranges are scattered rows (HB−): read
                                                        # as one coalesced row gather, not range reads
    buffer: tuple = ()                                  # a partition buffer's state after the change (its
                                                        # physical partitions; "buckets" data: the edge
                                                        # buckets among them are resident)
    update: int = 0                                     # its optimizer step in the run (`optsteps`; set by
                                                        # the plan's `steps`: a schedule's are all 0)
    link: LinkBatch | None = None                       # link prediction: the batch's edges and negatives
                                                        # (`seeds`: their sorted distinct nodes)

    @property
    def examples(self) -> int:
        """Its training examples: its edges on a link step, else its seeds (labelled nodes)."""
        return len(self.seeds) if self.link is None else len(self.link.edges)

    @property
    def visible(self) -> np.ndarray | None:
        """Sorted ids sampling is restricted to (None: all), one array object per group."""
        return None if self.group_visible is None else self.group_visible.get()


class Visible:
    """A group's visible set, computed when first asked (by the loader that prepares the group, or by
    the sampler) and shared by the group's steps; freed with them."""

    def __init__(self, compute, ranges):
        self.compute, self.ranges, self.value = compute, ranges, None
        self.lock = threading.Lock()

    def get(self) -> np.ndarray:
        with self.lock:
            if self.value is None:
                self.value = self.compute(self.ranges)
            return self.value


def _merge(ranges):
    """Sorted, non-empty, coalesced (lo, hi) ranges: adjacent parts become one read."""
    out = []
    for lo, hi in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _ids_of_ranges(ranges) -> np.ndarray:
    return np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges]) if ranges else _EMPTY


def _cut(ids, batch_size):
    return [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]


def _even_cut(ids, batch_size):
    """ids in ceil(n / batch_size) batches of equal sizes (within one): no short last batch."""
    return np.array_split(ids, -(-len(ids) // batch_size)) if len(ids) else []


def _carry_cut(ids, batch_size, filled):
    """ids in batches of `batch_size` after a first one that fills the open batch of `filled` (0 <= filled <
    batch_size: the first is batch_size - filled, or all of ids where fewer)."""
    head = ids[:batch_size - filled] if filled else ids[:0]
    return ([head] if len(head) else []) + _cut(ids[len(head):], batch_size)


class Schedule:
    """Base: the store's layout, a seed and a batch size; subclasses implement `epoch`."""
    name = "base"
    data: tuple = ()
    passes = 1.0            # visits of each training node an epoch (HierBatching's p: `MegabatchSchedule`)

    def __init__(self, store, batch_size=1024, seed=0, assignment=None):
        if int(batch_size) < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        self.store, self.batch_size, self.seed = store, int(batch_size), int(seed)
        self.train_idx = np.asarray(store.train_idx, dtype=np.int64)
        self.scattered = assignment is not None
        if self.scattered:
            # parts given by an assignment over store ids, not contiguous ranges (HierBatching's
            # HB−: the same partition batches on a layout that does not follow them)
            assignment = np.asarray(assignment, dtype=np.int64)
            order = np.argsort(assignment, kind="stable")
            self.offsets = np.searchsorted(assignment[order], np.arange(assignment.max() + 2))
            self._order = order
            tr = self.train_idx[np.argsort(assignment[self.train_idx], kind="stable")]
            self._train_sorted = tr
            self.tstart = np.searchsorted(assignment[tr], np.arange(assignment.max() + 2))
        else:
            self.offsets = np.asarray(store.part_offsets, dtype=np.int64)
            # training nodes of part k: train_idx[tstart[k]:tstart[k+1]] (train_idx sorted, parts contiguous)
            self.tstart = np.searchsorted(self.train_idx, self.offsets)
            self._train_sorted = self.train_idx
        self.num_parts = len(self.offsets) - 1

    def part_ranges(self, k):
        """Store-id ranges of part k: one range, or one per run of consecutive ids when scattered."""
        lo, hi = self.offsets[k], self.offsets[k + 1]
        if not self.scattered:
            return [(lo, hi)]
        ids = np.sort(self._order[lo:hi])
        brk = np.flatnonzero(np.diff(ids) != 1) + 1
        return [(int(r[0]), int(r[-1]) + 1) for r in np.split(ids, brk) if len(r)]

    def rng(self, epoch, stream):
        """Independent streams per (seed, epoch): 0 forms groups, 1 shuffles batches."""
        return np.random.default_rng([self.seed, int(epoch), stream])

    def epoch(self, epoch: int):
        raise NotImplementedError

    def setup(self) -> Step | None:
        """What is resident all run, loaded once before the first step (None: nothing)."""
        return None

    def steps(self, epochs: int):
        """(epoch, batch index, Step) of `epochs` epochs from epoch 0, in order."""
        for e in range(int(epochs)):
            for b, step in enumerate(self.epoch(e)):
                yield e, b, step

    def __repr__(self):
        args = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def params(self) -> dict:
        return {"batch_size": self.batch_size, "seed": self.seed}


class RandomSchedule(Schedule):
    """Shuffled training nodes in batches of B; nothing resident, sampling over the full graph."""
    name = "random"

    def epoch(self, epoch):
        for seeds in _cut(self.rng(epoch, 1).permutation(self.train_idx), self.batch_size):
            yield Step(seeds=seeds)


class _GroupSchedule(Schedule):
    """Parts permuted each epoch and cut into groups of `group_size` (the last takes the rest)."""
    group_size = 1

    def groups(self, epoch):
        """[(ranges, train ids)] of the epoch's groups that hold training nodes, in order."""
        perm = self.rng(epoch, 0).permutation(self.num_parts)
        out = []
        for i in range(0, self.num_parts, self.group_size):
            parts = perm[i:i + self.group_size]
            train = np.concatenate([self._train_sorted[self.tstart[k]:self.tstart[k + 1]] for k in parts])
            if len(train):
                out.append((_merge(r for k in parts for r in self.part_ranges(k)), train))
        return out

    def _previous(self, epoch):
        prev = self.groups(epoch - 1) if epoch > 0 else []
        return prev[-1][0] if prev else []

    def batches(self, train, rng):
        return _cut(rng.permutation(train), self.batch_size)

    restricted = False                               # sampling stays inside each group's `visible(ranges)`

    def visible(self, ranges):
        return None

    def epoch(self, epoch):
        rng, resident = self.rng(epoch, 1), self._previous(epoch)
        for g, (ranges, train) in enumerate(self.groups(epoch)):
            visible = Visible(self.visible, ranges) if self.restricted else None
            for j, seeds in enumerate(self.batches(train, rng)):
                step = Step(seeds=seeds, group=g, data=self.data, group_visible=visible, scattered=self.scattered)
                if j == 0:
                    step.leave_ranges, step.enter_ranges = resident, ranges
                    resident = ranges
                yield step


class PartitionSchedule(_GroupSchedule):
    """OUTRE §4.2 partition-based batching: macro batches of `n_per_macro` random parts."""
    name = "partition"
    data = ("adjacency",)

    def __init__(self, store, batch_size=1024, n_per_macro=20, seed=0, assignment=None):
        super().__init__(store, batch_size, seed, assignment)
        if int(n_per_macro) < 1:
            raise UserError(f"n_per_macro must be >= 1, got {n_per_macro}")
        self.group_size = self.n_per_macro = int(n_per_macro)

    def params(self):
        return {**super().params(), "n_per_macro": self.n_per_macro}


class MegabatchSchedule(_GroupSchedule):
    """HierBatching Alg. 1: mega-batches of N_d parts + a static cache, p passes, sampling inside them."""
    name = "megabatch"
    data = ("features", "adjacency")
    restricted = True

    def __init__(self, store, batch_size=1024, parts_per_megabatch=8, static_ratio=0.01, passes=1.0,
                 static_scope="adjacent", seed=0, assignment=None, restricted=True):
        super().__init__(store, batch_size, seed, assignment)
        self.restricted = bool(restricted)        # False: sampling covers the graph (the composed policy)
        if int(parts_per_megabatch) < 1:
            raise UserError(f"parts_per_megabatch must be >= 1, got {parts_per_megabatch}")
        if not 0 <= static_ratio <= 1:
            raise UserError(f"static_ratio must be in [0, 1], got {static_ratio}")
        if not passes >= 1:
            raise UserError(f"passes must be >= 1 (every training node at least once), got {passes}")
        if static_scope not in ("adjacent", "all"):
            raise UserError(f"static_scope must be 'adjacent' or 'all', got {static_scope!r}")
        self.group_size = self.parts_per_megabatch = int(parts_per_megabatch)
        self.static_ratio, self.passes, self.static_scope = float(static_ratio), float(passes), static_scope
        deg = store.degrees()
        k = int(self.static_ratio * store.num_nodes)
        # top-k by degree, ties to the smaller id (as staticcache.static_cache_candidates)
        self.static_ids = np.sort(np.argsort(-deg, kind="stable")[:k]).astype(np.int64)
        self._static_mask = np.zeros(store.num_nodes, dtype=bool)
        self._static_mask[self.static_ids] = True

    def params(self):
        return {**super().params(), "parts_per_megabatch": self.parts_per_megabatch,
                "static_ratio": self.static_ratio, "passes": self.passes, "static_scope": self.static_scope,
                **({} if self.restricted else {"restricted": False})}

    def batches(self, train, rng):
        """floor(p) full passes, then a fresh shuffle's first round(frac(p)·|train|) nodes (App. B)."""
        full, frac = divmod(self.passes, 1.0)
        out = []
        for _ in range(int(full)):
            out += _cut(rng.permutation(train), self.batch_size)
        extra = int(round(frac * len(train)))
        if extra:
            out += _cut(rng.permutation(train)[:extra], self.batch_size)
        return out

    def visible(self, ranges):
        """Group nodes T plus the static nodes: all of them, or those adjacent to T (T ∪ (N(T) ∩ P))."""
        t = _ids_of_ranges(ranges)
        if self.static_scope == "all":
            return np.union1d(t, self.static_ids)
        indptr = self.store.indptr
        nbr = np.concatenate([self.store.index_slice(indptr[lo], indptr[hi]) for lo, hi in ranges])
        adj = nbr[self._static_mask[nbr]]
        return np.union1d(t, adj.astype(np.int64))

    def setup(self):
        """The static cache, features and adjacency, for the whole run."""
        return Step(seeds=_EMPTY, enter_ids=self.static_ids, data=self.data)


class BufferSchedule(Schedule):
    """MariusGNN §5: `c` of `p` physical partitions (consecutive store parts grouped,
    `buckets.physical_offsets`) in a buffer, in the states of an ordering (`oocgnn.orderings`), each
    training node in the state it is assigned to (its X_i), shuffled and cut into batches there.

    A state's first step enters the partitions the previous loaded state lacked, one range each
    (`buffer` names them all: the runtime loads what it lacks, so a resumed run gets the whole state),
    and leaves those it drops; "buckets": the edge buckets among the state's partitions come with
    them (`buckets.EdgeBuckets`, written on first use). Sampling stays inside the state's partitions.
    States without training nodes are not loaded. Epoch e's orderings and assignments come from
    (seed, e): COMET regroups its logical partitions every epoch.

    `placement`: `ordering` assigns as MariusGNN does (COMET: a state drawn at random among those holding
    the node's partition; BETA: the first); `neighbours` takes, among the same states, the one holding most of
    the node's neighbours (`orderings.assign_by_neighbours`; the neighbour counts read once, as the buckets
    are), so in-buffer sampling loses fewer of them. The states and their loads are the ordering's either way."""
    name = "buffer"
    data = ("features", "buckets")
    restricted = True

    def __init__(self, store, batch_size=1024, physical_parts=16, buffer_parts=4, ordering="comet",
                 logical_parts=0, seed=0, placement="ordering"):
        super().__init__(store, batch_size, seed)
        if ordering not in ORDERINGS:
            raise UserError(f"unknown ordering {ordering!r}; choose from {', '.join(ORDERINGS)}")
        if placement not in PLACEMENTS:
            raise UserError(f"unknown placement {placement!r}; choose from {', '.join(PLACEMENTS)}")
        self.placement = placement
        self.p, self.c, self.ordering = int(physical_parts), int(buffer_parts), ordering
        self.bounds = physical_offsets(store, self.p)
        low = 1 if ordering == "sequential" else 2
        if not low <= self.c <= self.p:
            raise UserError(f"a {ordering} buffer holds {low}..p partitions; got c={self.c} of p={self.p}")
        self.l = int(logical_parts) or (auto_logical(self.p, self.c) if ordering == "comet" else 0)
        if ordering == "comet":
            comet_shape(self.p, self.c, self.l)
        self.part_of_train = np.searchsorted(self.bounds, self.train_idx, side="right") - 1

    def params(self):
        return {**super().params(), "physical_parts": self.p, "buffer_parts": self.c, "ordering": self.ordering,
                "logical_parts": self.l, "placement": self.placement}

    @cached_property
    def neighbour_counts(self):
        """Each training node's neighbours per physical partition (`orderings.neighbour_parts`)."""
        return neighbour_parts(self.store, self.train_idx, self.bounds)

    @cached_property
    def buckets(self):
        """The store's edge buckets at p partitions (written on first use)."""
        return EdgeBuckets.of(self.store, self.p)

    def states(self, epoch):
        """(states, state of each training node) of the epoch (`orderings`)."""
        rng = self.rng(epoch, 0)
        states = epoch_states(self.ordering, self.p, self.c, self.l, rng)
        if self.placement == "neighbours":
            return states, assign_by_neighbours(states, self.part_of_train, self.neighbour_counts, rng)
        how = "greedy" if self.ordering != "comet" else "random"
        return states, assign(states, self.part_of_train, self.p, how, rng)

    def groups(self, epoch):
        """[(state, train ids)] of the epoch's states that hold training nodes, in order."""
        states, of = self.states(epoch)
        order = np.argsort(of, kind="stable")
        cut = np.searchsorted(of[order], np.arange(len(states) + 1))
        return [(tuple(sorted(states[i])), self.train_idx[order[cut[i]:cut[i + 1]]])
                for i in range(len(states)) if cut[i + 1] > cut[i]]

    def ranges_of(self, parts):
        return [(int(self.bounds[k]), int(self.bounds[k + 1])) for k in sorted(parts)
                if self.bounds[k + 1] > self.bounds[k]]

    def visible(self, ranges):
        return _ids_of_ranges(ranges)

    def epoch(self, epoch):
        rng = self.rng(epoch, 1)
        prev = self.groups(epoch - 1) if epoch > 0 else []
        held = set(prev[-1][0]) if prev else set()
        for g, (state, train) in enumerate(self.groups(epoch)):
            visible = Visible(self.visible, self.ranges_of(state))
            for j, seeds in enumerate(_cut(rng.permutation(train), self.batch_size)):
                step = Step(seeds=seeds, group=g, data=self.data, group_visible=visible, buffer=state)
                if j == 0:
                    step.leave_ranges = self.ranges_of(held - set(state))
                    step.enter_ranges = self.ranges_of(set(state) - held)
                    held = set(state)
                yield step


SCHEDULES = {"random": RandomSchedule, "partition": PartitionSchedule, "megabatch": MegabatchSchedule,
             "buffer": BufferSchedule}     # node schedules by name; a link store's plans make theirs (`edgeschedules`)


def make_schedule(name, store, **params) -> Schedule:
    """A schedule by name (see SCHEDULES) and its parameters: make_schedule("partition", s, n_per_macro=20).

    A Schedule instance is returned as is."""
    if isinstance(name, Schedule):
        return name
    if name not in SCHEDULES:
        raise UserError(f"unknown schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    return SCHEDULES[name](store, **params)
