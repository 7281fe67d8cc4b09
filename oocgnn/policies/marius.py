"""MariusGNN (§3, §5): a buffer of partitions and their edge buckets, in COMET/BETA orderings."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..buckets import physical_offsets
from ..errors import UserError
from ..orderings import PLACEMENTS, ORDERINGS, auto_logical, comet_shape, swap_size
from ..edgeschedules import STATE_BATCHES, EdgeBufferSchedule
from ..schedules import make_schedule
from ..units import format_size
from .base import Plan, register, setting

@register
class MariusPlan(Plan):
    """MariusGNN (§3, §5): a buffer of c of p physical partitions holding their features and the edge
    buckets among them (`oocgnn.buckets`), in the states of an ordering (`oocgnn.orderings`: COMET by
    default, BETA, sequential); each training node trains in one state (where one step covers the training set,
    the one, among those holding its partition, that holds most of its neighbours; else MariusGNN's rule), sampling
    only over the edges inside the buffer. Swaps read whole partitions and buckets sequentially, the next state's in the
    background (`oocgnn.buffer`). The topology is on disk: the buckets are all the run reads of it
    (evaluation reads lists as every policy's does). c defaults to the most partitions the budget holds; the
    prefetch slot is taken only from what is left (a larger buffer loses fewer neighbours and loads fewer states).
    On a link store the examples are the training edges, by edge bucket (`edgeschedules.EdgeBufferSchedule`)."""
    listed = 6
    name, source, induces, partition_buffer = "marius", "MariusGNN §3, §5", True, True
    tasks = ("node", "link")     # link: each edge bucket trains in a state holding both its partitions
    io_pattern = "sequential partitions + edge buckets, in the background"
    grid = ({"ordering": "comet"}, {"ordering": "beta"})

    @dataclass
    class Options:
        physical_parts: int = setting(16, "p: physical partitions, consecutive store parts grouped (at most the "
                                          "store's parts)")
        buffer_parts: int = setting(0, "c: physical partitions in the buffer (0: the most the budget holds)")
        ordering: str = setting("comet", "buffer states: comet (MariusGNN) | beta (Marius) | sequential (control)")
        logical_parts: int = setting(0, "l: COMET's logical partitions (0: MariusGNN's rule, 2p/c; where that "
                                      "does not split p and c, the fewest l < p with c·l/p whole, >= 2)")
        prefetch: str = setting("auto", "load the next state's partitions and buckets while this one trains: on | "
                                        "off | auto (on where the budget holds its slot beside the largest buffer c "
                                        "it holds without one: never a smaller c for it)")
        placement: str = setting("auto", "node stores: the state each training node trains in, among those "
                                         "holding its partition: neighbours (the one holding most of its "
                                         "neighbours: in-buffer sampling loses the fewest) | ordering (MariusGNN's: "
                                         "COMET draws one at random, BETA takes the first) | auto (neighbours where "
                                         "one label-balanced step covers the training set, else ordering)")
        state_batches: str = setting("even", "link stores: a state's edges in batches of equal sizes, as many as "
                                             "batches of --batch-size take (even) | in batches of --batch-size and a "
                                             "short last one (full: MariusGNN's) | the states' edges cut every "
                                             "--batch-size edges, a batch that spans two states an optimizer step "
                                             "accumulated over both (carry)")

        def __post_init__(self):
            if self.physical_parts < 1 or self.buffer_parts < 0 or self.logical_parts < 0:
                raise UserError("physical_parts must be >= 1, buffer_parts and logical_parts >= 0 (0: automatic)")
            if self.ordering not in ORDERINGS:
                raise UserError(f"ordering must be one of {', '.join(ORDERINGS)}, got {self.ordering!r}")
            if self.placement not in ("auto",) + PLACEMENTS:
                raise UserError(f"placement must be one of auto, {', '.join(PLACEMENTS)}, got {self.placement!r}")
            if isinstance(self.prefetch, bool):       # run configs written when it was a switch
                self.prefetch = "on" if self.prefetch else "off"
            if self.prefetch not in ("auto", "on", "off"):
                raise UserError(f"prefetch must be auto, on or off, got {self.prefetch!r}")
            if self.state_batches not in STATE_BATCHES:
                raise UserError(f"state_batches must be one of {', '.join(STATE_BATCHES)}, got {self.state_batches!r}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        o = self.options
        if cfg.topology == "memory":
            raise UserError("marius keeps only its buffer's edge buckets in memory: use --topology disk or auto")
        self.topology = "disk"
        self.p = min(o.physical_parts, store.num_parts)
        if self.p < 2:
            raise UserError(f"marius needs a partitioned store; {store.path} has 1 part "
                            "(prepare it with --partitioner metis|fennel|random --parts K)")
        bounds = physical_offsets(store, self.p)
        self.part_rows, self.part_entries = np.diff(bounds), np.diff(np.asarray(store.indptr)[bounds])
        self.c, self.pipeline = self._buffer_and_prefetch()
        if self.c > self.p:
            raise UserError(f"--buffer-parts {self.c} exceeds the {self.p} physical partitions")
        self.l = o.logical_parts
        if o.ordering == "comet":
            comet_shape(self.p, self.c, self.l or auto_logical(self.p, self.c))

    def describe(self):
        return {"buffer": self.buffer()}

    @staticmethod
    def summary_lines(s):
        b = s["buffer"]
        return [f"buffer: {b['ordering']}, c={b['c']} of p={b['p']} partitions" + (f", l={b['l']}" if b["l"] else "")
                + ("" if b.get("prefetch", True) else ", without a prefetch slot")
                + f", {b['states_loaded']} of {b['states_per_epoch']} states loaded in epoch 0 (states without "
                "training nodes are skipped)" + (f"; training nodes placed by {b['placement']}" if "placement" in b
                                                 else "")]

    def mixing_fix(self, more_parts):
        """A state is c of p partitions: more of them (c from a larger budget, or a larger p at the same c/p, each
        state then a random union of more, smaller partitions) mix it more."""
        c, p = getattr(self, "c", "c"), getattr(self, "p", "p")
        more_p = f" {2 * p}" if isinstance(p, int) else ""
        return f"a larger --buffer-parts (now {c} of {p}) or more, smaller partitions (--physical-parts{more_p})"

    def buffer(self) -> dict:
        """The buffer this plan runs (c from the budget when not given): for run summaries."""
        sch = self.schedule
        return {"ordering": self.options.ordering, "p": self.p, "c": self.c, "l": sch.l,
                "prefetch": self.pipeline, "states_per_epoch": len(sch.states(0)[0]),
                "states_loaded": len(sch.groups(0)),
                **({"placement": self.placement} if self.task == "node" else {})}

    def valid_c(self) -> list:
        """Buffer sizes the ordering accepts at p (COMET: those giving whole r and c_l >= 2 at l)."""
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

    def _need(self, c, prefetch) -> int:
        return sum(self._memory(c, prefetch).values())

    def _buffer_and_prefetch(self) -> tuple:
        """(c, prefetch): `--buffer-parts` or the largest c the budget holds (without a prefetch slot unless
        `--prefetch on`); under `--prefetch auto` the slot is added where the budget still holds it. MariusGNN
        sizes the buffer to memory (§3): a larger c keeps more of a node's neighbours in its state and loads
        fewer states (on coauthor_cs at a third of its features, c = 4 of 16 without the slot instead of c = 2
        with it)."""
        o = self.options
        slot = o.prefetch == "on"
        c = o.buffer_parts or self._most_that_fit(slot)
        if o.prefetch == "auto":
            slot = not self.budgeted or self._need(c, True) <= self.budget
        return c, slot

    def _most_that_fit(self, prefetch) -> int:
        fits = [c for c in self.valid_c() if self._need(c, prefetch) <= self.budget]
        if not fits:
            c = min(self.valid_c(), default=2)
            raise UserError(f"policy marius needs {format_size(self._need(c, prefetch))} for its smallest buffer "
                            f"(c={c} of p={self.p} partitions{', and a prefetch slot' if prefetch else ''}) but "
                            f"--memory-budget is {format_size(self.budget)}; raise the budget or --physical-parts "
                            "(smaller partitions)" + (" or use --prefetch off" if prefetch else ""))
        return max(fits)

    def _swap(self, c) -> int:
        return swap_size(self.options.ordering, self.p, c, self.options.logical_parts)

    @cached_property
    def schedule(self):
        """Training nodes in their states, or on a link store the edge buckets (`edgeschedules.EdgeBufferSchedule`)."""
        cfg, buffer = self.cfg, {"physical_parts": self.p, "buffer_parts": self.c, "ordering": self.options.ordering,
                                 "logical_parts": self.l}
        if self.task == "link":
            return EdgeBufferSchedule(self.store, cfg.batch_size, seed=self.seed, num_negatives=cfg.negatives,
                                      chunks=cfg.negative_chunks, degree_fraction=cfg.negative_degree_fraction,
                                      state_batches=self.options.state_batches, **buffer)
        return make_schedule("buffer", self.store, batch_size=cfg.batch_size, seed=self.seed,
                             placement=self.placement, **buffer)

    @cached_property
    def accumulate(self) -> bool:
        """`--accumulate`; auto on a link store: on with `--state-batches carry` (a batch that spans two states is
        one optimizer step of --batch-size edges), else off."""
        if self.task == "link" and self.cfg is not None and self.cfg.accumulate == "auto":
            return self.options.state_batches == "carry"
        return super().accumulate

    @property
    def placement(self) -> str:
        """`--placement`, auto resolved: neighbours where label-balanced steps are not off and the training set
        fits one step (each step then sees every state's labels, whatever states the nodes crowd into), else
        MariusGNN's. Crowded states cost where a step is a few states' batches: on amazon_photo's random split at
        batch 256 (3 steps an epoch) neighbours lost 3.0 points to inmemory, MariusGNN's rule 0.9."""
        o = self.options
        if o.placement != "auto":
            return o.placement
        fits = self.cfg.accumulate != "off" and len(self.store.train_idx) <= self.cfg.batch_size
        return "neighbours" if fits else "ordering"

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

    def _memory(self, c, prefetch):
        n, isz = self.store.num_nodes, np.dtype(self.store.meta["index_dtype"]).itemsize
        slots = c + (self._swap(c) if prefetch else 0)
        rows_c, entries_c = self._largest(self.part_rows, c), self._largest(self.part_entries, c)
        return {"feature_rows": slots * int(self.part_rows.max()) * self.store.row_bytes, "slot_table": 4 * n,
                "topology": (n + 1) * 8 + 8 * n, "sampler": 4 * n,
                # the held buckets (and, while a swap is read, the entering partitions'): pairs of ids
                "buckets": self._largest(self.part_entries, slots) * 2 * isz,
                "induced": self.subgraphs() * ((rows_c + 1) * 8 + entries_c * 4)}

    def memory(self):
        return self._memory(self.c, self.pipeline)
