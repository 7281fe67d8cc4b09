"""The on-disk store (DESIGN.md; format `VERSION`): partition-ordered features, CSR, labels; opened and checked.

Store ids are the source ids relabelled by an `order` (store id i holds source node
`order[i]`), so each partition is a contiguous id range and one sequential read
(HierBatching §3.1). Feature rows are padded to a stride that never lets a row straddle a
4 KiB page (`io.feature_row_stride`); they are float32, or compressed (float16, or int8 with a per-column
scale and offset in feature_codec.npy: `codec`, `prepare --feature-dtype`). A write (`storewrite.write_store`) builds a temporary directory and swaps
it into place under a lock (`atomicdir`); `--force` replaces only a store. `open_store` validates everything and
names the first problem it finds: meta.json's every field and its checksum, file sizes, the small
files' CRC32 and invariants (indptr, ids, labels, splits, parts) on every open, and the two big
files' CRC32 once, then trusted while a stamp of their size, mtime, ctime and inode still matches
(`verify="full"`, `oocgnn info --verify`, checks them again).

A link-prediction store (`prepare --task link`, `linksplit`) has task 'link' and a `link` record in meta.json
(the split, its counts, OGB's negatives if any); its topology holds the training edges only, its held-out edges
are `link_val.npy` and `link_test.npy` (int64 [M, 2] store ids), with OGB's negatives `link_val_neg.npy` and
`link_test_neg.npy` ([K, 2] pairs shared by every positive, or [M, K] targets, one row per positive). These are
checked like the big files: sizes, shapes and dtypes on every open, CRC32 and ids once, then trusted by the stamp.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from functools import cached_property
from pathlib import Path

import numpy as np

from .codec import CODEC_FILE, Codec
from .atomicdir import describe_leftovers, writing
from .csrsource import CSRSource
from .errors import StoreError, UserError
from .linksplit import HELD_OUT, train_directions
from .io import release_pages
from .readers import open_reader
from .storemeta import BIG_FILES, FORMAT, LINK_FILES, STAMP, VERSION, is_int, link_files, meta_checksum, meta_problem
from .topology import NeighbourLists
from .units import format_size

def _stamped(meta: dict) -> tuple:
    """The files checked once and then trusted while their stamp matches."""
    return BIG_FILES + link_files(meta)


def open_store(path, verify=True) -> "Store":
    """Open and validate a store; raise StoreError naming the first problem found.

    Always: meta.json (every field, its consistency and its checksum), each file's size, the .npy
    files' shapes and dtypes and the invariants of indptr, labels, splits, parts and orig_ids.
    `verify=True` adds the CRC32 of the .npy files, and of features.bin and indices.bin unless
    their stamp (size, mtime, ctime, inode, written when they were last checked) still matches;
    `verify="full"` checks every CRC32 and every neighbour id regardless; False no CRC32.
    """
    path = Path(path)
    meta_path = path / "meta.json"
    if not path.is_dir():
        left = describe_leftovers(path)
        raise StoreError(f"no store at {path}: " + ("; ".join(left) if left else
                         "directory not found (create one with `oocgnn prepare`)"))
    if not meta_path.is_file():
        if (path / "shards.json").is_file():
            raise StoreError(f"{path} holds per-rank shards (`prepare --shards`), not a store: train on it with "
                             "`torchrun ... -m oocgnn train ... --distributed`, or give the store itself")
        raise StoreError(f"no store at {path}: meta.json is missing")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{meta_path} is not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "version" not in meta:
        raise StoreError(f"{path} is not an oocgnn store (meta.json has no format/version)")
    if meta["version"] != VERSION:
        if isinstance(meta["version"], int) and meta["version"] < VERSION:
            raise StoreError(f"{path}: store format version {meta['version']} was written by an older "
                             f"oocgnn (this one reads version {VERSION}); check and upgrade it in place with "
                             f"`oocgnn info --upgrade {path}`, or re-create it with `oocgnn prepare`")
        raise StoreError(f"{path}: unknown store format version {meta['version']!r} "
                         f"(this oocgnn reads version {VERSION})")
    if is_int(meta.get("checksum")) and meta["checksum"] != meta_checksum(meta):
        raise StoreError(f"store {path}: meta.json was edited or corrupted (its checksum does not match); "
                         "re-create the store with `oocgnn prepare`")
    problem = meta_problem(meta)
    if problem:
        raise StoreError(f"store {path}: meta.json {problem} (re-create the store with `oocgnn prepare`)")
    store = Store(path, meta)
    store.validate(verify=verify)
    return store


def upgrade_store(path) -> "Store":
    """Upgrade a version-1 store in place (its data files are unchanged; meta.json gains its
    checksum) after a full check of every file against the CRC32 it records."""
    path = Path(path)
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        raise StoreError(f"no store to upgrade at {path} ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != 1:
        raise StoreError(f"{path} is not a version-1 oocgnn store (nothing to upgrade)")
    meta = {**meta, "version": VERSION}
    meta["checksum"] = meta_checksum(meta)
    problem = meta_problem(meta)
    if problem:
        raise StoreError(f"store {path}: meta.json {problem}; it cannot be upgraded (re-create it)")
    with writing(path):
        store = Store(path, meta)
        store.validate(verify="full")
        tmp = path / f".meta.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, path / "meta.json")
        _write_stamp(path, meta)
    return open_store(path)


def _rises(a, strictly=False, chunk=1 << 22) -> bool:
    """Whether `a` never falls (or, `strictly`, always rises), checked in chunks: no N-sized temporary."""
    for lo in range(0, max(len(a) - 1, 0), chunk):
        hi = min(lo + chunk, len(a) - 1)
        x, y = a[lo:hi], a[lo + 1:hi + 1]
        if (np.any(y <= x) if strictly else np.any(y < x)):
            return False
    return True


def _stat_key(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _write_stamp(root: Path, meta: dict):
    """Record that the big files matched their CRC32 as they are now (a read-only store skips it)."""
    stamp = {"meta": meta["checksum"], "files": {f: _stat_key(root / f) for f in _stamped(meta)},
             "checked": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = root / f".{STAMP}.tmp-{os.getpid()}"
    try:
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, root / STAMP)
    except OSError:
        with contextlib.suppress(OSError):      # a read-only store: even the cleanup's unlink is refused
            tmp.unlink(missing_ok=True)


class Store:
    """An opened store: metadata, lazily loaded arrays, and readers of its feature file."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.meta = Path(path), meta
        self.num_nodes, self.num_edges = meta["num_nodes"], meta["num_edges"]
        self.feat_dim, self.num_classes = meta["feat_dim"], meta["num_classes"]
        self.row_bytes, self.row_stride = meta["row_bytes"], meta["row_stride"]
        self.num_parts = meta["num_parts"]
        self.features_path = self.path / "features.bin"
        self.feature_dtype = meta["dtype"]

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
                "part_offsets.npy": (None, (k + 1,), "int64"), "orig_ids.npy": (None, (n,), "int64"),
                **({CODEC_FILE: (None, (2, self.feat_dim), "float32")} if self.feature_dtype == "int8" else {}),
                **self._expected_links()}

    def _expected_links(self):
        link = self.meta.get("link")
        if not link:
            return {}
        out = {f"link_{s}.npy": (None, (link[s], 2), "int64") for s in HELD_OUT}
        for s in HELD_OUT if link["negatives"] != "none" else ():
            k = link[f"{s}_negatives"]
            out[f"link_{s}_neg.npy"] = (None, (k, 2) if link["negatives"] == "pairs" else (link[s], k), "int64")
        return out

    def validate(self, verify=True):
        """See `open_store`; sets `self.verified` to what was checked (for `oocgnn info`)."""
        files = self.meta["files"]
        small = {}
        for name, (_, shape, dtype) in self._expected().items():
            f = self.path / name
            if not f.is_file():
                raise StoreError(f"store {self.path}: missing file {name}")
            size, want = f.stat().st_size, files[name]["bytes"]
            if size != want:
                kind = "truncated" if size < want else "larger than recorded"
                raise StoreError(f"store {self.path}: {name} is {kind} ({size} bytes, expected {want})")
            if shape is not None:
                try:
                    arr = np.load(f, mmap_mode="r", allow_pickle=False)
                except ValueError as e:
                    raise StoreError(f"store {self.path}: {name} is not a valid .npy file ({e})") from None
                if arr.shape != shape or arr.dtype != np.dtype(dtype):
                    raise StoreError(f"store {self.path}: {name} has shape {arr.shape} dtype "
                                     f"{arr.dtype}, expected {shape} {dtype}")
                if name not in LINK_FILES:           # link files: checked with the big ones
                    small[name[:-4]] = arr
        if verify:
            for name in small:
                self._check_crc(f"{name}.npy")
        self._check_invariants(small)
        self.verified = "sizes and invariants only (no CRC32)"
        if verify:
            self.verified = self._verify_big_files(full=verify == "full")

    def _check_crc(self, name, check=None):
        """The file's CRC32 against meta.json's, read in blocks; each block is also passed to `check`,
        whose first complaint (a message) is raised once the CRC32 matched."""
        crc, path, complaint = 0, self.path / name, None
        with open(path, "rb") as f:
            while block := f.read(16 << 20):
                crc = zlib.crc32(block, crc)
                if check is not None and complaint is None:
                    complaint = check(block)
        if crc != self.meta["files"][name]["crc32"]:
            raise StoreError(f"store {self.path}: checksum mismatch in {name} (the file was modified or "
                             "corrupted; re-create the store with `oocgnn prepare`)")
        if complaint:
            raise StoreError(f"store {self.path}: {complaint}; the store is damaged (re-create it with "
                             "`oocgnn prepare`)")

    def _check_invariants(self, a):
        """What a run relies on, refused with the field named (cheap: the small files, O(N))."""
        n, m, c = self.num_nodes, self.num_edges, self.num_classes

        def bad(what):
            raise StoreError(f"store {self.path}: {what}; the store is damaged (re-create it with `oocgnn prepare`)")
        indptr = a["indptr"]
        if indptr[0] != 0 or indptr[-1] != m or not _rises(indptr):
            bad(f"indptr.npy does not rise from 0 to {m} (the edge count)")
        labels = a["labels"]
        if labels.min() < -1 or labels.max() >= c:
            bad(f"labels.npy holds labels outside -1..{c - 1}")
        seen = np.zeros(n, dtype=bool)
        for split in ("train_idx", "val_idx", "test_idx"):
            ids = np.asarray(a[split])
            if len(ids) and (ids[0] < 0 or ids[-1] >= n or not _rises(ids, strictly=True)):
                bad(f"{split}.npy is not a sorted list of distinct node ids in 0..{n - 1}")
            if seen[ids].any():
                bad(f"{split}.npy shares nodes with another split")
            seen[ids] = True
            if len(ids) and labels[ids].min() < 0:
                bad(f"{split}.npy holds unlabelled nodes")
        offsets = a["part_offsets"]
        if offsets[0] != 0 or offsets[-1] != n or not _rises(offsets):
            bad(f"part_offsets.npy does not rise from 0 to {n}")
        codec = a.get(CODEC_FILE[:-4])
        if codec is not None and not (np.isfinite(codec).all() and (codec[0] > 0).all()):
            bad(f"{CODEC_FILE} holds a scale that is not positive or a value that is not finite")
        orig = a["orig_ids"]
        if orig.min() < 0 or orig.max() >= n:
            bad("orig_ids.npy holds ids outside the graph")
        seen[:] = False
        seen[orig] = True                   # n ids in range that cover all n: a permutation
        if not seen.all():
            bad("orig_ids.npy is not a permutation of the node ids")

    def _verify_big_files(self, full=False) -> str:
        """CRC32 of features.bin and indices.bin (and every neighbour id in range), and of a link store's
        files (their ids in range), unless the stamp says they were checked as they are now; writes the
        stamp after a pass."""
        stamped = _stamped(self.meta)
        if not full:
            try:
                stamp = json.loads((self.path / STAMP).read_text())
                if stamp["meta"] == self.meta["checksum"] and \
                        stamp["files"] == {f: _stat_key(self.path / f) for f in stamped}:
                    names = f"{', '.join(stamped[:-1])} and {stamped[-1]}"
                    return f"small files now; {names} checked {stamp['checked']}"
            except (OSError, ValueError, KeyError, TypeError):
                pass
        dtype, n = np.dtype(self.meta["index_dtype"]), self.num_nodes

        def ids_in_range(block):          # blocks are whole entries: 16 MiB, and the size was checked
            ids = np.frombuffer(block, dtype=dtype)
            if len(ids) and (ids.min() < 0 or ids.max() >= n):
                return f"indices.bin holds a node id outside 0..{n - 1}"
        self._check_crc("features.bin")
        self._check_crc("indices.bin", ids_in_range)
        for name in link_files(self.meta):
            self._check_crc(name)
            ids = np.load(self.path / name, mmap_mode="r")
            for lo in range(0, len(ids), 1 << 20):
                chunk = ids[lo:lo + (1 << 20)]
                if chunk.size and (chunk.min() < 0 or chunk.max() >= n):
                    raise StoreError(f"store {self.path}: {name} holds a node id outside 0..{n - 1}; the store "
                                     "is damaged (re-create it with `oocgnn prepare`)")
                release_pages(ids)
        _write_stamp(self.path, self.meta)
        return "every file now (CRC32 and neighbour ids)"

    def _npy(self, name):
        return np.load(self.path / f"{name}.npy", allow_pickle=False)

    @cached_property
    def indptr(self):
        return self._npy("indptr")

    @cached_property
    def indices(self):
        ids = np.fromfile(self.path / "indices.bin", dtype=self.meta["index_dtype"])
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise StoreError(f"store {self.path}: indices.bin holds a node id outside 0..{self.num_nodes - 1}; "
                             "the store is damaged (run `oocgnn info --verify`)")
        return ids

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

    @property
    def task(self) -> str:
        """'node' (classification) or 'link' (prediction: `link_edges`)."""
        return self.meta.get("task", "node")

    @cached_property
    def train_edges(self) -> np.ndarray:
        """A link store's training edges: int64 [M, 2], each undirected edge {u, v} of its topology once, in CSR
        order of u < v (a link store's topology holds its training edges only, `linksplit`), as (source,
        destination) in the direction a fair coin fixed per edge (`linksplit.train_directions`)."""
        src = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        indices = np.asarray(self.indices, dtype=np.int64)
        keep = indices > src
        return train_directions(src[keep], indices[keep], self.orig_ids)

    def link_edges(self, split) -> np.ndarray:
        """A link store's held-out 'val' or 'test' edges: int64 [M, 2] store ids, memory-mapped."""
        return np.load(self._link_path(split), mmap_mode="r")

    def link_negatives(self, split):
        """OGB's negatives of a held-out split, memory-mapped (meta.json's link['negatives'] says which form:
        'pairs' [K, 2], 'targets' [M, K]), or None."""
        path = self._link_path(split, "_neg")
        return None if self.meta["link"]["negatives"] == "none" else np.load(path, mmap_mode="r")

    def _link_path(self, split, suffix="") -> Path:
        if split not in HELD_OUT or self.task != "link":
            raise UserError(f"{self.path}: no held-out {split!r} edges (a {self.task} store; held out: "
                            f"{', '.join(HELD_OUT)} of link stores)")
        return self.path / f"link_{split}{suffix}.npy"

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

    def csr_source(self) -> CSRSource:
        """The topology as a CSR streamed from indices.bin in chunks (partitioners, streaming passes)."""
        return CSRSource(self.meta["name"], self.indptr, self.train_idx, indices_path=self.path / "indices.bin",
                         dtype=self.meta["index_dtype"], indices_crc=self.meta["files"]["indices.bin"]["crc32"])

    def neighbour_lists(self):
        """Every neighbour list in RAM as the sampler's topology source (`topology.NeighbourLists`), for
        analyses that walk a run without a plan's residency; built once per store object."""
        if getattr(self, "_lists", None) is None:
            self._lists = NeighbourLists.resident(self)
        return self._lists

    @property
    def topology_nbytes(self) -> int:
        """indptr + indices as stored (HierBatching App. B's B), from the metadata."""
        return (self.num_nodes + 1) * 8 + self.num_edges * np.dtype(self.meta["index_dtype"]).itemsize

    @cached_property
    def codec(self) -> Codec:
        """How the rows are stored (`codec.Codec`): readers return them so; `codec.decode` makes float32."""
        return Codec.of_store(self.path, self.feature_dtype)

    def reader(self, kind="direct", **kw):
        """A feature reader over this store ('direct', 'mmap' or 'memory'; see `oocgnn.io`), returning the
        rows as stored (`feature_dtype`; `codec.decode` turns them to float32)."""
        return open_reader(kind, self.features_path, self.num_nodes, self.feat_dim,
                           row_stride=self.row_stride, dtype=self.codec.dtype, **kw)

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
        source = self.meta.get("source")
        partition = source.get("partition") if isinstance(source, dict) else None
        partition = partition if isinstance(partition, dict) else {}
        files = {name: rec["bytes"] for name, rec in self.meta["files"].items()}
        return {
            "path": str(self.path), "name": self.meta["name"], "format_version": self.meta["version"],
            "nodes": self.num_nodes, "edges": self.num_edges, "feat_dim": self.feat_dim,
            "task": self.task, "classes": self.num_classes,
            **{f"{k}_nodes": v for k, v in self.meta["splits"].items()},
            **({**{f"link_{k}_edges": self.meta["link"][k] for k in ("train",) + HELD_OUT},
                "link_negatives": self.meta["link"]["negatives"]} if self.task == "link" else {}),
            "feature_dtype": self.feature_dtype, "row_bytes": self.row_bytes, "row_stride": self.row_stride,
            "partitioner": self.meta["partitioner"], "parts": self.num_parts,
            "part_nodes_min/mean/max": f"{sizes.min()}/{sizes.mean():.0f}/{sizes.max()}",
            **{f"partition_{k}": (f"{v:.4f}" if isinstance(v, float) else v)
               for k, v in partition.items() if k in ("edge_cut", "train_balance")},
            "feature_bytes": format_size(files["features.bin"]),
            "topology_bytes": format_size(files["indices.bin"] + files["indptr.npy"]),
            "total_bytes": format_size(sum(files.values())),
            "checked": getattr(self, "verified", "not validated"),
        }
