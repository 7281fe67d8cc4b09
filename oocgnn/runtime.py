"""The executor's runtime: a plan's steps done for real.

`Runtime(store, plan)` holds what the plan declares resident: feature rows in a `CachedReader` over
the store's direct reader, neighbour lists in the sampler's topology source (`NeighbourLists`:
all of them, or the setup's and the steps' on a disk topology). It interprets the plan's steps:
setup rows and lists are read before the run; entering ranges are loaded by a loader into one of
two buffers, in a background thread while training runs on the other when the plan pipelines
(HierBatching §3.3), and the loader also builds the subgraph that sampling inside them needs;
scattered ranges (HB−) are one coalesced gather, and so are a step's scattered entering rows (its `enter_ids`:
a link mega-batch's outsiders), placed after its ranges' in the same buffer (on a disk topology their
lists too, after the ranges' lists).
Plans that read through the OS page cache run under `PageCacheCap`; the others bound their own
resident bytes (`OwnBudget`). The history stage (`oocgnn.history`) decides which input rows a
batch needs and finishes its forward pass. Plans that sample ahead (Ginex, BatchGNN) get their
steps from the sample-ahead stage (`oocgnn.ahead.AheadStage`), which also drives their cache.
"""
from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .ahead import AheadStage
from .buffer import PartitionBuffer
from .device import HostToDevice, blocks_of
from .errors import UserError
from .history import HistoryCache, NoHistory
from .io import IOStats, drop_file_cache, range_chunks
from .memcap import MemoryCap
from .resident import CachedReader
from .sampler import Sampler, induced_csc, sampled_steps
from .schedules import _ids_of_ranges
from .topology import NeighbourLists



class OwnBudget:
    """The plan bounds its own resident arrays (checked by `Plan.check_budget`): no cgroup."""

    def __init__(self, runtime):
        self.name = runtime.plan.name

    def context(self):
        return contextlib.nullcontext(None)

    def end_warmup(self):
        pass

    def record(self) -> dict:
        return {"enforced": False, "reason": f"{self.name} bounds its own resident arrays (no cgroup)"}


class PageCacheCap:
    """Reads through np.memmap (MADV_RANDOM): the OS page cache is the only cache.

    Honest only under an enforced limit. A memory cgroup counts the process's new allocations
    as well as the page cache, so the run is capped at `budget + 1.25 W + 16 MiB`, where W is
    the working memory of sampling, training and evaluation, measured in the same cgroup during
    the warm-up steps while features are read with O_DIRECT (no page cache). What is left for
    caching feature pages during a step is then about the budget.
    """
    unlimited = 1 << 50

    def __init__(self, runtime):
        self.runtime, self.cap, self.working_set = runtime, None, None

    def context(self):
        drop_file_cache(self.runtime.store.features_path)
        self.cap = MemoryCap(self.unlimited)
        return self.cap

    def end_warmup(self):
        """Cap at budget + measured working set, then switch to the mmap reader."""
        budget = self.runtime.plan.budget
        self.working_set = self.cap.peak() if self.cap and self.cap.enforced else None
        if self.working_set is not None:
            self.cap.set_limit(budget + int(1.25 * self.working_set) + (16 << 20))
            self.cap.reset_peak()
        self.runtime.switch_reader(self.runtime.store.reader("mmap"))

    def record(self) -> dict:
        if self.cap is None:
            return {"enforced": False, "reason": "the run ended before its warm-up"}
        return {**self.cap.record(), "budget": self.runtime.plan.budget, "working_set": self.working_set}


