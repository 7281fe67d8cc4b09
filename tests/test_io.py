"""Feature readers: exact I/O accounting, identical rows across readers, fallbacks, bad input."""
import errno
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from oocgnn import direct as odirect
from oocgnn.errors import StoreError, UserError
from oocgnn.direct import DirectReader
from oocgnn.io import PAGE, IOStats, feature_row_stride
from oocgnn.readers import READERS, MemoryReader, MmapReader, open_reader

BACKENDS = ["threads"] + (["uring"] if odirect.uring_usable() else [])


def write_features(path, n, dim, seed=0, stride=None, offset=0):
    """Random float32 rows at the padded stride, zero padding; returns the source array."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, dim)).astype(np.float32)
    stride = stride or feature_row_stride(dim * 4)
    raw = np.zeros(offset + n * stride, np.uint8)
    rows = raw[offset:].reshape(n, stride)
    rows[:, :dim * 4] = data.view(np.uint8).reshape(n, dim * 4)
    raw.tofile(path)
    return data


def test_row_stride():
    assert [feature_row_stride(b) for b in (1, 3, 4, 400, 512, 513, 4096)] == [1, 4, 4, 512, 512, 1024, 4096]
    assert feature_row_stride(4097) == 8192 and feature_row_stride(6000) == 8192
    assert feature_row_stride(12288) == 12288
    with pytest.raises(UserError):
        feature_row_stride(0)


def counts(stats):
    return stats.requests, stats.pages, stats.bytes_read, stats.bytes_requested


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_stats_exact(tmp_path, backend):
    p = tmp_path / "f.bin"
    data = write_features(p, 1000, 128)  # 512 B rows: 8 per page, 125 pages
    with DirectReader(p, 1000, 128, backend=backend) as r:
        assert r.row_stride == 512 and r.backend == backend and r.direct
        cases = [([0, 1, 2], (1, 1, PAGE, 3 * 512)),          # one page
                 ([0, 8], (1, 2, 2 * PAGE, 2 * 512)),          # adjacent pages coalesce
                 ([8, 0, 23], (1, 3, 3 * PAGE, 3 * 512)),      # pages 0,1,2 in any order
                 ([0, 100], (2, 2, 2 * PAGE, 2 * 512)),        # pages 0 and 12: two requests
                 ([5, 5, 5, 0], (1, 1, PAGE, 2 * 512)),        # duplicates read once
                 ([999, 0, 500], (3, 3, 3 * PAGE, 3 * 512)),   # last page, first page, middle
                 (list(range(1000)), (4, 125, 125 * PAGE, 1000 * 512))]  # 32 pages per request cap
        for ids, want in cases:
            before = r.stats.snapshot()
            out = r.read_rows(ids)
            d = r.stats.delta(before)
            assert counts(d) == want, ids
            assert (d.calls, d.rows, d.unique_rows) == (1, len(ids), len(set(ids)))
            np.testing.assert_array_equal(out, data[ids])
        r.stats.reset()
        assert r.stats == IOStats()
        np.testing.assert_array_equal(r.read_range(0, 20), data[:20])    # 10 KiB: pages 0-2
        assert counts(r.stats) == (1, 3, 3 * PAGE, 20 * 512)
        r.stats.reset()
        np.testing.assert_array_equal(r.read_range(7, 9), data[7:9])     # straddles pages 0/1
        assert counts(r.stats) == (1, 2, 2 * PAGE, 2 * 512)
        r.stats.reset()
        np.testing.assert_array_equal(r.read_rows([]), data[:0])
        assert counts(r.stats) == (0, 0, 0, 0) and r.stats.calls == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_stats_caps_and_layouts(tmp_path, backend):
    p = tmp_path / "f.bin"
    data = write_features(p, 1000, 128)
    with DirectReader(p, 1000, 128, backend=backend, max_request=8192, range_request=3 * PAGE) as r:
        np.testing.assert_array_equal(r.read_rows(np.arange(32)), data[:32])   # 4 pages, cap 2
        assert counts(r.stats) == (2, 4, 4 * PAGE, 32 * 512)
        r.stats.reset()
        np.testing.assert_array_equal(r.read_range(0, 1000), data)             # 125 pages / 3
        assert counts(r.stats) == (42, 125, 125 * PAGE, 1000 * 512)
    p = tmp_path / "d100.bin"  # 400 B rows padded to 512
    data = write_features(p, 300, 100)
    with DirectReader(p, 300, 100, backend=backend) as r:
        assert r.row_stride == 512
        np.testing.assert_array_equal(r.read_rows([7, 8, 299, 16]), data[[7, 8, 299, 16]])
        assert counts(r.stats) == (2, 4, 4 * PAGE, 4 * 400)   # pages 0-2 coalesce; page 37
    p = tmp_path / "d1500.bin"  # 6000 B rows padded to 8192: two pages each
    data = write_features(p, 50, 1500)
    with DirectReader(p, 50, 1500, backend=backend, max_request=4 * PAGE) as r:
        assert r.row_stride == 8192
        for ids, want in [([0, 1], (1, 4)), ([0, 2], (2, 4)), ([3], (1, 2)), ([49, 0, 1, 2], (3, 8))]:
            before = r.stats.snapshot()
            np.testing.assert_array_equal(r.read_rows(ids), data[ids])
            d = r.stats - before
            assert (d.requests, d.pages, d.bytes_read) == (*want, want[1] * PAGE), ids


@pytest.mark.parametrize("backend", BACKENDS)
def test_direct_small_buffer_offset_and_eof(tmp_path, backend):
    # many buffer-sized chunks per call, a header offset, an odd stride that straddles pages,
    # and a file that ends right after the last row (partial last page: short reads)
    rng = np.random.default_rng(1)
    for n, dim, stride, offset, buf in [(2000, 37, 160, 64, 3 * PAGE), (30, 1500, None, 0, PAGE)]:
        p = tmp_path / f"f{dim}.bin"
        data = write_features(p, n, dim, stride=stride, offset=offset)
        stride = stride or feature_row_stride(dim * 4)
        os.truncate(p, offset + (n - 1) * stride + dim * 4)
        ids = rng.integers(0, n, 3000)
        with DirectReader(p, n, dim, row_stride=stride, offset=offset, backend=backend, buffer_bytes=buf) as r:
            np.testing.assert_array_equal(r.read_rows(ids), data[ids])
            into = np.zeros((len(ids), dim), np.float32)
            r.read_rows_into(ids, into, np.arange(len(ids))[::-1])   # many chunks, scattered in place
            np.testing.assert_array_equal(into[::-1], data[ids])
            np.testing.assert_array_equal(r.read_rows(ids[:1]), data[ids[:1]])
            np.testing.assert_array_equal(r.read_range(1, n), data[1:])
            assert r.stats.requests > 3


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Each layout: source array and the readers over the same file."""
    out = []
    for n, dim in [(257, 128), (100, 100), (40, 1500), (70, 3)]:
        p = tmp_path_factory.mktemp("feat") / "f.bin"
        data = write_features(p, n, dim, seed=dim)
        readers = [DirectReader(p, n, dim, backend=b) for b in BACKENDS]
        readers += [MmapReader(p, n, dim), MemoryReader(p, n, dim), MemoryReader.from_array(data)]
        out.append((data, readers))
    yield out
    for _, readers in out:
        for r in readers:
            r.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 3), raw=st.lists(st.integers(0, 10**6), max_size=80),
       edges=st.lists(st.sampled_from(["first", "last"]), max_size=3), rng=st.integers(0, 10**6))
