"""MariusGNN's partition buffer against its oracles: orderings against brute-force counts and the
closed forms of the digest, edge buckets against the store's lists, the buffer's subgraph and samples
against sampling the whole lists inside the same nodes, and clear errors for what does not fit."""
import contextlib
import itertools
import json
import os

import numpy as np
import pytest

from oocgnn.buckets import EdgeBuckets, buffer_csc, physical_offsets
from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.orderings import (assign, auto_logical, beta_loads, beta_states, comet_shape, comet_states,
                              pair_coverage, sequential_states)
from oocgnn.policies import make_plan
from oocgnn.policies.marius import MariusPlan
from oocgnn.runtime import Runtime
from oocgnn.sampler import Sampler, induced_csc
from oocgnn.schedules import make_schedule


def _loads(states):
    """Partitions read walking `states` from an empty buffer (brute force)."""
    return len(states[0]) + sum(len(set(b) - set(a)) for a, b in zip(states, states[1:]))


@pytest.mark.parametrize("n,cap", [(2, 2), (5, 2), (7, 3), (9, 2), (16, 4), (32, 8), (13, 5), (8, 8)])
def test_beta_covers_every_pair_one_swap_at_a_time(n, cap):
    for seed in range(3):
        states = beta_states(n, cap, np.random.default_rng(seed))
        assert all(len(set(s)) == cap for s in states)
        assert pair_coverage(states, n).all(), "every pair of partitions co-resident at least once"
        assert all(len(set(b) - set(a)) == 1 for a, b in zip(states, states[1:]))
        assert _loads(states) == beta_loads(n, cap)


def test_beta_matches_the_digests_table():
    """Digest §3's simulation table: p=16, c=4 gives 43 states and 46 partition loads; p=64, c=16 166."""
    assert beta_loads(16, 4) == 46 and len(beta_states(16, 4, np.random.default_rng(0))) == 43
    assert beta_loads(64, 16) == 166 and beta_loads(32, 8) == 86


@pytest.mark.parametrize("p,c,l", [(16, 4, 8), (32, 8, 8), (32, 8, 16), (12, 6, 4), (16, 8, 4)])
def test_comet_swaps_random_logical_groups_and_covers_every_pair(p, c, l):
    r, c_l = comet_shape(p, c, l)
    groupings = set()
    for seed in range(4):
        states = comet_states(p, c, l, np.random.default_rng(seed))
        assert all(len(set(s)) == c for s in states) and pair_coverage(states, p).all()
        # the logical partitions: groups of r that always move together
        together = np.ones((p, p), bool)
        for s in states:
            inside = np.zeros(p, bool)
            inside[s] = True
            together &= inside[:, None] == inside[None, :]
        groups = {tuple(np.flatnonzero(row)) for row in together}
        assert len(groups) == l and all(len(g) == r for g in groups)
        assert all(len(set(b) - set(a)) == r for a, b in zip(states, states[1:])), "one logical partition a swap"
        assert _loads(states) == r * beta_loads(l, c_l)
        groupings.add(frozenset(groups))
    assert len(groupings) == 4, "a new random grouping every epoch"


def test_comet_refuses_shapes_it_cannot_make_and_says_which_would_do():
    with pytest.raises(UserError, match=r"choose l from \[8, 16\]"):
        comet_shape(16, 4, 6)
    assert auto_logical(16, 4) == 8 and comet_shape(16, 4, 8) == (2, 2)


