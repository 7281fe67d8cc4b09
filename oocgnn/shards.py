"""What one rank of a distributed run reads: its rows, lists and labels, from the shared store or its shard.

`oocgnn prepare ... --shards R` (`write_shards`) cuts a store into R shards, one directory per rank,
so that a machine holds only what its ranks own (BatchGNN §2.1, DistDGL's partitions):

    <store>-shards<R>/shards.json      world, the owners' row bounds, the store's identity and layout
    <store>-shards<R>/rank<r>/         features.bin  rows [lo, hi) at the store's row stride
                                        indptr.npy    their neighbour lists' offsets (from 0)
                                        indices.bin   their lists' entries (global ids)
                                        labels.npy    their labels
                                        train_idx.npy, val_idx.npy, test_idx.npy: the whole splits
                                        (ids only: every rank splits the steps and picks the evaluated
                                        nodes as one process would)

`RankData.open(path, world, rank)` gives a rank the same view of either source: a store (it reads
its own range of the shared files) or a shards directory (it reads `rank<r>/` only). Feature rows are
read through a reader over the rank's rows (local ids 0..hi-lo), lists through `RankLists`.
"""
from __future__ import annotations

import json
import os
import shutil
from functools import cached_property
from pathlib import Path

import numpy as np

from .errors import UserError
from .readers import open_reader
from .store import open_store

SHARD_FILES = ("features.bin", "indptr.npy", "indices.bin", "labels.npy", "train_idx.npy", "val_idx.npy",
               "test_idx.npy")
LAYOUT = ("name", "num_nodes", "num_edges", "feat_dim", "num_classes", "num_parts", "index_dtype", "row_stride",
          "checksum")


def shards_path(store_path, world) -> Path:
    return Path(f"{Path(store_path)}-shards{int(world)}")


def _copy_bytes(src, dst, start, length, chunk=16 << 20):
    with open(src, "rb") as f, open(dst, "wb") as g:
        f.seek(start)
        left = length
        while left > 0:
            block = f.read(min(chunk, left))
            if not block:
                raise UserError(f"{src} ended early while writing a shard: the store is damaged")
            g.write(block)
            left -= len(block)


def check_shards_target(out, force):
    """UserError unless shards may be written at `out`: nothing there, or with `force` earlier shards
    (a directory with shards.json; --force never deletes anything else)."""
    out = Path(out)
    if os.path.lexists(out):
        if out.is_symlink() or not out.is_dir() or not (out / "shards.json").is_file():
            raise UserError(f"{out} exists and is not a shards directory (no shards.json); move it away")
        if not force:
            raise UserError(f"{out} already holds shards; use --force to replace them")


