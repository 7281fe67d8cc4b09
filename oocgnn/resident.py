"""Feature rows resident in RAM in front of a reader: the cache stage of the executor.

`CachedReader(reader, num_nodes, capacity)` has a reader's interface, `read_rows(ids)` and
`stats`: it holds rows as the store encodes them (`codec`: float32, float16 or int8, so a compressed
store's budget holds more of them), decodes a batch's rows after the gather, and serves the rows it holds from RAM and reads the rest through `reader`, so `stats`
count what reached the device (GraphBolt's CPUCachedFeature over its fallback is the model).
What it holds is decided outside it: a plan's steps place its setup rows and point at loaded
ranges (`place`, `point`, `drop`), or a replacement policy of `oocgnn.cache` drives it iteration
by iteration with the same code the trace replays run (`PolicyCache`).
"""
from __future__ import annotations

import numpy as np
import torch

from .codec import Codec
from .errors import UserError
from .io import MAX_REQUEST, page_span, request_breaks

READ_CHUNK = 64 << 20          # rows in flight when a cache is made (`CachedReader.make`)
GATHER_PIECE = 8 << 20         # bytes of resident rows copied at a time into a batch (`ResidentRows.gather`)


class CachedReader:
    """Rows `rows` [capacity, D] (as `codec` stores them; float32 by default) at slots `slot[id]` (int32
    [N], −1 = not resident), over a fallback `reader` (of the same encoding) for the rest. The last
    `dynamic` slots (default all) are the dynamic part a replacement policy drives (`apply`, `make`);
    the slots before it hold what a plan's steps place and point at (setup rows, loaded ranges)."""

    def __init__(self, reader, num_nodes, capacity, dynamic=None, codec=None):
        self.reader, self.num_nodes, self.dim = reader, int(num_nodes), reader.dim
        self.codec = Codec() if codec is None else codec
        if np.dtype(reader.dtype) != self.codec.dtype:
            raise ValueError(f"the reader returns {np.dtype(reader.dtype)} rows; the codec stores {self.codec.dtype}")
        self.rows = torch.empty((int(capacity), self.dim), dtype=self.codec.torch_dtype)
        self.slot = np.full(self.num_nodes, -1, dtype=np.int32)
        self.dynamic_base = 0 if dynamic is None else int(capacity) - int(dynamic)
        self._free = None                                 # free slots of `apply`, made on first use

    @property
    def stats(self):
        """The fallback reader's `IOStats`: what reached the device."""
        return self.reader.stats

    @property
    def capacity(self) -> int:
        return self.rows.shape[0]

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size() + self.slot.nbytes

    def place(self, ids, base, data):
        """Put rows `data` (for `ids`) at slots base.. and point the table at them."""
        self.rows[base:base + len(data)] = torch.from_numpy(np.ascontiguousarray(data))
        self.point(ids, base)

    def read_into(self, ids, base, chunk_bytes=READ_CHUNK):
        """Read rows `ids` from the fallback reader into slots base.. (in `ids`' order) a piece at a time
        (`request_chunks`: the same pages and requests as one call, which the simulator counts), so that
        the rows are never held twice (a setup's static cache of 1.6 GiB on xlarge was)."""
        given = np.asarray(ids, dtype=np.int64)
        order = np.argsort(given, kind="stable")
        ids = given[order]
        for lo, hi in request_chunks(self.reader, ids, chunk_bytes):
            rows = np.ascontiguousarray(self.reader.read_rows(ids[lo:hi]))
            self.rows[torch.from_numpy(base + order[lo:hi])] = torch.from_numpy(rows)
        self.point(given, base)

    def point(self, ids, base):
        """Point `ids` at slots base.. (their rows are already there: a loader wrote them); a row the
        dynamic part held there leaves it (its slot is free again)."""
        self.release(ids)
        self.slot[ids] = np.arange(base, base + len(ids), dtype=np.int32)

    def release(self, ids):
        """Free the dynamic slots of those of `ids` the dynamic part holds."""
        if self._free is None or self.dynamic_base >= self.capacity:
            return
        slots = self.slot[ids]
        slots = slots[slots >= self.dynamic_base]
        if len(slots):
            self._free[self._nfree:self._nfree + len(slots)] = slots
            self._nfree += len(slots)

    def drop(self, ids):
        self.slot[ids] = -1

    def gather(self, ids: np.ndarray, reader=None, out=None, stored=False) -> torch.Tensor:
        """Rows of `ids` [len(ids), D], float32: resident ones from RAM, the rest through `reader` (default the
        fallback; evaluation passes its own so its reads stay out of the run's), decoded once gathered.
        `stored`: as stored instead (decoded later: on the GPU after the copy). `out`: a [len(ids), D]
        tensor of that type to write them into (a pinned buffer for a GPU)."""
        if stored or self.codec.identity:
            return self._gather(ids, reader, out)
        return self.codec.decode(self._gather(ids, reader), out)

    def decode(self, rows: torch.Tensor, out=None) -> torch.Tensor:
        """Rows `gather(..., stored=True)` returned, as float32 (on their device; float32 rows pass)."""
        return self.codec.decode(rows, out)

    def _gather(self, ids, reader=None, out=None) -> torch.Tensor:
        slots = self.slot[ids]
        hit = slots >= 0
        if out is not None and tuple(out.shape) != (len(ids), self.dim):
            raise ValueError(f"out has shape {tuple(out.shape)}, the gather makes {(len(ids), self.dim)}")
        if hit.all():
            index = torch.from_numpy(slots.astype(np.int64))
            return self.rows[index] if out is None else torch.index_select(self.rows, 0, index, out=out)
        reader = self.reader if reader is None else reader
        if out is None:
            out = torch.empty((len(ids), self.dim), dtype=self.rows.dtype)
        hits = np.flatnonzero(hit)                 # copied a piece at a time: no [hits, D] temporary
        piece = max(1, GATHER_PIECE // (self.rows.element_size() * self.dim))
        for lo in range(0, len(hits), piece):
            at = hits[lo:lo + piece]
            out[torch.from_numpy(at)] = self.rows[torch.from_numpy(slots[at].astype(np.int64))]
        misses = np.flatnonzero(~hit)
        if hasattr(reader, "read_rows_into"):      # placed by the reader: no [misses, D] temporary either
            reader.read_rows_into(ids[misses], out.numpy(), misses)
        else:
            out[torch.from_numpy(misses)] = torch.from_numpy(reader.read_rows(ids[misses]))
        return out

    def read_rows(self, ids) -> np.ndarray:
        """A reader's `read_rows`: rows of `ids` as a [len(ids), D] float32 array."""
        return self.gather(np.asarray(ids, dtype=np.int64)).numpy()

    def apply(self, evict, admit, rows):
        """A replacement policy's change: free the slots of `evict`, put `admit` with `rows` in free ones."""
        if self._free is None:                            # a stack of free slots, made on first use
            used = np.zeros(self.capacity, dtype=bool)
            used[self.slot[self.slot >= 0]] = True
            used[:self.dynamic_base] = True               # the steps' slots are not the policy's
            free = np.flatnonzero(~used)[::-1]
            self._free, self._nfree = np.empty(self.capacity, np.int64), len(free)
            self._free[:len(free)] = free
        n = self._nfree
        self._free[n:n + len(evict)] = self.slot[evict]
        n += len(evict)
        self.drop(evict)
        if len(admit) > n:
            raise UserError(f"cache overflow: {len(admit)} rows to admit, {n} free slots")
        slots = self._free[n - len(admit):n][::-1].copy()
        self._nfree = n - len(admit)
        if len(admit):
            self.rows[torch.from_numpy(slots)] = torch.as_tensor(rows)
        self.slot[admit] = slots.astype(np.int32)

    def make(self, ids, chunk_bytes=READ_CHUNK) -> int:
        """Hold exactly the sorted rows `ids`: evict the others, read those not held into the dynamic part;
        returns how many were read. Rows in other slots stay. The rows are read in pieces of about
        `chunk_bytes`, cut where the reader starts a request (`io.request_breaks`), so the pages and
        requests are those of one coalesced `read_rows` while the rows in flight stay bounded (Ginex's
        switch to a superbatch's init can read a whole cache: 1.7 GiB on xlarge at a 4GB budget)."""
        held = np.flatnonzero(self.slot >= self.dynamic_base)
        gone, new = np.setdiff1d(held, ids, assume_unique=True), np.setdiff1d(ids, held, assume_unique=True)
        self.apply(gone, new[:0], None)
        for lo, hi in request_chunks(self.reader, new, chunk_bytes):
            self.apply(new[:0], new[lo:hi], self.reader.read_rows(new[lo:hi]))
        return len(new)


def request_chunks(reader, ids, chunk_bytes=READ_CHUNK):
    """(lo, hi) pieces of the sorted, distinct `ids`, about `chunk_bytes` of rows each, cut only where `reader`
    starts a new request: reading them one by one gives the pages and requests of reading them at once."""
    n = len(ids)
    step = max(1, int(chunk_bytes) // max(1, reader.row_stride))
    if n <= step:
        return [(0, n)] if n else []
    pos = reader.offset + np.asarray(ids, dtype=np.int64) * reader.row_stride
    first, last = page_span(pos, reader.row_bytes)
    starts = np.flatnonzero(request_breaks(first, last, getattr(reader, "_row_pages", 1),
                                           getattr(reader, "max_request", MAX_REQUEST)))
    cuts = np.unique(starts[np.minimum(np.searchsorted(starts, np.arange(step, n, step)), len(starts) - 1)])
    bounds = [0, *[int(c) for c in cuts if 0 < c < n], n]
    return list(zip(bounds[:-1], bounds[1:]))


def replay_changes(policy, trace):
    """Per iteration i of replaying `trace` through a row policy of `oocgnn.cache`: (C_i, C_{i+1}),
    the sorted rows cached when iteration i looks up its ids (after any prefetch) and after it.
    Prefetches (Ginex's init, PaGraph's fill) replace the contents before the iteration they are made
    for; between them the protocol holds: C_{i+1} ⊆ C_i ∪ ids_i."""
    if policy.unit != "row":
        raise UserError(f"{policy.name} caches {policy.unit}s, not rows: it cannot drive a row cache")
    policy.begin(trace)
    for i in range(len(trace)):
        before = policy.contents()
        policy.run(i, i + 1)
        yield (np.sort(policy.prefetched) if policy.prefetch_at == i else before), policy.contents()


class PolicyCache:
    """A replacement policy of `oocgnn.cache` executed: before iteration i the cache is made C_i
    (prefetched rows are read then, outside the batch), the batch gathers through it, and the rows
    the policy admits come from the batch itself. Hits and reads equal the policy's replay (a test)."""

    def __init__(self, cached: CachedReader, policy, trace):
        self.cached, self.trace = cached, trace
        self.changes = replay_changes(policy, trace)
        self.hits = self.prefetched_rows = 0

    def gather(self, ids: np.ndarray) -> torch.Tensor:
        """Rows of the next iteration's `ids` (its trace entry, in any order)."""
        c_i, c_next = next(self.changes)
        cached = self.cached
        self.prefetched_rows += cached.make(c_i)          # a prefetch: rows the batch may not hold
        self.hits += int(np.count_nonzero(cached.slot[ids] >= 0))
        x = cached.gather(ids, stored=True)
        admit, evict = np.setdiff1d(c_next, c_i), np.setdiff1d(c_i, c_next)
        order = np.argsort(ids, kind="stable")
        pos = order[np.minimum(np.searchsorted(ids, admit, sorter=order), len(ids) - 1)]
        if not np.array_equal(ids[pos], admit):
            raise UserError("the policy admits rows its iteration did not access (C_i+1 ⊄ C_i ∪ ids_i)")
        cached.apply(evict, admit, x[torch.from_numpy(pos)])
        return cached.decode(x)