def test_auto_logical_is_mariusgnns_fewest_l_that_still_groups_partitions():
    """MariusGNN §6: the fewest l with p/c = l/c_l and c_l >= 2 (2p/c where that splits p); where 2p/c does not,
    the fewest such l below p (logical partitions of at least two physical ones), against a brute-force search
    of the shapes comet_shape accepts. A c with no such l keeps 2p/c, which comet_shape refuses."""
    for p in (2, 6, 8, 12, 16, 64):
        for c in range(2, p + 1):
            fits = []
            for l in range(1, p + 1):
                with contextlib.suppress(UserError):
                    comet_shape(p, c, l)
                    fits.append(l)
            grouping = [l for l in fits if l < p or l == 2 * p // c]
            if grouping:
                assert auto_logical(p, c) == min(grouping)
            else:
                with pytest.raises(UserError):
                    comet_shape(p, c, auto_logical(p, c))
            if (2 * p) % c == 0 and p % (2 * p // c) == 0:
                assert auto_logical(p, c) == 2 * p // c
    assert auto_logical(16, 6) == 8 and comet_shape(16, 6, 8) == (2, 3)
    assert auto_logical(16, 12) == 4 and comet_shape(16, 12, 4) == (4, 3)
    assert auto_logical(16, 2) == 16
    with pytest.raises(UserError):
        comet_shape(16, 5, auto_logical(16, 5))


def test_the_budget_gets_a_buffer_of_any_size_comet_can_group(fennel16, tmp_path):
    """A budget that holds six of 16 partitions but not seven gets c = 6 (l = 8, three logical partitions in
    the buffer) without a prefetch slot, not c = 4 with one; one that holds five but not six gets c = 4 (c = 5
    groups only as l = 16, no grouping)."""
    probe = make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget="1GB", prefetch="off"))
    assert 5 not in probe.valid_c() and {4, 6, 10, 12} <= set(probe.valid_c())
    budget = probe._need(6, False)
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget=str(budget)))
    assert (plan.c, plan.buffer()["l"], plan.buffer()["prefetch"]) == (6, 8, False)
    assert sum(plan.memory().values()) <= budget < plan._need(7, False)
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget=str(budget - 1)))
    assert plan.c == 4 and plan._need(5, False) <= budget - 1


def test_sequential_holds_each_partition_once():
    states = sequential_states(10, 4)
    assert states == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_assignment_picks_a_state_holding_the_partition():
    rng = np.random.default_rng(0)
    states = beta_states(8, 3, rng)
    parts = rng.integers(0, 8, 5000)
    greedy = assign(states, parts, 8, "greedy", rng)
    random = assign(states, parts, 8, "random", rng)
    for k in range(8):
        holding = [i for i, s in enumerate(states) if k in s]
        assert (greedy[parts == k] == holding[0]).all()
        drawn = random[parts == k]
        assert set(drawn) <= set(holding)
        if len(holding) > 1 and len(drawn) > 200:
            counts = np.bincount(drawn, minlength=len(states))[holding]
            assert counts.min() > 0.5 * len(drawn) / len(holding), "uniform among the states holding it"


@pytest.mark.parametrize("ordering", ["comet", "beta"])
def test_neighbour_placement_takes_the_state_holding_most_of_each_nodes_neighbours(fennel16, ordering):
    """Brute force over the states: each training node trains in a state holding its partition and, among those,
    one holding the most of its neighbours; the states (and loads) are the ordering's; the training nodes keep
    more of their neighbours inside the buffer than under the ordering's own placement."""
    kw = dict(batch_size=64, physical_parts=8, buffer_parts=4, ordering=ordering)
    near, own = make_schedule("buffer", fennel16, placement="neighbours", **kw), make_schedule("buffer", fennel16, **kw)
    part = np.searchsorted(physical_offsets(fennel16, 8), np.arange(fennel16.num_nodes), side="right") - 1
    indptr, indices = np.asarray(fennel16.indptr), fennel16.indices
    kept = {"near": 0, "own": 0}
    for e in range(2):
        (states, of), (states_own, of_own) = near.states(e), own.states(e)
        assert states == states_own
        for j, v in enumerate(near.train_idx):
            nbr_parts = part[indices[indptr[v]:indptr[v + 1]]]
            inside = {i: int(np.isin(nbr_parts, s).sum()) for i, s in enumerate(states) if part[v] in s}
            assert of[j] in inside and inside[of[j]] == max(inside.values())
            kept["near"] += inside[of[j]]
            kept["own"] += inside[of_own[j]]
    assert kept["near"] > kept["own"], kept


