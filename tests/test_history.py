"""Historical embedding cache (OUTRE §4.3) against oracles: the plain forward, simulate's pruning."""
import copy
import dataclasses

import numpy as np
import pytest
import torch

from oocgnn.errors import UserError
from oocgnn.history import HistoryCache, forward_with_history, history_prune
from oocgnn.models import build_model
from oocgnn.importance import history_nodes
from oocgnn.sampler import Sampler
from oocgnn.simulate import Layout, count_batch

HIDDEN = 16
MODELS = [(m, L) for m in ("sage", "gat", "gin") for L in (2, 3)]


@pytest.fixture(scope="module")
def env(tiny_store):
    x = torch.from_numpy(tiny_store.reader("memory").read_range(0, tiny_store.num_nodes))
    return tiny_store, tiny_store.neighbour_lists(), x, history_nodes(tiny_store, 0.3, by="degree")


def _batch(env, layers, b=0, size=64):
    store, g, x, _ = env
    seeds = store.train_idx[b * size:(b + 1) * size]
    inp, _, blocks = Sampler(g, [5] * layers, 0).sample(seeds, 0, b)
    return blocks, x[inp]


def _model(name, layers, store):
    torch.manual_seed(0)
    return build_model(name, store.feat_dim, HIDDEN, store.num_classes, layers).eval()


def _cache(env, staleness):
    store, _, _, cand = env
    return HistoryCache(cand, HIDDEN, staleness, store.num_nodes)


@pytest.mark.parametrize("name,layers", MODELS)
def test_staleness_one_never_reuses_and_is_exact(env, name, layers):
    model, cache = _model(name, layers, env[0]), _cache(env, 1)
    with torch.no_grad():
        for t, b in enumerate([0, 1, 0, 0]):                 # repeated batches: candidates met again
            blocks, x = _batch(env, layers, b)
            plan = cache.plan(blocks, t)
            assert plan.hits == 0 and plan.need.all() and plan.pushes > 0
            torch.testing.assert_close(forward_with_history(model, plan, x, cache), model(blocks, x),
                                       rtol=0, atol=0)
            assert (cache.stamp[plan.push_slots] == t).all()
    assert cache.stats == {"batches": 4, "hits": 0, "pushes": cache.stats["pushes"]}


@pytest.mark.parametrize("name,layers", MODELS)
def test_second_meeting_skips_and_pulls_the_cached_row(env, name, layers):
    model, cache = _model(name, layers, env[0]), _cache(env, 100)
    blocks, x = _batch(env, layers)
    with torch.no_grad():
        exact = model(blocks, x)
        p0 = cache.plan(blocks, 0)
        assert p0.hits == 0
        forward_with_history(model, p0, x, cache)
    p1 = cache.plan(blocks, 1)
    hop1 = blocks[-1].src_nodes
    k = blocks[-1].num_dst
    expect = p0.push.copy()
    expect[:k] = False                                        # seeds are never skipped
    assert np.array_equal(p1.skipped, expect) and p1.hits > 0
    assert not (p1.push & p1.skipped).any()
    assert not p1.push[k:].any(), "non-seed candidates are all fresh now"
    assert p1.need.sum() < len(p1.need), "skipped sub-trees are not gathered"
    assert np.array_equal(cache.slot[hop1[p1.skipped]], p1.skip_slots)
    # same parameters: the history equals the exact h^(L-1), so reuse is exact here
    with torch.no_grad():
        torch.testing.assert_close(forward_with_history(model, p1, x, copy.deepcopy(cache)), exact,
                                   rtol=0, atol=1e-5)
    # poison the histories: only seeds with a skipped in-neighbour at the last layer change
    poisoned = copy.deepcopy(cache)
    poisoned.emb[torch.from_numpy(p1.skip_slots)] += 10.0
    with torch.no_grad():
        bad = forward_with_history(model, p1, x, poisoned)
    src, dst = blocks[-1].edges()
    touched = np.zeros(k, dtype=bool)
    touched[dst[p1.skipped[src]]] = True
    assert touched.any()
    changed = (bad - exact).abs().amax(1).numpy() > 1e-4
    assert np.array_equal(changed, touched)
    # gradients reach the model, never the cache; pruned input rows get none
    xg = x.clone().requires_grad_(True)
    forward_with_history(model, p1, xg, cache).sum().backward()
    assert cache.emb.grad is None and not cache.emb.requires_grad
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert (xg.grad[torch.from_numpy(~p1.need)] == 0).all()


@pytest.mark.parametrize("name,layers", MODELS)
def test_non_needed_rows_and_pruning_do_not_matter(env, name, layers):
    model, cache = _model(name, layers, env[0]), _cache(env, 100)
    blocks, x = _batch(env, layers)
    with torch.no_grad():
        forward_with_history(model, cache.plan(blocks, 0), x, cache)
        plan = cache.plan(blocks, 1)
        assert plan.hits > 0
        x0 = plan.inputs(x[torch.from_numpy(plan.need)])      # zeros outside the needed rows
        assert (x0[torch.from_numpy(~plan.need)] == 0).all()
        full = forward_with_history(model, plan, x, copy.deepcopy(cache))
        zero = forward_with_history(model, plan, x0, copy.deepcopy(cache))
        unpruned = forward_with_history(model, dataclasses.replace(plan, pruned_blocks=blocks), x,
                                        copy.deepcopy(cache))
    torch.testing.assert_close(zero, full, rtol=0, atol=0)
    torch.testing.assert_close(unpruned, full, rtol=0, atol=0)