def test_readers_agree(layouts, which, raw, edges, rng):
    data, readers = layouts[which]
    n = len(data)
    ids = np.array([x % n for x in raw] + [0 if e == "first" else n - 1 for e in edges], np.int64)
    lo = rng % (n + 1)
    hi = lo + (rng // 7) % (n + 1 - lo)
    for r in readers:
        out = r.read_rows(ids)
        assert out.dtype == np.float32 and out.shape == (len(ids), data.shape[1]) and out.flags.c_contiguous
        np.testing.assert_array_equal(out, data[ids], err_msg=repr(r))
        before = r.stats.as_dict()
        r.read_rows(ids)
        once = {k: v - before[k] for k, v in r.stats.as_dict().items() if k != "seconds"}
        into = np.full((len(ids) + 5, data.shape[1]), -1, np.float32)
        where = np.random.default_rng(rng).permutation(len(ids) + 5)[:len(ids)]
        before = r.stats.as_dict()
        r.read_rows_into(ids, into, where)       # the same rows and the same reads, placed at `where`
        assert {k: v - before[k] for k, v in r.stats.as_dict().items() if k != "seconds"} == once, repr(r)
        np.testing.assert_array_equal(into[where], data[ids], err_msg=repr(r))
        assert (np.delete(into, where, axis=0) == -1).all()
        rng_out = r.read_range(lo, hi)
        assert rng_out.flags.c_contiguous
        np.testing.assert_array_equal(rng_out, data[lo:hi], err_msg=repr(r))


def test_buffered_fallback(monkeypatch):
    """Where O_DIRECT is refused (EINVAL), warn once, read buffered, still exact."""
    real_open = os.open

    def no_direct(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", no_direct)
    p = f"/dev/shm/oocgnn_test_io_{os.getpid()}.bin"
    try:
        data = write_features(p, 300, 128)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            r = DirectReader(p, 300, 128, backend="threads")
            ids = [299, 0, 5, 5, 150]
            np.testing.assert_array_equal(r.read_rows(ids), data[ids])
            np.testing.assert_array_equal(r.read_range(10, 300), data[10:])
        assert [str(x.message) for x in w if "O_DIRECT" in str(x.message)] == [str(w[0].message)]
        assert not r.direct
        assert counts(r.stats)[:2] == (3 + 1, 3 + 37)  # rows: pages 0, 18, 37; range: pages 1-37
        r.close()
    finally:
        os.unlink(p)


def test_bad_input(tmp_path):
    p = tmp_path / "f.bin"
    write_features(p, 100, 16)
    for kind in READERS:
        with open_reader(kind, p, 100, 16) as r:
            for bad in ([100], [-1], [0, 5, 1000]):
                with pytest.raises(IndexError, match="out of range"):
                    r.read_rows(bad)
            with pytest.raises(IndexError):
                r.read_range(50, 101)
            with pytest.raises(TypeError):
                r.read_rows([0.5])
        with pytest.raises(ValueError, match="closed"):
            r.read_rows([0])
        with pytest.raises(StoreError, match="truncated"):
            open_reader(kind, p, 101, 16)
        with pytest.raises(StoreError):
            open_reader(kind, tmp_path / "missing.bin", 1, 16)
    with pytest.raises(UserError, match="unknown reader"):
        open_reader("nope", p, 100, 16)
    with pytest.raises(UserError, match="row_stride"):
        DirectReader(p, 10, 16, row_stride=32)
    with pytest.raises(UserError):
        DirectReader(p, 10, 16, backend="aio")


def test_mmap_stats_count_real_device_reads(tmp_path):
    """MmapReader reports what the kernel fetched: cold pages once, cached pages never."""
    p = tmp_path / "f.bin"
    data = write_features(p, 1000, 128)
    with MmapReader(p, 1000, 128) as r:
        r.drop_cache()
        np.testing.assert_array_equal(r.read_rows([0, 1, 8, 100, 100]), data[[0, 1, 8, 100, 100]])
        first = r.stats.snapshot()
        if first.bytes_read == 0:
            pytest.skip(f"{tmp_path} is not on a block device (no device reads to count)")
        # MADV_RANDOM: one 4 KiB page per fault, no read-around; rows 0 and 1 share a page
        assert (first.pages, first.bytes_read, first.requests, first.unique_rows) == (3, 3 * PAGE, 3, 4)
        r.read_rows([0, 1, 8, 100])
        assert (r.stats - first).bytes_read == 0, "cached pages cost nothing"
        np.testing.assert_array_equal(r.read_range(0, 1000), data)
    s = r.stats  # accumulates in place
    assert s is r.stats and s.calls == 3 and s.rows == 1009
    d = IOStats(requests=3, seconds=1.0) + IOStats(requests=2)
    assert d.as_dict()["requests"] == 5 and (d - IOStats(requests=5)).requests == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_callers(tmp_path, backend):
    """One reader shared by several threads (e.g. a prefetcher and the trainer) stays correct."""
    from concurrent.futures import ThreadPoolExecutor
    p = tmp_path / "f.bin"
    data = write_features(p, 5000, 64)
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 5000, 700) for _ in range(12)]
    with DirectReader(p, 5000, 64, backend=backend, buffer_bytes=8 * PAGE) as r, ThreadPoolExecutor(4) as ex:
        for ids, out in zip(batches, ex.map(r.read_rows, batches)):
            np.testing.assert_array_equal(out, data[ids])
        assert r.stats.calls == 12 and r.stats.rows == 12 * 700


