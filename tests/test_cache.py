"""Cache policies: one contract for all, brute-force oracles, Belady's optimality, Ginex's changesets."""
from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from oocgnn.belady import belady_changesets, belady_naive, changeset_hits
from oocgnn.cache import CACHE_POLICIES, capacity_from_budget, make_cache, replay
from oocgnn.macrobatch import macrobatch_fetch
from oocgnn.errors import UserError
from oocgnn.io import PAGE
from oocgnn.trace import Trace, synthetic_trace

N = 40
ONLINE = ("lru", "fifo", "clock", "s3fifo", "sieve", "random", "static-degree", "static-frequency")
VARIANTS = [("static-degree", {}), ("static-degree", {"fill": "lazy"}), ("static-frequency", {}),
            ("lru", {}), ("fifo", {}), ("clock", {}), ("s3fifo", {}), ("sieve", {}), ("random", {"seed": 3}),
            ("belady", {}), ("belady", {"prefetch": False}), ("belady", {"horizon": 4}),
            ("belady", {"horizon": 3, "prefetch": False}), ("page-lru", {})]
HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_trace(seed, n=N, t=25, hi=14, stride=512, rbytes=None):
    rng = np.random.default_rng(seed)
    hot = rng.permutation(n)[: n // 4]                     # some skew, so caches matter
    batches = [np.concatenate([rng.integers(0, n, rng.integers(0, hi)), rng.choice(hot, rng.integers(0, hi))])
               for _ in range(t)]
    return Trace.from_batches(batches, n, row_stride=stride, row_bytes=rbytes)


def policy(name, cap, trace, **kw):
    if name == "static-degree":
        kw.setdefault("degrees", np.random.default_rng(0).integers(0, 20, trace.num_nodes))
    if name == "static-frequency":
        kw.setdefault("counts", trace.counts())
    return CACHE_POLICIES[name](cap, trace.num_nodes, **kw)


def pages_of(rows, stride, rbytes):
    return {p for v in rows for p in range(v * stride // PAGE, (v * stride + rbytes - 1) // PAGE + 1)}


@pytest.mark.parametrize("cap", [0, 1, 6, 25])
@pytest.mark.parametrize("name,kw", VARIANTS, ids=[f"{n}{kw or ''}" for n, kw in VARIANTS])
def test_contract(name, kw, cap):
    """Stepping one iteration at a time: hits_i = |ids_i ∩ C_i|, C_{i+1} ⊆ C_i ∪ ids_i (∪ a reported
    prefetch), |C| ≤ capacity, missed pages exact; the same totals as one replay, twice."""
    for stride, rbytes in ((512, 512), (8192, 5000)):
        tr = random_trace(cap, stride=stride, rbytes=rbytes)
        p = policy(name, cap, tr, **kw)
        paged = p.unit == "page"
        p.begin(tr)
        cache = set()
        for i, ids in enumerate(tr.iterations()):
            hits, pages, irows, ipages = p.run(i, i + 1)
            if p.prefetch_at == i:                       # prefetched before iteration i: rows not held are read
                held, cache = cache, set(p.prefetched.tolist())
                new = cache - held
                assert irows[0] == len(new) and len(cache) <= cap and ipages[0] == len(pages_of(new, stride, rbytes))
            else:
                assert irows[0] == ipages[0] == 0
            if paged:
                resident = [pages_of([v], stride, rbytes) <= cache for v in ids]
                assert hits[0] == sum(resident)
                assert pages[0] == len(pages_of(ids, stride, rbytes) - cache)
                allowed = cache | pages_of(ids, stride, rbytes)
            else:
                assert hits[0] == len(cache & set(ids.tolist()))
                assert pages[0] == len(pages_of(set(ids.tolist()) - cache, stride, rbytes))
                allowed = cache | set(ids.tolist())
            new = set(p.contents().tolist())
            assert new <= allowed and len(new) <= cap
            cache = new
        r1, r2 = replay(tr, policy(name, cap, tr, **kw), per_iteration=True), replay(tr, p, per_iteration=True)
        assert r1.hits + r1.misses == r1.accesses == tr.accesses
        assert r1.as_dict() | {"seconds": 0} == r2.as_dict() | {"seconds": 0}
        assert r1.per_iteration.equals(r2.per_iteration)
        assert r1.per_iteration.hits.sum() == r1.hits and r1.per_iteration.pages_read.sum() == r1.pages_read
        assert r1.bytes_read == r1.pages_read * PAGE and r1.bytes_requested == r1.misses * tr.row_bytes


def _lru_oracle(trace, cap, move=True, paged=False):
    """OrderedDict LRU/FIFO at iteration granularity (ids touched in id order, evict after)."""
    od, hits, pages = OrderedDict(), [], []
    for ids in trace.iterations():
        before = set(od)
        keys = [sorted(pages_of([v], trace.row_stride, trace.row_bytes)) if paged else [v] for v in ids]
        hits.append(sum(all(k in before for k in ks) for ks in keys))
        pages.append(len({k for ks in keys for k in ks} - before))
        for k in (k for ks in keys for k in ks):
            if k not in od:
                od[k] = True
            elif move:
                od.move_to_end(k)
        while len(od) > cap:
            od.popitem(last=False)
    return np.array(hits), pages


@pytest.mark.parametrize("stride,rbytes", [(512, 512), (1024, 700), (8192, 8192)])
@pytest.mark.parametrize("cap", [0, 1, 3, 8])
def test_lru_fifo_page_lru_match_ordered_dict(cap, stride, rbytes):
    tr = random_trace(10 + cap, n=120, t=30, stride=stride, rbytes=rbytes)
    for name, move, paged in (("lru", True, False), ("fifo", False, False), ("page-lru", True, True)):
        want_hits, want_pages = _lru_oracle(tr, cap, move, paged)
        r = replay(tr, CACHE_POLICIES[name](cap, tr.num_nodes), per_iteration=True)
        assert np.array_equal(r.per_iteration.hits, want_hits), name
        if paged:
            assert np.array_equal(r.per_iteration.pages_read, want_pages)


def _sieve_oracle(trace, cap):
    """SIEVE as in Zhang et al. NSDI'24, Fig. 3, on a list (queue[0]: the tail, the oldest) at iteration
    granularity: hits against C_i set visited bits, then the misses enter in id order."""
    queue, visited, hand, hits = [], {}, None, []          # hand: an object, None = start at the tail
    for ids in trace.iterations():
        missed = [v for v in ids.tolist() if v not in visited]
        hits.append(len(ids) - len(missed))
        for v in ids.tolist():
            if v in visited:
                visited[v] = True
        for v in missed if cap > 0 else []:
            if len(queue) == cap:
                j = 0 if hand is None else queue.index(hand)
                while visited[queue[j]]:
                    visited[queue[j]] = False
                    j = (j + 1) % len(queue)
                hand = queue[j + 1] if j + 1 < len(queue) else None
                del visited[queue.pop(j)]
            queue.append(v)
            visited[v] = False
    return np.array(hits, np.int64), sorted(queue)


@pytest.mark.parametrize("cap", [0, 1, 2, 5, 13, 40, 200])
def test_sieve_matches_reference(cap):
    """Per-iteration hits and the final contents equal the paper's SIEVE, on skewed random traces and
    Zipf-like ones; capacities from 0 to past every distinct id (then each row misses once)."""
    traces = [random_trace(20 + s, n=120, t=40, hi=20) for s in range(3)]
    traces += [synthetic_trace(150, 40, size, alpha, seed) for size, alpha, seed in ((8, 0.8, 1), (30, 1.2, 2))]
    for tr in traces:
        want_hits, want_contents = _sieve_oracle(tr, cap)
        p = CACHE_POLICIES["sieve"](cap, tr.num_nodes)
        r = replay(tr, p, per_iteration=True)
        assert np.array_equal(r.per_iteration.hits, want_hits)
        assert p.contents().tolist() == want_contents
        if cap >= len(np.unique(tr.ids)):
            assert r.misses == len(np.unique(tr.ids))


def test_sieve_demotes_new_rows_before_the_survivors_behind_its_hand():
    """Capacity 3, one id per iteration. 4 is visited; 1's miss clears it and evicts 0, the hand stays on 2;
    3, 2, 1 then evict 2, 1, 3, the newer rows ahead of the hand, so only 4's access hits (CLOCK hits 2)."""
    tr = Trace.from_batches([[v] for v in (4, 0, 4, 2, 1, 3, 2, 1)], 5)
    p = CACHE_POLICIES["sieve"](3, 5)
    r = replay(tr, p, per_iteration=True)
    assert r.per_iteration.hits.tolist() == [0, 0, 1, 0, 0, 0, 0, 0] and p.contents().tolist() == [1, 2, 4]
    assert replay(tr, CACHE_POLICIES["clock"](3, 5)).hits == 2


def test_page_lru_budget_is_pages_and_counts_whole_pages():
    tr = random_trace(5, n=400, t=30)
    p = CACHE_POLICIES["page-lru"].from_budget(10 * PAGE + 100, 512, tr.num_nodes)
    assert p.capacity == 10
    big = replay(tr, CACHE_POLICIES["page-lru"](1 << 20, tr.num_nodes))
    assert big.pages_read == len(pages_of(np.unique(tr.ids), 512, 512))   # each page read once


def test_budget_arithmetic_counts_the_address_table():
    n, row = 1_000_000, 512
    assert capacity_from_budget(256 << 20, row, n) == ((256 << 20) - 4 * n) // row
    assert capacity_from_budget(256 << 20, row, n, table_bytes=8) == ((256 << 20) - 8 * n) // row
    assert capacity_from_budget(3 * n, row, n) == 0                        # the table alone does not fit
    for name in ONLINE + ("belady",):
        kw = {"degrees": np.ones(n)} if name == "static-degree" else {"counts": np.ones(n)} if name == "static-frequency" else {}
        p = CACHE_POLICIES[name].from_budget(64 << 20, row, n, **kw)
        assert p.capacity == ((64 << 20) - 4 * n) // row
    with pytest.raises(UserError):
        make_cache("nope", 3, n)
    with pytest.raises(UserError):
        make_cache("static-degree", 3, n)                                 # degrees= missing
    with pytest.raises(UserError):
        make_cache("belady", 3, n, horizon=0)


def _exhaustive_max_hits(trace, cap, free_init):
    """Max total hits over every feasible cache sequence (C_{i+1} ⊆ C_i ∪ ids_i, |C| ≤ cap)."""
    universe = sorted(set(trace.ids.tolist()))
    bit = {v: 1 << j for j, v in enumerate(universe)}
    pop = [bin(m).count("1") for m in range(1 << len(universe))]
    states = {m: 0 for m in range(1 << len(universe)) if pop[m] <= cap} if free_init else {0: 0}
    for ids in trace.iterations():
        mask = sum(bit[v] for v in ids.tolist())
        new = {}
        for c, h in states.items():
            h, cand = h + pop[c & mask], c | mask
            sub = cand
            while True:
                if pop[sub] <= cap and new.get(sub, -1) < h:
                    new[sub] = h
                if sub == 0:
                    break
                sub = (sub - 1) & cand
        states = new
    return max(states.values())


tiny_traces = st.lists(st.sets(st.integers(0, 5), max_size=4), min_size=1, max_size=6)


@HYPO
@given(tiny_traces, st.integers(0, 3), st.booleans())
def test_belady_equals_exhaustive_optimum(batches, cap, prefetch):
    tr = Trace.from_batches([sorted(b) for b in batches], 6)
    best = _exhaustive_max_hits(tr, cap, free_init=prefetch)
    init, sets = belady_changesets(tr, cap, prefetch=prefetch)
    assert changeset_hits(tr, init, sets, cap).sum() == best
    r = replay(tr, CACHE_POLICIES["belady"](cap, 6, prefetch=prefetch))
    assert r.hits == best and r.init_rows == len(init)


traces = st.lists(st.sets(st.integers(0, 29), max_size=12), min_size=1, max_size=20)


@HYPO
@given(traces, st.integers(0, 12), st.booleans(), st.data())
def test_changesets_equal_naive_belady(batches, cap, prefetch, data):
    tr = Trace.from_batches([sorted(b) for b in batches], 30)
    start = data.draw(st.integers(0, len(tr) - 1))
    stop = data.draw(st.integers(start, len(tr)))
    init, sets = belady_changesets(tr, cap, start, stop, prefetch)
    ninit, nsets = belady_naive(tr, cap, start, stop, prefetch)
    assert np.array_equal(init, ninit)                     # Ginex's init: first `cap` distinct ids
    got, want = changeset_hits(tr, init, sets, cap, start), changeset_hits(tr, ninit, nsets, cap, start)
    assert np.array_equal(got, want)                        # per iteration, not just in total
    for add, out, pos in sets:
        assert len(np.unique(add)) == len(add) and len(np.unique(out)) == len(out)


@HYPO
@given(traces, st.integers(0, 12), st.integers(1, 7), st.booleans())
def test_belady_replay_with_horizon_equals_naive_per_superbatch(batches, cap, horizon, prefetch):
    tr = Trace.from_batches([sorted(b) for b in batches], 30)
    r = replay(tr, CACHE_POLICIES["belady"](cap, 30, horizon=horizon, prefetch=prefetch), per_iteration=True)
    if prefetch:                     # each superbatch restarts from its init; rows held are not re-read
        want, inits = [], []         # (which are held is the stepping contract's check: test_contract)
        for s in range(0, len(tr), horizon):
            init, sets = belady_naive(tr, cap, s, min(len(tr), s + horizon))
            want.append(changeset_hits(tr, init, sets, cap, s))
            inits.append(len(init))
        assert np.array_equal(r.per_iteration.hits, np.concatenate(want))
        assert r.per_iteration.init_rows.iloc[0] == inits[0] and r.init_rows <= sum(inits)
    else:
        assert r.init_rows == 0
        if horizon >= len(tr):
            init, sets = belady_naive(tr, cap, prefetch=False)
            assert np.array_equal(r.per_iteration.hits, changeset_hits(tr, init, sets, cap))


@HYPO
@given(st.integers(0, 2**32 - 1), st.integers(0, 30), st.integers(5, 60))
def test_belady_never_misses_more_than_an_online_policy(seed, cap, n):
    tr = random_trace(seed, n=n, t=20, hi=n // 3 + 1)
    cold = replay(tr, CACHE_POLICIES["belady"](cap, n, prefetch=False)).misses
    warm = replay(tr, CACHE_POLICIES["belady"](cap, n)).misses        # optimal free initial cache
    assert warm <= cold
    for name in ONLINE:
        kw = {"fill": "lazy"} if name == "static-degree" else {}
        assert cold <= replay(tr, policy(name, cap, tr, **kw)).misses, name
        if name.startswith("static"):
            assert warm <= replay(tr, policy(name, cap, tr, fill="prefetch")).misses, name
    assert warm == replay(tr, CACHE_POLICIES["belady"](cap, n, horizon=len(tr))).misses


def test_static_frequency_fills_lazily_and_degree_prefetches():
    tr = Trace.from_batches([[1, 2], [1, 2], [1, 3]], 5)
    lazy = replay(tr, CACHE_POLICIES["static-frequency"](2, 5, counts=tr.counts()), per_iteration=True)
    assert list(lazy.per_iteration.hits) == [0, 2, 1] and lazy.init_rows == 0   # first access: a miss
    pre = replay(tr, CACHE_POLICIES["static-degree"](2, 5, degrees=np.array([0, 9, 9, 1, 0])), per_iteration=True)
    assert list(pre.per_iteration.hits) == [2, 2, 1] and pre.init_rows == 2 and pre.init_pages == 1


def _fetch_oracle(trace, k):
    rows = pages = 0
    for s in range(0, len(trace), k):
        u = set(np.concatenate([trace[i] for i in range(s, min(len(trace), s + k))]).tolist())
        rows, pages = rows + len(u), pages + len(pages_of(u, trace.row_stride, trace.row_bytes))
    return rows, pages


@pytest.mark.parametrize("stride", [512, 8192])
def test_macrobatch_fetch_matches_brute_force(stride):
    tr = random_trace(7, n=300, t=24, hi=30, stride=stride)
    df = macrobatch_fetch(tr, [1, 2, 3, 5, 24, None])
    assert df.k.tolist() == [1, 2, 3, 5, 24, 24]
    for row in df.itertuples():
        assert (row.fetched_rows, row.fetched_pages) == _fetch_oracle(tr, row.k)
        assert row.bytes_read == row.fetched_pages * PAGE and row.macrobatches == -(-24 // row.k)
    assert df.fetched_rows.iloc[0] == tr.accesses                                  # k = 1: Σ unique
    assert df.fetched_rows.iloc[-1] == len(np.unique(tr.ids))                      # k = T: the union
    assert df.rows_vs_k1.iloc[0] == 1 and df.fetched_rows.is_monotonic_decreasing


def test_macrobatch_fetch_behind_a_cache():
    tr = random_trace(8, n=300, t=24, hi=30)
    lru = CACHE_POLICIES["lru"](50, 300)
    df = macrobatch_fetch(tr, [1, 4], cache=lru)
    for row in df.itertuples():
        r = replay(tr.coarsen(row.k), CACHE_POLICIES["lru"](50, 300))
        assert row.fetched_rows == r.misses and row.fetched_pages == r.pages_read and row.cache == "lru"
    assert df.fetched_rows.iloc[0] == replay(tr, CACHE_POLICIES["lru"](50, 300)).misses
    everything = macrobatch_fetch(tr, [1, 3], cache=CACHE_POLICIES["lru"](300, 300))
    assert (everything.fetched_rows == len(np.unique(tr.ids))).all()               # each row read once


def test_replay_neighbour_stream():
    b = [np.arange(i, i + 5) for i in range(10)]
    tr = Trace.from_batches(b, 20, neighbours=[x[:2] for x in b])
    r = replay(tr, CACHE_POLICIES["lru"](3, 20), stream="neighbours")
    assert r.accesses == 20 and r.hits == replay(tr.stream("neighbours"), CACHE_POLICIES["lru"](3, 20)).hits


def test_cache_for_budget_is_the_policy_the_budget_buys(fennel16):
    """A store's budget buys `from_budget`'s rows, a degree cache ranked by the store's degrees; a replay's
    summary is its counts as ratios."""
    from oocgnn.cache import CACHE_POLICIES, cache_for_budget, replay
    from oocgnn.trace import record_trace
    budget = 40 * fennel16.row_bytes + 4 * fennel16.num_nodes
    got = cache_for_budget("static-degree", budget, fennel16)
    want = CACHE_POLICIES["static-degree"].from_budget(budget, fennel16.row_bytes, fennel16.num_nodes,
                                                       degrees=fennel16.degrees())
    assert got.capacity == want.capacity == 40 and np.array_equal(got.static_ids, want.static_ids)
    tr = record_trace(fennel16, "random", [5, 5], seed=0, cache_dir=False, batch_size=64)
    r = replay(tr, got)
    s = r.summary(fennel16.row_bytes)
    assert s["miss_ratio"] == r.misses / r.accesses and s["read_ratio"] == (r.misses + r.init_rows) / r.accesses
    assert s["pages_read"] == r.pages_read + r.init_pages
    with pytest.raises(UserError, match="unknown cache policy"):
        cache_for_budget("nope", budget, fennel16)
