"""The simulator against brute force: page counts, residency, loads, and per-epoch summaries."""
import numpy as np
import pytest

from oocgnn.datasets import GraphData, csr_from_edges
from oocgnn.io import PAGE
from oocgnn.sampler import Sampler
from oocgnn.schedules import make_schedule
from oocgnn.simulate import page_union, read_totals, simulate, summarize
from oocgnn.storewrite import write_store

FAN = [4, 3]


def _store(path, n=600, d=20, parts=9, seed=0):
    """A random graph in a random store order, `parts` uneven parts; d=20 -> 80 B rows at stride 128."""
    rng = np.random.default_rng(seed)
    indptr, indices = csr_from_edges(rng.integers(0, n, 3 * n), rng.integers(0, n, 3 * n), n)
    ids = rng.permutation(n)
    data = GraphData("g", indptr, indices, rng.standard_normal((n, d)).astype(np.float32),
                     rng.integers(0, 3, n), np.sort(ids[:150]), ids[150:200], ids[200:260])
    cuts = np.arange(1, parts) * n // parts + rng.integers(-20, 20, parts - 1)   # uneven, none tiny
    return write_store(data, path, order=rng.permutation(n), progress=False,
                       part_offsets=np.concatenate([[0], cuts, [n]]))


@pytest.fixture(scope="module", params=[20, 1100], ids=["stride128", "stride8192"])
def store(request, tmp_path_factory):
    return _store(tmp_path_factory.mktemp("sim") / "s", d=request.param)


