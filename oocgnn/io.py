"""Feature readers with exact I/O stats: one interface, three implementations.

All readers share `read_rows(ids)` / `read_range(lo, hi)` and return identical rows. A feature
file holds `num_rows` rows of `dim` items, `row_stride` bytes apart from `offset`; padding is
ignored. `DirectReader` (O_DIRECT, io_uring or a thread pool) lives in `oocgnn.direct`;
`MmapReader` (the page-cache baseline) and `MemoryReader` live here with the shared pieces:
`IOStats`, the row layout, and the request-planning rule the simulator also uses.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import resource
import threading
import time

import numpy as np

from .errors import StoreError, UserError

PAGE = 4096
MAX_REQUEST = 128 * 1024     # DirectReader: bytes per coalesced row request
RANGE_REQUEST = 1 << 20      # DirectReader: bytes per sequential range request


def feature_row_stride(row_bytes: int) -> int:
    """On-disk row stride: the next power of two up to 4 KiB (a row never straddles a page), else whole pages."""
    row_bytes = int(row_bytes)
    if row_bytes <= 0:
        raise UserError(f"row size must be > 0 bytes, got {row_bytes}")
    return 1 << (row_bytes - 1).bit_length() if row_bytes <= PAGE else -(-row_bytes // PAGE) * PAGE


@dataclasses.dataclass
class IOStats:
    """Cumulative I/O accounting of a reader, exact for DirectReader.

    bytes_requested: useful bytes, i.e. distinct rows per call * row_bytes. bytes_read: pages * 4096
    moved from the device. MmapReader counts pages touched, an upper bound because pages already
    cached are counted too. MemoryReader reads nothing.
    """
    calls: int = 0           # read_rows / read_range calls
    requests: int = 0        # device requests (preadv calls or io_uring SQEs; mmap: page faults)
    rows: int = 0            # rows returned, duplicates included
    unique_rows: int = 0     # distinct rows per call, summed over calls
    pages: int = 0           # 4 KiB pages read
    bytes_requested: int = 0
    bytes_read: int = 0
    seconds: float = 0.0     # wall time inside read calls

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)

    def snapshot(self) -> "IOStats":
        return dataclasses.replace(self)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __iadd__(self, other: "IOStats") -> "IOStats":  # in place: `reader.stats` keeps its identity
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def __add__(self, other: "IOStats") -> "IOStats":
        return self.snapshot().__iadd__(other)

    def __sub__(self, other: "IOStats") -> "IOStats":
        return IOStats(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))

    def delta(self, before: "IOStats") -> "IOStats":
        """Stats accumulated since `before = stats.snapshot()`."""
        return self - before


class FeatureReader:
    """Base class: layout and id validation, stats, a lock, context-manager support."""
    kind = "base"

    def __init__(self, path, num_rows, dim, row_stride=None, dtype=np.float32, offset=0):
        self.path = None if path is None else os.fspath(path)
        self.num_rows, self.dim, self.offset = int(num_rows), int(dim), int(offset)
        self.dtype = np.dtype(dtype)
        isz = self.dtype.itemsize
        if self.num_rows < 0 or self.dim < 1 or self.offset < 0:
            raise UserError(f"bad feature layout: num_rows={num_rows}, dim={dim}, offset={offset}")
        self.row_bytes = self.dim * isz
        self.row_stride = feature_row_stride(self.row_bytes) if row_stride is None else int(row_stride)
        if self.row_stride < self.row_bytes or self.row_stride % isz or self.offset % isz or PAGE % isz:
            raise UserError(f"bad feature layout: row_stride={self.row_stride} must be >= the row size "
                            f"{self.row_bytes} and, like offset={offset}, a multiple of {isz}")
        self.stats = IOStats()
        self.closed = False
        self._lock = threading.Lock()  # one call at a time: buffers and the ring are shared

    def _file_size(self) -> int:
        need = self.offset + ((self.num_rows - 1) * self.row_stride + self.row_bytes if self.num_rows else 0)
        try:
            size = os.stat(self.path).st_size
        except OSError as e:
            raise StoreError(f"cannot open feature file {self.path}: {e.strerror}") from None
        if size < need:
            raise StoreError(f"feature file {self.path} is truncated: {size} bytes, but {self.num_rows} rows "
                             f"at stride {self.row_stride} from offset {self.offset} need {need}")
        return size

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise UserError(f"row ids must be a 1-D array, got shape {ids.shape}")
        if ids.size == 0:
            return ids.astype(np.int64)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"row ids must be integers, got dtype {ids.dtype}")
        lo, hi = ids.min(), ids.max()
        if lo < 0 or hi >= self.num_rows:
            raise IndexError(f"row id {lo if lo < 0 else hi} out of range [0, {self.num_rows}) "
                             f"for {self.path or 'array'}")
        return ids.astype(np.int64, copy=False)

    def read_rows(self, ids) -> np.ndarray:
        """Rows `ids` (any order, duplicates allowed) as a fresh C-contiguous [len(ids), dim] array."""
        ids = self._check_ids(ids)
        return self._timed(self._read_rows, ids)

    def read_range(self, lo: int, hi: int) -> np.ndarray:
        """Rows lo..hi-1 as a fresh C-contiguous [hi-lo, dim] array (one sequential read)."""
        lo, hi = int(lo), int(hi)
        if not 0 <= lo <= hi <= self.num_rows:
            raise IndexError(f"row range [{lo}, {hi}) out of range [0, {self.num_rows}]")
        return self._timed(self._read_range, lo, hi)

    def _timed(self, fn, *args):
        with self._lock:
            if self.closed:
                raise ValueError(f"{type(self).__name__} for {self.path} is closed")
            t = time.perf_counter()
            out = fn(*args)
            self.stats.seconds += time.perf_counter() - t
        return out

    def _count(self, rows, unique, requests, pages):
        self.stats += IOStats(1, requests, rows, unique, pages, unique * self.row_bytes, pages * PAGE)

    def _page_spans(self, rows: np.ndarray):
        """Byte position, first and last page of each row."""
        pos = self.offset + rows * self.row_stride
        return pos, pos // PAGE, (pos + self.row_bytes - 1) // PAGE

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"{type(self).__name__}({self.path!r}, num_rows={self.num_rows}, dim={self.dim}, "
                f"row_stride={self.row_stride}, dtype={self.dtype.name})")


def request_breaks(first, last, row_pages=1, max_request=MAX_REQUEST) -> np.ndarray:
    """Where DirectReader starts a new request, for rows with page spans [first, last] (sorted).

    A request ends at a gap between spans, or where it would exceed `max_request` bytes
    (at least one row). The simulator counts requests with the same rule, so simulated and
    executed request counts agree.
    """
    n = len(first)
    brk = np.ones(n, bool)
    if n:
        np.greater(first[1:], last[:-1] + 1, out=brk[1:])
        run_first = first[brk][np.cumsum(brk) - 1]
        cap = max(row_pages, max_request // PAGE // row_pages * row_pages)
        blk = (first - run_first) // cap
        brk[1:] |= blk[1:] != blk[:-1]
    return brk


def range_requests(pages: int, range_request=RANGE_REQUEST) -> int:
    """Requests DirectReader.read_range issues for a span of `pages` pages."""
    return -(-pages * PAGE // range_request)


def drop_file_cache(path) -> None:
    """Ask the kernel to drop `path`'s clean pages from the page cache (flushes dirty ones first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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


from .direct import DirectReader  # noqa: E402  (it builds on FeatureReader above; see oocgnn/__init__)

READERS = {"direct": DirectReader, "mmap": MmapReader, "memory": MemoryReader}


def open_reader(kind, path, num_rows, dim, row_stride=None, dtype=np.float32, **kw) -> FeatureReader:
    """Reader by name ("direct", "mmap" or "memory"); `kw` goes to its constructor."""
    if kind not in READERS:
        raise UserError(f"unknown reader {kind!r}: choose one of {', '.join(READERS)}")
    return READERS[kind](path, num_rows, dim, row_stride, dtype, **kw)
