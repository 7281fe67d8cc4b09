"""The bounded-memory CSR builder against the in-memory one (the oracle), and its memory bound."""
import tracemalloc

import numpy as np
import pytest

from oocgnn.csrbuild import CSRBuilder
from oocgnn.datasets import csr_from_edges
from oocgnn.errors import UserError


def _edges(n, e, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[: e // 50] = dst[: e // 50]                          # self-loops
    src[e // 50: e // 10], dst[e // 50: e // 10] = dst[: e // 10 - e // 50], src[: e // 10 - e // 50]  # reverses
    hub = rng.integers(0, n)
    src[-e // 20:] = hub                                      # one hub: a list longer than a merge step
    return src, dst


def _build(src, dst, n, tmp_path, memory, chunk, symmetrize=True):
    b = CSRBuilder(n, tmp_path, memory, symmetrize=symmetrize)
    for lo in range(0, len(src), chunk):
        b.add(src[lo:lo + chunk], dst[lo:lo + chunk])
    b.add(src[:0], dst[:0])                                   # an empty chunk is nothing
    return b, *b.finish(tmp_path / "indices.bin")


@pytest.mark.parametrize("memory", [4 << 10, 64 << 10, 1 << 20, 1 << 30])
@pytest.mark.parametrize("symmetrize", [True, False])
def test_equals_the_in_memory_csr_byte_for_byte(tmp_path, memory, symmetrize):
    n, e = 3000, 60_000
    src, dst = _edges(n, e)
    b, indptr, indices = _build(src, dst, n, tmp_path, memory, 7_777, symmetrize)
    ref_indptr, ref_indices = csr_from_edges(src, dst, n, symmetrize=symmetrize)
    assert indptr.dtype == ref_indptr.dtype and np.array_equal(indptr, ref_indptr)
    assert indices.dtype == ref_indices.dtype and np.array_equal(np.asarray(indices), ref_indices)
    assert (tmp_path / "indices.bin").read_bytes() == ref_indices.tobytes()
    if memory < 1 << 20:
        assert len(b.runs) > 1                                # the small budgets did spill to runs
    assert not b.dir.exists(), "the runs are removed"


def test_holds_about_its_memory_whatever_the_edge_list(tmp_path):
    """An edge list of 16 MiB of keys (2 x 1M int64) through a 1 MiB budget: peak allocations (NumPy's,
    traced) stay within 1.2 x the budget plus 32 bytes a node."""
    n, e = 20_000, 1_000_000
    src, dst = _edges(n, e, seed=1)
    memory = 1 << 20
    tracemalloc.start()
    try:
        b = CSRBuilder(n, tmp_path, memory)
        for lo in range(0, e, 250_000):
            b.add(src[lo:lo + 250_000], dst[lo:lo + 250_000])
        indptr, indices = b.finish(tmp_path / "indices.bin")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 1.2 * memory + 32 * n, (peak, memory)
    assert np.array_equal(np.asarray(indices), csr_from_edges(src, dst, n)[1])


def test_empty_and_all_self_loops(tmp_path):
    for src, dst in (([], []), ([3, 3, 1], [3, 3, 1])):
        b, indptr, indices = _build(np.array(src, np.int64), np.array(dst, np.int64), 5, tmp_path, 4096, 2)
        assert np.array_equal(indptr, np.zeros(6, np.int64)) and len(indices) == 0


def test_bad_edges_are_refused(tmp_path):
    b = CSRBuilder(4, tmp_path, 4096)
    with pytest.raises(UserError, match="outside 0..3"):
        b.add([0, 1], [2, 4])
    with pytest.raises(UserError, match="2 sources but 1 destinations"):
        b.add([0, 1], [2])
    with pytest.raises(UserError, match="too small"):
        CSRBuilder(4, tmp_path, 10)
    b.close()
    assert not b.dir.exists()


def test_sort_memory_leaves_the_per_node_arrays_theirs():
    """--prepare-memory holds the per-node arrays first; a budget they do not fit is refused with the
    smallest that works, and a prepare of a synthetic preset is refused before any graph is made."""
    from oocgnn.csrbuild import NODE_BYTES, sort_memory
    assert sort_memory(NODE_BYTES * 1000 + 4096, 1000) == 4096
    with pytest.raises(UserError, match=r"too small for 1,000,000 nodes.*give at least"):
        sort_memory(100 << 20, 1_000_000)


def test_the_merge_releases_each_run_as_it_reads_it(tmp_path, monkeypatch):
    """A run's file pages leave the resident set as soon as that run is read in a merge step (a map's
    read-ahead made 30 runs hold 0.3 GB of pages until released together): release_pages follows every
    run's search and every run's slice."""
    import oocgnn.csrbuild as cb
    calls = []
    monkeypatch.setattr(cb, "release_pages", lambda run: calls.append(id(run)))
    rng = np.random.default_rng(0)
    b = CSRBuilder(500, tmp_path, 4096)
    b.add(rng.integers(0, 500, 3000), rng.integers(0, 500, 3000))
    runs = len(b.runs)
    steps = []
    b.finish(tmp_path / "ind.bin", progress=steps.append)
    assert runs > 3 and len(calls) == 2 * runs * len(steps)