def _pages_brute(store, rows):
    pages = set()
    for r in rows:
        a = int(r) * store.row_stride
        pages.update(range(a // PAGE, (a + store.row_bytes - 1) // PAGE + 1))
    return len(pages)


def _adj_page_set(store, nodes):
    isz, pages = np.dtype(store.meta["index_dtype"]).itemsize, set()
    for v in nodes:
        a, b = int(store.indptr[v]) * isz, int(store.indptr[v + 1]) * isz
        if b > a:
            pages.update(range(a // PAGE, (b - 1) // PAGE + 1))
    return pages


def _adj_pages_brute(store, nodes):
    return len(_adj_page_set(store, nodes))


def _adj_requests_brute(store, nodes):
    """One request per run of consecutive pages, split every 128 KiB (32 pages) from the run's start."""
    pages, requests, run = sorted(_adj_page_set(store, nodes)), 0, 0
    for i, p in enumerate(pages):
        run = run + 1 if i and p == pages[i - 1] + 1 else 1
        requests += (run - 1) % 32 == 0
    return requests


def test_page_union_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(50):
        first = np.sort(rng.integers(0, 40, rng.integers(0, 12)))
        last = first + rng.integers(0, 4, len(first))
        covered = set().union(*[set(range(a, b + 1)) for a, b in zip(first, last)]) if len(first) else set()
        runs = sum(1 for p in covered if p - 1 not in covered)
        assert page_union(first, last) == (len(covered), runs)


def _residents(store, schedule, epoch=0):
    """Per step: (feature-resident mask, adjacency-resident mask), replayed independently."""
    n = store.num_nodes
    rng_mask, ids_mask, out = np.zeros(n, bool), np.zeros(n, bool), []
    setup = schedule.setup()
    if setup is not None:
        ids_mask[setup.enter_ids] = True
    for s in schedule.epoch(epoch):
        for lo, hi in s.leave_ranges:
            rng_mask[lo:hi] = False
        for lo, hi in s.enter_ranges:
            rng_mask[lo:hi] = True
        ids_mask[s.enter_ids] = True
        res = rng_mask | ids_mask
        out.append((s, res if "features" in s.data else np.zeros(n, bool),
                    res if "adjacency" in s.data else np.zeros(n, bool)))
    return out


@pytest.mark.parametrize("name,kw", [("random", {}), ("partition", {"n_per_macro": 2}),
                                     ("megabatch", {"parts_per_megabatch": 3, "static_ratio": 0.05})])
def test_batch_counts_match_brute_force(store, name, kw):
    sch = make_schedule(name, store, batch_size=40, seed=1, **kw)
    df = simulate(store, sch, FAN, seed=5, progress=False)
    steps = _residents(store, sch)
    assert len(df) == len(steps)
    for (s, feat, adj), row in zip(steps, df.itertuples()):
        inp, out, blocks = Sampler(store.neighbour_lists(), FAN, 5).sample(s.seeds, 0, row.batch, s.visible)
        exp = blocks[0].dst_nodes
        assert row.seeds == len(s.seeds) == row.unique_l0
        assert row.input_nodes == row.feature_rows_needed == len(set(inp.tolist())) == row.unique_l2
        assert row.unique_l1 == len(set(blocks[1].src_nodes.tolist()))
        miss = [v for v in inp if not feat[v]]
        assert row.feature_rows_read == len(miss)
        assert row.feature_pages_read == _pages_brute(store, miss)
        lists = [v for v in exp if not adj[v] and store.indptr[v + 1] > store.indptr[v]]
        assert row.neighbour_lists_needed == len(exp)
        assert row.neighbour_lists_read == len(lists)
        pages = requests = 0                      # the sampler reads each layer's new lists in one call
        for i in range(len(blocks) - 1, -1, -1):
            known = blocks[i + 1].num_dst if i + 1 < len(blocks) else 0
            new = [v for v in blocks[i].dst_nodes[known:] if v in set(lists)]
            pages, requests = pages + _adj_pages_brute(store, new), requests + _adj_requests_brute(store, new)
        assert row.neighbour_pages_read == pages and row.neighbour_requests == requests


def test_megabatch_reads_each_part_once_per_epoch(store):
    sch = make_schedule("megabatch", store, batch_size=40, parts_per_megabatch=2, static_ratio=0.05,
                        passes=2, seed=2)
    df = simulate(store, sch, FAN, epochs=2, progress=False)
    n, static = store.num_nodes, sch.static_ids
    assert (df[["feature_rows_read", "neighbour_lists_read", "feature_pages_read"]] == 0).all().all()
    isz = np.dtype(store.meta["index_dtype"]).itemsize
    assert np.all(np.diff(np.searchsorted(store.train_idx, store.part_offsets)) > 0), "every part trains"
    for epoch in (0, 1):
        e = df[df.epoch == epoch]
        loaded, pages, adj_pages, group = np.zeros(n, int), 0, 0, None
        for s, row in zip(sch.epoch(epoch), e.itertuples()):
            for lo, hi in s.enter_ranges:
                loaded[lo:hi] += 1
                pages += _pages_brute(store, range(lo, hi))
                a, b = store.indptr[lo] * isz, store.indptr[hi] * isz
                adj_pages += (b - 1) // PAGE - a // PAGE + 1 if b > a else 0
            if s.enter_ranges:
                group = np.concatenate([np.arange(lo, hi) for lo, hi in s.enter_ranges])
            assert row.resident_feature_rows == row.resident_adjacency_nodes == len(np.union1d(group, static))
        assert (loaded == 1).all(), "each partition's rows are loaded exactly once per epoch"
        assert e.load_feature_rows.sum() == n and e.load_edges.sum() == store.num_edges
        assert e.load_feature_pages.sum() == pages and e.load_adjacency_pages.sum() == adj_pages
        assert e.load_bytes.sum() == (e.load_feature_pages.sum() + e.load_adjacency_pages.sum()) * PAGE
    setup = df.attrs["setup"]                    # the static cache is loaded once per run, before it
    assert setup["load_feature_rows"] == len(static)
    assert setup["load_edges"] == store.degrees()[static].sum()
    assert setup["load_feature_pages"] == _pages_brute(store, static)
    assert setup["load_adjacency_pages"] == _adj_pages_brute(store, static)


def test_partition_loads_adjacency_only(store):
    df = simulate(store, "partition", FAN, epochs=2, batch_size=40, n_per_macro=2, progress=False)
    for _, e in df.groupby("epoch"):
        assert e.load_feature_rows.sum() == 0 and (e.feature_rows_read == e.input_nodes).all()
        assert e.load_edges.sum() <= store.num_edges
        assert (e.neighbour_lists_read < e.neighbour_lists_needed).any()
    assert (df.resident_feature_rows == 0).all()


def test_random_reads_everything_and_caches_help(store):
    df = simulate(store, "random", FAN, batch_size=40, progress=False)
    assert (df.load_pages == 0).all() and (df.feature_rows_read == df.input_nodes).all()
    full = simulate(store, "random", FAN, batch_size=40, progress=False,
                    feature_cache=np.ones(store.num_nodes, bool), neighbour_cache=np.arange(store.num_nodes))
    assert (full.feature_rows_read == 0).all() and (full.neighbour_lists_read == 0).all()
    np.testing.assert_array_equal(full.input_nodes, df.input_nodes)   # caches change misses, not demand
    again = simulate(store, "random", FAN, batch_size=40, progress=False)
    assert df.equals(again), "deterministic"


def test_read_totals_are_the_frames_sums(store):
    """A plan's residency changes and its batches' reads, in rows, MiB and requests."""
    from oocgnn.config import TrainConfig
    from oocgnn.policies import make_plan
    cfg = TrainConfig.create(store=str(store.path), policy="hierbatching", batch_size=40, fanouts="5,5",
                             parts_per_megabatch=3, memory_budget=str(2 * store.num_nodes * store.row_stride),
                             progress=False)
    df = simulate(store, make_plan(store, cfg), epochs=2, progress=False)
    t, s = read_totals(df), summarize(df).sum()
    assert df["load_feature_pages"].sum() > 0 and t["input_rows"] == s["input_nodes"]
    assert t["rows_read"] == s["feature_rows_read"] + s["load_feature_rows"]
    assert t["feature_MiB"] * 2**20 == (s["feature_pages_read"] + s["load_feature_pages"]) * 4096
    assert t["requests"] == s["feature_requests"] + s["load_feature_requests"]
    assert t["list_MiB"] * 2**20 == (s["neighbour_pages_read"] + s["load_adjacency_pages"]) * 4096
    assert t["visible_nodes"] == df["visible_nodes"].mean() < store.num_nodes


def test_summarize(store):
    df = simulate(store, "partition", FAN, epochs=2, batch_size=40, n_per_macro=2, progress=False)
    s = summarize(df)
    assert list(s.epoch) == [0, 1] and s.batches.sum() == len(df)
    for epoch, e in df.groupby("epoch"):
        row = s[s.epoch == epoch].iloc[0]
        assert row.seeds == len(store.train_idx) == e.seeds.sum()
        assert row.rr == pytest.approx(e.input_nodes.sum() / e.seeds.sum())
        assert row.disk_pages == (e.feature_pages_read.sum() + e.neighbour_pages_read.sum()
                                  + e.load_pages.sum())
        assert row.groups == e.group.nunique()


@pytest.mark.parametrize("name, kw", [("random", {}), ("partition", {"n_per_macro": 2})])
def test_steps_is_a_prefix(store, name, kw):
    """`steps` stops where a run cut by max_steps stops: the same first rows, nothing after."""
    full = simulate(store, name, FAN, epochs=2, batch_size=40, progress=False, **kw)
    for k in (1, 5, len(full) - 1):
        cut = simulate(store, name, FAN, epochs=2, batch_size=40, progress=False, steps=k, **kw)
        assert len(cut) == k
        assert cut.reset_index(drop=True).equals(full.head(k).reset_index(drop=True))
