"""The executor's partition buffer (MariusGNN §3): c physical partitions and the edge buckets among them.

A state change (a step whose `buffer` differs from what is held) drops the partitions that leave
(their feature slots freed, their buckets forgotten), reads the entering partitions' feature rows
into free slots (one sequential read each) and the buckets pairing them with the buffer (sequential
reads of the bucket file, `buckets.EdgeBuckets.read`), and builds the subgraph sampling sees
(`buckets.buffer_csc`). With prefetching the next state's partitions and buckets are read, and its
subgraph built, in a background thread while this state trains (MariusGNN §3, Steps A–D), into the
slots the plan keeps spare for one swap; a change larger than that (an epoch's first state) is
loaded in the foreground once the partitions leaving are gone.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .buckets import buffer_csc
from .io import IOStats, range_chunks


def read_into_slot(reader, rows, pos, lo, hi, row_stride) -> int:
    """Feature rows [lo, hi) read sequentially (`io.range_chunks`) into the table `rows` from row `pos`
    on: one partition loaded into its slot. Returns the row after the last one written."""
    for a, b in range_chunks(lo, hi, row_stride):
        rows[pos:pos + b - a] = torch.from_numpy(reader.read_range(a, b))
        pos += b - a
    return pos


class PartitionBuffer:
    """`slots` feature slots of `slot_rows` rows in the runtime's `CachedReader`, a partition in each;
    the buckets among the held partitions; its own readers (what each load read is known exactly)."""

    def __init__(self, runtime, prefetch):
        self.runtime, plan = runtime, runtime.plan
        sch = plan.schedule
        self.buckets, self.bounds = sch.buckets, sch.bounds
        self.slot_rows, self.free = plan.group_rows(), list(range(plan.buffers()))[::-1]
        self.slot_of, self.edges = {}, {}             # partition -> slot; (i, j) -> pairs
        self.visible = None                           # the Visible whose subgraph the sampler holds
        self.reader = runtime.store.reader("direct")
        self.bucket_reader = self.buckets.reader()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="oocgnn-buffer") if prefetch else None
        self.pending = None                           # (step, future of its load)

    def io(self) -> tuple:
        """(feature, bucket) reads of every load so far."""
        return self.reader.stats.snapshot(), self.bucket_reader.stats.snapshot()

    def pending_io(self) -> tuple:
        if self.pending is None:
            return IOStats(), IOStats()
        return self.pending[1].result()[3]

    @property
    def nbytes(self) -> int:
        """Bytes of the buckets held (the feature slots are the CachedReader's)."""
        return self.buckets.nbytes_of(self.edges)

    def _read(self, step, placed, held_edges):
        """Read the partitions `placed` ({partition: slot}: those of `step.buffer` not held) into their slots
        and the buckets the buffer lacks; build its subgraph from them and the `held_edges` it keeps.
        Returns (seconds reading, placed, the state's buckets, io, subgraph)."""
        t, c, io0 = time.perf_counter(), time.thread_time(), self.io()
        rows = self.runtime.cached.rows
        for k, slot in placed.items():
            read_into_slot(self.reader, rows, slot * self.slot_rows, int(self.bounds[k]), int(self.bounds[k + 1]),
                           self.runtime.store.row_stride)
        got = self.buckets.read(self.buckets.pairs(step.buffer, self.slot_of), self.bucket_reader)
        seconds, t = time.perf_counter() - t, time.perf_counter()
        self.runtime._time("load_cpu", time.thread_time() - c)          # the processor's share (the cost model's)
        c = time.thread_time()
        edges = {pair: held_edges[pair] for pair in held_edges if pair[0] in step.buffer and pair[1] in step.buffer}
        edges.update(got)
        subgraph = buffer_csc(self.buckets, step.buffer, edges)[1]
        self.runtime._time("subgraph", time.perf_counter() - t)
        self.runtime._time("subgraph_cpu", time.thread_time() - c)
        return seconds, placed, edges, tuple(a - b for a, b in zip(self.io(), io0)), subgraph

    def _drop(self, parts):
        cached = self.runtime.cached
        for k in parts:
            cached.drop(np.arange(self.bounds[k], self.bounds[k + 1]))
            self.free.append(self.slot_of.pop(k))

    def before(self, step, next_step):
        """Hold `step.buffer` (loading what is missing) and its subgraph; start loading `next_step`'s."""
        if step.group_visible is self.visible:
            return
        t = time.perf_counter()
        if self.pending is not None and self.pending[0] is step:
            result = self.pending[1].result()
            self.runtime._time("wait", time.perf_counter() - t)
        else:
            if self.pending is not None:              # a load for a step that did not come (a resume)
                self.free.extend(self.pending[1].result()[1].values())
            result = None
        self.pending = None
        self._drop([k for k in list(self.slot_of) if k not in step.buffer])
        if result is None:                            # the leaving partitions' buckets go before the read
            keep = set(step.buffer)
            self.edges = {pair: e for pair, e in self.edges.items() if pair[0] in keep and pair[1] in keep}
            result = self._read(step, self._slots_for(step), self.edges)
        seconds, placed, self.edges, _, subgraph = result
        self.runtime._time("load", seconds)
        for k, slot in placed.items():
            self.slot_of[k] = slot
            self.runtime.cached.point(np.arange(self.bounds[k], self.bounds[k + 1]), slot * self.slot_rows)
        self.visible = step.group_visible
        self.runtime.sampler.prepare(step.visible, subgraph)
        if self.pool is not None and next_step is not None:
            if sum(k not in self.slot_of for k in next_step.buffer) <= len(self.free):   # room beside this state
                self.pending = (next_step, self.pool.submit(self._read, next_step, self._slots_for(next_step),
                                                            self.edges))

    def _slots_for(self, step) -> dict:
        """{partition: free slot} for the partitions of `step.buffer` not held."""
        return {k: self.free.pop() for k in step.buffer if k not in self.slot_of}

    def close(self):
        if self.pool:
            self.pool.shutdown(wait=True)
        self.reader.close()
        self.bucket_reader.close()
