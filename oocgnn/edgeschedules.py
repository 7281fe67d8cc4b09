"""Link prediction's schedules: steps that are batches of training edges (a `--task link` store's plans make them).

- `edges`: the training edges (the topology's, each undirected edge once) shuffled and cut into batches of B
  edges, each with its chunk-shared negatives (`negatives.batch_negatives`, MariusGNN §2.8); a step's seeds are
  its endpoints and negatives.
- `edge-buffer`: `schedules.BufferSchedule` for link prediction: each edge bucket (i, j) trains in one state
  holding both.
- `edge-megabatch`: `schedules.MegabatchSchedule` for link prediction: each training edge trains in one
  mega-batch an epoch (once a pass), the one holding both endpoints where there is one.
- `edge-partition`: `schedules.PartitionSchedule` (OUTRE) for link prediction: each training edge trains in the
  macro batch of one of its endpoints' parts.

A step (`schedules.Step`) carries its edges and negatives in `link` (`schedules.LinkBatch`); its residency
changes follow the node schedule it extends.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np

from .distributed import edge_owner
from .errors import UserError
from .negatives import batch_negatives
from .orderings import epoch_states
from .schedules import (_EMPTY, BufferSchedule, LinkBatch, MegabatchSchedule, PartitionSchedule, Schedule, Step,
                        Visible, _cut, _carry_cut, _even_cut, _ids_of_ranges, _merge)


STATE_BATCHES = ("even", "full", "carry")


class EdgeSchedule(Schedule):
    """Link prediction: the training edges shuffled each epoch and cut into batches of B edges, each with
    MariusGNN's chunk-shared negatives (`negatives.batch_negatives`: `num_negatives` per chunk, `chunks`
    chunks, a `degree_fraction` of them drawn from the batch's destinations, the rest uniform over the
    nodes), keyed by (seed, epoch, batch). A step's seeds are the sorted distinct endpoints and negatives:
    the nodes whose embeddings its loss needs, sampled over the whole graph."""
    name = "edges"

    def __init__(self, store, batch_size=1024, seed=0, num_negatives=100, chunks=10, degree_fraction=0.0):
        super().__init__(store, batch_size, seed)
        self.num_negatives, self.chunks, self.degree_fraction = int(num_negatives), int(chunks), float(degree_fraction)

    @cached_property
    def edges(self) -> np.ndarray:
        """The training edges this schedule batches: the store's (a rank's view: those it owns)."""
        return self.store.train_edges

    def params(self):
        return {**super().params(), "num_negatives": self.num_negatives, "chunks": self.chunks,
                "degree_fraction": self.degree_fraction}

    def batch(self, edges, epoch, b, nodes=None) -> Step:
        """The step of positives `edges`, its negatives uniform over `nodes` (None: every node), keyed by
        (seed, epoch, b) in one process and by (seed, epoch, b·R + r) on rank r of R (`disttrain.RankView.share`):
        every rank's batch b draws its own."""
        share = getattr(self.store, "share", None)
        key = b if share is None else b * share[1] + share[0]
        negatives, filt = batch_negatives(edges, self.store.num_nodes if nodes is None else nodes, self.num_negatives,
                                          min(self.chunks, len(edges)), self.degree_fraction, self.seed, epoch, key)
        seeds = np.unique(np.concatenate([edges.ravel(), negatives.ravel()]))
        return Step(seeds=seeds, link=LinkBatch(edges, negatives, filt))

    def epoch(self, epoch):
        edges = self.edges[self.rng(epoch, 1).permutation(len(self.edges))]
        for b, lo in enumerate(range(0, len(edges), self.batch_size)):
            yield self.batch(edges[lo:lo + self.batch_size], epoch, b)