def test_marius_places_by_neighbours_where_one_step_covers_the_training_set(fennel16, tmp_path):
    """auto: neighbours when label-balanced steps are on and the training set fits a batch, else MariusGNN's."""
    n = len(fennel16.train_idx)
    placed = lambda **kw: make_plan(fennel16, _cfg(fennel16, tmp_path, **kw)).schedule.placement
    assert placed(batch_size=n) == "neighbours" and placed(batch_size=n - 1) == "ordering"
    assert placed(batch_size=n, accumulate="off") == "ordering"
    assert placed(batch_size=n - 1, placement="neighbours") == "neighbours"
    assert placed(batch_size=n, placement="ordering") == "ordering"
    with pytest.raises(UserError, match="placement must be one of auto, neighbours, ordering"):
        _cfg(fennel16, tmp_path, placement="nearest")


# ---- edge buckets ---------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [16, 5])
def test_buckets_hold_every_edge_once_and_rebuild_the_induced_subgraph(fennel16, p):
    buckets = EdgeBuckets.of(fennel16, p)
    reader = buckets.reader()
    held = buckets.read([(i, j) for i in range(p) for j in range(p)], reader)
    reader.close()
    bounds = physical_offsets(fennel16, p)
    edges = np.concatenate([held[i, j] for i in range(p) for j in range(p)]).astype(np.int64)
    assert len(edges) == fennel16.num_edges
    for (i, j), e in held.items():
        assert ((bounds[i] <= e[:, 0]) & (e[:, 0] < bounds[i + 1])).all()
        assert ((bounds[j] <= e[:, 1]) & (e[:, 1] < bounds[j + 1])).all()
    src = np.repeat(np.arange(fennel16.num_nodes), fennel16.degrees())
    assert sorted(map(tuple, edges)) == sorted(zip(src, np.asarray(fennel16.indices, np.int64)))
    lists = fennel16.neighbour_lists()
    rng = np.random.default_rng(1)
    for size in (1, 2, 3, p):
        state = sorted(rng.choice(p, size, replace=False).tolist())
        visible, (indptr, indices) = buffer_csc(buckets, state, {k: v for k, v in held.items()
                                                                 if k[0] in state and k[1] in state})
        oracle = induced_csc(lists, visible)
        assert np.array_equal(indptr, oracle[0]) and np.array_equal(indices, oracle[1]), state


def test_buckets_are_written_once_and_rewritten_for_another_store(fennel16, tmp_path):
    first = EdgeBuckets.of(fennel16, 4)
    stamp = os.stat(first.path).st_mtime_ns
    assert os.stat(EdgeBuckets.of(fennel16, 4).path).st_mtime_ns == stamp, "reused"
    meta = first.path.parent / "meta.json"
    saved = meta.read_text()
    meta.write_text(json.dumps({**json.loads(saved), "store_checksum": 1}))
    again = EdgeBuckets.of(fennel16, 4)                     # written for another store: rebuilt
    assert json.loads(meta.read_text()) == json.loads(saved) and np.array_equal(again.offsets, first.offsets)


