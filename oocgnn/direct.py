"""DirectReader: O_DIRECT reads with page-aligned buffers, coalesced requests, many in flight.

Rows on the same or adjacent pages are coalesced into one request (`io.request_breaks`, the rule
the simulator counts with); requests go to io_uring when `liburing` works (one Python thread,
a deep queue) or to a thread pool calling `os.preadv` (which releases the GIL). Where O_DIRECT
is unsupported (tmpfs) it falls back to buffered reads with one warning and drops the file
from the page cache after each call, so reads stay honest.
"""
from __future__ import annotations

import errno
import functools
import math
import mmap
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor, wait as wait_futures

import numba
import numpy as np

from .errors import UserError
from .io import MAX_REQUEST, PAGE, RANGE_REQUEST, FeatureReader, page_span, request_breaks, span_runs

try:  # optional (pinned in requirements.txt): without it DirectReader uses its thread pool
    import liburing as _L
except ImportError:  # pragma: no cover - depends on the environment
    _L = None

_PROBE = ("import liburing as L; r = L.Ring(); L.Cqe(); L.io_uring_queue_init(8, r); "
          "L.io_uring_queue_exit(r)")


@functools.lru_cache(maxsize=None)
def uring_usable() -> bool:
    """Whether the liburing binding runs here. Its wheel can use instructions this processor lacks
    (measured: SIGILL on building a ring), which no `try` can catch, so a child process builds a ring
    first, once per process."""
    if _L is None:
        return False
    try:
        return subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _anon(nbytes: int) -> mmap.mmap:
    """Page-aligned anonymous memory for O_DIRECT. Private, so that transparent huge pages apply
    (shared anonymous memory is shmem): 4 KiB first-touch faults halve read throughput on this VM."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= 4 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return buf


@numba.njit(nogil=True, cache=True)
def _gather_spans(src, src_starts, nbytes, out, out_starts):
    for i in range(len(src_starts)):
        out[out_starts[i]:out_starts[i] + nbytes[i]] = src[src_starts[i]:src_starts[i] + nbytes[i]]


class DirectReader(FeatureReader):
    """O_DIRECT reads: ids are sorted, rows on the same or adjacent pages coalesced into one request
    (at most `max_request` bytes, or one row if larger), many requests in flight.

    backend "uring" uses liburing from the calling thread with up to `queue_depth` in flight;
    "threads" uses a persistent pool of `threads` workers calling os.preadv, which releases the GIL.
    "auto" is "threads": the liburing binding (2026.3.30) never releases the buffers handed to an
    `Iovec` (measured: ~170 B per multi-page request, and whole buffers for fresh ones), so
    uring is opt-in, and even then ranges go through the threads (they read as fast: one
    request per MiB). Where O_DIRECT is refused
    (EINVAL) it warns once and reads buffered (`direct=False`), dropping the page cache after each call.
    `buffer_bytes` bounds the persistent read buffer (it stays resident: a run has a few readers);
    larger calls are read in chunks of it, each with all its requests in flight.
    """
    kind = "direct"

    def __init__(self, path, num_rows, dim, row_stride=None, dtype=np.float32, offset=0, *,
                 threads=16, backend="auto", max_request=MAX_REQUEST, queue_depth=64,
                 range_request=RANGE_REQUEST, range_depth=2, buffer_bytes=8 << 20):
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
        if backend == "uring":
            err = self._init_uring()
            if err is None:
                self.backend = "uring"
            else:
                raise UserError(f"io_uring backend unavailable: {err}")

    def _init_uring(self):
        """Set up the ring and check one read against preadv; returns None or why it failed."""
        if _L is None:
            return "liburing is not installed"
        if not uring_usable():
            return "the liburing binding crashes on this processor (a child process building a ring died)"
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

    def _issue(self, offs, lens, bofs, mv, depth, ring=True):
        """Read lens[i] bytes at file offset offs[i] into mv[bofs[i]:], up to `depth` in flight."""
        if ring and self._ring is not None:
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

    def _read_rows_into(self, ids, out, where):
        self._read_rows(ids, into=(out, where))

    def _read_rows(self, ids, into=None):
        """Rows `ids`, or with `into` = (out, where) written to out[where] straight from the buffer."""
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
            if into is None and i == 0 and j == nreq:   # one chunk: one gather in requested order
                inv = np.empty(n, np.int64)
                inv[order] = uid
                out = view[(ubyte - base * PAGE)[inv] // slot]
            else:                              # several (or into): scatter each chunk's rows into place
                if out is None:
                    out = np.empty((n, self.dim), self.dtype) if into is None else into[0]
                a, b = ustart[rstart[i]], (ustart[rstart[j]] if j < nreq else n)
                dest = order[a:b] if into is None else into[1][order[a:b]]
                out[dest] = view[(ubyte[uid[a:b]] - base * PAGE) // slot]
            i = j
        self._done_call()
        return out

    def read_spans(self, lo, hi) -> np.ndarray:
        """Rows lo[i]..hi[i]-1 of every span, concatenated in the given order ([sum, dim]): what reading
        many neighbour lists of a one-item-a-row file needs, without per-row arrays. Spans are read
        in ascending order; those whose pages touch coalesce into runs, read in requests of at most
        max_request bytes (`io.span_runs`, the simulator's rule too), many in flight. Rows must be
        unpadded (row_stride == row_bytes)."""
        if self.row_stride != self.row_bytes:
            raise UserError("read_spans needs unpadded rows (row_stride == row_bytes)")
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        if len(lo) and (lo.min() < 0 or hi.max() > self.num_rows or (hi < lo).any()):
            raise IndexError(f"row spans out of range [0, {self.num_rows}]")
        return self._timed(self._read_spans, lo, hi)

    def _read_spans(self, lo, hi):
        lens = hi - lo
        out = np.empty((int(lens.sum()), self.dim), self.dtype)
        keep = np.flatnonzero(lens > 0)
        if not len(keep):
            self._count(len(out), len(out), 0, 0)
            return out
        order = keep[np.argsort(lo[keep], kind="stable")]
        pos = self.offset + lo[order] * self.row_stride              # each span's first byte in the file
        first, last = page_span(pos, lens[order] * self.row_stride)
        run_first, run_pages, run_requests = span_runs(first, last, self.max_request)
        run = np.searchsorted(run_first, first, side="right") - 1      # each span's run
        out_start = np.zeros(len(lens), np.int64)
        np.cumsum(lens[:-1], out=out_start[1:])
        out_bytes = out.reshape(-1).view(np.uint8)
        self._count(len(out), len(out), int(run_requests.sum()), int(run_pages.sum()))
        cap, r0 = self.max_request // PAGE, 0
        ends = np.cumsum(run_pages)
        while r0 < len(run_first):                    # groups of runs that fit the persistent buffer
            base = int(ends[r0] - run_pages[r0])
            r1 = max(r0 + 1, int(np.searchsorted(ends, base + self._buf_pages, "right")))
            run_buf = ends[r0:r1] - run_pages[r0:r1] - base            # their first pages in the buffer
            req_run = np.repeat(np.arange(r0, r1), run_requests[r0:r1])
            k = np.arange(len(req_run)) - np.repeat(np.cumsum(run_requests[r0:r1]) - run_requests[r0:r1],
                                                    run_requests[r0:r1])
            req_pages = np.minimum(cap, run_pages[req_run] - k * cap)
            nbytes = int(ends[r1 - 1] - base) * PAGE
            self._ensure(nbytes)
            self._issue(((run_first[req_run] + k * cap) * PAGE).tolist(), (req_pages * PAGE).tolist(),
                        ((run_buf[req_run - r0] + k * cap) * PAGE).tolist(), self._mv, 1 << 30)
            a, b = np.searchsorted(run, [r0, r1])                      # the spans of these runs
            src = (run_buf[run[a:b] - r0] - run_first[run[a:b]]) * PAGE + pos[a:b]
            _gather_spans(np.frombuffer(self._buf, np.uint8, nbytes), src, lens[order[a:b]] * self.row_bytes,
                          out_bytes, out_start[order[a:b]] * self.row_bytes)
            r0 = r1
        self._done_call()
        return out

    def _read_range(self, lo, hi):
        n = hi - lo
        if n == 0:
            self._count(0, 0, 0, 0)
            return np.empty((0, self.dim), self.dtype)
        start = self.offset + lo * self.row_stride
        p0, last = page_span(start, (n - 1) * self.row_stride + self.row_bytes)
        p1 = last + 1
        offs = list(range(p0 * PAGE, p1 * PAGE, self.range_request))
        self._count(n, n, len(offs), p1 - p0)      # len(offs) == range_requests(p1 - p0)
        buf = _anon((p1 - p0) * PAGE)  # fresh: for unpadded rows it IS the result (no copy)
        self._issue(offs, [min(self.range_request, p1 * PAGE - o) for o in offs],
                    [o - p0 * PAGE for o in offs], memoryview(buf), self.range_depth, ring=False)
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
