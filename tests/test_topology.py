"""Neighbour-cache scores and selection against brute force on a hand-checkable store."""
import numpy as np
import pytest

from oocgnn.datasets import GraphData, csr_from_edges
from oocgnn.storewrite import write_store
from oocgnn.topology import cross_partition_degree, ginex_score, neighbour_cache, neighbour_scores


@pytest.fixture(scope="module")
def directed(tmp_path_factory):
    """A random directed graph (not symmetrised), 3 uneven parts: out- and in-degrees differ."""
    rng = np.random.default_rng(3)
    n = 60
    indptr, indices = csr_from_edges(rng.integers(0, n, 200), rng.integers(0, n, 200), n, symmetrize=False)
    data = GraphData("g", indptr, indices, rng.standard_normal((n, 4)).astype(np.float32),
                     rng.integers(0, 2, n), np.arange(20), np.arange(20, 30), np.arange(30, 40))
    return write_store(data, tmp_path_factory.mktemp("topo") / "g", part_offsets=[0, 17, 41, 60], progress=False)


def _lists(store):
    return [store.indices[store.indptr[v]:store.indptr[v + 1]].tolist() for v in range(store.num_nodes)]


def test_scores_match_brute_force(directed):
    lists, n = _lists(directed), directed.num_nodes
    part = [next(k for k in range(directed.num_parts) if directed.part_offsets[k] <= v < directed.part_offsets[k + 1])
            for v in range(n)]
    cross = [sum(part[u] != part[v] for u in lists[v]) for v in range(n)]
    np.testing.assert_array_equal(cross_partition_degree(directed), cross)
    indeg = [sum(lst.count(v) for lst in lists) for v in range(n)]
    np.testing.assert_allclose(ginex_score(directed), [len(lists[v]) / max(indeg[v], 1) for v in range(n)])
    assert not np.allclose(ginex_score(directed), ginex_score(directed).round()), "directed: not all 0/1"
    scores = neighbour_scores(directed, seed=1)
    assert set(scores) == {"degree", "ginex out/in", "outre cross-part", "random"}
    np.testing.assert_array_equal(scores["random"], neighbour_scores(directed, seed=1)["random"])


@pytest.mark.parametrize("budget", [0, 4, 37, 100, 10_000])
def test_neighbour_cache_is_the_longest_fitting_prefix(directed, budget):
    score = cross_partition_degree(directed)
    ids = neighbour_cache(directed, score, budget)
    isz, deg = np.dtype(directed.meta["index_dtype"]).itemsize, directed.degrees()
    order = sorted(range(directed.num_nodes), key=lambda v: (-score[v], v))
    want, used = [], 0
    for v in order:
        if used + deg[v] * isz > budget:
            break
        want.append(v)
        used += deg[v] * isz
    assert ids.tolist() == want