@pytest.mark.parametrize("layers", [2, 3])
def test_plan_matches_simulate(env, layers):
    store = env[0]
    cache = _cache(env, 100)
    model = _model("sage", layers, store)
    lay = Layout(store)
    resident = {d: np.zeros(store.num_nodes, dtype=bool) for d in ("features", "adjacency")}
    for t, b in enumerate([0, 1, 0, 2, 1]):
        blocks, x = _batch(env, layers, b)
        fresh = cache.fresh_mask(t)
        plan = cache.plan(blocks, t)
        need, expanded, skipped = history_prune(blocks, fresh)
        assert np.array_equal(plan.need, need) and np.array_equal(plan.skipped, skipped)
        assert np.array_equal(plan.expanded, expanded)
        row = count_batch(lay, resident, blocks, history=fresh)
        assert plan.input_rows == row["input_nodes_hist"] == len(plan.input_ids)
        assert plan.hits == row["history_hits"]
        assert np.array_equal(plan.input_ids, blocks[0].src_nodes[need])
        for i, (pb, blk) in enumerate(zip(plan.pruned_blocks[:-1], blocks[:-1])):
            keep = history_prune(blocks[i:], fresh)[1]         # expanded dst of block i
            assert (pb.num_src, pb.num_dst) == (blk.num_src, blk.num_dst)
            deg, full = np.diff(pb.indptr), np.diff(blk.indptr)
            assert np.array_equal(deg[keep], full[keep]) and (deg[~keep] == 0).all()
            kept = np.repeat(keep, full)                       # the kept edges, in order
            assert np.array_equal(pb.indices, blk.indices[kept])
            assert np.array_equal(pb.src_nodes, blk.src_nodes)
        assert plan.pruned_blocks[-1] is blocks[-1]
        with torch.no_grad():
            forward_with_history(model, plan, x, cache)
    assert cache.stats["batches"] == 5 and cache.stats["hits"] > 0


def test_staleness_boundaries(env):
    S = 3
    model, cache = _model("sage", 2, env[0]), _cache(env, S)
    blocks, x = _batch(env, 2)
    with torch.no_grad():
        p = cache.plan(blocks, 0)
        forward_with_history(model, p, x, cache)
        pushed = p.push_slots
        assert (cache.stamp[pushed] == 0).all()
        p = cache.plan(blocks, S - 1)                           # t - stamp = S-1 < S: reuse
        assert p.hits > 0 and not np.isin(p.push_slots, p.skip_slots).any()
        forward_with_history(model, p, x, cache)
        assert (cache.stamp[p.skip_slots] == 0).all(), "a pull does not refresh the stamp"
        again = p.skip_slots
        p = cache.plan(blocks, S)                               # t - stamp = S: stale, refresh
        assert p.hits == 0 and np.isin(again, p.push_slots).all()
        forward_with_history(model, p, x, cache)
        assert (cache.stamp[again] == S).all()
    small = HistoryCache([1, 5, 9], 4, S, 12)
    small.push([1], torch.ones(1, 4), 10)
    assert [small.fresh_mask(t)[5] for t in (10, 12, 13)] == [True, True, False]
    assert np.flatnonzero(small.fresh_mask(11)).tolist() == [5]


def test_nbytes_and_layout():
    c = HistoryCache(np.array([9, 1, 5, 5]), 7, 10, 12)
    assert c.candidates.tolist() == [1, 5, 9] and c.slot.dtype == np.int32 and c.stamp.dtype == np.int64
    assert c.slot.tolist() == [-1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1]
    assert c.emb.dtype == torch.float32 and c.emb.shape == (3, 7) and (c.stamp == -1).all()
    assert c.nbytes == 3 * 7 * 4 + 12 * 4 + 3 * 8
    assert HistoryCache([], 7, 10, 12).nbytes == 12 * 4
    assert not c.fresh_mask(0).any()


def test_errors(env):
    store = env[0]
    for bad in [dict(candidates=[12]), dict(candidates=[-1]), dict(dim=0), dict(staleness=0)]:
        with pytest.raises(UserError):
            HistoryCache(**({"candidates": [1], "dim": 4, "staleness": 2, "num_nodes": 12} | bad))
    blocks, x = _batch(env, 2)
    cache = _cache(env, 10)
    plan = cache.plan(blocks, 0)
    with pytest.raises(UserError, match="MLP"):
        forward_with_history(_model("mlp", 2, store), plan, x, cache)
    with pytest.raises(UserError, match="layers"):
        forward_with_history(_model("sage", 3, store), plan, x, cache)
    other = HistoryCache(cache.candidates, 8, 10, store.num_nodes)
    with pytest.raises(UserError, match="dim"):
        forward_with_history(_model("sage", 2, store), plan, x, other)
    with pytest.raises(UserError):
        cache.plan(blocks[-1:], 0)                              # one layer: nothing to cache


def test_the_fresh_view_reads_as_the_mask():
    """`fresh_at(t)[ids]` (what pruning reads, no N-long mask per batch) equals `fresh_mask(t)[ids]`."""
    from oocgnn.history import HistoryStamps
    rng = np.random.default_rng(3)
    stamps = HistoryStamps(rng.choice(1000, 120, replace=False), staleness=5, num_nodes=1000)
    stamps.stamp[:] = rng.integers(-1, 20, len(stamps.stamp))
    ids = rng.integers(0, 1000, 700)
    for t in (0, 4, 10, 19, 30):
        assert np.array_equal(stamps.fresh_at(t)[ids], stamps.fresh_mask(t)[ids])
    empty = HistoryStamps(np.empty(0, np.int64), staleness=5, num_nodes=1000)
    assert not empty.fresh_at(3)[ids].any()
