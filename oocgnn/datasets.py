"""Graph sources: the `GraphData` container, CSR helpers, the `.npz` loader.

Every source is canonicalised the same way before it reaches a store: self-loops dropped,
edges symmetrised and deduplicated (the usual undirected node-classification graph).
The synthetic generator lives in `synthetic.py`, OGB's raw layouts in `ogbraw.py` (`prepare.load_source` reads
either), link-prediction edge splits in `linksplit.py`.
"""
from __future__ import annotations

import dataclasses
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError
from .csrbuild import CSRBuilder, sort_memory
from .io import index_dtype
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
