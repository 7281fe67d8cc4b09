"""Graph sources: the `GraphData` container, CSR helpers, and loaders for `.npz` and OGB raw dirs.

Every source is canonicalised the same way before it reaches a store: self-loops dropped,
edges symmetrised and deduplicated (the usual undirected node-classification graph).
The synthetic generator lives in `synthetic.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError


@dataclass
class GraphData:
    """A node-classification graph in CSR form, ids 0..N-1 in the source's order.

    `features` is anything indexable by an id array that returns float32 rows and has
    `.shape`/`.dtype`: a NumPy array, or a lazy source (synthetic `large`) that is only
    ever read in chunks by `store.write_store`.
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
        import dataclasses
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
    try:
        fracs = tuple(float(f) for f in rest.split(","))
    except ValueError:
        raise UserError(bad) from None
    if len(fracs) != 3 or not all(np.isfinite(fracs)):
        raise UserError(bad)
    if min(fracs) <= 0:
        raise UserError(f"bad --split {text!r}: every fraction must be > 0")
    if sum(fracs) > 1 + 1e-9:
        raise UserError(f"bad --split {text!r}: the fractions sum to {sum(fracs):g}, more than 1")
    return fracs


def index_dtype(num_nodes: int):
    """int32 neighbour ids while they fit, int64 beyond (DESIGN: indices.bin)."""
    return np.int32 if num_nodes < 2**31 else np.int64


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
    `prepare_memory` is None, else through `csrbuild.CSRBuilder` under that many bytes, with its runs and
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
    from .csrbuild import CSRBuilder
    builder = CSRBuilder(num_nodes, workdir, prepare_memory)
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


