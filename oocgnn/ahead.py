"""Sample ahead, then fetch: Ginex superbatches (Ginex §3) and BatchGNN macrobatches (BatchGNN §4).

Both papers sample a chunk of mini-batches before fetching any feature row, then fetch what the
chunk needs once, in the best order. A plan with `lookahead` S > 0 walks its steps in chunks of S
consecutive batches of one epoch (`chunks`); its `fetcher` turns a chunk's sampled input rows into
a `ChunkFetch`:

- `BeladyFetch` (Ginex §3.4): the Belady changesets of the superbatch (`belady.belady_changesets`,
  computed over the superbatch's own ids so its scratch is O(accesses), not O(N)). At the chunk's
  start the feature cache is made its `init` (the rows not already held are read: Ginex's
  "switch"); after each batch's gather the cache evicts `out` and admits `in` from the batch's own
  rows, so a miss is read once, when its batch gathers it.
- `UnionFetch` (BatchGNN): the union of the chunk's input rows, minus an optional static cache,
  read in one deduplicated, coalesced call into one of two buffers; every batch of the chunk then
  gathers from RAM.

The composed policy (`policies.ComposedPlan`) runs a `BeladyFetch` over what each chunk of a
mega-batch reads outside it and the static set (its `chunk_fetch`); its chunks never span two
mega-batches, and a mega-batch's load happens once the chunks before it have trained.

The simulator (`oocgnn.simulate`) and the executor's stage (`AheadStage`, which samples and
prepares the next chunk in a background thread while the current one trains) read the same
`ChunkFetch`es, so their reads agree exactly (a test).
"""
from __future__ import annotations

import queue
import threading
import time
from typing import NamedTuple

import numpy as np
import torch

from .belady import belady_changesets
from .blocks import background_thread
from .errors import UserError
from .history import HistoryStamps
from .io import IOStats, range_chunks
from .trace import Trace


def sample_bound(batch_size, fanouts, num_nodes, num_edges, dense=False) -> tuple[int, int]:
    """(input rows, bytes) a sampled batch of `batch_size` seeds can hold at most: layer by layer from
    the seeds, ≤ fanout distinct picks per destination (all its edges for -1), every count capped by
    the graph's nodes and edges; bytes of our `Block`s (int64 indptr, indices and src_nodes). `dense`:
    a destination keeps the draw of the outermost layer it met first (DENSE), so up to the largest
    fanout from its layer to the seeds' (new rows still come only from the layer's own fanout)."""
    dst, nbytes, fanouts = min(int(batch_size), int(num_nodes)), 0, [int(f) for f in fanouts]
    for i in range(len(fanouts) - 1, -1, -1):
        f = fanouts[i]
        reach = -1 if dense and -1 in fanouts[i:] else (max(fanouts[i:]) if dense else f)
        edges = int(num_edges) if reach < 0 else min(dst * reach, int(num_edges))
        src = min(int(num_nodes), dst + edges)
        nbytes += 8 * (dst + 1) + 8 * edges + 8 * src
        dst = src
    return dst, nbytes


_NONE = np.empty(0, np.int32)


class ChunkFetch(NamedTuple):
    """What a chunk fetches: `resident`, the sorted rows its dynamic cache holds from the chunk's start
    (read then: those not yet held, or all of them if `reread`), and per batch (in_ids, out_ids,
    positions of in_ids in the batch's sorted input rows) applied after its gather, or None. `span`:
    the rows are read as rows [lo, hi) of the plan's fetch reader, one sequential range (DiskGNN's packed
    batch, `policies.packed`), instead of by id from features.bin."""
    resident: np.ndarray
    changes: list | None
    reread: bool
    span: tuple | None = None


class BeladyFetch:
    """Ginex §3.4: the Belady-optimal changesets of one superbatch for a cache of `capacity` rows."""

    def __init__(self, capacity):
        self.capacity = int(capacity)

    def __call__(self, inputs) -> ChunkFetch:
        if not sum(len(a) for a in inputs):
            return ChunkFetch(np.empty(0, np.int64), [(_NONE, _NONE, _NONE)] * len(inputs), False)
        uniq, local = np.unique(np.concatenate(inputs), return_inverse=True)   # the superbatch's own ids
        offsets = np.zeros(len(inputs) + 1, np.int64)
        np.cumsum([len(a) for a in inputs], out=offsets[1:])
        ids = np.concatenate([np.sort(local[offsets[i]:offsets[i + 1]]) for i in range(len(inputs))])
        trace = Trace(offsets, ids.astype(np.int32), len(uniq))
        init, sets = belady_changesets(trace, self.capacity)
        small = np.int32 if len(uniq) < 2**31 and uniq[-1] < 2**31 else np.int64     # 12 B per admitted row
        return ChunkFetch(uniq[init], [(uniq[a].astype(small), uniq[o].astype(small), p.astype(small))
                                       for a, o, p in sets], False)


