"""Access traces: the per-iteration unique feature (and neighbour-list) ids of a schedule, on disk.

A stream is a CSR pair: iteration i accessed `ids[offsets[i]:offsets[i+1]]` (unique, sorted;
Ginex §3.1 writes the same `ids_k` per mini-batch). A trace is recorded once, saved under
`data/traces/<name>-<hash of its parameters>` and replayed many times (`oocgnn.cache`).
`.npz` for small traces, a directory of `.npy` files (memory-mapped on load) for large ones.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
import zipfile
import zlib
from pathlib import Path

import numba
import numpy as np

from .atomicdir import swap_in
from .blocks import SAMPLER_VERSION
from .errors import UserError
from .io import page_span
from .sampler import Sampler, sampled_steps
from .schedules import make_schedule

DEFAULT_CACHE_DIR = Path(os.environ.get("OOCGNN_TRACE_CACHE",
                                        Path(__file__).resolve().parents[1] / "data" / "traces"))
DEFAULT_ROW_STRIDE = 512        # D = 128 float32, the synthetic presets' layout


@numba.njit(cache=True, inline="always")
def new_pages(v, last, stride, rbytes):
    """(pages of row v not counted yet, new last page) for rows visited in increasing order."""
    first, end = page_span(v * stride, rbytes)
    first = max(first, last + 1)
    return max(0, end - first + 1), max(end, last)


@numba.njit(cache=True)
def _pages_per_iteration(offsets, ids, stride, rbytes):
    out = np.zeros(len(offsets) - 1, np.int64)
    for i in range(len(offsets) - 1):
        last = -1
        for p in range(offsets[i], offsets[i + 1]):
            n, last = new_pages(np.int64(ids[p]), last, stride, rbytes)
            out[i] += n
    return out


@numba.njit(cache=True)
def _unions(offsets, ids, k, num_nodes):
    """CSR of the unions of k consecutive iterations (each sorted)."""
    t = len(offsets) - 1
    groups = (t + k - 1) // k
    seen = np.full(num_nodes, -1, np.int64)
    out, offs = np.empty(len(ids), ids.dtype), np.zeros(groups + 1, np.int64)
    n = 0
    for g in range(groups):
        for p in range(offsets[g * k], offsets[min(t, (g + 1) * k)]):
            v = ids[p]
            if seen[v] != g:
                seen[v] = g
                out[n] = v
                n += 1
        out[offs[g]:n].sort()
        offs[g + 1] = n
    return offs, out[:n]


@numba.njit(cache=True)
def _zipf_iterations(num_nodes, iterations, size, alpha, seed):
    """`size` distinct ids per iteration drawn from a power law over ranks (rank r ~ r^-alpha)."""
    np.random.seed(seed)
    perm = np.random.permutation(num_nodes)          # rank -> node: popularity carries no id locality
    seen = np.full(num_nodes, -1, np.int64)
    out = np.empty(iterations * size, np.int32)
    a, top = 1.0 - alpha, float(num_nodes) + 1.0
    span = top ** a - 1.0
    for i in range(iterations):
        n = 0
        while n < size:
            u = np.random.random()
            x = (span * u + 1.0) ** (1.0 / a) if a != 0.0 else top ** u
            v = perm[min(num_nodes - 1, int(x) - 1)]
            if seen[v] != i:
                seen[v] = i
                out[i * size + n] = v
                n += 1
        out[i * size:(i + 1) * size].sort()
    return out


def count_pages(ids, row_stride, row_bytes=None) -> int:
    """Distinct 4 KiB pages holding rows `ids` (any order)."""
    ids = np.unique(np.asarray(ids, dtype=np.int64))
    return int(_pages_per_iteration(np.array([0, len(ids)]), ids, int(row_stride), int(row_bytes or row_stride))[0])


def trace_key(params: dict) -> str:
    """A stable 16-hex hash of JSON-able parameters (the cache key)."""
    return hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Trace:
    """Per-iteration unique, sorted ids of the "features" stream (+ optional other streams).

    `trace[i]` -> ids of iteration i; `len(trace)` -> iterations; `stream("neighbours")` -> the
    neighbour-list stream as a Trace with the same metadata. `row_stride`/`row_bytes` give the
    store layout, from which 4 KiB pages are counted (`oocgnn.io.feature_row_stride`).
    """

    def __init__(self, offsets, ids, num_nodes, params=None, row_stride=DEFAULT_ROW_STRIDE,
                 row_bytes=None, streams=None):
        self.offsets, self.ids = np.asarray(offsets), np.asarray(ids)
        self.num_nodes, self.params = int(num_nodes), dict(params or {})
        self.row_stride = int(row_stride)
        self.row_bytes = int(row_bytes or row_stride)
        self.streams = dict(streams or {})             # name -> (offsets, ids), besides "features"
        self.cached = False                             # set by cached_trace when loaded from disk
        self.saved_checksums = None                     # set by load: the CRC32s saved with the trace
        o = self.offsets
        if o.ndim != 1 or len(o) < 1 or o[0] != 0 or o[-1] != len(self.ids) or np.any(o[1:] < o[:-1]):
            raise UserError(f"bad trace offsets: must rise from 0 to {len(self.ids)}")

    @classmethod
    def from_batches(cls, batches, num_nodes, params=None, row_stride=DEFAULT_ROW_STRIDE,
                     row_bytes=None, neighbours=None) -> "Trace":
        """From one id array per iteration (any order, duplicates allowed); `neighbours` likewise."""
        def csr(arrays):
            uniq = [np.unique(np.asarray(b, dtype=np.int64)) for b in arrays]
            offs = np.zeros(len(uniq) + 1, np.int64)
            np.cumsum([len(u) for u in uniq], out=offs[1:])
            flat = np.concatenate(uniq) if uniq else np.empty(0, np.int64)
            if len(flat) and (flat[0] < 0 or flat.max() >= num_nodes):
                raise UserError(f"trace ids must lie in [0, {num_nodes})")
            return offs, flat.astype(np.int32 if num_nodes < 2**31 else np.int64)
        streams = {"neighbours": csr(neighbours)} if neighbours is not None else None
        return cls(*csr(batches), num_nodes, params, row_stride, row_bytes, streams)

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i) -> np.ndarray:
        i = range(len(self))[i]
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def iterations(self):
        for i in range(len(self)):
            yield self[i]

    @property
    def accesses(self) -> int:
        return int(self.offsets[-1])

    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def counts(self) -> np.ndarray:
        """Accesses per node (the profiled frequency of OUTRE §4.4)."""
        return np.bincount(self.ids, minlength=self.num_nodes)

    def summary(self) -> dict:
        """The trace at a glance: iterations, feature rows (all, distinct, per iteration as % of the graph),
        neighbour lists and rows per list (a recorded trace's "neighbours" stream), and its size."""
        nb = self.stream("neighbours")
        arrays = [self.offsets, self.ids, nb.offsets, nb.ids]
        return {"iterations": len(self), "feature_rows": self.accesses, "unique_rows": len(np.unique(self.ids)),
                "rows_per_batch_%_of_graph": 100 * self.accesses / len(self) / self.num_nodes,
                "neighbour_lists": nb.accesses, "rows_per_list": self.accesses / nb.accesses,
                "trace_MiB": sum(a.nbytes for a in arrays) / 2**20}

    def superbatch_bytes(self, s) -> int:
        """The largest trace of `s` consecutive iterations, rows and lists at 4 bytes an id: what Ginex keeps
        of a superbatch between its sample and gather passes (§4.2)."""
        nb = self.stream("neighbours")
        return max((self.slice(i, i + s).accesses + nb.slice(i, i + s).accesses) * 4 for i in range(0, len(self), s))

    def pages(self) -> np.ndarray:
        """Distinct 4 KiB pages of each iteration's rows (no cache)."""
        return _pages_per_iteration(self.offsets, self.ids, self.row_stride, self.row_bytes)

    def _like(self, offsets, ids, **params):
        return Trace(offsets, ids, self.num_nodes, {**self.params, **params}, self.row_stride, self.row_bytes)

    def stream(self, name: str) -> "Trace":
        if name == "features":
            return self
        if name not in self.streams:
            raise UserError(f"trace has no {name!r} stream (has: features, {', '.join(self.streams)})")
        return self._like(*self.streams[name], stream=name)

    def slice(self, lo: int, hi: int) -> "Trace":
        """Iterations lo..hi-1 (e.g. one superbatch, or a profiling epoch)."""
        lo, hi, _ = slice(lo, hi).indices(len(self))
        o = self.offsets[lo:max(lo, hi) + 1]
        return self._like(o - o[0], self.ids[o[0]:o[-1]], slice=[lo, hi])

    def coarsen(self, k: int) -> "Trace":
        """Iteration j = union of iterations jk..jk+k-1: a macrobatch's one deduplicated fetch."""
        if int(k) < 1:
            raise UserError(f"macrobatch size must be >= 1, got {k}")
        offs, ids = _unions(self.offsets.astype(np.int64), self.ids, int(k), self.num_nodes)
        return self._like(offs, ids, macrobatch=int(k))

    def relabel(self, new_of_old, row_stride=None, row_bytes=None) -> "Trace":
        """The same accesses in another store order: id v becomes new_of_old[v] (a permutation),
        each iteration re-sorted; optionally on another layout. Isolates layout from demand."""
        new_of_old = np.asarray(new_of_old)
        if new_of_old.shape != (self.num_nodes,):
            raise UserError(f"relabel needs a permutation of {self.num_nodes} ids, got shape {new_of_old.shape}")

        def remap(offsets, ids):
            seg = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
            key = seg * self.num_nodes + new_of_old[ids]          # sort within each iteration
            key.sort()
            return offsets, (key - seg * self.num_nodes).astype(ids.dtype)
        if row_stride is None:
            row_stride, row_bytes = self.row_stride, row_bytes or self.row_bytes
        streams = {name: remap(*st) for name, st in self.streams.items()}
        return Trace(*remap(self.offsets, self.ids), self.num_nodes, {**self.params, "relabelled": True},
                     row_stride, row_bytes, streams)

    def meta(self) -> dict:
        return {"num_nodes": self.num_nodes, "params": self.params, "row_stride": self.row_stride,
                "row_bytes": self.row_bytes, "streams": ["features", *self.streams]}

    def arrays(self) -> dict:
        out = {"features_offsets": self.offsets, "features_ids": self.ids}
        for name, (o, i) in self.streams.items():
            out[f"{name}_offsets"], out[f"{name}_ids"] = o, i
        return out

    def checksums(self) -> dict:
        """CRC32 of every array (saved with the trace; a cached trace that does not match is rebuilt)."""
        return {k: zlib.crc32(np.ascontiguousarray(a)) for k, a in self.arrays().items()}

    def check(self):
        """UserError unless every stream's offsets rise from 0 to its length and its ids are nodes."""
        for name, (o, i) in {"features": (self.offsets, self.ids), **self.streams}.items():
            if o.ndim != 1 or len(o) != len(self) + 1 or o[0] != 0 or o[-1] != len(i) or np.any(o[1:] < o[:-1]):
                raise UserError(f"bad trace: the {name} offsets must rise from 0 to {len(i)}")
            if len(i) and (i.min() < 0 or i.max() >= self.num_nodes):
                raise UserError(f"bad trace: the {name} stream holds ids outside [0, {self.num_nodes})")

    def save(self, path) -> Path:
        """`<path>.npz`, or a directory of .npy files (memory-mapped by load); atomic."""
        path = Path(path)
        arrays, meta = self.arrays(), {**self.meta(), "crc32": self.checksums()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        if path.suffix == ".npz":
            try:
                with open(tmp, "wb") as f:
                    np.savez(f, meta=json.dumps(meta), **arrays)
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            return path
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            for name, arr in arrays.items():
                np.save(tmp / f"{name}.npy", arr)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            swap_in(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return path

    @classmethod
    def load(cls, path, mmap=True) -> "Trace":
        path = Path(path)
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                meta, arrays = json.loads(str(z["meta"])), {k: z[k] for k in z.files if k != "meta"}
        elif (path / "meta.json").is_file():
            meta = json.loads((path / "meta.json").read_text())
            arrays = {f"{s}_{k}": np.load(path / f"{s}_{k}.npy", mmap_mode="r" if mmap else None)
                      for s in meta["streams"] for k in ("offsets", "ids")}
        else:
            raise UserError(f"no trace at {path}")
        streams = {s: (arrays[f"{s}_offsets"], arrays[f"{s}_ids"]) for s in meta["streams"] if s != "features"}
        trace = cls(arrays["features_offsets"], arrays["features_ids"], meta["num_nodes"], meta["params"],
                    meta["row_stride"], meta["row_bytes"], streams)
        trace.saved_checksums = meta.get("crc32")
        return trace


def cached_trace(key_params: dict, cache_dir=None, build_fn=None, fmt="npz") -> Trace:
    """The trace saved under `cache_dir/<name>-<trace_key(key_params)>`, else `build_fn()` saved there.

    `cache_dir` defaults to data/traces (or $OOCGNN_TRACE_CACHE); False disables the cache.
    fmt "npz" (one file) or "dir" (.npy files, memory-mapped on load: for large traces).
    """
    key_params = json.loads(json.dumps(key_params, sort_keys=True, default=str))
    name = str(key_params.get("name", "trace")).replace("/", "_")
    path = None
    if cache_dir is not False:
        path = Path(cache_dir or DEFAULT_CACHE_DIR) / (f"{name}-{trace_key(key_params)}"
                                                       + (".npz" if fmt == "npz" else ""))
        if path.exists():
            try:
                trace = Trace.load(path)
                if trace.params == key_params and trace.saved_checksums == trace.checksums():
                    trace.check()
                    trace.cached = True
                    return trace
            except (OSError, ValueError, KeyError, TypeError, EOFError, zlib.error, zipfile.BadZipFile):
                pass          # unreadable, damaged or another key's: rebuild and overwrite
    trace = build_fn()
    trace.params = key_params
    if path is not None:
        try:
            trace.save(path)
        except OSError as e:
            warnings.warn(f"trace cache not written ({e.strerror or e}: {e.filename or path}); the trace "
                          "is used but will be recorded again next time", stacklevel=2)
    return trace


def synthetic_trace(num_nodes, iterations, size, alpha=0.9, seed=0, row_stride=DEFAULT_ROW_STRIDE) -> Trace:
    """`size` distinct ids per iteration, Zipf-like popularity (exponent alpha, a random id order)."""
    if not 0 < size <= num_nodes:
        raise UserError(f"ids per iteration must be in 1..{num_nodes}, got {size}")
    ids = _zipf_iterations(int(num_nodes), int(iterations), int(size), float(alpha), int(seed))
    params = {"name": "zipf", "num_nodes": num_nodes, "iterations": iterations, "size": size,
              "alpha": alpha, "seed": seed}
    return Trace(np.arange(iterations + 1, dtype=np.int64) * size, ids, num_nodes, params, row_stride)


def store_fingerprint(store) -> dict:
    """What identifies a store's content for a trace: sizes, layout and the CRC32 of every file but
    features.bin (topology, splits and parts decide the batches; feature values and the path do not,
    so a trace survives a move or a rewrite of the same graph)."""
    files = store.meta.get("files", {})
    return {"name": store.meta.get("name"), "num_nodes": store.num_nodes, "num_edges": store.num_edges,
            "row_stride": store.row_stride, "row_bytes": store.row_bytes,
            "crc32": {k: v["crc32"] for k, v in sorted(files.items()) if k != "features.bin"}}


def record_trace(store, schedule, fanouts, epochs=1, seed=0, cache_dir=None, progress=False,
                 fmt=None, topology=None, **schedule_params) -> Trace:
    """The access trace of `epochs` epochs of `schedule` over `store`, recorded once and cached.

    Replays the schedule exactly as `oocgnn.simulate.simulate` does (`sampler.sampled_steps` with a
    `Sampler(graph, fanouts, seed)`; a schedule given by name gets `seed` and `schedule_params`):
    iteration i is the i-th batch of the run; "features" holds its unique input ids
    (blocks[0]'s sources, simulate's `input_nodes`), "neighbours" the nodes whose neighbour
    lists it expanded (blocks[0]'s dst nodes, `neighbour_lists_needed`). Demand only: what a
    schedule keeps resident is not subtracted. Keyed by the store's content
    (`store_fingerprint`), the schedule's repr, fanouts, epochs, seed and the sampler's version in `cache_dir`
    (default data/traces; False = no cache). fmt: "npz", or "dir" (memory-mapped; the default
    from 1M nodes on).
    """
    from tqdm.auto import tqdm

    fanouts = [int(f) for f in fanouts]
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, store, **({"seed": seed} | schedule_params))
    elif schedule_params:
        raise UserError("schedule parameters go with a schedule name, not a Schedule object")
    key = {"name": f"{store.meta.get('name', 'store')}-{schedule.name}", "store": store_fingerprint(store),
           "schedule": repr(schedule), "fanouts": fanouts, "epochs": int(epochs), "seed": int(seed),
           "sampler": SAMPLER_VERSION}

    def build():
        feats, nbrs = [], []
        bar = tqdm(desc=f"trace {schedule.name}", unit="batch", disable=not progress, leave=False)
        sampler = Sampler(topology or store.neighbour_lists(), fanouts, seed)   # any source: the same samples
        for _, _, _, _, sample in sampled_steps(schedule, sampler, int(epochs)):
            feats.append(sample.input_nodes)
            nbrs.append(sample.blocks[0].dst_nodes)                  # ⊇ every later block's dst
            bar.update()
        bar.close()
        return Trace.from_batches(feats, store.num_nodes, row_stride=store.row_stride,
                                  row_bytes=store.row_bytes, neighbours=nbrs)
    fmt = fmt or ("dir" if store.num_nodes >= 1_000_000 else "npz")
    return cached_trace(key, cache_dir, build, fmt=fmt)