def test_default_reader_does_not_leak(tmp_path):
    """Repeated reads keep RSS flat (the liburing binding pins buffers; the default avoids it)."""
    p = tmp_path / "f.bin"
    write_features(p, 65536, 128)                      # 32 MiB
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096   # noqa: E731
    with DirectReader(p, 65536, 128) as r:
        r.read_range(0, 65536)
        r.read_rows(np.arange(0, 65536, 3))
        before = rss()
        for _ in range(8):
            r.read_range(0, 65536)
            r.read_rows(np.arange(0, 65536, 3))
        assert rss() - before < 64 << 20


@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 200)), max_size=60), st.sampled_from([4, 8]),
       st.sampled_from([4096, 128 * 1024]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_read_spans_equal_rows_and_count_by_the_span_rule(tmp_path, spans, isz, max_request):
    """read_spans returns the rows of every span in the given order, and reads the pages and requests
    `io.span_runs` counts: the pages of the spans, coalesced where they touch, split at max_request."""
    from oocgnn.io import span_runs
    n = 3300
    dtype = np.int32 if isz == 4 else np.int64
    path = tmp_path / f"entries{isz}.bin"
    if not path.exists():
        np.arange(n, dtype=dtype).tofile(path)
    lo = np.array([a for a, _ in spans], dtype=np.int64)
    hi = np.minimum(lo + [b for _, b in spans], n)
    with DirectReader(path, n, 1, dtype=dtype, row_stride=isz, max_request=max_request) as r:
        out = r.read_spans(lo, hi)[:, 0]
        np.testing.assert_array_equal(out, np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)] or [[]]))
        keep = np.flatnonzero(hi > lo)
        order = keep[np.argsort(lo[keep], kind="stable")]
        first, last = lo[order] * isz // PAGE, (hi[order] * isz - 1) // PAGE
        pages = set().union(*[set(range(a, b + 1)) for a, b in zip(first, last)]) if len(order) else set()
        _, run_pages, requests = span_runs(first, last, max_request)
        assert r.stats.pages == len(pages) == run_pages.sum() and r.stats.requests == requests.sum()
        assert r.stats.bytes_read == len(pages) * PAGE