def test_a_run_waits_for_another_process_writing_the_buckets(fennel16, capsys):
    """Two runs started together on a fresh store: the one that finds the buckets' lock held waits for it
    (saying so) and then uses or writes them, where it used to fail."""
    import fcntl
    import shutil
    import threading
    import time
    where = EdgeBuckets.location(fennel16, 8)
    shutil.rmtree(where, ignore_errors=True)
    fd = os.open(where.parent / f".{where.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)                    # another writer holds it (its own open file)
    released = threading.Event()

    def other_writer():
        time.sleep(0.5)
        released.set()
        os.close(fd)
    threading.Thread(target=other_writer).start()
    buckets = EdgeBuckets.of(fennel16, 8)
    assert released.is_set() and "writing the edge buckets" in capsys.readouterr().err
    oracle = EdgeBuckets.of(fennel16, 8)
    assert buckets.path == oracle.path and np.array_equal(buckets.offsets, oracle.offsets)
    assert int(buckets.offsets[-1]) == fennel16.num_edges


def test_bucket_reads_coalesce_adjacent_buckets(fennel16):
    b = EdgeBuckets.of(fennel16, 16)
    pairs = b.pairs([0, 1, 2], held=[0, 1])
    assert pairs == [(0, 2), (1, 2), (2, 0), (2, 1), (2, 2)]
    ranges = b.ranges(pairs)
    row2 = (int(b.offsets[2 * 16]), int(b.offsets[2 * 16 + 3]))
    assert row2 in ranges, "(2, 0), (2, 1), (2, 2) are one read"


# ---- the schedule and the executed buffer -----------------------------------------------------------
def _cfg(store, tmp_path, **kw):
    kw = {"policy": "marius", "epochs": 2, "batch_size": 64, "max_eval_nodes": 100, "progress": False,
          "out": str(tmp_path / "run"), "memory_budget": "2MB", **kw}
    return TrainConfig.create(store=str(store.path), **kw)


@pytest.mark.parametrize("ordering", ["comet", "beta", "sequential"])
def test_every_training_node_once_an_epoch_inside_its_buffer(fennel16, ordering):
    sch = make_schedule("buffer", fennel16, batch_size=64, physical_parts=8, buffer_parts=4, ordering=ordering)
    bounds = physical_offsets(fennel16, 8)
    for e in range(2):
        seen = []
        for step in sch.epoch(e):
            inside = np.zeros(fennel16.num_nodes, bool)
            for k in step.buffer:
                inside[bounds[k]:bounds[k + 1]] = True
            assert inside[step.seeds].all() and np.array_equal(step.visible, np.flatnonzero(inside))
            seen.append(step.seeds)
        assert np.array_equal(np.sort(np.concatenate(seen)), fennel16.train_idx)


@pytest.mark.parametrize("ordering", ["comet", "beta"])
def test_the_buffer_samples_as_the_whole_lists_inside_it(fennel16, tmp_path, ordering):
    """The runtime's buffer (partitions and buckets read, subgraph built from buckets) gives every batch
    the blocks a sampler over all lists draws inside the same visible nodes."""
    cfg = _cfg(fennel16, tmp_path, ordering=ordering)
    plan = make_plan(fennel16, cfg)
    runtime = Runtime(fennel16, plan)
    runtime.setup()
    oracle = Sampler(fennel16.neighbour_lists(), plan.fanouts, plan.seed)
    memory = fennel16.reader("memory")
    steps = list(plan.steps(2))
    nxt = [next((s for _, _, s in steps[i + 1:] if s.enter_ranges), None) for i in range(len(steps))]
    for i, (e, b, step) in enumerate(steps):
        runtime.before(step, nxt[i])
        got = runtime.sampler.sample(step.seeds, e, b, step.visible)
        want = oracle.sample(step.seeds, e, b, step.visible)
        for x, y in zip(got.blocks, want.blocks):
            assert np.array_equal(x.src_nodes, y.src_nodes) and np.array_equal(x.indices, y.indices)
        x = runtime.gather(got.input_nodes)
        assert np.array_equal(x.numpy(), memory.read_rows(got.input_nodes)), "rows from the buffer"
        assert runtime.cached.reader.stats.calls == 0, "every input row is in the buffer"
    runtime.close()
    assert {"load_cpu", "subgraph_cpu"} <= set(runtime.timers), "the cost model's processor shares of the loads"


def test_budget_picks_the_largest_buffer_and_errors_say_what_fits(fennel16, tmp_path):
    small, large = (make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget=b)) for b in ("1600KB", "4MB"))
    assert small.c < large.c and all(sum(p.memory().values()) <= p.budget for p in (small, large))
    assert small.c in small.valid_c() and min(c for c in small.valid_c() if c > small.c) not in [
        c for c in small.valid_c() if small._need(c, False) <= small.budget]
    with pytest.raises(UserError, match="smallest buffer .* raise the budget"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget="300KB"))
    with pytest.raises(UserError, match="--memory-budget"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, buffer_parts=16, memory_budget="1MB"))
    with pytest.raises(UserError, match="exceeds the 8 physical"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, buffer_parts=10, physical_parts=8))
    with pytest.raises(UserError, match="choose l from"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, buffer_parts=4, logical_parts=3))
    with pytest.raises(UserError, match="topology disk"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, topology="memory"))


