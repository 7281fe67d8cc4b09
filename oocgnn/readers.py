"""The readers beside DirectReader, and the registry that opens any of them by name.

`MmapReader` is the page-cache baseline (np.memmap, MADV_RANDOM; its stats are what the kernel
really fetched), `MemoryReader` holds every row in RAM. All share `oocgnn.io.FeatureReader`'s
interface with `oocgnn.direct.DirectReader` and return identical rows.
"""
from __future__ import annotations

import mmap
import resource

import numpy as np

from .direct import DirectReader
from .errors import UserError
from .io import PAGE, FeatureReader, IOStats, drop_file_cache


def _thread_device_reads():
    """(bytes this thread made the kernel read from storage, major page faults so far)."""
    with open("/proc/thread-self/io", "rb") as f:
        nbytes = next(int(line.split()[1]) for line in f if line.startswith(b"read_bytes:"))
    return nbytes, resource.getrusage(resource.RUSAGE_THREAD).ru_majflt


class MmapReader(FeatureReader):
    """np.memmap baseline with MADV_RANDOM: the default 8 MiB read-around would load whole files.

    Stats are what the kernel really fetched for this thread: `bytes_read`/`pages` from
    /proc/thread-self/io read_bytes (page-cache misses, read-around included), `requests` =
    major page faults. Pages already in the page cache cost nothing and count nothing.
    """
    kind = "mmap"

    def __init__(self, path, num_rows, dim, row_stride=None, dtype=np.float32, offset=0, *, advice="random"):
        super().__init__(path, num_rows, dim, row_stride, dtype, offset)
        self._file_size()
        self._mm, self._view = None, np.empty((0, self.dim), self.dtype)
        if self.num_rows:
            span = (self.num_rows - 1) * self.row_stride + self.row_bytes
            self._mm = np.memmap(self.path, np.uint8, "r", offset=self.offset, shape=(span,))
            if advice == "random":
                self._mm._mmap.madvise(mmap.MADV_RANDOM)
            self._view = np.ndarray((self.num_rows, self.dim), self.dtype, buffer=self._mm,
                                    strides=(self.row_stride, self.dtype.itemsize))

    def _read_rows(self, ids):
        return self._measured(len(ids), len(np.unique(ids)), lambda: self._view[ids])

    def _read_range(self, lo, hi):
        return self._measured(hi - lo, hi - lo, lambda: np.ascontiguousarray(self._view[lo:hi]))

    def _measured(self, n, unique, gather):
        bytes0, faults0 = _thread_device_reads()
        out = gather()
        bytes1, faults1 = _thread_device_reads()
        nbytes = bytes1 - bytes0
        self.stats += IOStats(1, faults1 - faults0, n, unique, -(-nbytes // PAGE),
                              unique * self.row_bytes, nbytes)
        return out

    def drop_cache(self) -> None:
        """Evict the file from the page cache (our mapped pages first: fadvise skips mapped pages)."""
        if self._mm is not None:
            self._mm._mmap.madvise(mmap.MADV_DONTNEED)
        drop_file_cache(self.path)

    def close(self) -> None:
        super().close()
        self._view = self._mm = None


class MemoryReader(FeatureReader):
    """All rows in RAM: loaded once with sequential direct reads (`load_stats`), or wrapping an array."""
    kind = "memory"

    def __init__(self, path, num_rows, dim, row_stride=None, dtype=np.float32, offset=0, *,
                 chunk_bytes=64 << 20, **direct_kw):
        super().__init__(path, num_rows, dim, row_stride, dtype, offset)
        self.data = np.empty((self.num_rows, self.dim), self.dtype)
        step = max(1, int(chunk_bytes) // self.row_stride)
        with DirectReader(path, num_rows, dim, row_stride, dtype, offset, **direct_kw) as r:
            for lo in range(0, self.num_rows, step):
                self.data[lo:lo + step] = r.read_range(lo, min(lo + step, self.num_rows))
        self.load_stats = r.stats

    @classmethod
    def from_array(cls, arr) -> "MemoryReader":
        arr = np.ascontiguousarray(arr)
        if arr.ndim != 2:
            raise UserError(f"features must be a 2-D array, got shape {arr.shape}")
        self = cls.__new__(cls)
        FeatureReader.__init__(self, None, arr.shape[0], arr.shape[1], None, arr.dtype)
        self.data, self.load_stats = arr, IOStats()
        return self

    def _read_rows(self, ids):
        if len(ids) * 8 >= self.num_rows:  # distinct count: a bitmap beats a sort for big calls
            seen = np.zeros(self.num_rows, bool)
            seen[ids] = True
            nu = int(np.count_nonzero(seen))
        else:
            nu = len(np.unique(ids))
        self._count(len(ids), nu, 0, 0)
        return np.take(self.data, ids, axis=0)

    def _read_range(self, lo, hi):
        self._count(hi - lo, hi - lo, 0, 0)
        return self.data[lo:hi].copy()

    def close(self) -> None:
        super().close()
        self.data = None


READERS = {"direct": DirectReader, "mmap": MmapReader, "memory": MemoryReader}


def open_reader(kind, path, num_rows, dim, row_stride=None, dtype=np.float32, **kw) -> FeatureReader:
    """Reader by name ("direct", "mmap" or "memory"); `kw` goes to its constructor."""
    if kind not in READERS:
        raise UserError(f"unknown reader {kind!r}: choose one of {', '.join(READERS)}")
    return READERS[kind](path, num_rows, dim, row_stride, dtype, **kw)