def _check_labels(where: str, labels) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or (len(labels) and not np.issubdtype(labels.dtype, np.integer)):
        raise UserError(f"{where}: labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if len(labels) and labels.min() < -1:
        raise UserError(f"{where}: labels must be 0..C-1 (or -1 for unlabelled), found {labels.min()}")
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


def load_npz(path, name=None, row_normalize=False, prepare_memory=None, workdir=None) -> GraphData:
    """A `.npz` in the /work/shared/datasets format (keys `NPZ_KEYS`), canonicalised.

    `row_normalize` scales each feature row to sum 1 (rows of zeros stay zero), the usual
    preprocessing of bag-of-words features (Kipf & Welling; PyG's NormalizeFeatures)."""
    import zipfile
    path = Path(path)
    if not path.is_file():
        raise UserError(f"npz file not found: {path}")
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable .npz archive ({e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: is a single .npy array, not an .npz archive with keys {', '.join(NPZ_KEYS)}")
    with z:
        missing = [k for k in NPZ_KEYS if k not in z.files]
        if missing:
            raise UserError(f"{path}: missing key(s) {', '.join(missing)} (has {', '.join(z.files) or 'none'})")
        try:
            arr = {k: z[k] for k in NPZ_KEYS}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(f"{path}: cannot read arrays ({e})") from None
    name = name or path.stem
    src, dst, feat = arr["src"], arr["dst"], arr["feat"]
    for k in ("src", "dst"):
        if arr[k].ndim != 1 or (arr[k].size and not np.issubdtype(arr[k].dtype, np.integer)):
            raise UserError(f"{path}: {k} must be a 1-D integer array, got {arr[k].dtype} {arr[k].shape}")
    if src.shape != dst.shape:
        raise UserError(f"{path}: src has {len(src)} entries but dst has {len(dst)}")
    labels = _check_labels(str(path), arr["label"])
    if feat.ndim != 2 or not (np.issubdtype(feat.dtype, np.number) or feat.dtype == bool):
        raise UserError(f"{path}: feat must be a 2-D numeric array [N, D], got {feat.dtype} {feat.shape}")
    if feat.shape[0] != len(labels):
        raise UserError(f"{path}: feat has {feat.shape[0]} rows but label has {len(labels)} entries")
    n = len(labels)
    if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise UserError(f"{path}: src/dst hold node ids outside 0..{n - 1}")
    splits = _check_splits(str(path), labels, {k: arr[k] for k, _ in _SPLITS})
    _check_trainable(str(path), splits)
    indptr, indices = build_csr([(src, dst)], n, prepare_memory, workdir)
    feat = np.ascontiguousarray(feat, dtype=np.float32)
    _check_finite(f"{path}: feat", feat)
    if row_normalize:
        feat /= np.maximum(np.abs(feat).sum(1, keepdims=True), np.float32(1e-12))
    return GraphData(name=name, indptr=indptr, indices=indices, features=feat, labels=labels,
                     **splits, info={"source": "npz", "path": str(path), "name": name,
                                     "row_normalize": bool(row_normalize)})


def _ogb_dir(root: Path):
    """The OGB dataset dir: `root` if it holds raw/edge.csv.gz, else its only subdir that does."""
    if (root / "raw" / "edge.csv.gz").is_file():
        return root
    subs = [d for d in sorted(root.iterdir()) if (d / "raw" / "edge.csv.gz").is_file()] if root.is_dir() else []
    return subs[0] if len(subs) == 1 else None


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
                 workdir=None, progress=False) -> GraphData:
    """An OGB node-property-prediction dataset dir (raw/*.csv.gz + split/<name>/), streamed.

    Edges are read `chunk_rows` lines at a time; features go chunk by chunk into a float32
    `.npy` (`<feature_dir>/<name>-node-feat.npy`, kept) opened as a read-only memmap, so they
    never sit in RAM. Without `feature_dir` the file lives in a TemporaryDirectory that is
    attached to the memmap and removed when the last view of the features is gone.
    NaN labels become -1 and those nodes are dropped from the splits. With `prepare_memory` the edges
    go through `build_csr`'s bounded path (runs and neighbour file in `workdir`).
    """
    import re
    import tempfile
    root = Path(root)
    d = _ogb_dir(root)
    if d is None:
        raise UserError(f"missing file {root / 'raw' / 'edge.csv.gz'} (not an OGB raw dataset dir)")
    raw, name = d / "raw", name or d.name
    lab = _csv_column(raw / "node-label.csv.gz", chunk_rows, np.float64, skip_blank_lines=False)  # "" = NaN
    known = ~np.isnan(lab)
    if (lab[known] < 0).any() or (lab[known] != np.round(lab[known])).any():
        raise UserError(f"{raw / 'node-label.csv.gz'}: labels must be non-negative integers (or NaN)")
    labels = np.where(known, lab, -1).astype(np.int64)
    del lab, known
    n = len(labels)
    if (raw / "num-node-list.csv.gz").is_file():
        nn = _csv_column(raw / "num-node-list.csv.gz", chunk_rows, np.int64)
        if nn.tolist() != [n]:
            raise UserError(f"{raw / 'num-node-list.csv.gz'} says {nn.tolist()} nodes, "
                            f"node-label.csv.gz has {n} rows")
    seen = 0

    def edges():
        nonlocal seen
        for c in _csv_chunks(raw / "edge.csv.gz", chunk_rows, np.int64):
            if c.shape[1] != 2:
                raise UserError(f"{raw / 'edge.csv.gz'}: expected 2 columns (src,dst), found {c.shape[1]}")
            bad = np.flatnonzero((c < 0).any(1) | (c >= n).any(1))
            if len(bad):
                raise UserError(f"{raw / 'edge.csv.gz'}: line {seen + bad[0] + 1} holds node id "
                                f"{c[bad[0]].tolist()} outside 0..{n - 1}")
            seen += len(c)
            yield c[:, 0].copy(), c[:, 1].copy()

    indptr, indices = build_csr(edges(), n, prepare_memory, workdir, progress)
    if (raw / "num-edge-list.csv.gz").is_file():
        ne = _csv_column(raw / "num-edge-list.csv.gz", chunk_rows, np.int64)
        if ne.tolist() != [seen]:
            raise UserError(f"{raw / 'num-edge-list.csv.gz'} says {ne.tolist()} edges, edge.csv.gz has {seen}")

    split_root = d / "split"
    if split == "auto":
        subs = sorted(p.name for p in split_root.iterdir() if p.is_dir()) if split_root.is_dir() else []
        if len(subs) != 1:
            raise UserError(f"{split_root}: split='auto' needs exactly one split subdirectory, "
                            f"found {subs or 'none'}; pass split=<name>")
        split = subs[0]
    splits, dropped = {}, 0
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

    tmp = tempfile.TemporaryDirectory(prefix="oocgnn-ogb-") if feature_dir is None else None
    fdir = Path(tmp.name if tmp else feature_dir)
    fdir.mkdir(parents=True, exist_ok=True)
    fpath = fdir / (re.sub(r"[^\w.-]", "_", name) + "-node-feat.npy")
    ffile = raw / "node-feat.csv.gz"
    try:
        mm, row = None, 0
        for c in _csv_chunks(ffile, chunk_rows, np.float32):
            if mm is None:
                mm = np.lib.format.open_memmap(fpath, mode="w+", dtype=np.float32, shape=(n, c.shape[1]))
            if c.shape[1] != mm.shape[1] or np.isnan(c).any():
                raise UserError(f"{ffile}: rows {row + 1}..{row + len(c)} have missing or extra values "
                                f"(expected {mm.shape[1]} per row)")
            _check_finite(str(ffile), c, row)
            if row + len(c) > n:
                raise UserError(f"{ffile}: has more than {n} rows (node-label.csv.gz has {n})")
            mm[row:row + len(c)] = c
            row += len(c)
        if row != n:
            raise UserError(f"{ffile}: has {row} rows, node-label.csv.gz has {n}")
        mm.flush()
        del mm
        features = np.load(fpath, mmap_mode="r")
    except BaseException:
        mm = None  # noqa: F841  (close the memmap before removing its file)
        tmp.cleanup() if tmp else fpath.unlink(missing_ok=True)
        raise
    if tmp:
        features._oocgnn_tmpdir = tmp   # the directory lives exactly as long as the memmap
    return GraphData(name=name, indptr=indptr, indices=indices, features=features, labels=labels,
                     **splits, info={"source": "ogb_raw", "path": str(d), "name": name, "split": split,
                                     "feature_file": str(fpath), "feature_file_temporary": tmp is not None,
                                     "unlabelled_dropped_from_splits": dropped})


def load_source(path, **kw) -> GraphData:
    """A `.npz` file -> `load_npz`; an OGB dataset dir (or its parent) -> `load_ogb_raw`."""
    path = Path(path)
    if path.is_file() and path.suffix == ".npz":
        both = ("name", "row_normalize", "prepare_memory", "workdir", "progress")
        extra = sorted(k for k, v in kw.items() if v is not None and k not in both)
        if extra:
            raise UserError(f"{path}: option(s) {', '.join(extra)} only apply to OGB raw directories")
        return load_npz(path, name=kw.get("name"), row_normalize=bool(kw.get("row_normalize")),
                        prepare_memory=kw.get("prepare_memory"), workdir=kw.get("workdir"))
    if path.is_dir() and _ogb_dir(path) is not None:
        if kw.pop("row_normalize", None):
            raise UserError(f"{path}: --row-normalize applies to .npz sources only")
        return load_ogb_raw(path, **kw)
    what = "does not exist" if not path.exists() else "is not a recognised graph source"
    raise UserError(f"{path} {what}; accepted sources: a .npz file with keys {', '.join(NPZ_KEYS)}, "
                    f"or an OGB node-property dir holding raw/edge.csv.gz (or its parent dir "
                    f"with exactly one such dataset subdirectory)")
