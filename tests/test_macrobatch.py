"""Macrobatching (BatchGNN §2.1) is a pure I/O transformation: sampling k batches ahead leaves
every sampled subgraph as it is at k = 1; only the fetch set changes (one union per k batches)."""
import numpy as np
import pytest

from oocgnn.cache import make_cache
from oocgnn.macrobatch import macrobatch_fetch
from oocgnn.sampler import Sampler
from oocgnn.schedules import make_schedule
from oocgnn.simulate import simulate
from oocgnn.trace import record_trace

FAN = [4, 3]
SCHEDULES = {"random": {"batch_size": 64}, "partition": {"batch_size": 64, "n_per_macro": 3},
             "megabatch": {"batch_size": 64, "parts_per_megabatch": 4, "static_ratio": 0.01}}


def _subgraph(blocks):
    """Everything a batch trains on: per block the global src/dst ids and the local edges."""
    return [(b.src_nodes, b.dst_nodes, *b.edges()) for b in blocks]


def _macrobatches(store, name, k, seed, epochs):
    """Sample k batches ahead (the macrobatch sampler), last one first and with an unrelated batch
    sampled between, then fetch the union of their inputs once: ([subgraph per batch], [union per k])."""
    steps = [(e, b, st) for e in range(epochs)
             for b, st in enumerate(make_schedule(name, store, seed=seed, **SCHEDULES[name]).epoch(e))]
    subgraphs, unions = [None] * len(steps), []
    for lo in range(0, len(steps), k):
        group = list(range(lo, min(len(steps), lo + k)))
        for i in reversed(group):
            e, b, st = steps[i]
            subgraphs[i] = _subgraph(Sampler(store.neighbour_lists(), FAN, seed).sample(st.seeds, e, b,
                                                                                      st.visible).blocks)
            Sampler(store.neighbour_lists(), [2], 77).sample(steps[0][2].seeds)   # an unrelated batch between
        unions.append(np.unique(np.concatenate([subgraphs[i][0][0] for i in group])))
    return subgraphs, unions


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_macrobatch_changes_the_fetch_not_the_subgraphs(parted, tmp_path, name):
    seed, epochs = 3, 2
    trace = record_trace(parted, name, FAN, epochs=epochs, seed=seed, cache_dir=tmp_path, **SCHEDULES[name])
    t = len(trace)
    ref, _ = _macrobatches(parted, name, 1, seed, epochs)
    for k in (1, 3, t):
        subgraphs, unions = _macrobatches(parted, name, k, seed, epochs)
        for a, b in zip(subgraphs, ref, strict=True):               # identical to k = 1, block by block
            for x, y in zip(a, b, strict=True):
                assert all(np.array_equal(u, v) for u, v in zip(x, y, strict=True))
        mb = trace.coarsen(k)                                        # the fetch set: a union per k batches
        assert len(mb) == len(unions) == -(-t // k)
        assert all(np.array_equal(mb[j], u) for j, u in enumerate(unions))
    df = simulate(parted, name, FAN, epochs=epochs, seed=seed, progress=False, **SCHEDULES[name])
    fetch = macrobatch_fetch(trace, [1, 3, t]).set_index("k")
    assert fetch.loc[1, "fetched_rows"] == df["feature_rows_needed"].sum() == trace.accesses
    assert fetch.loc[1, "fetched_pages"] == trace.pages().sum()
    assert fetch.loc[t, "fetched_rows"] == len(np.unique(np.concatenate([s[0][0] for s in ref])))
    assert fetch.loc[t, "macrobatches"] == 1 and fetch.loc[t, "max_union_rows"] == fetch.loc[t, "fetched_rows"]
    assert fetch["fetched_rows"].is_monotonic_decreasing and fetch["rows_vs_k1"].iloc[0] == 1
    # a cache behind the fetch reads no more than the fetch alone; an unbounded one reads the union once
    n = parted.num_nodes
    for k in (1, 3):
        cached = macrobatch_fetch(trace, [k], make_cache("lru", n // 10, n))
        assert cached["fetched_rows"].item() <= fetch.loc[k, "fetched_rows"]
        assert macrobatch_fetch(trace, [k], make_cache("lru", n, n))["fetched_rows"].item() == fetch.loc[t, "fetched_rows"]
