"""The canonical CSR of an edge stream under a memory bound: sorted runs on disk, merged by source range.

`datasets.csr_from_edges` sorts one array of every key (src * N + dst, both directions): 16 bytes per
undirected edge and a copy, 5.5 GiB for `large`'s 134M edges and ~50 GB for ogbn-papers100M — where the
preprocessing of DGL (#7086), MariusGNN (#117) and OGB (#46) runs out of memory. `CSRBuilder` gives the
same CSR, byte for byte, holding at most about `memory` bytes at a time (plus 32 bytes a node):

1. runs: edges come in chunks of any size (`add`); each piece of at most `memory / 72` edges is
   symmetrised, its self-loops dropped, its keys sorted, deduplicated and written to a run file; a count
   of keys per source node (duplicates across runs included: an upper bound) is kept in memory;
2. merge by source range (`finish`): the sources are cut into ranges whose counted keys fit the bound;
   for each range, every run's slice of it (found by binary search in the memory-mapped sorted run) is
   read, the slices sorted together and deduplicated, and the rows appended to the neighbour file.

A source id range per merge step, rather than a k-way heap merge of the runs, keeps every step a few
vectorised NumPy calls (DESIGN: external sort, sorted runs then a merge).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .errors import UserError
from .io import index_dtype, release_pages
from .units import format_size

KEY_BYTES = 36      # per key held: the key, its copies in the concatenation and deduplication, rows and masks
# What a prepare holds per node besides the sort, measured (benchmarks/prepare.py on the papers100M fixture):
# labels, degrees, the partition, the order and its inverse, the relabelled indptr while the store is written
NODE_BYTES = 144


def sort_memory(prepare_memory: int, num_nodes: int) -> int:
    """What `--prepare-memory` leaves the edge sort once the prepare's per-node arrays have theirs
    (`NODE_BYTES` a node: they are held whatever the sort is given); refuses a budget they do not fit."""
    need = NODE_BYTES * int(num_nodes)
    if prepare_memory - need < 1024:
        raise UserError(f"--prepare-memory {format_size(prepare_memory)} is too small for {num_nodes:,} nodes: a "
                        f"prepare holds about {NODE_BYTES} bytes a node besides the edge sort "
                        f"({format_size(need)}); give at least {format_size(need + (256 << 20))} (the sort "
                        f"then gets 256 MiB; more sorts in fewer runs)")
    return prepare_memory - need


class CSRBuilder:
    """Accumulate an edge list in sorted runs under `workdir`; `finish` writes the CSR's neighbour ids."""

    def __init__(self, num_nodes: int, workdir, memory: int, symmetrize: bool = True):
        if memory < 1024:
            raise UserError(f"a prepare memory of {memory} bytes is too small to sort edges in (>= 1 KiB)")
        self.n, self.symmetrize, self.memory = int(num_nodes), symmetrize, int(memory)
        self.run_keys = max(2, self.memory // KEY_BYTES)        # keys sorted at once
        self.dir = Path(tempfile.mkdtemp(prefix="oocgnn-runs-", dir=workdir))
        self.runs: list[Path] = []
        self.count = np.zeros(self.n, dtype=np.int64)           # keys per source over the runs

    def add(self, src, dst):
        """Take a chunk of edges (any length; ids in 0..N-1)."""
        src, dst = np.asarray(src), np.asarray(dst)
        if len(src) != len(dst):
            raise UserError(f"edge list has {len(src)} sources but {len(dst)} destinations")
        step = max(1, self.run_keys // (2 if self.symmetrize else 1))
        for lo in range(0, len(src), step):
            self._run(np.asarray(src[lo:lo + step], dtype=np.int64), np.asarray(dst[lo:lo + step], dtype=np.int64))

    def _run(self, src, dst):
        if not len(src):
            return
        if min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= self.n:
            raise UserError(f"edge list holds node ids outside 0..{self.n - 1}")
        keep = src != dst
        n = np.int64(self.n)
        keys = np.concatenate([src[keep] * n + dst[keep], dst[keep] * n + src[keep]]) if self.symmetrize \
            else src[keep] * n + dst[keep]
        del src, dst, keep
        keys = _unique_sorted(keys)
        if not len(keys):
            return
        self.count += np.bincount(keys // n, minlength=self.n)
        path = self.dir / f"run{len(self.runs):05d}.npy"
        np.save(path, keys)
        self.runs.append(path)

    def finish(self, indices_path, progress=None) -> tuple[np.ndarray, np.memmap]:
        """Merge the runs into (indptr int64 [N+1], the neighbour ids written to `indices_path` as raw
        int32/int64 and returned memory-mapped); the runs are deleted. `progress(rows)`, if given, is
        called as source rows are finished."""
        n, dtype = self.n, index_dtype(self.n)
        indptr = np.zeros(n + 1, dtype=np.int64)
        runs = [np.load(p, mmap_mode="r") for p in self.runs]
        cursor = [0] * len(runs)
        bound = np.cumsum(self.count)                            # keys of sources 0..v, an upper bound
        written = 0
        try:
            with open(indices_path, "wb") as out:
                a = 0
                while a < n:
                    # the sources whose counted keys fit, at least one (a hub's list is read whole)
                    base = bound[a - 1] if a else 0
                    b = max(a + 1, int(np.searchsorted(bound, base + self.run_keys, side="right")))
                    b = min(b, n)
                    hi = np.int64(b) * np.int64(n)
                    # each run released as soon as it is read: a fault in a map brings in its read-ahead
                    # window (8 MiB here), so the searches and slices of 30 runs held 0.3 GB of file pages
                    ends = []
                    for i, run in enumerate(runs):
                        ends.append(cursor[i] + int(np.searchsorted(run[cursor[i]:], hi)))
                        release_pages(run)
                    keys = np.empty(sum(e - c for e, c in zip(ends, cursor)), dtype=np.int64)
                    at = 0
                    for i, run in enumerate(runs):
                        keys[at:at + ends[i] - cursor[i]] = run[cursor[i]:ends[i]]
                        at += ends[i] - cursor[i]
                        release_pages(run)
                    cursor = ends
                    keys = _unique_sorted(keys)
                    rows = keys // n
                    np.cumsum(np.bincount(rows - a, minlength=b - a), out=indptr[a + 1:b + 1])
                    indptr[a + 1:b + 1] += written
                    nbrs = (keys - rows * n).astype(dtype)
                    out.write(nbrs.tobytes())
                    written += len(nbrs)
                    del keys, rows, nbrs
                    if progress is not None:
                        progress(b - a)
                    a = b
                out.flush()
                os.fsync(out.fileno())
        finally:
            del runs
            shutil.rmtree(self.dir, ignore_errors=True)
        indices = np.memmap(indices_path, dtype=dtype, mode="r", shape=(written,)) if written else \
            np.empty(0, dtype=dtype)
        return indptr, indices

    def close(self):
        """Remove the runs (a builder abandoned before `finish`)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _unique_sorted(keys: np.ndarray) -> np.ndarray:
    """`keys` sorted in place and deduplicated."""
    keys.sort()
    if len(keys) < 2:
        return keys
    uniq = np.empty(len(keys), dtype=bool)
    uniq[0] = True
    np.not_equal(keys[1:], keys[:-1], out=uniq[1:])
    return keys[uniq]
