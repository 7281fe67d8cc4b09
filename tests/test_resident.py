"""The executed cache stage against its oracles: the replay of the same policy (hits, reads, prefetch)
and the rows of the source (values)."""
import numpy as np
import pytest
import torch

from oocgnn.cache import CACHE_POLICIES, make_cache, replay
from oocgnn.errors import UserError
from oocgnn.readers import MemoryReader
from oocgnn.resident import CachedReader, PolicyCache
from oocgnn.trace import synthetic_trace

N, D = 3000, 8


def _kw(name, trace):
    rng = np.random.default_rng(1)
    if name == "static-degree":
        return {"degrees": trace.counts() * rng.uniform(0.5, 1.5, N)}
    if name == "static-frequency":
        return {"counts": trace.slice(0, len(trace) // 2).counts()}
    return {}


ROW_POLICIES = [(n, {}) for n, c in CACHE_POLICIES.items() if c.unit == "row"] + \
    [("belady", {"horizon": 7}), ("belady", {"horizon": 7, "prefetch": False})]


@pytest.mark.parametrize("name, extra", ROW_POLICIES, ids=lambda x: str(x))
def test_executed_cache_equals_its_replay(name, extra):
    """A CachedReader driven by a policy hits, reads and prefetches exactly what its replay counts,
    and returns the source's rows."""
    trace = synthetic_trace(N, 30, 200, alpha=0.8, seed=2)
    source = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32)
    capacity = 400
    want = replay(trace, make_cache(name, capacity, N, **_kw(name, trace), **extra))
    cached = CachedReader(MemoryReader.from_array(source), N, capacity)
    stage = PolicyCache(cached, make_cache(name, capacity, N, **_kw(name, trace), **extra), trace)
    rng = np.random.default_rng(3)
    for i in range(len(trace)):
        ids = rng.permutation(trace[i]).astype(np.int64)          # a batch's order, not the trace's
        before = cached.stats.unique_rows
        x = stage.gather(ids)
        torch.testing.assert_close(x, torch.from_numpy(source[ids]))
        assert cached.stats.unique_rows - before >= len(ids) - np.count_nonzero(cached.slot[ids] >= 0) - len(ids)
        assert np.count_nonzero(cached.slot >= 0) <= capacity
    assert stage.hits == want.hits
    assert stage.prefetched_rows == want.init_rows
    assert cached.stats.unique_rows == want.misses + want.init_rows, "misses and prefetches, nothing else"


def test_page_policies_cannot_drive_a_row_cache():
    trace = synthetic_trace(N, 3, 50, seed=1)
    cached = CachedReader(MemoryReader.from_array(np.zeros((N, D), np.float32)), N, 10)
    with pytest.raises(UserError, match="caches pages"):
        PolicyCache(cached, make_cache("page-lru", 10, N), trace).gather(trace[0].astype(np.int64))


def test_cached_reader_is_a_reader():
    """Resident rows from RAM, the rest through the fallback, whose stats are the reader's."""
    source = np.arange(N * D, dtype=np.float32).reshape(N, D)
    cached = CachedReader(MemoryReader.from_array(source), N, 5)
    cached.place(np.array([7, 3]), 0, source[[7, 3]] + 1000)      # resident copies, marked
    out = cached.read_rows([3, 9, 7, 9])
    np.testing.assert_array_equal(out, np.stack([source[3] + 1000, source[9], source[7] + 1000, source[9]]))
    assert (cached.stats.calls, cached.stats.unique_rows) == (1, 1)
    cached.drop([3])
    np.testing.assert_array_equal(cached.read_rows([3]), source[[3]])
    assert cached.nbytes == 5 * D * 4 + N * 4


@pytest.mark.parametrize("dim", [3, 256, 1500])          # rows of 16 B, 1 KiB, and over a page
def test_make_reads_in_pieces_the_pages_and_requests_of_one_read(tmp_path, dim):
    """A cache made in pieces of a few rows (cut where a request starts) reads the same pages and requests
    as in one coalesced read, and holds the same rows."""
    from oocgnn.direct import DirectReader
    from oocgnn.io import feature_row_stride
    n = 3000
    data = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    stride = feature_row_stride(dim * 4)
    padded = np.zeros((n, stride // 4), np.float32)
    padded[:, :dim] = data
    padded.tofile(tmp_path / "f.bin")
    ids = np.unique(np.random.default_rng(1).choice(n, 1200))
    ids = np.concatenate([ids, np.arange(100, 180)]) if dim == 3 else ids   # a long adjacent run too
    ids = np.unique(ids)
    stats = []
    for chunk in (1 << 40, 5 * stride):
        with DirectReader(tmp_path / "f.bin", n, dim, row_stride=stride, max_request=16 << 10) as reader:
            cached = CachedReader(reader, n, len(ids))
            assert cached.make(ids, chunk_bytes=chunk) == len(ids)
            assert np.array_equal(cached.gather(ids).numpy(), data[ids])
            stats.append((reader.stats.pages, reader.stats.requests, reader.stats.calls))
    (pages, requests, calls), (pages2, requests2, calls2) = stats
    assert (pages, requests) == (pages2, requests2) and calls == 1 < calls2


@pytest.mark.parametrize("piece", [4 << 20, 3 * 4 * 16])
def test_partial_gather_places_hits_and_misses_in_pieces(tmp_path, monkeypatch, piece):
    """Hits copied a few rows at a time and misses placed by the reader itself: the rows and the reads of
    one plain read of the misses, into a given buffer too."""
    from oocgnn import resident
    from oocgnn.direct import DirectReader
    from oocgnn.io import feature_row_stride
    monkeypatch.setattr(resident, "GATHER_PIECE", piece)
    n, dim = 2000, 16
    data = np.random.default_rng(0).standard_normal((n, dim)).astype(np.float32)
    padded = np.zeros((n, feature_row_stride(dim * 4) // 4), np.float32)
    padded[:, :dim] = data
    padded.tofile(tmp_path / "f.bin")
    held = np.arange(0, n, 3)
    ids = np.random.default_rng(1).integers(0, n, 700)
    with DirectReader(tmp_path / "f.bin", n, dim, row_stride=padded.shape[1] * 4) as reader:
        cached = CachedReader(reader, n, len(held))
        cached.make(held)
        before = reader.stats.pages, reader.stats.requests
        out = torch.full((len(ids), dim), -1.0)
        assert cached.gather(ids, out=out) is out and np.array_equal(out.numpy(), data[ids])
        got = reader.stats.pages - before[0], reader.stats.requests - before[1]
    with DirectReader(tmp_path / "f.bin", n, dim, row_stride=padded.shape[1] * 4) as plain:
        plain.read_rows(ids[~np.isin(ids, held)])
        assert got == (plain.stats.pages, plain.stats.requests)