class RangeLoader:
    """Loads a step's entering ranges (their feature rows and, on a disk topology, their lists) into
    one of two buffers, in a background thread if pipelined, and builds the subgraph they induce for
    sampling (the loader prepares both, HierBatching §3.3)."""

    def __init__(self, runtime, pipeline):
        self.runtime, self.pipeline = runtime, pipeline
        plan, store = runtime.plan, runtime.store
        self.rows, self.row_base = plan.group_rows(), plan.setup_rows()
        self.entries, self.entry_base = plan.group_entries(), plan.setup_entries()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="oocgnn-load") if pipeline else None
        self.pending = None                           # (step, future)
        self.buffer = 0                               # which half holds the current group
        # its own readers: what each load read is known exactly, whatever the trainer reads meanwhile
        self.reader = store.reader("direct") if self.rows else None
        self.lists_reader = NeighbourLists.index_reader(store) if self.entries else None

    def io(self) -> tuple:
        """(feature, list) reads of every load so far."""
        return tuple(r.stats.snapshot() if r is not None else IOStats() for r in (self.reader, self.lists_reader))

    def pending_io(self) -> tuple:
        """(feature, list) reads of the load running ahead (done or not yet: waited for)."""
        if self.pending is None:
            return IOStats(), IOStats()
        return self.pending[1].result()[2]

    def bases(self, half):
        """(first feature slot, first list entry) of buffer `half`."""
        return self.row_base + half * self.rows, self.entry_base + half * self.entries

    def _read(self, step, half):
        """Read `step`'s rows and lists into buffer `half`; returns (seconds reading, induced CSC or None)."""
        t, c, io0 = time.perf_counter(), time.thread_time(), self.io()
        rt = self.runtime
        base, entry_base = self.bases(half)
        reader, rows = self.reader, rt.cached.rows
        if "features" in step.data and step.scattered:     # HB−: one coalesced gather of scattered rows
            ids = _ids_of_ranges(step.enter_ranges)
            rows[base:base + len(ids)] = _tensor(reader.read_rows(ids))
        elif "features" in step.data:                      # sequential reads, range by range
            pos = base
            for lo, hi in step.enter_ranges:
                for a, b in range_chunks(lo, hi, rt.store.row_stride):
                    rows[pos:pos + b - a] = _tensor(reader.read_range(a, b))
                    pos += b - a
        if "features" in step.data and len(step.enter_ids):  # scattered rows after them: one coalesced gather
            pos = base + sum(hi - lo for lo, hi in step.enter_ranges)
            rows[pos:pos + len(step.enter_ids)] = _tensor(reader.read_rows(step.enter_ids))
        ids_base = entry_base
        if "adjacency" in step.data:                       # the ranges' lists, then the scattered ids' (one gather)
            ids_base += rt.topology.read_ranges(step.enter_ranges, entry_base, self.lists_reader)
            rt.topology.read_ids(step.enter_ids, ids_base, self.lists_reader)
        seconds, t = time.perf_counter() - t, time.perf_counter()
        rt._time("load_cpu", time.thread_time() - c)          # the processor's share (the cost model's)
        c = time.thread_time()
        io = tuple(a - b for a, b in zip(self.io(), io0))
        induced = None
        if step.visible is not None:
            lists = "adjacency" in step.data
            spans = rt.topology.group_spans(step.visible, step.enter_ranges if lists else [], entry_base,
                                            step.enter_ids if lists else (), ids_base)
            induced = induced_csc(rt.topology, step.visible, spans)
        rt._time("subgraph", time.perf_counter() - t)
        rt._time("subgraph_cpu", time.thread_time() - c)
        return seconds, induced, io

    def load(self, step, next_step) -> tuple:
        """Make `step`'s ranges resident (returns the bases of their buffer); start loading `next_step`'s."""
        half = 1 - self.buffer if self.pipeline else 0
        if self.pending is not None and self.pending[0] is step:
            t = time.perf_counter()
            seconds, induced, _ = self.pending[1].result()
            self.runtime._time("wait", time.perf_counter() - t)
        else:
            seconds, induced, _ = self._read(step, half)
        self.runtime._time("load", seconds)
        if induced is not None:
            self.runtime.sampler.prepare(step.visible, induced)
        self.pending, self.buffer = None, half
        if self.pipeline and next_step is not None:
            self.pending = (next_step, self.pool.submit(self._read, next_step, 1 - half))
        return self.bases(half)

    def close(self):
        if self.pool:
            self.pool.shutdown(wait=True)
        for r in (self.reader, self.lists_reader):
            if r is not None:
                r.close()


def _tensor(a):
    import torch
    return torch.from_numpy(a)