def test_a_prefetch_slot_never_costs_the_buffer_a_partition(fennel16, tmp_path):
    """`--prefetch auto` sizes c as if there were no slot, then adds the slot where the budget still holds
    it; `on` takes the slot first (a smaller c where the budget is tight), `off` never takes it."""
    big = make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget="1GB", prefetch="off"))
    need = {c: {pf: big._need(c, pf) for pf in (False, True)} for c in big.valid_c()}
    c = next(c for c in sorted(need) if c > min(need) and need[c][True] > need[c][False])
    tight = need[c][False]                    # holds c without a slot, not with one
    plans = {pf: make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget=str(tight), prefetch=pf))
             for pf in ("auto", "on", "off")}
    assert (plans["auto"].c, plans["auto"].pipeline) == (c, False) == (plans["off"].c, plans["off"].pipeline)
    assert plans["on"].pipeline and plans["on"].c < c
    assert plans["auto"].buffer()["prefetch"] is False and plans["on"].buffer()["prefetch"] is True
    line = MariusPlan.summary_lines({"buffer": plans["auto"].buffer()})[0]
    assert f"c={c} of p=16 partitions" in line and "without a prefetch slot" in line
    assert all(p.resident_bytes() <= tight for p in plans.values())
    roomy = make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget=str(need[c][True]), buffer_parts=c))
    assert (roomy.c, roomy.pipeline, roomy.buffers()) == (c, True, c + roomy._swap(c))
    legacy = make_plan(fennel16, _cfg(fennel16, tmp_path, memory_budget=str(tight), prefetch=False))
    assert legacy.options.prefetch == "off" and not legacy.pipeline    # a run config written when it was a switch
    with pytest.raises(UserError, match="prefetch must be auto, on or off"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, prefetch="sometimes"))


def test_orderings_trade_loads_for_balance(fennel16):
    """Per epoch, BETA reads fewer partitions than COMET, and its greedy assignment piles examples into
    the first states (MariusGNN §5.1: unbalanced X_i) while COMET's are even."""
    def per_state(ordering):
        sch = make_schedule("buffer", fennel16, batch_size=10 ** 6, physical_parts=16, buffer_parts=4,
                            ordering=ordering)
        groups = sch.groups(0)
        sizes = np.array([len(t) for _, t in groups])
        return _loads([list(s) for s, _ in groups]), sizes.std() / sizes.mean()
    (beta_loads_, beta_cv), (comet_loads, comet_cv) = per_state("beta"), per_state("comet")
    assert beta_loads_ < comet_loads and comet_cv < beta_cv