def write_shards(store, world, out=None, force=False, progress=True) -> Path:
    """Write `world` shards of `store` (see the module docstring) to `out` (default <store>-shards<R>),
    atomically (a temporary directory renamed into place)."""
    from tqdm.auto import tqdm
    from .distributed import owner_bounds  # torch: imported when used, not with this module
    if store.task == "link":
        raise UserError(f"{store.path} is a link store: its ranks read it shared (train --distributed), each its own "
                        "training edges; shards hold node batches' rows")
    if store.feature_dtype != "float32":
        raise UserError(f"{store.path} stores {store.feature_dtype} features; shards (`train --distributed`) hold "
                        "float32 rows: prepare the store without --feature-dtype")
    out = Path(out) if out else shards_path(store.path, world)
    check_shards_target(out, force)
    bounds = owner_bounds(store.part_offsets, world)
    if os.path.lexists(out):
        shutil.rmtree(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    dtype = np.dtype(store.meta["index_dtype"])
    labels = np.load(store.path / "labels.npy", mmap_mode="r")
    for r in tqdm(range(world), desc=f"shards of {store.path.name}", unit="rank", disable=not progress):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        d = tmp / f"rank{r}"
        d.mkdir(parents=True)
        _copy_bytes(store.features_path, d / "features.bin", lo * store.row_stride, (hi - lo) * store.row_stride)
        indptr = np.asarray(store.indptr[lo:hi + 1], dtype=np.int64)
        np.save(d / "indptr.npy", indptr - indptr[0])
        _copy_bytes(store.path / "indices.bin", d / "indices.bin", int(indptr[0]) * dtype.itemsize,
                    int(indptr[-1] - indptr[0]) * dtype.itemsize)
        np.save(d / "labels.npy", np.asarray(labels[lo:hi]))
        for split in ("train_idx", "val_idx", "test_idx"):
            np.save(d / f"{split}.npy", getattr(store, split))
    meta = {"world": int(world), "bounds": bounds.tolist(), "part_offsets": np.asarray(store.part_offsets).tolist(),
            "store": str(store.path),
            **{k: store.meta.get(k) for k in LAYOUT}, "row_stride": int(store.row_stride)}
    (tmp / "shards.json").write_text(json.dumps(meta, indent=2) + "\n")
    tmp.rename(out)
    return out


class RankData:
    """Rank `rank`'s view of a store or shards directory: layout (`num_nodes`, `feat_dim`, ...), the
    owners' `bounds`, its rows [lo, hi), the splits, its labels (`labels_of(ids)`), a feature reader over
    its rows (`reader()`: local ids) and its lists (`lists()`)."""

    def __init__(self, path, world, rank, meta, bounds, source):
        self.path, self.world, self.rank, self.meta = Path(path), int(world), int(rank), meta
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.lo, self.hi = int(self.bounds[rank]), int(self.bounds[rank + 1])
        self.num_nodes, self.feat_dim = int(meta["num_nodes"]), int(meta["feat_dim"])
        self.num_classes, self.row_stride = int(meta["num_classes"]), int(meta["row_stride"])
        self.row_bytes = self.feat_dim * 4
        self.source = source                      # the Store, or the rank's shard directory

    @classmethod
    def open(cls, path, world, rank) -> "RankData":
        from .distributed import owner_bounds  # torch: imported when used, not with this module
        path = Path(path)
        if (path / "shards.json").is_file():
            meta = json.loads((path / "shards.json").read_text())
            if int(meta["world"]) != int(world):
                raise UserError(f"{path} holds {meta['world']} shards; run it with as many ranks, not {world} "
                                f"(or write {world} with `oocgnn prepare ... --shards {world}`)")
            d = path / f"rank{rank}"
            missing = [f for f in SHARD_FILES if not (d / f).is_file()]
            if missing:
                raise UserError(f"{d} lacks {', '.join(missing)}: copy rank {rank}'s shard to this machine "
                                f"(written by `oocgnn prepare ... --shards {world}`)")
            return cls(path, world, rank, meta, meta["bounds"], d)
        store = open_store(path)
        if store.feature_dtype != "float32":
            raise UserError(f"{path} stores {store.feature_dtype} features; ranks that hold only their own rows "
                            "(--rank-data own) exchange float32 rows: run with --rank-data shared (each rank reads "
                            "the store through the policy), or prepare the store without --feature-dtype")
        meta = {**{k: store.meta.get(k) for k in LAYOUT}, "row_stride": int(store.row_stride)}
        return cls(path, world, rank, meta, owner_bounds(store.part_offsets, world), store)

    @property
    def part_offsets(self) -> np.ndarray:
        """The store's partition offsets (the rank's parts are those inside [lo, hi))."""
        if self.sharded:
            return np.asarray(self.meta["part_offsets"], dtype=np.int64)
        return np.asarray(self.source.part_offsets, dtype=np.int64)

    @property
    def sharded(self) -> bool:
        return not hasattr(self.source, "features_path")

    def _split(self, name):
        return np.load(self.source / f"{name}.npy") if self.sharded else getattr(self.source, name)

    @cached_property
    def train_idx(self):
        return self._split("train_idx")

    @cached_property
    def val_idx(self):
        return self._split("val_idx")

    @cached_property
    def test_idx(self):
        return self._split("test_idx")

    def labels(self) -> np.ndarray:
        """The labels of rows [lo, hi) (narrowest integer width)."""
        dtype = np.int16 if self.num_classes < 2**15 else np.int32
        if self.sharded:
            return np.load(self.source / "labels.npy").astype(dtype)
        return np.asarray(np.load(self.source.path / "labels.npy", mmap_mode="r")[self.lo:self.hi]).astype(dtype)

    def reader(self, kind="direct"):
        """A feature reader over this rank's rows, ids local (0 .. hi - lo)."""
        if self.sharded:
            return open_reader(kind, self.source / "features.bin", self.hi - self.lo, self.feat_dim,
                               row_stride=self.row_stride)
        return open_reader(kind, self.source.features_path, self.hi - self.lo, self.feat_dim,
                           row_stride=self.row_stride, offset=self.lo * self.row_stride)

    def lists(self):
        """This rank's neighbour lists (`distributed.RankLists`)."""
        from .distributed import RankLists  # torch: imported when used, not with this module
        if not self.sharded:
            return RankLists.of_store(self.source, self.bounds, self.rank)
        dtype = np.dtype(self.meta["index_dtype"])
        indptr = np.load(self.source / "indptr.npy")
        indices = np.fromfile(self.source / "indices.bin", dtype=dtype)
        if len(indices) != int(indptr[-1]) or len(indptr) != self.hi - self.lo + 1:
            raise UserError(f"{self.source}: indptr.npy and indices.bin disagree; the shard is damaged")
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_nodes):
            raise UserError(f"{self.source}/indices.bin holds a node id outside 0..{self.num_nodes - 1}; "
                            "the shard is damaged")
        return RankLists(self.num_nodes, self.lo, self.hi, indptr, indices)
