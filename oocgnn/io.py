"""Feature readers: O_DIRECT (io_uring or a thread pool), mmap and in-memory, with exact I/O stats.

All readers share one interface (`read_rows`, `read_range`) and return identical rows. A feature
file holds `num_rows` rows of `dim` items, `row_stride` bytes apart from `offset`; padding is ignored.
"""
from __future__ import annotations

import dataclasses
import errno
import math
import mmap
import os
import resource
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, wait as wait_futures

import numpy as np

from .errors import StoreError, UserError

try:  # optional (pinned in requirements.txt): without it DirectReader uses its thread pool
    import liburing as _L
except ImportError:  # pragma: no cover - depends on the environment
    _L = None

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


def _anon(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous memory for O_DIRECT. Private, so that transparent huge pages apply
    (shared anonymous memory is shmem): 4 KiB first-touch faults halve read throughput on this VM."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= 4 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


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


class DirectReader(FeatureReader):
    """O_DIRECT reads: ids are sorted, rows on the same or adjacent pages coalesced into one request
    (at most `max_request` bytes, or one row if larger), many requests in flight.

    backend "uring" uses liburing from the calling thread with up to `queue_depth` in flight;
    "threads" uses a persistent pool of `threads` workers calling os.preadv, which releases the GIL.
    "auto" picks uring if it imports and a self-test read matches preadv. Where O_DIRECT is refused
    (EINVAL) it warns once and reads buffered (`direct=False`), dropping the page cache after each call.
    `buffer_bytes` bounds the persistent read buffer; larger calls are read in chunks.
    """
    kind = "direct"

    def __init__(self, path, num_rows, dim, row_stride=None, dtype=np.float32, offset=0, *,
                 threads=16, backend="auto", max_request=MAX_REQUEST, queue_depth=64,
                 range_request=RANGE_REQUEST, range_depth=2, buffer_bytes=64 << 20):
        super().__init__(path, num_rows, dim, row_stride, dtype, offset)
        if backend not in ("auto", "threads", "uring"):
            raise UserError(f"unknown backend {backend!r}: use auto, threads or uring")
        self.threads, self.queue_depth = max(1, int(threads)), max(1, int(queue_depth))
        self.max_request = max(PAGE, int(max_request) // PAGE * PAGE)
        self.range_request = max(PAGE, int(range_request) // PAGE * PAGE)
        self.range_depth = max(1, int(range_depth))
        self._size = self._file_size()
        self._buf_pages = max(1, int(buffer_bytes) // PAGE)
        self._buf = self._mv = self._pool = self._ring = self._efd = self._fd = None
        # every row starts at a multiple of `slot` inside a page-aligned buffer, so a strided view
        # with this slot size addresses all rows and extraction is one fancy-index gather
        self._slot = math.gcd(PAGE, self.row_stride, self.offset)
        # rows tiling whole pages: the request cap is a multiple of a row, never splitting one
        self._row_pages = self.row_stride // PAGE if self.row_stride % PAGE == 0 == self.offset % PAGE else 1
        self.direct = True
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            self._ensure(2 * PAGE)
            os.preadv(self._fd, [self._mv[:PAGE]], 0)  # some file systems refuse only the read
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            if self._fd is not None:
                os.close(self._fd)
            self.direct = False
            warnings.warn(f"O_DIRECT is not supported for {self.path}; reading buffered and dropping "
                          "the page cache after each call", RuntimeWarning, stacklevel=2)
            self._fd = os.open(self.path, os.O_RDONLY)
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead: honest counts
        self.backend = "threads"
        if backend != "threads":
            err = self._init_uring()
            if err is None:
                self.backend = "uring"
            elif backend == "uring":
                raise UserError(f"io_uring backend unavailable: {err}")

    def _init_uring(self):
        """Set up the ring and check one read against preadv; returns None or why it failed."""
        if _L is None:
            return "liburing is not installed"
        try:
            self._ring, self._cqe = _L.Ring(), _L.Cqe()
            _L.io_uring_queue_init(self.queue_depth, self._ring)
        except Exception as e:  # no io_uring in this kernel, seccomp, ...
            self._ring = None
            return f"io_uring_queue_init failed: {e}"
        try:
            # completions are awaited with os.read on an eventfd, which releases the GIL; the
            # binding's io_uring_wait_* calls hold it and would stall every other Python thread
            self._efd = os.eventfd(0, os.EFD_CLOEXEC)
            _L.io_uring_register_eventfd(self._ring, self._efd)
            n = os.preadv(self._fd, [self._mv[:PAGE]], 0)
            self._uring([0], [PAGE], [PAGE], self._mv, 1)
            if self._mv[:n] != self._mv[PAGE:PAGE + n]:
                raise OSError("io_uring read returned other bytes than preadv")
        except Exception as e:
            self._close_ring()
            return f"self-test failed: {e}"
        return None

    def _close_ring(self):
        if self._ring is not None:
            _L.io_uring_queue_exit(self._ring)
            self._ring = None
        if self._efd is not None:
            os.close(self._efd)
            self._efd = None

    def _ensure(self, nbytes: int) -> None:
        """Persistent page-aligned buffer (an anonymous mmap: only touched pages use RAM)."""
        if self._buf is None or len(self._buf) < nbytes:
            self._mv = self._iov = None  # cached Iovecs point into the old buffer
            self._buf = _anon(max(nbytes, self._buf_pages * PAGE))
            self._mv = memoryview(self._buf)
            self._iov = [None] * (len(self._buf) // PAGE)

    def _issue(self, offs, lens, bofs, mv, depth):
        """Read lens[i] bytes at file offset offs[i] into mv[bofs[i]:], up to `depth` in flight."""
        if self._ring is not None:
            return self._uring(offs, lens, bofs, mv, min(depth, self.queue_depth))
        k = min(depth, self.threads, len(offs))
        if k <= 1:
            return self._worker(offs, lens, bofs, mv)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="oocgnn-io")
        # interleaved shares: each worker walks the file in order (sequential for ranges)
        futs = [self._pool.submit(self._worker, offs[w::k], lens[w::k], bofs[w::k], mv) for w in range(k)]
        wait_futures(futs)  # all done before any error is raised: no read lands after we return
        for f in futs:
            f.result()

    def _worker(self, offs, lens, bofs, mv):
        fd, preadv = self._fd, os.preadv
        for off, ln, bo in zip(offs, lens, bofs):
            got = preadv(fd, [mv[bo:bo + ln]], off)
            if got != ln:
                self._finish(off, ln, bo, mv, got)

    def _finish(self, off, ln, bo, mv, got):
        """Complete a short read; only the end of the file may legitimately be short."""
        end = min(ln, self._size - off)
        while got < end:
            n = os.preadv(self._fd, [mv[bo + got:bo + ln]], off + got)
            if n <= 0:
                raise OSError(errno.EIO, f"short read at offset {off + got} of {self.path}")
            got += n

    def _uring(self, offs, lens, bofs, mv, depth):
        L, ring, cqe, fd, efd = _L, self._ring, self._cqe, self._fd, self._efd
        get_sqe, prep, set_data, Iovec = L.io_uring_get_sqe, L.io_uring_prep_readv, L.io_uring_sqe_set_data64, L.Iovec
        wait, seen, ready = L.io_uring_wait_cqe, L.io_uring_cqe_seen, L.io_uring_cq_ready
        cache = self._iov if mv is self._mv else None  # one-page Iovecs are reused: building one costs ~1 us
        n, sub, done, inflight = len(offs), 0, 0, 0
        keep, short, err = {}, [], None  # an Iovec holds raw pointers only: keep it alive while in flight
        try:
            while done < n:
                while sub < n and inflight < depth:
                    bo, ln = bofs[sub], lens[sub]
                    if cache is not None and ln == PAGE:
                        iov = cache[bo // PAGE]
                        if iov is None:
                            iov = cache[bo // PAGE] = Iovec([mv[bo:bo + PAGE]])
                    else:
                        iov = keep[sub] = Iovec([mv[bo:bo + ln]])
                    sqe = get_sqe(ring)
                    prep(sqe, fd, iov, offs[sub])
                    set_data(sqe, sub)
                    sub += 1
                    inflight += 1
                L.io_uring_submit(ring)
                while not ready(ring):
                    os.read(efd, 8)  # wakes at the first completion; more arrive while we reap
                for _ in range(ready(ring)):
                    wait(ring, cqe)  # the binding's cqe[j>0] is unreliable: one at a time via cqe[0]
                    c = cqe[0]
                    res, i = c.res, c.user_data
                    seen(ring, c)
                    inflight -= 1
                    done += 1
                    if res != lens[i]:
                        if res < 0:
                            err = err or OSError(-res, f"{os.strerror(-res)} reading {self.path} at {offs[i]}")
                        else:
                            short.append((i, res))
        finally:
            while inflight:  # interrupted: drain, so no stale completion reaches the next call
                L.io_uring_submit_and_wait(ring, 1)
                for _ in range(ready(ring)):
                    wait(ring, cqe)
                    seen(ring, cqe[0])
                    inflight -= 1
        if err is not None:
            raise err
        for i, res in short:
            self._finish(offs[i], lens[i], bofs[i], mv, res)

    def _done_call(self):
        if not self.direct:  # keep the buffered fallback honest: nothing stays cached
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def _read_rows(self, ids):
        n = len(ids)
        if n == 0:
            self._count(0, 0, 0, 0)
            return np.empty((0, self.dim), self.dtype)
        order = np.argsort(ids, kind="stable")
        s = ids[order]
        newu = np.empty(n, bool)
        newu[0] = True
        np.not_equal(s[1:], s[:-1], out=newu[1:])
        ustart = np.flatnonzero(newu)          # sorted position of each distinct row's first copy
        uid = np.cumsum(newu) - 1              # distinct-row index of each sorted position
        nu = len(ustart)
        pos, first, last = self._page_spans(s[ustart])
        brk = request_breaks(first, last, self._row_pages, self.max_request)
        rstart = np.flatnonzero(brk)           # first distinct row of each request
        rfirst = first[rstart]
        rpages = last[np.append(rstart[1:], nu) - 1] - rfirst + 1
        rend = np.cumsum(rpages)               # request end page in one virtual buffer
        rbuf = rend - rpages
        ubyte = (rbuf - rfirst)[np.cumsum(brk) - 1] * PAGE + pos  # each distinct row's byte in it
        nreq = len(rstart)
        self._count(n, nu, nreq, int(rend[-1]))
        slot, isz, out, i = self._slot, self.dtype.itemsize, None, 0
        while i < nreq:  # chunks of requests that fit the persistent buffer
            base = int(rbuf[i])
            j = max(i + 1, int(np.searchsorted(rend, base + self._buf_pages, "right")))
            nbytes = int(rend[j - 1] - base) * PAGE
            self._ensure(nbytes)
            self._issue((rfirst[i:j] * PAGE).tolist(), (rpages[i:j] * PAGE).tolist(),
                        ((rbuf[i:j] - base) * PAGE).tolist(), self._mv, 1 << 30)
            view = np.lib.stride_tricks.as_strided(
                np.frombuffer(self._buf, self.dtype, nbytes // isz),
                ((nbytes - self.row_bytes) // slot + 1, self.dim), (slot, isz), writeable=False)
            if i == 0 and j == nreq:           # one chunk: one gather in requested order
                inv = np.empty(n, np.int64)
                inv[order] = uid
                out = view[(ubyte - base * PAGE)[inv] // slot]
            else:                              # several: scatter each chunk's rows into place
                if out is None:
                    out = np.empty((n, self.dim), self.dtype)
                a, b = ustart[rstart[i]], (ustart[rstart[j]] if j < nreq else n)
                out[order[a:b]] = view[(ubyte[uid[a:b]] - base * PAGE) // slot]
            i = j
        self._done_call()
        return out

    def _read_range(self, lo, hi):
        n = hi - lo
        if n == 0:
            self._count(0, 0, 0, 0)
            return np.empty((0, self.dim), self.dtype)
        start = self.offset + lo * self.row_stride
        p0, p1 = start // PAGE, (self.offset + (hi - 1) * self.row_stride + self.row_bytes - 1) // PAGE + 1
        offs = list(range(p0 * PAGE, p1 * PAGE, self.range_request))
        self._count(n, n, len(offs), p1 - p0)      # len(offs) == range_requests(p1 - p0)
        buf = _anon((p1 - p0) * PAGE)  # fresh: for unpadded rows it IS the result (no copy)
        self._issue(offs, [min(self.range_request, p1 * PAGE - o) for o in offs],
                    [o - p0 * PAGE for o in offs], memoryview(buf), self.range_depth)
        self._done_call()
        a = np.ndarray((n, self.dim), self.dtype, buffer=buf, offset=start - p0 * PAGE,
                       strides=(self.row_stride, self.dtype.itemsize))
        return a if self.row_stride == self.row_bytes else np.ascontiguousarray(a)

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._close_ring()
        os.close(self._fd)
        self._mv = self._iov = self._buf = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


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


READERS = {"direct": DirectReader, "mmap": MmapReader, "memory": MemoryReader}


def open_reader(kind, path, num_rows, dim, row_stride=None, dtype=np.float32, **kw) -> FeatureReader:
    """Reader by name ("direct", "mmap" or "memory"); `kw` goes to its constructor."""
    if kind not in READERS:
        raise UserError(f"unknown reader {kind!r}: choose one of {', '.join(READERS)}")
    return READERS[kind](path, num_rows, dim, row_stride, dtype, **kw)