# ---- DENSE (MariusGNN §4.1) ---------------------------------------------------------------------------
def _shared_draw_blocks(lists, seeds, fanouts, seed, epoch, batch):
    """The oracle: per-hop blocks (DGL's to_block order) in which a node's neighbours, wherever it is a
    destination, are the one draw made where it first was one (that layer's fanout and key), drawn
    node by node with the per-hop kernel."""
    from oocgnn.blocks import sample_layer
    scratch = np.full(lists.num_nodes, -1, np.int32)
    draw, blocks, frontier = {}, [None] * len(fanouts), np.asarray(seeds, np.int64)
    for layer in range(len(fanouts) - 1, -1, -1):
        for v in frontier:
            if v not in draw:
                starts, ends, buf = lists.lists(np.array([v]))
                one = sample_layer(np.array([v]), starts, ends, buf, fanouts[layer], seed, epoch, batch, layer,
                                   scratch)
                draw[v] = one.src_nodes[one.indices]
        src, local, indptr, indices = list(frontier), {int(v): i for i, v in enumerate(frontier)}, [0], []
        for v in frontier:
            for u in draw[v]:
                if int(u) not in local:
                    local[int(u)] = len(src)
                    src.append(u)
                indices.append(local[int(u)])
            indptr.append(len(indices))
        blocks[layer] = (np.array(indptr), np.array(indices), np.array(src, np.int64))
        frontier = np.array(src, np.int64)
    return blocks


@pytest.mark.parametrize("fanouts", [[4, 7], [5, 10, 15], [15, 10, 5], [3, -1, 2]])
def test_dense_blocks_are_per_hop_blocks_with_shared_draws(fennel16, fanouts):
    lists = fennel16.neighbour_lists()
    dense = Sampler(lists, fanouts, 11, dense=True)
    for batch, seeds in enumerate([np.arange(0, 300, 7), fennel16.train_idx[:64]]):
        got = dense.sample(seeds, 2, batch).blocks
        want = _shared_draw_blocks(lists, seeds, fanouts, 11, 2, batch)
        for b, (indptr, indices, src) in zip(got, want):
            assert np.array_equal(b.indptr, indptr) and np.array_equal(b.indices, indices)
            assert np.array_equal(b.src_nodes, src)


def test_dense_draws_fewer_and_equals_per_hop_at_one_layer(fennel16):
    lists = fennel16.neighbour_lists()
    seeds = fennel16.train_idx[:128]
    one = [Sampler(lists, [10], 3, dense=d).sample(seeds, 0, 0).blocks[0] for d in (False, True)]
    assert np.array_equal(one[0].indices, one[1].indices) and np.array_equal(one[0].src_nodes, one[1].src_nodes)
    for fanouts in ([10, 10], [10, 10, 10]):
        per_hop, dense = (Sampler(lists, fanouts, 3, dense=d).sample(seeds, 0, 0).blocks for d in (False, True))
        assert dense[0].num_edges < sum(b.num_edges for b in per_hop), "DENSE draws only each layer's delta"
        assert dense[-1].num_edges == per_hop[-1].num_edges