class _GroupedEdges:
    """What a schedule of groups adds for link prediction: its training edges' batches (`edge_batches`, an
    `EdgeSchedule` of the same batch size and seed), their negatives' settings among its params, and for groups of
    parts (mega-batches, macro batches) which group trains each edge (`part_groups`, `by_group`)."""

    def params(self):
        return {**super().params(), **{k: v for k, v in self.edge_batches.params().items()
                                       if k not in ("batch_size", "seed")}}

    def part_groups(self, epoch) -> tuple:
        """(perm, group_of): the epoch's part order and each part's group, `group_size` consecutive parts of it."""
        perm = self.rng(epoch, 0).permutation(self.num_parts)
        group_of = np.empty(self.num_parts, np.int64)
        group_of[perm] = np.arange(self.num_parts) // self.group_size
        return perm, group_of

    def by_group(self, perm, home):
        """(ranges, positions of the training edges whose `home` it is) of each group of parts (`part_groups`)
        holding edges, in order (a mega-batch's, a macro batch's)."""
        order = np.argsort(home, kind="stable")
        count = -(-self.num_parts // self.group_size)
        cut = np.searchsorted(home[order], np.arange(count + 1))
        for i in range(count):
            if cut[i + 1] > cut[i]:
                parts = perm[i * self.group_size:(i + 1) * self.group_size]
                yield _merge(r for k in parts for r in self.part_ranges(k)), order[cut[i]:cut[i + 1]]


class EdgeBufferSchedule(_GroupedEdges, BufferSchedule):
    """MariusGNN §5 for link prediction: the training edges in edge buckets (i, j) of their sources' and
    destinations' physical partitions; each bucket trains in one state holding both i and j (BETA: the first,
    greedy; COMET: one drawn uniformly, MariusGNN §5.1's deferred random assignment, (i, j) and (j, i) apart as in
    its code), its edges shuffled with the state's others
    and cut into batches (`EdgeSchedule.batch`) whose uniform negatives are the buffer's nodes (MariusGNN
    draws them from the nodes in memory), so every seed is resident and sampling stays inside the buffer.
    An ordering must bring every pair of partitions together (BETA and COMET do; sequential does not).

    `state_batches` says how a state's edges become batches: `full` (MariusGNN's), batches of B and a short last
    one; `even`, ceil(n/B) batches of equal sizes; `carry`, the epoch's states' edges in one stream cut every B
    edges, a state's first batch completing the one its predecessor left open (with accumulated optimizer steps,
    `optsteps`, a step then sees exactly B edges, however the states divide them). A state's short batch is an
    optimizer step as large as a full one on a few edges: on amazon_photo (c = 4 of 16, ~15 short batches in 117
    an epoch) in-memory training fed marius's batch sizes with edges drawn over the whole graph lost 2.0 points of
    test MRR, and marius's own batches cut evenly 1.3 against their 2.5 (`benchmarks/comet_gap.py`)."""
    name = "edge-buffer"

    def __init__(self, store, batch_size=1024, physical_parts=16, buffer_parts=4, ordering="comet", logical_parts=0,
                 seed=0, num_negatives=100, chunks=10, degree_fraction=0.0, state_batches="even"):
        if ordering == "sequential":
            raise UserError("link prediction trains each edge bucket (i, j) in a state holding i and j: the sequential "
                            "ordering never holds most pairs together (use comet or beta)")
        super().__init__(store, batch_size, physical_parts, buffer_parts, ordering, logical_parts, seed)
        self.edge_batches = EdgeSchedule(store, batch_size, seed, num_negatives, chunks, degree_fraction)
        if state_batches not in STATE_BATCHES:
            raise UserError(f"state_batches must be one of {', '.join(STATE_BATCHES)}, got {state_batches!r}")
        self.state_batches = state_batches

    def params(self):
        return {**super().params(), "state_batches": self.state_batches}

    @cached_property
    def bucket_of_edge(self) -> np.ndarray:
        """int64 [M]: each training edge's bucket i·p + j, i its source's partition and j its destination's."""
        part = np.searchsorted(self.bounds, self.edge_batches.edges, side="right") - 1
        return part[:, 0] * self.p + part[:, 1]

    @cached_property
    def bucket_edges(self) -> np.ndarray:
        """int64 [p, p]: training edges per bucket (i, j), each edge in its own."""
        return np.bincount(self.bucket_of_edge, minlength=self.p * self.p).reshape(self.p, self.p)

    def bucket_states(self, epoch) -> np.ndarray:
        """int64 [p, p]: the state, numbered among the epoch's loaded states (`groups`), in which each edge bucket
        trains; -1 for a bucket without training edges. BETA's is the first state holding the pair
        (`orderings.first_shared` on its loaded states), COMET's one drawn among them for each of (i, j), (j, i)."""
        out = np.full(self.p * self.p, -1, dtype=np.int64)
        for g, (_, positions) in enumerate(self.groups(epoch)):
            out[self.bucket_of_edge[positions]] = g
        return out.reshape(self.p, self.p)

    def groups(self, epoch):
        """[(state, training edges' positions)] of the epoch's states that hold edges, in order."""
        rng = self.rng(epoch, 0)
        states = epoch_states(self.ordering, self.p, self.c, self.l, rng)
        holding = [[] for _ in range(self.p * self.p)]
        for i, state in enumerate(states):
            for a in state:
                for b in state:
                    holding[a * self.p + b].append(i)
        buckets = np.unique(self.bucket_of_edge)
        if self.ordering == "comet":
            pick = [h[int(rng.integers(len(h)))] for h in (holding[k] for k in buckets)]
        else:
            pick = [holding[k][0] for k in buckets]
        state_of = np.full(self.p * self.p, -1, dtype=np.int64)
        state_of[buckets] = pick
        of = state_of[self.bucket_of_edge]
        order = np.argsort(of, kind="stable")
        cut = np.searchsorted(of[order], np.arange(len(states) + 1))
        return [(tuple(sorted(states[i])), order[cut[i]:cut[i + 1]]) for i in range(len(states)) if cut[i + 1] > cut[i]]

    def epoch(self, epoch):
        rng = self.rng(epoch, 1)
        prev = self.groups(epoch - 1) if epoch > 0 else []
        held = set(prev[-1][0]) if prev else set()
        edges, b, filled = self.edge_batches.edges, 0, 0
        for g, (state, positions) in enumerate(self.groups(epoch)):
            ranges = self.ranges_of(state)
            visible, nodes = Visible(self.visible, ranges), _ids_of_ranges(ranges)
            ids = rng.permutation(positions)
            if self.state_batches == "carry":
                batches, filled = _carry_cut(ids, self.batch_size, filled), (filled + len(ids)) % self.batch_size
            else:
                batches = (_even_cut if self.state_batches == "even" else _cut)(ids, self.batch_size)
            for j, batch in enumerate(batches):
                step = self.edge_batches.batch(edges[batch], epoch, b, nodes)
                step.group, step.data, step.group_visible, step.buffer = g, self.data, visible, state
                if j == 0:
                    step.leave_ranges = self.ranges_of(held - set(state))
                    step.enter_ranges = self.ranges_of(set(state) - held)
                    held = set(state)
                b += 1
                yield step


class EdgeMegabatchSchedule(_GroupedEdges, MegabatchSchedule):
    """HierBatching (Alg. 1) for link prediction. The paper trains node classification only
    (papers/hierbatching.md §2.4: a mega-batch's examples are the training nodes of its N_d parts T, sampled
    inside T ∪ (N(T) ∩ P), P the static nodes); here its examples are training edges, like MariusGNN's edge
    buckets inside a buffer state (`EdgeBufferSchedule`), on the same epoch's mega-batches and passes.

    Each training edge (u, v) trains in one mega-batch an epoch, and once in each of its p passes
    (`MegabatchSchedule.batches`): the mega-batch holding both endpoints' parts where there is one (an edge
    inside T), or holding one endpoint's part where the other is static (resident in every mega-batch, and
    visible there: adjacent to T through the edge itself); a static source with a destination in another
    mega-batch trains in the destination's. HierBatching's mega-batches hold each part once an epoch and never two
    parts of different mega-batches together, so an edge between two of them whose endpoints are both
    non-static has no mega-batch holding both: it trains in its source's, with its destination an *outsider*
    of that mega-batch. A mega-batch's outsiders X are read with it (the first step's `enter_ids`, one coalesced
    gather after its parts' sequential reads, dropped with it) and are visible there (on a disk topology their
    lists are read with them, one gather after the parts' lists); its visible set is T ∪ (N(T) ∩ P) ∪ X, so its other
    batches may sample them too. Reading X per mega-batch rather than per batch that samples it keeps the
    reads near the parts' (with p passes, every batch would read its outsiders anew). A batch's uniform negatives
    are drawn among the mega-batch's *negative pool*: `negative_pool` nodes drawn uniformly over the graph for each
    mega-batch (keyed by seed, epoch and mega-batch), read with its outsiders and visible there, so that negatives
    are uniform over the graph as an in-memory run's are. Drawn among T alone (`negative_pool` 0, MariusGNN's
    rule: the nodes in memory), a mega-batch of one METIS community ranks its edges only against that community's
    nodes, and the model never learns to tell communities apart (amazon_photo, N_d = 1 of 16 METIS parts: test
    MRR 0.16 against in-memory's 0.59). Its degree-drawn negatives are among its destinations
    (`EdgeSchedule.batch`). Mega-batches without edges are not loaded.

    Unrestricted (`restricted=False`, the composed policy's), sampling covers the graph and rows outside the
    mega-batch are read as a batch needs them (composed: through its Belady cache): an edge trains in the same
    mega-batch, with no outsiders read with it and no pool, its uniform negatives drawn over every node."""
    name = "edge-megabatch"

    def __init__(self, store, batch_size=1024, parts_per_megabatch=8, static_ratio=0.01, passes=1.0,
                 static_scope="adjacent", seed=0, assignment=None, restricted=True, num_negatives=100, chunks=10,
                 degree_fraction=0.0, negative_pool=0):
        super().__init__(store, batch_size, parts_per_megabatch, static_ratio, passes, static_scope, seed,
                         assignment, restricted)
        self.edge_batches = EdgeSchedule(store, batch_size, seed, num_negatives, chunks, degree_fraction)
        self.negative_pool = min(int(negative_pool), store.num_nodes) if self.restricted else 0

    def params(self):
        return {**super().params(), "negative_pool": self.negative_pool}

    def pool(self, epoch, group) -> np.ndarray | None:
        """Sorted distinct ids: mega-batch `group`'s negative pool, drawn uniformly over the graph (None without one)."""
        if not self.negative_pool:
            return None
        rng = np.random.default_rng([self.seed, int(epoch), 2, int(group)])
        return np.sort(rng.choice(self.store.num_nodes, self.negative_pool, replace=False))

    @cached_property
    def part_of_node(self) -> np.ndarray:
        """int64 [N]: the part (of those mega-batches group) of each node."""
        parts = np.repeat(np.arange(self.num_parts, dtype=np.int64), np.diff(self.offsets))
        if not self.scattered:
            return parts
        out = np.empty(len(parts), np.int64)
        out[self._order] = parts
        return out

    @cached_property
    def edge_parts(self) -> np.ndarray:
        """int64 [M, 2]: the parts of each training edge's source and destination."""
        return self.part_of_node[self.edge_batches.edges]

    def homes(self, epoch) -> tuple:
        """(perm, home, outsider): the epoch's part order (`groups`), each training edge's mega-batch and
        whether its destination is an outsider there (the class docstring's rule)."""
        perm, group_of = self.part_groups(epoch)
        g = group_of[self.edge_parts]                                   # [M, 2]
        static = self._static_mask[self.edge_batches.edges]            # [M, 2]
        apart = g[:, 0] != g[:, 1]
        home = np.where(apart & static[:, 0] & ~static[:, 1], g[:, 1], g[:, 0])
        return perm, home, apart & ~static.any(axis=1) & self.restricted

    def groups(self, epoch):
        """[(ranges, positions of its training edges, its outsiders, its negative pool)] of the epoch's
        mega-batches that hold edges, in order; outsiders are the rows read with it: the destinations outside its
        parts and its pool's nodes outside them."""
        perm, home, outsider = self.homes(epoch)
        dst = self.edge_batches.edges[:, 1]
        out = []
        for ranges, positions in self.by_group(perm, home):
            outsiders, pool = np.unique(dst[positions[outsider[positions]]]), self.pool(epoch, len(out))
            if pool is not None:
                outsiders = np.union1d(outsiders, np.setdiff1d(pool, _ids_of_ranges(ranges), assume_unique=True))
            out.append((ranges, positions, outsiders, pool))
        return out

    def epoch(self, epoch):
        rng = self.rng(epoch, 1)
        prev = self.groups(epoch - 1) if epoch > 0 else []
        resident, held = (prev[-1][0], prev[-1][2]) if prev else ([], _EMPTY)
        edges, b = self.edge_batches.edges, 0
        for g, (ranges, positions, outsiders, pool) in enumerate(self.groups(epoch)):
            visible = Visible(lambda r, x=outsiders: np.union1d(self.visible(r), x), ranges) if self.restricted else None
            nodes = None if not self.restricted else _ids_of_ranges(ranges) if pool is None else pool
            for j, batch in enumerate(self.batches(positions, rng)):
                step = self.edge_batches.batch(edges[batch], epoch, b, nodes)
                step.group, step.data, step.group_visible, step.scattered = g, self.data, visible, self.scattered
                if j == 0:              # the outsiders' rows come with the mega-batch: one coalesced gather
                    step.leave_ranges, step.enter_ranges = resident, ranges
                    step.leave_ids, step.enter_ids = held, outsiders
                    resident, held = ranges, outsiders
                b += 1
                yield step

    @cached_property
    def outsiders_by_part(self) -> tuple:
        """(rows, entries) per part, each sorted descending: the distinct other-part destinations of the edges
        whose source is in the part, and the sum of their degrees (statics included). A mega-batch's outsiders
        and their lists are at most its parts' sums: the largest N_d of each bound any grouping's. Unrestricted,
        none (zeros)."""
        if not self.restricted:
            return np.zeros(self.num_parts, np.int64), np.zeros(self.num_parts, np.int64)
        ep, dst = self.edge_parts, self.edge_batches.edges[:, 1]
        cross = ep[:, 0] != ep[:, 1]
        pairs = np.unique(np.stack([ep[cross, 0], dst[cross]], axis=1), axis=0)
        rows = np.bincount(pairs[:, 0], minlength=self.num_parts)
        entries = np.bincount(pairs[:, 0], self.store.degrees()[pairs[:, 1]], self.num_parts).astype(np.int64)
        return np.sort(rows)[::-1], np.sort(entries)[::-1]


class EdgePartitionSchedule(_GroupedEdges, PartitionSchedule):
    """OUTRE §4.2's partition-based batching for link prediction. The paper trains node classification only
    (papers/outre.md): a macro batch is `n_per_macro` random parts and its mini-batches are cut from their
    training nodes, so that they share neighbours (the Redundancy Ratio it lowers). Here its examples are
    training edges: an edge (u, v) trains in the macro batch of u's part where u + v is even, else of v's (the
    rule `distributed.edge_owner` splits edges between ranks by: an even share of the edges between two
    macro batches for each), its batches cut from the macro batch's shuffled edges (`EdgeSchedule.batch`, a
    short last one, as OUTRE's node batches). Sampling covers the graph, as OUTRE's does (rows outside the
    static cache are read directly), so negatives are drawn over every node, as an in-memory run's are."""
    name = "edge-partition"

    def __init__(self, store, batch_size=1024, n_per_macro=20, seed=0, num_negatives=100, chunks=10,
                 degree_fraction=0.0):
        super().__init__(store, batch_size, n_per_macro, seed)
        self.edge_batches = EdgeSchedule(store, batch_size, seed, num_negatives, chunks, degree_fraction)

    @cached_property
    def part_of_edge(self) -> np.ndarray:
        """int64 [M]: the part whose macro batch trains each training edge (the class docstring's rule)."""
        return edge_owner(self.offsets, self.edge_batches.edges)

    def groups(self, epoch):
        """[(ranges, positions of its training edges)] of the epoch's macro batches that hold edges, in order."""
        perm, group_of = self.part_groups(epoch)
        return list(self.by_group(perm, group_of[self.part_of_edge]))

    def epoch(self, epoch):
        rng, resident = self.rng(epoch, 1), self._previous(epoch)
        edges, b = self.edge_batches.edges, 0
        for g, (ranges, positions) in enumerate(self.groups(epoch)):
            for j, batch in enumerate(self.batches(positions, rng)):
                step = self.edge_batches.batch(edges[batch], epoch, b)
                step.group, step.data = g, self.data
                if j == 0:
                    step.leave_ranges, step.enter_ranges = resident, ranges
                    resident = ranges
                b += 1
                yield step