class Runtime:
    """Resident rows and lists, readers, the sampler, loader, memory cap and history stage of one run
    of `plan`."""

    def __init__(self, store, plan, device="cpu"):
        self.store, self.plan = store, plan
        self.h2d = HostToDevice(device)               # the model's device: pinned buffers, side stream
        self.cached = CachedReader(store.reader("direct"), store.num_nodes, plan.capacity(), plan.dynamic_rows(),
                                   codec=store.codec)
        self.topology = NeighbourLists(store, plan.list_capacity())
        self.sampler = Sampler(self.topology, plan.fanouts, plan.seed, dense=plan.dense)
        self.io_before_switch = IOStats()             # stats of readers replaced mid-run
        self.timers = {}                              # background stages (the loader thread)
        self._setup_rows = []                         # scattered rows the setup placed (they keep their slots)
        # entering ranges: into one of two buffers, or a partition buffer's slots (MariusGNN)
        self.loader = (PartitionBuffer if plan.partition_buffer else RangeLoader)(self, plan.pipeline)
        self.cap = PageCacheCap(self) if plan.reader == "mmap" else OwnBudget(self)
        self.stage = None                             # the history stage: made at setup (it may profile)
        self.ahead = AheadStage(self) if plan.lookahead else None   # sample ahead, then fetch (Ginex, BatchGNN, composed)
        # evaluation (and the plan's profiling) read lists outside the measured run: with their own reader
        self.eval_topology = self.topology if plan.topology == "memory" else \
            self.topology.view(NeighbourLists.index_reader(store))
        plan.lists = self.eval_topology
        # evaluation reads rows outside the measured run; through the page cache, there is only one
        self.eval_reader = store.reader("direct") if plan.reader == "direct" else None
        self.stream_reader = None                     # layer-wise evaluation's own direct reader (made on use)

    def _time(self, stage, seconds):
        self.timers[stage] = self.timers.get(stage, 0.0) + seconds

    def memory(self) -> dict:
        """Bytes the runtime really holds, by the plan's kinds (`Plan.memory()` predicts them; the
        induced subgraphs it bounds are built per group and not counted here)."""
        out = {"feature_rows": self.cached.rows.numel() * self.cached.rows.element_size(), "slot_table": self.cached.slot.nbytes,
               "topology": self.topology.nbytes if self.plan.topology == "disk" else
               self.topology.indptr.nbytes + self.store.num_edges * self.topology.dtype.itemsize,
               "sampler": self.sampler.scratch.nbytes}
        if self.stage is not None and self.plan.history is not None:
            out["history"] = self.stage.nbytes
        if self.ahead is not None:                    # built per chunk: their bound (`ahead.sample_nbytes`)
            out["samples"] = self.plan.samples_bytes()
        if isinstance(self.loader, PartitionBuffer):  # read per state: their bound (`loader.nbytes` now)
            out["buckets"] = self.plan.memory()["buckets"]
        return out

    # -- the plan's steps --------------------------------------------------------------------
    def setup(self):
        """Load what the plan keeps resident all run (before the first step), in the plan's order: its
        lists first, so that profiling what else to keep samples through them; then the history stage."""
        rows = entries = 0
        for step in self.plan.setup():
            if "features" in step.data:
                if len(step.enter_ids):
                    self.cached.read_into(step.enter_ids, rows)
                    self._setup_rows.append(step.enter_ids)
                    rows += len(step.enter_ids)
                for lo, hi in step.enter_ranges:
                    for a, b in range_chunks(lo, hi, self.store.row_stride):
                        self.cached.place(np.arange(a, b), rows, self.cached.reader.read_range(a, b))
                        rows += b - a
            if "adjacency" in step.data:
                if step.enter_ranges == [(0, self.store.num_nodes)]:
                    self.topology.place_all()
                elif step.enter_ranges:
                    raise UserError("plans keep whole lists in setup ranges only for every node")
                entries += self.topology.place_ids(step.enter_ids, entries) if len(step.enter_ids) else 0
        self.stage = HistoryCache.of(self.plan.history, self.store.num_nodes) if self.plan.history else NoHistory()
        if self.ahead is not None:                    # its fetch reader (a packed file is written here)
            self.ahead.setup()

    def before(self, step, next_load):
        """Apply the step's residency change before its batch is sampled; `next_load` (the next step
        that loads ranges, or None) starts loading in the background when the plan pipelines."""
        if "buckets" in step.data:                    # a partition buffer: it loads what the state lacks
            return self.loader.before(step, next_load)
        if not (step.enter_ranges or len(step.enter_ids)) or not step.data:
            return
        if "features" in step.data:
            for lo, hi in step.leave_ranges:
                self.cached.drop(np.arange(lo, hi))
            self.cached.drop(step.leave_ids)
        if "adjacency" in step.data:
            self.topology.drop_ranges(step.leave_ranges)  # the setup's lists stay
            self.topology.drop_ids(step.leave_ids)
        base, entry_base = self.loader.load(step, next_load)
        if "features" in step.data:
            ranged = _ids_of_ranges(step.enter_ranges)
            self.cached.point(ranged, base)
            self.cached.point(step.enter_ids, base + len(ranged))   # scattered rows after the ranges'
            for ids in self._setup_rows:              # setup rows keep their slots
                self.cached.point(ids, 0)
        if "adjacency" in step.data:
            self.topology.point_ranges(step.enter_ranges, entry_base)
            ranged = sum(int(self.topology.indptr[hi] - self.topology.indptr[lo]) for lo, hi in step.enter_ranges)
            self.topology.point_ids(step.enter_ids, entry_base + ranged)   # scattered lists after the ranges'

    def walk(self, steps, sample, before, start=0):
        """(i, epoch, batch, step, sample) of the run's steps from `start` (`sampler.sampled_steps`, with
        `sample` the sampler's call and `before` the residency change); a plan that samples ahead gets
        them a chunk ahead, from the stage's thread (the sampler's own calls: timed there)."""
        if self.ahead is None:
            return sampled_steps(steps, SimpleNamespace(sample=sample), before=before, start=start)
        def timed_sample(*args):
            t = time.perf_counter()
            out = self.sampler.sample(*args)
            self._time("sample", time.perf_counter() - t)
            return out
        return self.ahead.walk(steps, timed_sample, before, start)

    def gather(self, ids):
        """Feature rows of `ids` for training (resident from RAM, the rest read): float32 on the CPU; on a
        GPU into a pinned buffer as stored, decoded after the copy (`to_device`: a compressed store's rows
        cross the bus compressed)."""
        stored = self.h2d.on_gpu
        out = self.h2d.buffer(len(ids), self.store.feat_dim, self.cached.rows.dtype)
        source = self.cached if self.ahead is None else self.ahead
        return source.gather(ids, out=out, stored=stored)

    def to_device(self, tensors, ctx):
        """The batch's tensors and its blocks on the model's device (`device.HostToDevice`), its input rows
        (the first tensor) decoded there."""
        moved = self.h2d(tensors, blocks_of(ctx))
        return [self.cached.decode(moved[0]), *moved[1:]] if moved else moved

    def eval_rows(self, ids):
        """Feature rows for evaluation: resident from RAM, the rest through the evaluation reader."""
        return self.cached.gather(ids, self.eval_reader)

    def stream_rows(self, ids):
        """Feature rows for layer-wise evaluation (sorted ids, read once each): resident from RAM, the
        rest by direct reads of its own reader (never in the run's I/O, whatever the plan's reader)."""
        if self.stream_reader is None:
            self.stream_reader = self.store.reader("direct")
        return self.cached.gather(ids, self.stream_reader)

    def labels(self):
        """The labels of every node (a tensor indexed by store id)."""
        return _tensor(self.store.compact_labels())

    def log_fields(self) -> dict:
        """Counters the log adds to its columns (none: reads are already there)."""
        return {}

    def record(self) -> dict:
        """What a rank adds to its record in a distributed run's summary (nothing: its reads are there)."""
        return {}

    def summarize(self, records) -> dict:
        """What a distributed run's summary adds from every rank's record (nothing)."""
        return {}

    # -- the history stage ---------------------------------------------------------------------
    def inputs(self, sample, t):
        """(x, what `forward` needs): the input rows the batch uses (a history plan prunes them)."""
        return self.stage.inputs(sample, t, self.gather)

    def forward(self, model, ctx, x, t):
        return self.stage.forward(model, ctx, x, t)

    # -- readers and the memory cap ------------------------------------------------------------
    def io(self) -> IOStats:
        """Everything the run's feature readers read so far (a reader replaced mid-run included)."""
        return self.io_before_switch + self.cached.stats + self.loader.io()[0] + \
            (self.ahead.io() if self.ahead is not None else IOStats())

    def topology_io(self) -> IOStats:
        """Everything the run read of indices.bin."""
        return self.topology.stats + self.loader.io()[1]

    def switch_reader(self, reader):
        self.io_before_switch += self.cached.reader.stats
        self.cached.reader.close()
        self.cached.reader = reader

    def memory_cap(self):
        return self.cap.context()

    def end_warmup(self):
        self.cap.end_warmup()

    def cap_record(self) -> dict:
        return self.cap.record()

    def state(self) -> dict:
        """What a checkpoint needs of the runtime: the history stage (the rest follows from the plan)."""
        stage = self.stage
        return {"stats": dict(stage.stats), **({"emb": stage.emb.clone(), "stamp": stage.stamp.copy()}
                                               if isinstance(stage, HistoryCache) else {})}

    def load_state(self, state: dict):
        self.stage.stats.update(state["stats"])
        if isinstance(self.stage, HistoryCache):
            self.stage.emb.copy_(state["emb"])
            self.stage.stamp[:] = state["stamp"]

    @property
    def history_hits(self) -> int:
        return self.stage.stats["hits"] if self.stage is not None else 0

    def eval_io(self) -> tuple:
        """(features, lists) evaluation read through its own readers (layer-wise streaming, batch evaluation's
        reader, its view of the lists), never counted in the run's I/O."""
        rows = sum((r.stats for r in (self.eval_reader, self.stream_reader) if r is not None), IOStats())
        own = self.eval_topology is not None and self.eval_topology.reader is not self.topology.reader
        return rows, (self.eval_topology.reader.stats if own else IOStats())

    def close(self):
        self.loader.close()
        if self.ahead is not None:
            self.ahead.close()
        for r in (self.eval_reader, self.stream_reader):
            if r is not None:
                r.close()
        if self.eval_topology is not None and self.eval_topology.reader is not self.topology.reader:
            self.eval_topology.reader.close()
        self.cached.reader.close()
        self.topology.close()
