"""The on-disk store, format version 1 (DESIGN.md): partition-ordered features, CSR, labels.

Store ids are the source ids relabelled by an `order` (store id i holds source node
`order[i]`), so each partition is a contiguous id range and one sequential read
(HierBatching §3.1). Feature rows are padded to a stride that never lets a row straddle a
4 KiB page (`io.feature_row_stride`). Writes go to a temporary directory renamed into place;
`open_store` validates everything and names the first problem it finds.
"""
from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from functools import cached_property
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .datasets import GraphData, index_dtype
from .errors import StoreError, UserError
from .io import feature_row_stride
from .readers import open_reader
from .units import format_size

FORMAT = "oocgnn-store"
VERSION = 1
NPY_FILES = ("indptr", "labels", "train_idx", "val_idx", "test_idx", "part_offsets", "orig_ids")
_CHUNK_BYTES = 64 << 20


def _crc_file(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(16 << 20):
            crc = zlib.crc32(block, crc)
    return crc


class _CrcWriter:
    """A binary file written in order, with its CRC32 computed on the way (no re-read)."""

    def __init__(self, path: Path):
        self.f, self.crc, self.bytes = open(path, "wb"), 0, 0

    def write(self, arr: np.ndarray):
        buf = memoryview(np.ascontiguousarray(arr)).cast("B")
        self.crc = zlib.crc32(buf, self.crc)
        self.bytes += self.f.write(buf)

    def close(self):
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return {"bytes": self.bytes, "crc32": self.crc}


def _relabelled_rows(data: GraphData, order, new_of_old, lo, hi):
    """Neighbour lists of store rows [lo, hi) in store ids, each row sorted."""
    src = order[lo:hi]
    starts, lens = data.indptr[src], data.indptr[src + 1] - data.indptr[src]
    if not lens.sum():
        return np.empty(0, dtype=np.int64)
    row = np.repeat(np.arange(hi - lo, dtype=np.int64), lens)
    first = np.cumsum(lens) - lens
    pos = np.arange(len(row), dtype=np.int64) - first[row] + starts[row]
    nbr = new_of_old[data.indices[pos]]
    key = row * data.num_nodes + nbr        # sort within each row, rows stay in order
    key.sort()
    return key - row * data.num_nodes


def write_store(data: GraphData, path, order=None, part_offsets=None, partitioner="none",
                force=False, progress=True) -> "Store":
    """Write `data` as a store at `path`, nodes relabelled by `order` (default identity).

    `order[i]` is the source id of store id i; `part_offsets` ([K+1], default one part)
    gives the partition ranges in store ids. Atomic: a temporary directory renamed into place.
    """
    path = Path(path)
    if path.exists() and not force:
        raise UserError(f"a store already exists at {path} (use --force / force=True to replace it)")
    n, d = data.num_nodes, data.feat_dim
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    if order.shape != (n,) or not np.array_equal(np.bincount(order, minlength=n), np.ones(n)):
        raise UserError("order must be a permutation of the node ids")
    part_offsets = np.array([0, n] if part_offsets is None else part_offsets, dtype=np.int64)
    if part_offsets[0] != 0 or part_offsets[-1] != n or np.any(np.diff(part_offsets) < 0):
        raise UserError("part_offsets must rise from 0 to N")
    new_of_old = np.empty(n, dtype=np.int64)
    new_of_old[order] = np.arange(n, dtype=np.int64)
    identity = bool(np.array_equal(order, np.arange(n)))

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        files = {}
        itemsize = np.dtype(np.float32).itemsize
        row_bytes, stride = d * itemsize, feature_row_stride(d * itemsize)
        rows_per_chunk = max(1, _CHUNK_BYTES // stride)
        bar = tqdm(total=2 * n, desc=f"writing {path.name}", unit="row", unit_scale=True,
                   disable=not progress, leave=False)
        feats = _CrcWriter(tmp / "features.bin")
        for lo in range(0, n, rows_per_chunk):
            hi = min(n, lo + rows_per_chunk)
            block = np.zeros((hi - lo, stride // itemsize), dtype=np.float32)
            block[:, :d] = data.features[order[lo:hi]]
            feats.write(block)
            bar.update(hi - lo)
        files["features.bin"] = feats.close()

        idx_dtype = index_dtype(n)
        indices = _CrcWriter(tmp / "indices.bin")
        deg = np.diff(data.indptr)[order]
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(deg, out=indptr[1:])
        edge_chunk = max(1, int(n * (1 << 24) // max(1, data.num_edges)))   # ~16M edges a chunk
        for lo in range(0, n, edge_chunk):
            hi = min(n, lo + edge_chunk)
            if identity:
                nbrs = data.indices[data.indptr[lo]:data.indptr[hi]]
            else:
                nbrs = _relabelled_rows(data, order, new_of_old, lo, hi)
            indices.write(np.asarray(nbrs, dtype=idx_dtype))
            bar.update(hi - lo)
        files["indices.bin"] = indices.close()
        bar.close()

        arrays = {"indptr": indptr, "labels": np.asarray(data.labels, dtype=np.int64)[order],
                  "part_offsets": part_offsets, "orig_ids": order}
        for split in ("train_idx", "val_idx", "test_idx"):
            arrays[split] = np.sort(new_of_old[np.asarray(getattr(data, split), dtype=np.int64)])
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", arr)
            files[f"{name}.npy"] = {"bytes": (tmp / f"{name}.npy").stat().st_size,
                                    "crc32": _crc_file(tmp / f"{name}.npy")}
        meta = {
            "format": FORMAT, "version": VERSION, "name": data.name,
            "num_nodes": n, "num_edges": int(data.num_edges), "feat_dim": d,
            "dtype": "float32", "row_bytes": row_bytes, "row_stride": stride,
            "index_dtype": np.dtype(idx_dtype).name, "num_classes": int(data.num_classes),
            "partitioner": partitioner, "num_parts": len(part_offsets) - 1,
            "splits": {s: len(arrays[f"{s}_idx"]) for s in ("train", "val", "test")},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "source": {k: v for k, v in data.info.items() if _jsonable(v)},
            "files": files,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        if path.exists():
            trash = path.parent / f".{path.name}.old-{os.getpid()}"
            path.rename(trash)
            tmp.rename(path)
            shutil.rmtree(trash)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return open_store(path, verify=False)


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False


def open_store(path, verify=True) -> "Store":
    """Open and validate a store; raise StoreError naming the first problem found.

    Sizes, shapes and dtypes are always checked; `verify=True` also checks every file's
    CRC32 (skipped when an earlier verification stamp matches the files' sizes and mtimes).
    """
    path = Path(path)
    meta_path = path / "meta.json"
    if not path.is_dir():
        raise StoreError(f"no store at {path}: directory not found (create one with `oocgnn prepare`)")
    if not meta_path.is_file():
        raise StoreError(f"no store at {path}: meta.json is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{meta_path} is not valid JSON ({e})") from None
    if meta.get("format") != FORMAT or "version" not in meta:
        raise StoreError(f"{path} is not an oocgnn store (meta.json has no format/version)")
    if meta["version"] != VERSION:
        raise StoreError(f"{path}: unknown store format version {meta['version']!r} "
                         f"(this oocgnn reads version {VERSION})")
    store = Store(path, meta)
    store.validate(verify=verify)
    return store


class Store:
    """An opened store: metadata, lazily loaded arrays, and readers of its feature file."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.meta = Path(path), meta
        self.num_nodes, self.num_edges = meta["num_nodes"], meta["num_edges"]
        self.feat_dim, self.num_classes = meta["feat_dim"], meta["num_classes"]
        self.row_bytes, self.row_stride = meta["row_bytes"], meta["row_stride"]
        self.num_parts = meta["num_parts"]
        self.features_path = self.path / "features.bin"

    def __repr__(self):
        return (f"Store({str(self.path)!r}, N={self.num_nodes:,}, E={self.num_edges:,}, "
                f"D={self.feat_dim}, parts={self.num_parts})")

    def _expected(self):
        """file -> (bytes or None, shape, dtype) implied by meta.json."""
        n, m, k = self.num_nodes, self.num_edges, self.num_parts
        s = self.meta["splits"]
        itemsize = np.dtype(self.meta["index_dtype"]).itemsize
        return {"features.bin": (n * self.row_stride, None, None),
                "indices.bin": (m * itemsize, None, None),
                "indptr.npy": (None, (n + 1,), "int64"), "labels.npy": (None, (n,), "int64"),
                "train_idx.npy": (None, (s["train"],), "int64"),
                "val_idx.npy": (None, (s["val"],), "int64"),
                "test_idx.npy": (None, (s["test"],), "int64"),
                "part_offsets.npy": (None, (k + 1,), "int64"), "orig_ids.npy": (None, (n,), "int64")}

    def validate(self, verify=True):
        files = self.meta.get("files", {})
        for name, (nbytes, shape, dtype) in self._expected().items():
            f = self.path / name
            if not f.is_file():
                raise StoreError(f"store {self.path}: missing file {name}")
            size = f.stat().st_size
            recorded = files.get(name, {}).get("bytes")
            if nbytes is not None and recorded is not None and nbytes != recorded:
                raise StoreError(f"store {self.path}: meta.json says {name} has {recorded} bytes "
                                 f"but N/E/stride imply {nbytes}")
            want = recorded if recorded is not None else nbytes
            if want is not None and size != want:
                kind = "truncated" if size < want else "larger than recorded"
                raise StoreError(f"store {self.path}: {name} is {kind} "
                                 f"({size} bytes, expected {want})")
            if shape is not None:
                try:
                    arr = np.load(f, mmap_mode="r")
                except ValueError as e:
                    raise StoreError(f"store {self.path}: {name} is not a valid .npy file ({e})") from None
                if arr.shape != shape or arr.dtype != np.dtype(dtype):
                    raise StoreError(f"store {self.path}: {name} has shape {arr.shape} dtype "
                                     f"{arr.dtype}, expected {shape} {dtype}")
        if verify:
            self._verify_checksums(files)

    def _verify_checksums(self, files):
        stamp_path = self.path / ".verified.json"
        now = {name: [(self.path / name).stat().st_size, (self.path / name).stat().st_mtime_ns]
               for name in files}
        try:
            if json.loads(stamp_path.read_text()) == now:
                return
        except (OSError, ValueError):
            pass
        for name, rec in files.items():
            if _crc_file(self.path / name) != rec["crc32"]:
                raise StoreError(f"store {self.path}: checksum mismatch in {name} (the file was "
                                 "modified or corrupted; re-create the store with `oocgnn prepare`)")
        try:
            stamp_path.write_text(json.dumps(now))
        except OSError:
            pass   # a read-only store is verified again next time

    def _npy(self, name):
        return np.load(self.path / f"{name}.npy")

    @cached_property
    def indptr(self):
        return self._npy("indptr")

    @cached_property
    def indices(self):
        return np.fromfile(self.path / "indices.bin", dtype=self.meta["index_dtype"])

    @cached_property
    def labels(self):
        return self._npy("labels")

    @cached_property
    def train_idx(self):
        return self._npy("train_idx")

    @cached_property
    def val_idx(self):
        return self._npy("val_idx")

    @cached_property
    def test_idx(self):
        return self._npy("test_idx")

    @cached_property
    def part_offsets(self):
        return self._npy("part_offsets")

    @cached_property
    def orig_ids(self):
        return self._npy("orig_ids")

    def degrees(self):
        return np.diff(self.indptr)

    def compact_labels(self) -> np.ndarray:
        """Labels at the narrowest integer width the classes need (a run keeps all N resident);
        read without keeping the stored int64 copy."""
        dtype = np.int16 if self.num_classes < 2**15 else np.int32
        return np.load(self.path / "labels.npy", mmap_mode="r").astype(dtype)

    def index_slice(self, lo, hi) -> np.ndarray:
        """indices.bin entries [lo, hi): a slice of the resident copy if there is one, else read."""
        if "indices" in self.__dict__:
            return self.indices[lo:hi]
        isz = np.dtype(self.meta["index_dtype"]).itemsize
        return np.fromfile(self.path / "indices.bin", dtype=self.meta["index_dtype"], count=int(hi - lo),
                           offset=int(lo) * isz)

    def neighbour_lists(self):
        """Every neighbour list in RAM as the sampler's topology source (`topology.NeighbourLists`), for
        analyses that walk a run without a plan's residency; built once per store object."""
        if getattr(self, "_lists", None) is None:
            from .topology import NeighbourLists
            self._lists = NeighbourLists.resident(self)
        return self._lists

    @property
    def topology_nbytes(self) -> int:
        """indptr + indices as stored (HierBatching App. B's B), from the metadata."""
        return (self.num_nodes + 1) * 8 + self.num_edges * np.dtype(self.meta["index_dtype"]).itemsize

    def reader(self, kind="direct", **kw):
        """A feature reader over this store ('direct', 'mmap' or 'memory'); see `oocgnn.io`."""
        return open_reader(kind, self.features_path, self.num_nodes, self.feat_dim,
                           row_stride=self.row_stride, **kw)

    def graph(self):
        """The topology as a DGL graph (CSC; the CSR is symmetric, so in = out neighbours), built once:
        for DGL's algorithms (METIS) and oracle tests, never the training path."""
        if getattr(self, "_graph", None) is None:
            self._graph = self._build_graph()
        return self._graph

    def _build_graph(self):
        import dgl
        import torch
        indptr = torch.from_numpy(self.indptr)
        # read afresh (not the cached `indices`): only the int64 copy stays resident
        stored = self.__dict__.get("indices")
        if stored is None:
            stored = np.fromfile(self.path / "indices.bin", dtype=self.meta["index_dtype"])
        indices = torch.from_numpy(stored.astype(np.int64, copy=False))
        del stored
        return dgl.graph(("csc", (indptr, indices, torch.empty(0, dtype=torch.int64))),
                         num_nodes=self.num_nodes).formats("csc")

    def summary(self) -> dict:
        """What `oocgnn info` prints."""
        sizes = np.diff(self.part_offsets)
        files = {name: rec["bytes"] for name, rec in self.meta["files"].items()}
        return {
            "path": str(self.path), "name": self.meta["name"], "format_version": self.meta["version"],
            "nodes": self.num_nodes, "edges": self.num_edges, "feat_dim": self.feat_dim,
            "classes": self.num_classes, **{f"{k}_nodes": v for k, v in self.meta["splits"].items()},
            "row_bytes": self.row_bytes, "row_stride": self.row_stride,
            "partitioner": self.meta["partitioner"], "parts": self.num_parts,
            "part_nodes_min/mean/max": f"{sizes.min()}/{sizes.mean():.0f}/{sizes.max()}",
            **{f"partition_{k}": (f"{v:.4f}" if isinstance(v, float) else v)
               for k, v in self.meta.get("source", {}).get("partition", {}).items()
               if k in ("edge_cut", "train_balance")},
            "feature_bytes": format_size(files["features.bin"]),
            "topology_bytes": format_size(files["indices.bin"] + files["indptr.npy"]),
            "total_bytes": format_size(sum(files.values())),
        }
