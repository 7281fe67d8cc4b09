"""What every feature reader shares: `IOStats`, the row layout, the reader base class, and the page
and request arithmetic that the readers and the simulator both count with.

All readers share `read_rows(ids)` / `read_range(lo, hi)` and return identical rows. A feature
file holds `num_rows` rows of `dim` items, `row_stride` bytes apart from `offset`; padding is
ignored. The readers: `oocgnn.direct.DirectReader` (O_DIRECT, io_uring or a thread pool), and
in `oocgnn.readers` the page-cache baseline `MmapReader`, `MemoryReader` and `open_reader`.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import threading
import time

import numba
import numpy as np

from .errors import StoreError, UserError

PAGE = 4096
MAX_REQUEST = 128 * 1024     # DirectReader: bytes per coalesced row request
RANGE_REQUEST = 1 << 20      # DirectReader: bytes per sequential range request
RANGE_CHUNK = 64 << 20       # a resident range is loaded in read_range calls of at most this many bytes


@numba.njit(cache=True)
def page_span(pos, nbytes):
    """(first, last) 4 KiB page of `nbytes` (>= 1) bytes at byte `pos`, for scalars or arrays: the one
    page rule of the readers, the simulator, traces and cache replays."""
    return pos // PAGE, (pos + nbytes - 1) // PAGE


def index_dtype(num_nodes: int):
    """int32 neighbour ids while they fit, int64 beyond (DESIGN: indices.bin)."""
    return np.int32 if num_nodes < 2**31 else np.int64


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

    def read_rows_into(self, ids, out: np.ndarray, where: np.ndarray) -> None:
        """`out[where] = read_rows(ids)`, the same reads, without the [len(ids), dim] array in between where
        the reader can place the rows itself (`DirectReader`: from its buffer, a piece at a time)."""
        ids = self._check_ids(ids)
        self._timed(self._read_rows_into, ids, out, np.asarray(where))

    def _read_rows_into(self, ids, out, where):
        out[where] = self._read_rows(ids)

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
        return (pos, *page_span(pos, self.row_bytes))

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


def span_runs(first, last, max_request=MAX_REQUEST):
    """(run first pages, run page counts, requests per run) of page spans [first, last] given in
    ascending order of first: spans that touch or overlap merge into one run of pages, read in
    requests of at most `max_request` bytes (the rule of `DirectReader.read_spans` and the simulator's
    list reads)."""
    first, last = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64)
    if not len(first):
        return first, first, first
    reach = np.maximum.accumulate(last)
    start = np.ones(len(first), bool)
    np.greater(first[1:], reach[:-1] + 1, out=start[1:])
    idx = np.flatnonzero(start)
    run_first = first[idx]
    run_last = np.maximum.reduceat(last, idx)
    pages = run_last - run_first + 1
    return run_first, pages, -(-pages // max(1, max_request // PAGE))


def range_requests(pages: int, range_request=RANGE_REQUEST) -> int:
    """Requests DirectReader.read_range issues for a span of `pages` pages."""
    return -(-pages * PAGE // range_request)


def range_chunks(lo, hi, row_stride, chunk_bytes=RANGE_CHUNK) -> list:
    """Rows [lo, hi) as the consecutive read_range calls that load them, each at most `chunk_bytes`
    (one row at least): the runtime loads resident ranges so, and the simulator counts them so."""
    step = max(1, int(chunk_bytes) // int(row_stride))
    return [(a, min(a + step, hi)) for a in range(int(lo), int(hi), step)]


def drop_file_cache(path) -> None:
    """Ask the kernel to drop `path`'s clean pages from the page cache (flushes dirty ones first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def release_pages(arr):
    """Unmap the pages of a memory-mapped array read so far: they stay in the page cache, but no longer
    count in this process's resident set (a bounded prepare reads its runs and neighbour file through maps)."""
    m = getattr(arr, "_mmap", None)
    if isinstance(arr, np.memmap) and m is not None and hasattr(m, "madvise"):
        m.madvise(mmap.MADV_DONTNEED)
