"""Writing a store (`oocgnn prepare`, `write_store`): a graph's files relabelled into partition order, in chunks.

Features are gathered in the store's order and written padded to their stride (float32, or a `codec`'s
compressed rows); neighbour lists are relabelled row range by row range, each row sorted; the small arrays,
held-out link pairs and meta.json follow, each file's CRC32 computed as it is written. The whole store is
built in a temporary directory and swapped into place under a lock (`atomicdir`), then opened: `store.open_store`
checks what was written. The format itself (files, meta.json, checks) is `store`'s.
"""
from __future__ import annotations

import io
import json
import mmap
import os
import shutil
import sys
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .atomicdir import swap_in, temp_path, writing
from .codec import CODEC_FILE, FEATURE_DTYPES, Codec, column_range
from .datasets import GraphData
from .direct import DirectReader
from .errors import StoreError, UserError
from .io import feature_row_stride, index_dtype, release_pages
from .linksplit import HELD_OUT
from .store import Store, _write_stamp, open_store
from .storemeta import FORMAT, STORE_FILES, VERSION, meta_checksum

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


def _write_ids(path: Path, ids, new_of_old) -> dict:
    """Node ids (held-out pairs, negatives) relabelled to store ids, written as an int64 .npy in chunks with
    its CRC32 computed on the way."""
    shape = tuple(int(x) for x in ids.shape)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
                                                  "fortran_order": False, "shape": shape})
    out = _CrcWriter(path)
    out.write(np.frombuffer(header.getvalue(), dtype=np.uint8))
    step = max(1, (1 << 22) // max(1, shape[1]))
    for lo in range(0, shape[0], step):
        out.write(new_of_old[np.asarray(ids[lo:lo + step], dtype=np.int64)])
        release_pages(ids)
    return out.close()


def _relabelled_rows(data: GraphData, order, new_of_old, lo, hi, lists):
    """Neighbour lists of store rows [lo, hi) in store ids, each row sorted; `lists(starts, lens)` reads the
    source's lists (`_list_reader`)."""
    src = order[lo:hi]
    starts, lens = data.indptr[src], data.indptr[src + 1] - data.indptr[src]
    if not lens.sum():
        return np.empty(0, dtype=np.int64)
    row = np.repeat(np.arange(hi - lo, dtype=np.int64), lens)
    nbr = new_of_old[lists(starts, lens)]
    key = row * data.num_nodes + nbr        # sort within each row, rows stay in order
    key.sort()
    return key - row * data.num_nodes


@contextmanager
def _list_reader(indices):
    """lists(starts, lens): the lists indices[s:s+l] concatenated. A neighbour file mapped in memory (a bounded
    prepare's) is read with one pread a list: a fault in a map maps the page cache's whole folio (2 MiB here),
    so gathering 150K scattered lists through the map held its 1.3 GB file in RSS; a pread maps nothing."""

    def gather(starts, lens):
        first = np.cumsum(lens) - lens
        pos = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(first - starts, lens)
        return indices[pos]

    if not isinstance(indices, np.memmap) or not isinstance(indices.base, mmap.mmap) or indices.filename is None:
        yield gather
        return
    item = indices.dtype.itemsize

    def pread(starts, lens):
        out = np.empty(int(lens.sum()), dtype=indices.dtype)
        view, at = memoryview(out).cast("B"), 0
        for s, n in zip((starts * item + indices.offset).tolist(), (lens * item).tolist()):
            if n and os.preadv(fd, [view[at:at + n]], s) != n:
                raise StoreError(f"{indices.filename}: short read at byte {s}")
            at += n
        return out

    fd = os.open(indices.filename, os.O_RDONLY)
    try:
        yield pread
    finally:
        os.close(fd)


def write_store(data: GraphData, path, order=None, part_offsets=None, partitioner="none",
                force=False, progress=True, feature_dtype="float32") -> Store:
    """Write `data` as a store at `path`, nodes relabelled by `order` (default identity).

    `order[i]` is the source id of store id i; `part_offsets` ([K+1], default one part)
    gives the partition ranges in store ids; `feature_dtype` how the rows are stored (`codec`).
    Atomic: a temporary directory renamed into place.
    """
    path = Path(os.path.abspath(path))
    if feature_dtype not in FEATURE_DTYPES:
        raise UserError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPES)}; got {feature_dtype!r}")
    check_target(path, force)
    n = data.num_nodes
    order = np.arange(n, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    if order.shape != (n,) or not np.array_equal(np.bincount(order, minlength=n), np.ones(n)):
        raise UserError("order must be a permutation of the node ids")
    part_offsets = np.array([0, n] if part_offsets is None else part_offsets, dtype=np.int64)
    if part_offsets[0] != 0 or part_offsets[-1] != n or np.any(np.diff(part_offsets) < 0):
        raise UserError("part_offsets must rise from 0 to N")
    new_of_old = np.empty(n, dtype=np.int64)
    new_of_old[order] = np.arange(n, dtype=np.int64)
    identity = bool(np.array_equal(order, np.arange(n)))

    _check_splits(data)
    with writing(path) as notes:
        for note in notes:
            print(f"oocgnn: note: {note}", file=sys.stderr)
        check_target(path, force)          # again, under the lock
        tmp = temp_path(path)
        tmp.mkdir()
        try:
            _write(data, tmp, path.name, order, new_of_old, identity, part_offsets, partitioner, progress,
                   feature_dtype)
            swap_in(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return open_store(path, verify=False)


def check_target(path: Path, force: bool):
    """UserError unless a store may be written at `path`: nothing there, an empty directory, or with
    `force` a directory holding only a store's files (`--force` never deletes anything else)."""
    if os.path.realpath(os.getcwd()).startswith(os.path.realpath(path).rstrip("/") + "/") or \
            os.path.realpath(os.getcwd()) == os.path.realpath(path):
        raise UserError(f"cannot write a store at {path}: it is the current directory or holds it "
                        "(name a new directory, e.g. --out data/mygraph)")
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        raise UserError(f"{path} is {'a link' if path.is_symlink() else 'a file'}, not a store: "
                        "choose another --out (a store is a directory)")
    entries = sorted(os.listdir(path))
    if not entries:
        return
    foreign = [e for e in entries if e not in STORE_FILES or not (path / e).is_file() or (path / e).is_symlink()]
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise UserError(f"{path} holds files that are not a store's ({shown}): --force replaces only a "
                        "store, never anything else; choose another --out or move them away")
    if not force:
        raise UserError(f"a store already exists at {path} (use --force / force=True to replace it)")


def _check_splits(data: GraphData):
    """Refuse splits a store cannot hold: repeated or shared ids, or unlabelled nodes."""
    c = int(data.num_classes)
    labels = np.asarray(data.labels)
    seen = np.zeros(data.num_nodes, dtype=bool)
    for split in ("train_idx", "val_idx", "test_idx"):
        ids = np.asarray(getattr(data, split), dtype=np.int64)
        if len(np.unique(ids)) != len(ids):
            raise UserError(f"{data.name}: {split} lists a node more than once")
        if seen[ids].any():
            raise UserError(f"{data.name}: {split} shares {int(seen[ids].sum())} nodes with an earlier split")
        seen[ids] = True
        bad = ids[(labels[ids] < 0) | (labels[ids] >= c)]
        if len(bad):
            raise UserError(f"{data.name}: {len(bad)} {split} nodes have no label in 0..{c - 1} "
                            f"(e.g. node {bad[0]} labelled {labels[bad[0]]})")


@contextmanager
def _row_gather(features, identity):
    """rows(ids) of the source's features. A float32 file mapped in memory (an OGB source's, larger than RAM)
    is gathered in a partition order by O_DIRECT reads, sorted and coalesced, many in flight
    (`direct.DirectReader`): page faults through the map would fetch its scattered rows one at a time."""
    mm = features
    if identity or not isinstance(mm, np.memmap) or not isinstance(mm.base, mmap.mmap) or mm.dtype != np.float32 \
            or mm.ndim != 2 or not mm.flags.c_contiguous or mm.filename is None:
        yield lambda ids: features[ids]
        return
    row_bytes = mm.shape[1] * 4
    as_bytes = mm.offset % 4 != 0         # an array inside a zip (.npz) starts anywhere: read its rows as bytes
    with DirectReader(mm.filename, mm.shape[0], row_bytes if as_bytes else mm.shape[1], row_stride=row_bytes,
                      dtype=np.uint8 if as_bytes else np.float32, offset=mm.offset, buffer_bytes=64 << 20) as reader:
        yield lambda ids: reader.read_rows(ids).view(np.float32)


def _fit_codec(data, feature_dtype, progress) -> Codec:
    """The codec of `feature_dtype` for `data`'s features (int8's and float16's checks need a first pass over
    them for each column's range; float32 none)."""
    if feature_dtype == "float32":
        return Codec()
    n, d = data.num_nodes, data.feat_dim
    step = max(1, _CHUNK_BYTES // (4 * d))
    bar = tqdm(total=n, desc=f"{feature_dtype}: column ranges", unit="row", unit_scale=True,
               disable=not progress, leave=False)
    def rows(ids):
        bar.update(len(ids))
        return data.features[ids]
    lo, hi = column_range(rows, n, d, step)
    bar.close()
    return Codec.fit(feature_dtype, lo, hi)


def _write(data, tmp, name, order, new_of_old, identity, part_offsets, partitioner, progress, feature_dtype):
    """Every file of the store into the directory `tmp`, meta.json (with its checksum) and stamp last."""
    n, d = data.num_nodes, data.feat_dim
    files = {}
    codec = _fit_codec(data, feature_dtype, progress)
    itemsize = codec.dtype.itemsize
    row_bytes, stride = d * itemsize, feature_row_stride(d * itemsize)
    rows_per_chunk = max(1, _CHUNK_BYTES // max(stride, 4 * d))
    bar = tqdm(total=2 * n, desc=f"writing {name}", unit="row", unit_scale=True,
               disable=not progress, leave=False)
    feats = _CrcWriter(tmp / "features.bin")
    with _row_gather(data.features, identity) as gather:
        for lo in range(0, n, rows_per_chunk):
            hi = min(n, lo + rows_per_chunk)
            rows = np.asarray(gather(order[lo:hi]), dtype=np.float32)
            if not np.isfinite(rows).all():      # sources that are memory-mapped in place were not checked
                bad = order[lo:hi][~np.isfinite(rows).all(1)]
                raise UserError(f"{data.name}: {len(bad)} feature row(s) hold NaN or infinite values (source rows "
                                f"{', '.join(map(str, bad[:5]))}{', ...' if len(bad) > 5 else ''}); clean them "
                                f"before preparing a store")
            block = np.zeros((hi - lo, stride // itemsize), dtype=codec.dtype)
            block[:, :d] = codec.encode(rows)
            feats.write(block)
            bar.update(hi - lo)
    files["features.bin"] = feats.close()
    if codec.table() is not None:
        with open(tmp / CODEC_FILE, "wb") as f:
            np.save(f, codec.table())
            f.flush()
            os.fsync(f.fileno())
        files[CODEC_FILE] = {"bytes": (tmp / CODEC_FILE).stat().st_size, "crc32": _crc_file(tmp / CODEC_FILE)}

    idx_dtype = index_dtype(n)
    indices = _CrcWriter(tmp / "indices.bin")
    deg = np.diff(data.indptr)[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    edge_chunk = max(1, int(n * (1 << 22) // max(1, data.num_edges)))   # ~4M edges a chunk: ~200 MB of work
    with _list_reader(data.indices) as lists:
        for lo in range(0, n, edge_chunk):
            hi = min(n, lo + edge_chunk)
            if identity:
                nbrs = data.indices[data.indptr[lo]:data.indptr[hi]]
            else:
                nbrs = _relabelled_rows(data, order, new_of_old, lo, hi, lists)
            indices.write(np.asarray(nbrs, dtype=idx_dtype))
            release_pages(data.indices)
            bar.update(hi - lo)
    files["indices.bin"] = indices.close()
    bar.close()

    arrays = {"indptr": indptr, "labels": np.asarray(data.labels, dtype=np.int64)[order],
              "part_offsets": part_offsets, "orig_ids": order}
    for split in ("train_idx", "val_idx", "test_idx"):
        arrays[split] = np.sort(new_of_old[np.asarray(getattr(data, split), dtype=np.int64)])
    for name, arr in arrays.items():
        with open(tmp / f"{name}.npy", "wb") as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())
        files[f"{name}.npy"] = {"bytes": (tmp / f"{name}.npy").stat().st_size,
                                "crc32": _crc_file(tmp / f"{name}.npy")}
    for key, ids in data.links.items():           # held-out edges and their negatives, in store ids
        files[f"link_{key}.npy"] = _write_ids(tmp / f"link_{key}.npy", ids, new_of_old)
    meta = {
        "format": FORMAT, "version": VERSION, "name": data.name,
        "num_nodes": n, "num_edges": int(data.num_edges), "feat_dim": d,
        "dtype": codec.name, "row_bytes": row_bytes, "row_stride": stride,
        "index_dtype": np.dtype(idx_dtype).name, "num_classes": int(data.num_classes),
        "partitioner": partitioner, "num_parts": len(part_offsets) - 1,
        "splits": {s: len(arrays[f"{s}_idx"]) for s in ("train", "val", "test")},
        "task": data.task, **({"link": _link_record(data)} if data.links else {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": {k: v for k, v in data.info.items() if k != "link" and _jsonable(v)},
        "files": files,
    }
    meta["checksum"] = meta_checksum(meta)
    with open(tmp / "meta.json", "w") as f:
        f.write(json.dumps(meta, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    _write_stamp(tmp, meta)                 # the big files' CRC32 were computed as they were written


def _link_record(data: GraphData) -> dict:
    """meta.json's `link`: how the edges were split (`linksplit.hold_out`'s info) and the counts a store is
    checked against: training pairs (half the topology's entries), held-out pairs, negatives per split."""
    link = {"negatives": "none", **{k: v for k, v in data.info.get("link", {}).items() if _jsonable(v)},
            "train": int(data.num_edges) // 2, **{s: len(data.links[s]) for s in HELD_OUT}}
    for s in HELD_OUT:
        neg = data.links.get(f"{s}_neg")
        if (neg is None) != (link["negatives"] == "none"):
            raise UserError(f"{data.name}: negatives given as {link['negatives']!r} but {s}_neg is "
                            f"{'absent' if neg is None else 'present'}")
        if neg is not None:
            link[f"{s}_negatives"] = int(neg.shape[0] if link["negatives"] == "pairs" else neg.shape[1])
    return link


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False
