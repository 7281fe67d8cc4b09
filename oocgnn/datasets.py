"""Graph sources: the `GraphData` container, CSR helpers, and loaders for `.npz` and OGB raw dirs.

Every source is canonicalised the same way before it reaches a store: self-loops dropped,
edges symmetrised and deduplicated (the usual undirected node-classification graph).
The synthetic generator lives in `synthetic.py`; link-prediction edge splits in `linksplit.py`.
"""
from __future__ import annotations

import dataclasses
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError
from .csrbuild import CSRBuilder, sort_memory
from .io import index_dtype
from .linksplit import hold_out, is_ogb_link_split, read_ogb_link_split
from .units import three_fractions


@dataclass
class GraphData:
    """A graph in CSR form, ids 0..N-1 in the source's order: node classification, or link prediction.

    `features` is anything indexable by an id array that returns float32 rows and has
    `.shape`/`.dtype`: a NumPy array, or a lazy source (synthetic `large`) that is only
    ever read in chunks by `storewrite.write_store`. `links` is empty for node classification; for link
    prediction (`linksplit.hold_out`) it holds the held-out 'val' and 'test' edges (int64 [M, 2]) and, from
    OGB, their negatives ('val_neg', 'test_neg'), all in source ids, and the CSR holds the training edges only.
    """
    name: str
    indptr: np.ndarray            # int64 [N+1]
    indices: np.ndarray           # int32/int64 [E], neighbours of each node, sorted per row
    features: object              # float32 [N, D] (array-like)
    labels: np.ndarray            # int64 [N]
    train_idx: np.ndarray         # int64
    val_idx: np.ndarray           # int64
    test_idx: np.ndarray          # int64
    num_classes: int = 0
    info: dict = field(default_factory=dict)   # generator / source arguments, saved in meta.json
    links: dict = field(default_factory=dict)  # link prediction's held-out edges (above)

    def __post_init__(self):
        if not self.num_classes:
            self.num_classes = int(self.labels.max()) + 1 if len(self.labels) else 0
        n = self.num_nodes
        if self.indptr.shape != (n + 1,) or self.indptr[0] != 0 or self.indptr[-1] != len(self.indices):
            raise UserError(f"{self.name}: CSR indptr does not match {n} nodes / {len(self.indices)} edges")
        if tuple(self.features.shape[:1]) != (n,):
            raise UserError(f"{self.name}: features have {self.features.shape[0]} rows, expected {n}")
        for split in ("train_idx", "val_idx", "test_idx"):
            ids = getattr(self, split)
            if len(ids) and (ids.min() < 0 or ids.max() >= n):
                raise UserError(f"{self.name}: {split} holds ids outside 0..{n - 1}")
        if self.links and not set(self.links) >= {"val", "test"}:
            raise UserError(f"{self.name}: held-out edges {sorted(self.links)} lack 'val' or 'test'")
        for key, ids in self.links.items():
            if ids.ndim != 2 or (key in ("val", "test") and ids.shape[1] != 2) or \
                    (len(ids) and (ids.min() < 0 or ids.max() >= n)):
                raise UserError(f"{self.name}: held-out {key} edges of shape {ids.shape} are not node ids in "
                                f"0..{n - 1}" + (" in [M, 2] pairs" if key in ("val", "test") else ""))

    @property
    def task(self) -> str:
        """'link' when edges are held out for link prediction, else 'node'."""
        return "link" if self.links else "node"

    @property
    def num_nodes(self) -> int:
        return len(self.labels)

    @property
    def num_edges(self) -> int:
        """Directed edges in the CSR (each undirected edge counts twice)."""
        return len(self.indices)

    @property
    def feat_dim(self) -> int:
        return int(self.features.shape[1])

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def resplit(self, train_frac, val_frac, seed=0, test_frac=None) -> "GraphData":
        """A copy with seeded random train/val/test splits over the labelled nodes: a random permutation
        cut into its first train_frac, the next val_frac and the next test_frac (None: the rest) of
        them (the 10/10/80 splits the HierBatching digest uses for small real graphs)."""
        labelled = np.flatnonzero(np.asarray(self.labels) >= 0)
        perm = np.random.default_rng(seed).permutation(labelled)
        a, b = int(train_frac * len(perm)), int((train_frac + val_frac) * len(perm))
        c = len(perm) if test_frac is None else min(len(perm), int((train_frac + val_frac + test_frac) * len(perm)))
        if not 0 < a < b < c:
            raise UserError(f"bad split fractions train={train_frac} val={val_frac} test={test_frac} "
                            f"for {len(perm)} labelled nodes: every split needs a node")
        what = f"{train_frac}/{val_frac}" + (f"/{test_frac}" if test_frac is not None else "")
        return dataclasses.replace(self, train_idx=np.sort(perm[:a]), val_idx=np.sort(perm[a:b]),
                                   test_idx=np.sort(perm[b:c]),
                                   info={**self.info, "split": f"random {what} seed {seed}"})