class UnionFetch:
    """BatchGNN: one deduplicated fetch of the union of a macrobatch's input rows (`static`: a bool
    mask [N] of rows resident all run, not fetched), into a buffer of `rows` rows."""

    def __init__(self, static, rows):
        self.static, self.rows = static, int(rows)

    def __call__(self, inputs) -> ChunkFetch:
        union = np.unique(np.concatenate(inputs)) if inputs else np.empty(0, np.int64)
        fetch = union[~self.static[union]]
        if len(fetch) > self.rows:
            raise UserError(f"a macrobatch of {len(inputs)} batches needs {len(fetch):,} rows fetched but its buffer "
                            f"holds {self.rows:,} (--union-rows); raise --union-rows (0: the bound, which always "
                            "holds) or lower --macrobatch")
        return ChunkFetch(fetch, None, True)


def chunks(plan, steps, sample, before=None, stamps=None):
    """(items, fetch) per chunk of `steps` ((i, epoch, batch, step) in order): consecutive batches with
    one key (epoch, group, batch // S) (`plan.lookahead` S; a resumed run keeps the chunks' edges and
    a chunk never spans two groups), sampled (`sample(seeds, epoch, batch, visible)`) when their chunk
    starts, each after `before(i, step)` (its residency change), as (i, epoch, batch, step, sample)
    items; and the plan's `ChunkFetch` of the rows they gather. `stamps`: the run's history stamps
    (`history.HistoryStamps`, a copy this walk advances), so that a batch's rows are those its pruned
    computation uses, as the history stage will decide when it runs."""
    def sampled(chunk):
        items, inputs = [], []
        for i, epoch, b, step in chunk:
            if before is not None:
                before(i, step)
            s = sample(step.seeds, epoch, b, step.visible)
            items.append((i, epoch, b, step, s))
            if stamps is None:
                inputs.append(s.input_nodes)
            else:
                used = stamps.plan(s.blocks, step.update, prune=False)   # its optimizer step
                stamps.mark(used)
                inputs.append(used.input_ids)
        return items, plan.chunk_fetch(items, inputs)

    chunk, key = [], None
    for i, epoch, b, step in steps:
        k = (epoch, step.group, b // plan.lookahead)
        if chunk and k != key:
            yield sampled(chunk)
            chunk = []
        chunk.append((i, epoch, b, step))
        key = k
    if chunk:
        yield sampled(chunk)


def sample_nbytes(items) -> int:
    """Bytes the samples of a chunk hold (their blocks' arrays): what `plan.memory()["samples"]` bounds."""
    return sum(a.nbytes for it in items for b in it[4].blocks for a in (b.indptr, b.indices, b.src_nodes))


class _Stopped(Exception):
    """The consumer stopped while the producer waited to change residency."""


class AheadStage:
    """The executor's sample-ahead stage: a background thread samples the next chunk and computes its
    fetch (Ginex overlaps the next superbatch's sampling with this one; BatchGNN the next macrobatch's
    sampling and fetch with this one's steps) while the main thread trains on the current chunk.
    Two chunks exist at most, and the first sample of a third (it ends the second): the plan's memory
    counts them. Union rows are read by the stage's own
    reader into the half of the cache's buffer the current chunk does not use."""

    def __init__(self, runtime):
        self.runtime, self.plan = runtime, runtime.plan
        self.cached = runtime.cached
        self.reader = None                      # the fetches' own reader (`setup`: the plan's)
        self.base, self.rows = self.plan.setup_rows(), self.plan.group_rows()   # the union buffers' halves
        self.change = None                      # the change to apply after the next gather
        self.held_union = None                  # the rows the current union buffer holds

    def setup(self):
        """After the plan's setup: open the reader the chunks' fetches read through (`fetch_reader`: the
        store's rows, or a packed file the plan writes first)."""
        if self.plan.fetch_reads_ahead and self.reader is None:
            self.reader = self.plan.fetch_reader(self.runtime.store)

    def io(self) -> IOStats:
        return self.reader.stats.snapshot() if self.reader is not None else IOStats()

    def _fetch_union(self, fetch, half):
        """Read the union rows into buffer `half` (in the producer thread): by id, or as one range of the
        fetch reader's rows, in the pieces the simulator counts (`io.range_chunks`)."""
        lo = self.base + half * self.rows
        if fetch.span is not None:
            for a, b in range_chunks(*fetch.span, self.reader.row_stride):
                self.cached.rows[lo:lo + b - a] = torch.from_numpy(self.reader.read_range(a, b))
                lo += b - a
        elif len(fetch.resident):
            self.cached.rows[lo:lo + len(fetch.resident)] = torch.from_numpy(self.reader.read_rows(fetch.resident))

    def walk(self, steps, sample, before, start=0):
        """(i, epoch, batch, step, sample) of `steps` ((epoch, batch, step)) from `start`, sampled and
        fetched a chunk ahead; the cache follows each chunk's fetch. A step that moves ranges (a
        mega-batch's first) has its residency change (`before`) made only once every chunk before it has
        trained: the loads still happen at group boundaries, and its chunk samples through them."""
        out, free, stop = queue.Queue(), threading.Semaphore(2), threading.Event()
        drained, count = threading.Condition(), {"put": 0, "done": 0}
        runtime, stage = self.runtime, self.runtime.stage
        stamps = stage.copy() if isinstance(stage, HistoryStamps) else None

        def change(i, step):
            if step.enter_ranges or step.leave_ranges:
                with drained:
                    drained.wait_for(lambda: count["done"] == count["put"] or stop.is_set())
                if stop.is_set():
                    raise _Stopped
            before(i, step)

        def produce():
            background_thread()                         # its sampling leaves the parallel kernels to training
            try:
                half = 0
                gen = chunks(self.plan, ((i, e, b, st) for i, (e, b, st) in enumerate(steps) if i >= start),
                             sample, change, stamps)
                while True:
                    free.acquire()
                    if stop.is_set():
                        return
                    t = time.perf_counter()
                    got = next(gen, None)
                    if got is None:
                        out.put(None)
                        return
                    items, fetch = got
                    if fetch.reread:
                        self._fetch_union(fetch, half)
                    runtime._time("ahead", time.perf_counter() - t)
                    with drained:
                        count["put"] += 1
                    out.put((items, fetch, half))
                    half = 1 - half
            except _Stopped:
                return
            except BaseException as e:                  # noqa: BLE001 (raised in the consumer)
                out.put(e)

        thread = threading.Thread(target=produce, name="oocgnn-ahead", daemon=True)
        thread.start()
        try:
            while True:
                t = time.perf_counter()
                got = out.get()
                runtime._time("wait", time.perf_counter() - t)
                if got is None:
                    return
                if isinstance(got, BaseException):
                    raise got
                items, fetch, half = got
                self.begin(fetch, half)
                for k, item in enumerate(items):
                    self.change = None if fetch.changes is None else fetch.changes[k]
                    yield item
                free.release()                          # its samples and buffer half may be reused
                with drained:
                    count["done"] += 1
                    drained.notify_all()
        finally:
            stop.set()
            with drained:
                drained.notify_all()
            free.release()
            free.release()
            thread.join()

    def begin(self, fetch, half):
        """A chunk starts: Ginex's switch (the cache becomes the superbatch's init; the rows not held are
        read now), or the union fetched into buffer `half` replaces the previous chunk's."""
        t = time.perf_counter()
        if fetch.reread:
            if self.held_union is not None:
                self.cached.drop(self.held_union)
            self.cached.point(fetch.resident, self.base + half * self.rows)
            self.held_union = fetch.resident
        else:
            self.cached.make(fetch.resident)
        self.runtime._time("switch", time.perf_counter() - t)

    def gather(self, ids, out=None, stored=False):
        """The batch's rows through the cache (`CachedReader.gather`), then the batch's changeset (Ginex §3.3
        Fig. 11): the rows it admits are copied from the batch itself, as stored."""
        x = self.cached.gather(ids, out=out if stored else None, stored=True)
        if self.change is not None:
            admit, evict, pos = self.change
            rows = x[torch.from_numpy(np.argsort(ids, kind="stable")[pos])] if len(pos) else None
            self.cached.apply(evict, admit, rows)
            self.change = None
        return x if stored else self.cached.decode(x, out)

    def close(self):
        if self.reader is not None:
            self.reader.close()
