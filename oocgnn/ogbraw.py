"""OGB's raw dataset layouts, streamed: the CSV one (raw/*.csv.gz) and ogbn-papers100M's binary one
(raw/data.npz, raw/node-label.npz), node- and link-property (`ogbl-*`) alike.

Nothing is read whole: edges come `chunk_rows` at a time into `build_csr` (bounded by `prepare_memory`),
features go chunk by chunk into a memory-mapped `.npy` (or are memory-mapped inside data.npz), and the
checks are `datasets`' own, so an OGB source and an `.npz` one fail the same way.
"""
from __future__ import annotations

import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .datasets import GraphData, _check_finite, _check_labels, _check_splits, _check_trainable, _SPLITS, build_csr
from .errors import UserError
from .linksplit import hold_out, is_ogb_link_split, read_ogb_link_split


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