def parse_split(text: str):
    """`prepare --split`: 'given' -> None (the source's split); 'random:TRAIN,VAL,TEST' (fractions of
    the labelled nodes, each > 0, summing to <= 1) -> (train, val, test)."""
    text = str(text).strip()
    if text == "given":
        return None
    kind, _, rest = text.partition(":")
    bad = f"bad --split {text!r}: use 'given' or 'random:TRAIN,VAL,TEST' fractions, e.g. random:0.1,0.1,0.8"
    if kind != "random":
        raise UserError(bad)
    fracs = three_fractions(rest, bad, f"bad --split {text!r}: every fraction must be > 0")
    if sum(fracs) > 1 + 1e-9:
        raise UserError(f"bad --split {text!r}: the fractions sum to {sum(fracs):g}, more than 1")
    return fracs


def csr_from_edges(src, dst, num_nodes: int, symmetrize: bool = True):
    """Canonical CSR from an edge list: drop self-loops, add reverse edges, dedupe, sort rows.

    Works on one sorted int64 key array (src * N + dst), so peak memory is a few
    bytes per edge beyond the inputs. Returns (indptr int64 [N+1], indices int32/int64).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if len(src) != len(dst):
        raise UserError(f"edge list has {len(src)} sources but {len(dst)} destinations")
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= num_nodes):
        raise UserError(f"edge list holds node ids outside 0..{num_nodes - 1}")
    keep = src != dst
    n = np.int64(num_nodes)
    if symmetrize:
        keys = np.concatenate([src[keep] * n + dst[keep], dst[keep] * n + src[keep]])
    else:
        keys = src[keep] * n + dst[keep]
    keys.sort()
    if len(keys):
        uniq = np.empty(len(keys), dtype=bool)
        uniq[0] = True
        np.not_equal(keys[1:], keys[:-1], out=uniq[1:])
        keys = keys[uniq]
    rows = keys // n
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_nodes), out=indptr[1:])
    indices = (keys - rows * n).astype(index_dtype(num_nodes))
    return indptr, indices


def build_csr(edge_chunks, num_nodes: int, prepare_memory=None, workdir=None, progress=False):
    """The canonical CSR of an iterable of (src, dst) chunks: in memory (`csr_from_edges`) when
    `prepare_memory` is None, else through `csrbuild.CSRBuilder` with what that many bytes leave once the
    prepare's per-node arrays have theirs (`csrbuild.sort_memory`), with its runs and
    the neighbour file (returned memory-mapped, to be kept until the store is written) in `workdir`.
    Both give the same arrays."""
    if prepare_memory is None:
        chunks = list(edge_chunks)
        src = np.concatenate([c[0] for c in chunks]) if chunks else np.empty(0, np.int64)
        dst = np.concatenate([c[1] for c in chunks]) if chunks else np.empty(0, np.int64)
        del chunks
        return csr_from_edges(src, dst, num_nodes)
    if workdir is None:
        raise ValueError("a bounded-memory CSR needs a workdir for its runs and neighbour file")
    from tqdm.auto import tqdm
    builder = CSRBuilder(num_nodes, workdir, sort_memory(prepare_memory, num_nodes))
    try:
        with tqdm(desc="sorting edges", unit="edge", unit_scale=True, disable=not progress, leave=False) as bar:
            for src, dst in edge_chunks:
                builder.add(src, dst)
                bar.update(len(src))
        with tqdm(total=num_nodes, desc="merging edge runs", unit="node", unit_scale=True,
                  disable=not progress, leave=False) as bar:
            return builder.finish(Path(workdir) / f"{builder.dir.name}-indices.bin", progress=bar.update)
    except BaseException:
        builder.close()
        raise


def csr_to_edges(indptr, indices):
    """(src, dst) int64 arrays of a CSR, row by row."""
    src = np.repeat(np.arange(len(indptr) - 1, dtype=np.int64), np.diff(indptr))
    return src, np.asarray(indices, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Loaders. Labels are int64 with -1 = unlabelled (never inside a split); splits are disjoint.

NPZ_KEYS = ("src", "dst", "feat", "label", "train_idx", "val_idx", "test_idx")
_SPLITS = (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test"))


MAX_CLASSES = 1 << 16      # more classes than nodes are refused; up to this many, whatever the nodes


def _check_labels(where: str, labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or (len(labels) and not np.issubdtype(labels.dtype, np.integer)):
        raise UserError(f"{where}: labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if len(labels) and labels.min() < -1:
        raise UserError(f"{where}: labels must be 0..C-1 (or -1 for unlabelled), found {labels.min()}")
    if len(labels) and labels.max() >= max(len(labels), MAX_CLASSES):
        raise UserError(f"{where}: labels must be class indices 0..C-1, but the largest is {labels.max():,} with "
                        f"{len(labels):,} nodes (C is the largest + 1: the model would have that many outputs); "
                        "number the classes from 0")
    return labels.astype(np.int64, copy=False)


def _check_splits(where: str, labels: np.ndarray, splits: dict) -> dict:
    """int64 split arrays: 1-D, in range, no repeats, labelled nodes only, pairwise disjoint."""
    n, out = len(labels), {}
    for key, ids in splits.items():
        ids = np.asarray(ids)
        if ids.ndim != 1 or (len(ids) and not np.issubdtype(ids.dtype, np.integer)):
            raise UserError(f"{where}: {key} must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        ids = ids.astype(np.int64, copy=False)
        if len(ids) and (ids.min() < 0 or ids.max() >= n):
            raise UserError(f"{where}: {key} holds node ids outside 0..{n - 1} "
                            f"(min {ids.min()}, max {ids.max()})")
        if len(np.unique(ids)) != len(ids):
            raise UserError(f"{where}: {key} repeats node ids")
        if len(ids) and (labels[ids] < 0).any():
            raise UserError(f"{where}: {key} holds {(labels[ids] < 0).sum()} unlabelled nodes")
        out[key] = ids
    keys = list(out)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            common = np.intersect1d(out[a], out[b])
            if len(common):
                raise UserError(f"{where}: {a} and {b} overlap in {len(common)} nodes "
                                f"(e.g. {common[:5].tolist()}); splits must be disjoint")
    return out


def _check_trainable(where: str, splits: dict):
    """A run needs training nodes to learn from and validation nodes to choose its best point."""
    for key in ("train_idx", "val_idx"):
        if not len(splits[key]):
            raise UserError(f"{where}: the {key.split('_')[0]} split is empty; a run needs training and "
                            "validation nodes (give the source a split, or resplit it)")


def _check_finite(where: str, feat, first_row=0):
    """Refuse NaN or infinite features, naming the first rows that hold them."""
    bad = np.flatnonzero(~np.isfinite(feat).all(1))
    if len(bad):
        rows = ", ".join(str(first_row + r) for r in bad[:5])
        raise UserError(f"{where}: {len(bad)} feature row(s) hold NaN or infinite values (rows {rows}"
                        f"{', ...' if len(bad) > 5 else ''}); clean them before preparing a store")


def load_npz(path, name=None, row_normalize=False, prepare_memory=None, workdir=None, task="node") -> GraphData:
    """A `.npz` in the /work/shared/datasets format (keys `NPZ_KEYS`), canonicalised.

    `row_normalize` scales each feature row to sum 1 (rows of zeros stay zero), the usual
    preprocessing of bag-of-words features (Kipf & Welling; PyG's NormalizeFeatures). For `task` 'link'
    only src, dst and feat are needed: labels are kept if given, node splits ignored (the edges are split)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"npz file not found: {path}")
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable .npz archive ({e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: is a single .npy array, not an .npz archive with keys {', '.join(NPZ_KEYS)}")
    need = NPZ_KEYS if task == "node" else ("src", "dst", "feat")
    with z:
        missing = [k for k in need if k not in z.files]
        if missing:
            raise UserError(f"{path}: missing key(s) {', '.join(missing)} (has {', '.join(z.files) or 'none'})")
        try:
            arr = {k: z[k] for k in need + (("label",) if task == "link" and "label" in z.files else ())}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(f"{path}: cannot read arrays ({e})") from None
    name = name or path.stem
    src, dst, feat = arr["src"], arr["dst"], arr["feat"]
    for k in ("src", "dst"):
        if arr[k].ndim != 1 or (arr[k].size and not np.issubdtype(arr[k].dtype, np.integer)):
            raise UserError(f"{path}: {k} must be a 1-D integer array, got {arr[k].dtype} {arr[k].shape}")
    if src.shape != dst.shape:
        raise UserError(f"{path}: src has {len(src)} entries but dst has {len(dst)}")
    if feat.ndim != 2 or not (np.issubdtype(feat.dtype, np.number) or feat.dtype == bool):
        raise UserError(f"{path}: feat must be a 2-D numeric array [N, D], got {feat.dtype} {feat.shape}")
    labels = _check_labels(str(path), arr["label"]) if "label" in arr else np.full(len(feat), -1, np.int64)
    if feat.shape[0] != len(labels):
        raise UserError(f"{path}: feat has {feat.shape[0]} rows but label has {len(labels)} entries")
    n = len(labels)
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise UserError(f"{path}: src/dst hold node ids outside 0..{n - 1}")
    if task == "node":
        splits = _check_splits(str(path), labels, {k: arr[k] for k, _ in _SPLITS})
        _check_trainable(str(path), splits)
    else:
        splits = {k: np.empty(0, np.int64) for k, _ in _SPLITS}
    indptr, indices = build_csr([(src, dst)], n, prepare_memory, workdir)
    feat = np.ascontiguousarray(feat, dtype=np.float32)
    _check_finite(f"{path}: feat", feat)
    if row_normalize:
        feat /= np.maximum(np.abs(feat).sum(1, keepdims=True), np.float32(1e-12))
    return GraphData(name=name, indptr=indptr, indices=indices, features=feat, labels=labels,
                     **splits, info={"source": "npz", "path": str(path), "name": name,
                                     "row_normalize": bool(row_normalize)})


OGB_EDGE_FILES = ("edge.csv.gz", "data.npz")     # OGB's CSV layout; its binary one (ogbn-papers100M)


def _ogb_dir(root: Path):
    """The OGB dataset dir: `root` if it holds raw/edge.csv.gz or raw/data.npz, else its only subdir that does."""
    def is_ogb(d):
        return any((d / "raw" / f).is_file() for f in OGB_EDGE_FILES)
    if is_ogb(root):
        return root
    subs = [d for d in sorted(root.iterdir()) if is_ogb(d)] if root.is_dir() else []
    return subs[0] if len(subs) == 1 else None


class _NpzMember:
    """One array of an .npz archive (a zip of .npy files), read without loading it: its header from the
    member, rows streamed by `chunks`, or the whole array memory-mapped in place (`memmap`) when the member
    is stored uncompressed. `np.load` of an .npz reads a member whole (56 GB: ogbn-papers100M's node_feat)."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        try:
            self.zip = zipfile.ZipFile(self.path)
            self.info = self.zip.getinfo(key + ".npy")
        except KeyError:
            raise UserError(f"{self.path}: holds no array {key!r} (has {', '.join(self.keys())})") from None
        except (zipfile.BadZipFile, OSError) as e:
            raise UserError(f"{self.path}: not a readable .npz archive ({e})") from None
        with self.zip.open(self.info) as f:
            self.shape, self.fortran, self.dtype = self._header(f)
            self.header_bytes = f.tell()

    def keys(self):
        return [n[:-4] for n in self.zip.namelist() if n.endswith(".npy")]

    def _header(self, f):
        fmt = np.lib.format
        try:
            version = fmt.read_magic(f)
            shape, fortran, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(f)
        except ValueError as e:
            raise UserError(f"{self.path}: {self.key} is not a valid .npy member ({e})") from None
        return tuple(shape), fortran, np.dtype(dtype)

    def _open_at(self, byte):
        """The member's file object positioned `byte` bytes into the array's data."""
        f = self.zip.open(self.info)
        f.seek(self.header_bytes + byte)
        return f

    def rows(self, fh, count, width):
        buf = fh.read(count * width * self.dtype.itemsize)
        if len(buf) != count * width * self.dtype.itemsize:
            raise UserError(f"{self.path}: {self.key} ends early (truncated archive?)")
        return np.frombuffer(buf, dtype=self.dtype).reshape(count, width)

    def memmap(self):
        """The array memory-mapped from the archive (read-only), or None when the member is compressed."""
        if self.info.compress_type != zipfile.ZIP_STORED or self.fortran:
            return None
        with open(self.path, "rb") as f:        # the local file header: 30 bytes + name + extra field
            f.seek(self.info.header_offset)
            local = f.read(30)
            start = self.info.header_offset + 30 + int.from_bytes(local[26:28], "little") + \
                int.from_bytes(local[28:30], "little")
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=start + self.header_bytes, shape=self.shape)

    def pairs(self, chunk_rows):
        """(src, dst) int64 chunks of an edge_index of shape [2, E] (either order) or [E, 2]."""
        if self.shape[:1] == (2,) and len(self.shape) == 2 and not self.fortran:
            e = self.shape[1]                   # all sources, then all destinations: two streams
            with self._open_at(0) as fs, self._open_at(e * self.dtype.itemsize) as fd:
                for lo in range(0, e, chunk_rows):
                    c = min(chunk_rows, e - lo)
                    yield self.rows(fs, c, 1)[:, 0].astype(np.int64), self.rows(fd, c, 1)[:, 0].astype(np.int64)
        elif len(self.shape) == 2 and (self.shape[1] == 2 and not self.fortran or self.shape[0] == 2 and self.fortran):
            e = self.shape[0] if self.shape[1] == 2 and not self.fortran else self.shape[1]
            with self._open_at(0) as f:         # pairs interleaved
                for lo in range(0, e, chunk_rows):
                    pair = self.rows(f, min(chunk_rows, e - lo), 2).astype(np.int64)
                    yield pair[:, 0].copy(), pair[:, 1].copy()
        else:
            raise UserError(f"{self.path}: {self.key} has shape {self.shape}; expected [2, E] or [E, 2]")

    def row_chunks(self, chunk_rows):
        """[k, D] chunks of a C-ordered 2-D array."""
        if len(self.shape) != 2 or self.fortran:
            raise UserError(f"{self.path}: {self.key} must be a C-ordered 2-D array, has shape {self.shape}")
        n, d = self.shape
        with self._open_at(0) as f:
            for lo in range(0, n, chunk_rows):
                yield self.rows(f, min(chunk_rows, n - lo), d)

    def read(self):
        """The whole (small) array."""
        with self._open_at(0) as f:
            count = int(np.prod(self.shape))
            out = self.rows(f, count, 1).reshape(self.shape, order="F" if self.fortran else "C")
        return out


def _csv_chunks(path: Path, chunk_rows: int, dtype, **kw):
    """2-D NumPy chunks of a headerless (gzip) CSV, streamed; parse errors become UserError."""
    import pandas as pd
    if not path.is_file():
        raise UserError(f"missing file {path}")
    try:
        with pd.read_csv(path, header=None, chunksize=chunk_rows, dtype=dtype, **kw) as reader:
            for chunk in reader:
                yield chunk.to_numpy()
    except pd.errors.EmptyDataError:
        return
    except (ValueError, OSError, EOFError) as e:   # ParserError, bad gzip, NA in int column
        raise UserError(f"{path}: not a headerless CSV of {np.dtype(dtype).name} values ({e})") from None


def _csv_column(path: Path, chunk_rows: int, dtype, **kw) -> np.ndarray:
    parts = []
    for c in _csv_chunks(path, chunk_rows, dtype, **kw):
        if c.shape[1] != 1:
            raise UserError(f"{path}: expected one value per line, found {c.shape[1]} columns")
        parts.append(c[:, 0])
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def load_ogb_raw(root, name=None, split="auto", feature_dir=None, chunk_rows=1_000_000, prepare_memory=None,
                 workdir=None, progress=False, task="node") -> GraphData:
    """An OGB node-property-prediction dataset dir, streamed: the CSV layout (raw/*.csv.gz) or the binary
    one of ogbn-papers100M (raw/data.npz with edge_index [2, E], node_feat [N, D], num_nodes_list,
    num_edges_list; raw/node-label.npz with node_label [N, 1]), with split/<name>/*.csv.gz.

    Edges are read `chunk_rows` at a time. CSV features go chunk by chunk into a float32 `.npy`
    (`<feature_dir>/<name>-node-feat.npy`, kept) opened as a read-only memmap, so they never sit in RAM;
    without `feature_dir` the file lives in a TemporaryDirectory attached to the memmap and removed with
    the last view of the features. Binary features stored uncompressed are memory-mapped inside data.npz
    (no copy: 56 GB for papers100M); compressed ones are streamed like CSV's. NaN labels become -1 and
    those nodes are dropped from the splits. With `prepare_memory` the edges go through `build_csr`'s
    bounded path (runs and neighbour file in `workdir`).

    An OGB link-property-prediction dir (ogbl-*: no labels, split/<name>/valid.pt and test.pt, read by
    `linksplit.read_ogb_link_split`) needs `task` 'link': its nodes are counted by num-node-list, and its
    given split is held out of the topology (`linksplit.hold_out`). A node dir with `task` 'link' loads as a
    node dir (its edges are then split at random by the caller).
    """
    root = Path(root)
    d = _ogb_dir(root)
    if d is None:
        raise UserError(f"missing file {root / 'raw' / 'edge.csv.gz'} (not an OGB raw dataset dir; "
                        f"the binary layout has raw/data.npz instead)")
    raw, name = d / "raw", name or d.name
    binary = not (raw / "edge.csv.gz").is_file()
    split_root = d / "split"
    link = is_ogb_link_split(split_root)
    if link and task != "link":
        raise UserError(f"{d} is an OGB link-prediction dataset (split/<name>/valid.pt): prepare it with --task link")

    def member(fname, key):
        if not (raw / fname).is_file():
            raise UserError(f"missing file {raw / fname}")
        return _NpzMember(raw / fname, key)

    def counts(kind):                         # num-node-list / num-edge-list, where the source has one
        if binary:
            m = member("data.npz", "num_nodes_list" if kind == "node" else "num_edges_list")
            return m.read().reshape(-1).astype(np.int64).tolist(), raw / "data.npz"
        f = raw / f"num-{kind}-list.csv.gz"
        return (_csv_column(f, chunk_rows, np.int64).tolist(), f) if f.is_file() else (None, f)

    nn, nfile = counts("node")
    if link:
        if nn is None or len(nn) != 1 or nn[0] < 1:
            raise UserError(f"{nfile}: an OGB link dataset's node count (one positive number) is needed, found {nn}")
        labels, label_file = np.full(nn[0], -1, np.int64), nfile
    else:
        if binary:
            lab = member("node-label.npz", "node_label").read().astype(np.float64)
            if lab.ndim == 2 and lab.shape[1] != 1 or lab.ndim > 2:
                raise UserError(f"{raw / 'node-label.npz'}: node_label has shape {lab.shape}; one label a node expected")
            lab = lab.reshape(-1)
        else:
            lab = _csv_column(raw / "node-label.csv.gz", chunk_rows, np.float64, skip_blank_lines=False)  # "" = NaN
        label_file = raw / ("node-label.npz" if binary else "node-label.csv.gz")
        known = ~np.isnan(lab)
        if (lab[known] < 0).any() or (lab[known] != np.round(lab[known])).any():
            raise UserError(f"{label_file}: labels must be non-negative integers (or NaN)")
        labels = _check_labels(str(label_file), np.where(known, lab, -1).astype(np.int64))
        del lab, known
    n = len(labels)
    if nn is not None and nn != [n]:
        raise UserError(f"{nfile} says {nn} nodes, {label_file.name} has {n} rows")
    if link and not binary and not (raw / "node-feat.csv.gz").is_file():
        raise UserError(f"{raw}: has no node-feat.csv.gz; a store needs node features (ogbl-ddi has none: "
                        "learned node embeddings are not supported)")
    seen = 0
    edge_file = raw / ("data.npz" if binary else "edge.csv.gz")

    def edges():
        nonlocal seen
        chunks = member("data.npz", "edge_index").pairs(chunk_rows) if binary else \
            _csv_chunks(edge_file, chunk_rows, np.int64)
        for c in chunks:
            if not binary:
                if c.shape[1] != 2:
                    raise UserError(f"{edge_file}: expected 2 columns (src,dst), found {c.shape[1]}")
                c = (c[:, 0].copy(), c[:, 1].copy())
            bad = np.flatnonzero((c[0] < 0) | (c[0] >= n) | (c[1] < 0) | (c[1] >= n))
            if len(bad):
                raise UserError(f"{edge_file}: {'edge' if binary else 'line'} {seen + bad[0] + 1} holds node id "
                                f"{[int(c[0][bad[0]]), int(c[1][bad[0]])]} outside 0..{n - 1}")
            seen += len(c[0])
            yield c

    indptr, indices = build_csr(edges(), n, prepare_memory, workdir, progress)
    ne, efile = counts("edge")
    if ne is not None and ne != [seen]:
        raise UserError(f"{efile} says {ne} edges, {edge_file.name} has {seen}")

    if split == "auto":
        subs = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
        if len(subs) != 1:
            raise UserError(f"{split_root}: split='auto' needs exactly one split subdirectory, "
                            f"found {subs or 'none'}; pass split=<name>")
        split = subs[0]
    info = {"source": "ogb_raw", "path": str(d), "name": name, "split": split, "layout": "binary" if binary else "csv"}
    splits, links = {k: np.empty(0, np.int64) for k, _ in _SPLITS}, {}
    if link:
        links, negatives = read_ogb_link_split(split_root / split, n)
        info["link"] = {"source_split": split, "negatives": negatives}
    else:
        dropped = 0
        for key, fname in _SPLITS:
            f = split_root / split / f"{fname}.csv.gz"
            ids = _csv_column(f, chunk_rows, np.int64)
            if len(ids) and (ids.min() < 0 or ids.max() >= n):
                raise UserError(f"{f}: holds node ids outside 0..{n - 1}")
            keep = labels[ids] >= 0
            dropped += int((~keep).sum())
            splits[key] = ids[keep]
        splits = _check_splits(str(split_root / split), labels, splits)
        _check_trainable(str(split_root / split), splits)
        info["unlabelled_dropped_from_splits"] = dropped

    features, feature_info = _ogb_features(raw, name, binary, member, n, label_file, feature_dir, chunk_rows)
    data = GraphData(name=name, indptr=indptr, indices=indices, features=features, labels=labels, **splits,
                     links=links, info={**info, **feature_info})
    return hold_out(data, workdir=workdir) if link else data


def _ogb_features(raw, name, binary, member, n, label_file, feature_dir, chunk_rows):
    """(features, their info) of an OGB raw dir: memory-mapped inside data.npz where stored uncompressed as
    float32, else streamed into a float32 .npy (`load_ogb_raw`)."""
    if binary:
        feat = member("data.npz", "node_feat")
        if len(feat.shape) != 2 or feat.shape[0] != n:
            raise UserError(f"{raw / 'data.npz'}: node_feat has shape {feat.shape}; expected [{n}, D]")
        features = feat.memmap() if feat.dtype == np.float32 else None
        if features is not None:             # NaN rows are refused by write_store as it copies them
            return features, {"feature_file": str(raw / "data.npz"), "feature_file_temporary": False}
        chunks, ffile = feat.row_chunks(chunk_rows), raw / "data.npz"
    else:
        ffile = raw / "node-feat.csv.gz"
        chunks = _csv_chunks(ffile, chunk_rows, np.float32)
    tmp = tempfile.TemporaryDirectory(prefix="oocgnn-ogb-") if feature_dir is None else None
    fdir = Path(tmp.name if tmp else feature_dir)
    fdir.mkdir(parents=True, exist_ok=True)
    fpath = fdir / (re.sub(r"[^\w.-]", "_", name) + "-node-feat.npy")
    try:
        mm, row = None, 0
        for c in chunks:
            c = np.asarray(c, dtype=np.float32)
            if mm is None:
                mm = np.lib.format.open_memmap(fpath, mode="w+", dtype=np.float32, shape=(n, c.shape[1]))
            if c.shape[1] != mm.shape[1] or np.isnan(c).any():
                raise UserError(f"{ffile}: rows {row + 1}..{row + len(c)} have missing or extra values "
                                f"(expected {mm.shape[1]} per row)")
            _check_finite(str(ffile), c, row)
            if row + len(c) > n:
                raise UserError(f"{ffile}: has more than {n} rows ({label_file.name} has {n})")
            mm[row:row + len(c)] = c
            row += len(c)
        if row != n:
            raise UserError(f"{ffile}: has {row} rows, {label_file.name} has {n}")
        mm.flush()
        del mm
        features = np.load(fpath, mmap_mode="r")
    except BaseException:
        mm = None  # noqa: F841  (close the memmap before removing its file)
        tmp.cleanup() if tmp else fpath.unlink(missing_ok=True)
        raise
    if tmp:
        features._oocgnn_tmpdir = tmp   # the directory lives exactly as long as the memmap
    return features, {"feature_file": str(fpath), "feature_file_temporary": tmp is not None}


def load_source(path, **kw) -> GraphData:
    """A `.npz` file -> `load_npz`; an OGB dataset dir (or its parent) -> `load_ogb_raw`."""
    path = Path(path)
    if path.is_file() and path.suffix == ".npz":
        both = ("name", "row_normalize", "prepare_memory", "workdir", "progress", "task")
        extra = sorted(k for k, v in kw.items() if v is not None and k not in both)
        if extra:
            raise UserError(f"{path}: option(s) {', '.join(extra)} only apply to OGB raw directories")
        return load_npz(path, name=kw.get("name"), row_normalize=bool(kw.get("row_normalize")),
                        prepare_memory=kw.get("prepare_memory"), workdir=kw.get("workdir"),
                        task=kw.get("task") or "node")
    if path.is_dir() and _ogb_dir(path) is not None:
        if kw.pop("row_normalize", None):
            raise UserError(f"{path}: --row-normalize applies to .npz sources only")
        return load_ogb_raw(path, **kw)
    what = "does not exist" if not path.exists() else "is not a recognised graph source"
    raise UserError(f"{path} {what}; accepted sources: a .npz file with keys {', '.join(NPZ_KEYS)}, "
                    f"or an OGB node- or link-property dir holding raw/edge.csv.gz or raw/data.npz (or its parent dir "
                    f"with exactly one such dataset subdirectory)")