def test_dense_runs_with_a_disk_topology_inside_a_buffer(fennel16, tmp_path):
    """Through lists read from disk, and inside a visible set, DENSE gives the in-memory DENSE blocks."""
    from oocgnn.topology import NeighbourLists
    disk = NeighbourLists(fennel16, capacity=0)
    seeds, visible = fennel16.train_idx[:50], np.arange(fennel16.num_nodes // 2)
    seeds = seeds[seeds < visible[-1]]
    for vis in (None, visible):
        sampler = Sampler(disk, [5, 5, 5], 1, dense=True)
        if vis is not None:                           # a buffer hands its subgraph over (as `oocgnn.buffer`)
            sampler.prepare(vis, induced_csc(fennel16.neighbour_lists(), vis))
        a = sampler.sample(seeds, 0, 3, vis).blocks
        b = Sampler(fennel16.neighbour_lists(), [5, 5, 5], 1, dense=True).sample(seeds, 0, 3, vis).blocks
        assert all(np.array_equal(x.indices, y.indices) and np.array_equal(x.src_nodes, y.src_nodes)
                   for x, y in zip(a, b))
    disk.close()


def test_describe_counts_loads_as_the_closed_forms():
    """Digest §3: COMET's bucket loads are c² + (|S| − 1)(c² − (c − r)²), BETA's with r = 1."""
    from oocgnn.orderings import describe, first_shared
    for p, c, l in [(16, 4, 8), (32, 8, 16)]:
        r, c_l = comet_shape(p, c, l)
        states = comet_states(p, c, l, np.random.default_rng(0))
        d = describe(states)
        assert d["partition_loads"] == r * beta_loads(l, c_l)
        assert d["bucket_loads"] == c * c + (d["states"] - 1) * (c * c - (c - r) ** 2)
        first = first_shared(states, p)
        assert (first >= 0).all() and (first == first.T).all()
        brute = {(i, j): min(k for k, s in enumerate(states) if i in s and j in s) for i in range(p) for j in range(p)}
        assert all(first[i, j] == k for (i, j), k in brute.items())
    beta = beta_states(16, 4, np.random.default_rng(1))
    d = describe(beta, sizes=[5, 5, 5])
    assert d["bucket_loads"] == 16 + (len(beta) - 1) * 7 and d["cv_examples"] == 0.0


def test_permutation_bias_is_the_widest_gap_between_partitions_trained_shares():
    """MariusGNN §6's B over partitions, by hand: p = 2, buckets (0, 0) 10 edges in state 0, (0, 1) 6 and (1, 0) 4
    and (1, 1) 10 in state 1. After state 0 partition 0 has trained 10 of its 20 edges, partition 1 none of its 20:
    B = 0.5; one state for every bucket (in-memory training) gives 0; brute force over random assignments agrees."""
    from oocgnn.orderings import partition_tallies, permutation_bias
    edges = np.array([[10, 6], [4, 10]])
    state = np.array([[0, 1], [1, 1]])
    assert np.allclose(partition_tallies(state, edges), [[0.5, 0.0], [1.0, 1.0]])
    assert permutation_bias(state, edges) == 0.5
    assert permutation_bias(np.zeros((2, 2), int), edges) == 0.0
    rng = np.random.default_rng(0)
    for _ in range(5):
        p = 5
        counts = rng.integers(0, 4, (p, p))
        st = np.where(counts > 0, rng.integers(0, 3, (p, p)), -1)
        trained = np.zeros(p)
        total = np.array([sum(counts[i, j] for i, j in itertools.product(range(p), repeat=2) if k in (i, j))
                          for k in range(p)])
        gaps = []
        for k in range(3):                      # state by state: each edge of (i, j) counts for i and for j
            for i, j in itertools.product(range(p), repeat=2):
                if st[i, j] == k:
                    trained[i] += counts[i, j]
                    trained[j] += counts[i, j] if i != j else 0
            share = trained[total > 0] / total[total > 0]
            gaps.append(share.max() - share.min())
        assert permutation_bias(st, counts) == pytest.approx(max(gaps))


def test_an_unpartitioned_store_says_how_to_partition_it(tiny_store, tmp_path):
    with pytest.raises(UserError, match="needs a partitioned store.*--partitioner"):
        make_plan(tiny_store, _cfg(tiny_store, tmp_path))


def test_the_cli_says_which_buffer_the_budget_chose(fennel16, tmp_path, capsys):
    from oocgnn.cli import main
    main(["train", str(fennel16.path), "--policy", "marius", "--ordering", "beta", "--memory-budget", "2MB",
          "--epochs", "1", "--max-eval-nodes", "100", "--out", str(tmp_path / "run"), "--no-progress"])
    out = capsys.readouterr().out
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, ordering="beta", epochs=1))
    assert f"buffer: beta, c={plan.c} of p=16 partitions" in out and "training nodes placed by neighbours" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["buffer"]["c"] == plan.c and summary["buffer"]["states_loaded"] <= summary["buffer"]["states_per_epoch"]
    assert summary["buffer"]["placement"] == "neighbours"        # auto: the training set fits one batch of 1024
