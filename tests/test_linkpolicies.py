"""Link prediction's out-of-core policies (`edgeschedules`): MariusGNN's edge buckets in buffer states (every bucket
once an epoch, its batches cut three ways, c = p equal to in-memory training), HierBatching's edges of a mega-batch
and its negative pool, OUTRE's macro batches (histories included), the composed policy's unrestricted mega-batches,
Ginex's and BatchGNN's batches; each reads what the simulator counts, learns, and the tuner ranks them."""
import json

import numpy as np
import pandas as pd
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.policies import make_plan
from oocgnn.train import train
from oocgnn.tune import candidates, tune

from .linkstores import link_cfg as _cfg


MARIUS = {"policy": "marius", "physical_parts": 8, "buffer_parts": 4, "topology": "disk"}


@pytest.mark.parametrize("ordering", ["comet", "beta"])
def test_marius_link_reads_what_simulate_counts(parted_link, tmp_path, ordering):
    """The partition buffer on a link store: executed feature and bucket reads equal the simulation's."""
    from .test_executor import _assert_agree, _simulated
    cfg = _cfg(parted_link, tmp_path, epochs=2, ordering=ordering, **MARIUS)
    run = train(cfg)
    _assert_agree(run, *_simulated(parted_link, cfg), exact=True)
    assert run["io"]["pages"] > 0 and run["topology_io"]["pages"] > 0


@pytest.mark.parametrize("ordering", ["comet", "beta"])
def test_marius_trains_every_edge_bucket_once_an_epoch_in_a_state_holding_it(parted_link, ordering):
    """BETA's pair coverage is the point: every pair of partitions shares a state, so every edge bucket (i, j)
    trains, once an epoch, with both partitions resident (COMET alike, over its logical partitions)."""
    from oocgnn.orderings import pair_coverage
    plan = make_plan(parted_link, TrainConfig.create(store=str(parted_link.path), batch_size=64, ordering=ordering,
                                                     **{k: v for k, v in MARIUS.items()}))
    sch = plan.schedule
    bounds = sch.bounds
    for epoch in range(2):
        states = [s for s, _ in sch.groups(epoch)]
        assert pair_coverage(sch.states(epoch)[0], sch.p).all()
        trained, buckets = [], {}
        for step in sch.epoch(epoch):
            parts = np.searchsorted(bounds, step.link.edges, side="right") - 1
            assert set(parts.ravel()) <= set(step.buffer)                  # both partitions resident
            assert np.isin(step.seeds, np.concatenate([np.arange(bounds[k], bounds[k + 1]) for k in step.buffer])).all()
            for i, j in parts.tolist():
                buckets.setdefault((i, j), set()).add(step.buffer)
            trained.append(step.link.edges)
        trained = np.concatenate(trained)
        assert len(trained) == len(sch.edge_batches.edges)                  # each training edge once
        assert {tuple(e) for e in trained.tolist()} == {tuple(e) for e in sch.edge_batches.edges.tolist()}
        assert all(len(s) == 1 for s in buckets.values())                   # a bucket in one state
        assert len(buckets) == len(np.unique(sch.bucket_of_edge)) and len(states) > 1


@pytest.mark.parametrize("cut", ["even", "full"])
def test_a_states_edges_are_cut_into_equal_batches_or_mariusgnns(parted_link, cut):
    """`--state-batches even` (the default): a state's n edges in ceil(n/B) batches whose sizes differ by at most
    one; `full`: batches of B and a short last one, as many."""
    def sizes(**kw):
        plan = make_plan(parted_link, TrainConfig.create(store=str(parted_link.path), batch_size=64, **MARIUS, **kw))
        out = {}
        for step in plan.schedule.epoch(1):
            out.setdefault(step.group, []).append(len(step.link.edges))
        return out

    got, full = sizes(**({"state_batches": cut} if cut == "full" else {})), sizes(state_batches="full")
    assert {g: len(s) for g, s in got.items()} == {g: len(s) for g, s in full.items()}
    assert {g: sum(s) for g, s in got.items()} == {g: sum(s) for g, s in full.items()}
    assert any(s[-1] < 64 for s in full.values())
    for s in got.values():
        if cut == "even":
            assert max(s) - min(s) <= 1 and max(s) <= 64
        else:
            assert all(n == 64 for n in s[:-1]) and 0 < s[-1] <= 64
    with pytest.raises(UserError, match="state_batches must be one of even, full, carry"):
        sizes(state_batches="half")


def test_carried_state_batches_make_optimizer_steps_of_exactly_a_batch_of_edges(parted_link):
    """`--state-batches carry`: the epoch's states' edges cut every B, a batch that spans a state change split there
    and its two pieces one accumulated optimizer step: each step but an epoch's last sees exactly B edges, as many
    steps as in-memory training takes (ceil(E / B)), each mini-batch inside one state; `--accumulate off` makes
    each piece a step of its own."""
    def run(**kw):
        plan = make_plan(parted_link, TrainConfig.create(store=str(parted_link.path), batch_size=64, **MARIUS,
                                                         state_batches="carry", **kw))
        edges, groups = {}, {}
        for e, _, step in plan.steps(2):
            edges[e, step.update] = edges.get((e, step.update), 0) + len(step.link.edges)
            groups.setdefault((e, step.update), set()).add(step.group)
        return plan, edges, groups

    plan, edges, groups = run()
    total = len(plan.schedule.edge_batches.edges)
    assert plan.accumulate and plan.step_target == 64
    for epoch in (0, 1):
        sizes = [n for (e, _), n in sorted(edges.items()) if e == epoch]
        assert len(sizes) == -(-total // 64) and sum(sizes) == total
        assert all(n == 64 for n in sizes[:-1]) and 0 < sizes[-1] <= 64
    assert sum(len(g) > 1 for g in groups.values()) > 3            # steps that span two states
    off, pieces, _ = run(accumulate="off")
    assert not off.accumulate and len(pieces) > len(edges)


@pytest.mark.parametrize("ordering,cut", [("comet", "full"), ("beta", "full"), ("comet", "carry")])
def test_marius_with_every_partition_in_its_buffer_trains_as_inmemory(parted_link, tmp_path, ordering, cut):
    """c = p: one buffer state holds the whole graph, its negatives are drawn from every node and its sampling sees
    every edge, so the run is in-memory training's, loss and MRR equal (the out-of-core vs in-memory oracle), where
    the state's edges are cut as in-memory's are (`--state-batches full`: batches of B and a short last one; carry
    in one state is that cut, each batch a step of its own)."""
    cfg = _cfg(parted_link, tmp_path, epochs=2)
    inmemory = train(cfg.replace(out=str(tmp_path / "inmemory")))
    marius = train(cfg.replace(out=str(tmp_path / ordering), ordering=ordering, state_batches=cut,
                               **{**MARIUS, "buffer_parts": 8}))
    assert marius["buffer"]["states_per_epoch"] == 1
    a, b = (pd.read_csv(tmp_path / name / "log.csv") for name in ("inmemory", ordering))
    assert a["train_loss"].equals(b["train_loss"]) and a["val_mrr"].equals(b["val_mrr"])
    assert marius["test_mrr_at_best_val"] == inmemory["test_mrr_at_best_val"]


@pytest.mark.parametrize("ordering", ["comet", "beta"])
def test_bucket_states_say_where_each_edge_bucket_trains(parted_link, ordering):
    """`EdgeBufferSchedule.bucket_states`: the loaded state each bucket's edges train in (the steps' own groups);
    BETA's is the first state holding the pair, COMET's any of them, (i, j) and (j, i) drawn apart;
    `bucket_edges` counts the edges, each in the bucket of its source's and destination's partitions."""
    from oocgnn.orderings import first_shared
    plan = make_plan(parted_link, TrainConfig.create(store=str(parted_link.path), batch_size=64, ordering=ordering,
                                                     **MARIUS))
    sch = plan.schedule
    edges = sch.bucket_edges
    assert edges.sum() == len(sch.edge_batches.edges) and (np.tril(edges, -1) > 0).any() and (np.triu(edges, 1) > 0).any()
    apart = False
    for epoch in range(2):
        states = sch.bucket_states(epoch)
        assert ((states >= 0) == (edges > 0)).all()
        both = (edges > 0) & (edges.T > 0)
        apart |= (states != states.T)[both].any()
        for step in sch.epoch(epoch):
            i, j = (np.searchsorted(sch.bounds, step.link.edges, side="right") - 1).T
            assert (states[i, j] == step.group).all() and set(i) | set(j) <= set(step.buffer)
        held = [s for s, _ in sch.groups(epoch)]
        first = first_shared(held, sch.p)
        if ordering == "beta":
            assert (states[edges > 0] == first[edges > 0]).all()
        else:
            assert (states[edges > 0] >= first[edges > 0]).all() and (states != first)[edges > 0].any()
    assert apart == (ordering == "comet")          # BETA's first shared state is symmetric; COMET draws each


def test_marius_link_refuses_the_sequential_ordering(parted_link, tmp_path):
    with pytest.raises(UserError, match="sequential ordering never holds most pairs"):
        train(_cfg(parted_link, tmp_path, ordering="sequential", **MARIUS))


HB = {"policy": "hierbatching", "parts_per_megabatch": 4, "static_ratio": 0.02, "memory_budget": "8MB"}


@pytest.mark.parametrize("passes,pool", [(1.0, 0), (2.0, 0), (1.5, 0), (2.0, 300)])
def test_hierbatching_trains_every_edge_once_a_pass_in_a_mega_batch_holding_it(link16, passes, pool):
    """Each training edge trains in one mega-batch an epoch, once a pass (a fraction of a pass: a share of each
    mega-batch's edges once more); its source is in the mega-batch's parts or static, its destination too or an
    outsider the mega-batch reads with its parts; an edge has an outsider only when its endpoints' parts are in
    different mega-batches and neither is static; every seed is visible; uniform negatives are the parts' or,
    with a negative pool, the pool's (read with the mega-batch where outside its parts)."""
    plan = make_plan(link16, TrainConfig.create(store=str(link16.path), batch_size=256, passes=passes,
                                                negative_pool=pool, **HB))
    sch = plan.schedule
    edges, static = sch.edge_batches.edges, sch._static_mask
    for epoch in range(2):
        groups = sch.groups(epoch)
        trained, outsiders_used, group_edges = [], 0, {}
        for step in sch.epoch(epoch):
            ranges, _, outsiders, drawn = groups[step.group]
            t = np.zeros(link16.num_nodes, bool)
            for lo, hi in ranges:
                t[lo:hi] = True
            if step.enter_ranges:
                assert step.enter_ranges == ranges and np.array_equal(step.enter_ids, outsiders)
            src, dst = step.link.edges.T
            assert (t[src] | static[src]).all()
            out = ~t[dst] & ~static[dst]
            assert np.isin(dst[out], outsiders).all() and not static[src[out]].any()   # neither endpoint static
            outsiders_used += int(out.sum())
            assert np.isin(step.seeds, step.visible).all()
            uniform = step.link.negatives[:, int(sch.edge_batches.num_negatives * sch.edge_batches.degree_fraction):]
            if pool:
                assert len(drawn) == pool and np.isin(uniform, drawn).all() and not t[uniform].all()
                assert np.isin(drawn[~t[drawn]], outsiders).all()
            else:
                assert drawn is None and t[uniform].all()
            group_edges.setdefault(step.group, []).append(step.link.edges)
            trained.append(step.link.edges)
        trained = np.concatenate(trained)
        keys = edges[:, 0] * link16.num_nodes + edges[:, 1]
        count = np.bincount(np.searchsorted(np.sort(keys), trained[:, 0] * link16.num_nodes + trained[:, 1]),
                            minlength=len(edges))
        lo, extra = divmod(passes, 1.0)
        assert count.min() >= int(lo) and count.max() <= int(lo) + (extra > 0)
        if not extra:
            assert (count == int(lo)).all()                          # every edge exactly once a pass
        else:                                                        # each mega-batch: round(frac · its edges) more
            assert count.sum() == int(lo) * len(edges) + sum(round(extra * len(p)) for _, p, _, _ in groups)
        for g, (ranges, positions, _, _) in enumerate(groups):          # a mega-batch's edges are its own, no other's
            mine = np.unique(np.concatenate(group_edges[g]), axis=0)
            assert np.array_equal(mine, np.unique(edges[positions], axis=0))
        assert outsiders_used > 0 and len(groups) == 4


def test_the_automatic_negative_pool_gives_way_to_the_mega_batch(link16):
    """auto: --negatives x --negative-chunks nodes where the budget holds them beside the mega-batch, halved while
    it then holds none (a given N_d, or an automatic one); a given pool that does not fit is refused."""
    def plan(budget, **kw):
        return make_plan(link16, TrainConfig.create(store=str(link16.path), policy="hierbatching", static_ratio=0.02,
                                                    memory_budget=budget, negatives=100, negative_chunks=10, **kw))
    roomy = plan("64MB", parts_per_megabatch=1)
    assert roomy._pool == 1000 and roomy.describe()["negative_pool"] == 1000
    without = plan("64MB", parts_per_megabatch=1, negative_pool=0).resident_bytes()
    assert without < roomy.resident_bytes()                         # the pool's rows and lists are planned
    tight = (without + roomy.resident_bytes()) // 2                 # holds one part, not the whole pool beside it
    for kw in ({"parts_per_megabatch": 1}, {}):
        p = plan(str(tight), **kw)
        assert 0 < p._pool < 1000 and p.resident_bytes() <= tight and p.n_d == 1
        assert p.schedule.negative_pool == p._pool
    with pytest.raises(UserError, match="memory-budget"):
        plan(str(tight), parts_per_megabatch=1, negative_pool=1000)


def test_a_negative_pool_on_a_node_store_is_refused(fennel16):
    with pytest.raises(UserError, match="negative-pool draws a link store's negatives"):
        make_plan(fennel16, TrainConfig.create(store=str(fennel16.path), negative_pool=100, **HB))


def test_hierbatching_negative_pools_are_uniform_over_the_graph(link16):
    """A mega-batch's negative pool is a uniform draw of distinct nodes, a new one per (epoch, mega-batch): over
    many, every node is drawn about equally often, inside and outside the mega-batch's parts alike."""
    sch = make_plan(link16, TrainConfig.create(store=str(link16.path), negative_pool=100, **HB)).schedule
    n, draws = link16.num_nodes, 400
    count, inside = np.zeros(n), 0
    for e in range(draws // 4):
        for ranges, _, _, pool in sch.groups(e):
            assert len(np.unique(pool)) == 100
            count[pool] += 1
            inside += sum(int(((pool >= lo) & (pool < hi)).sum()) for lo, hi in ranges)
    expected = draws * 100 / n
    chi2 = ((count - expected) ** 2 / expected).sum()
    assert chi2 < n + 5 * np.sqrt(2 * n), chi2                  # df = n - 1: far above this is not uniform
    assert abs(inside / (draws * 100) - 4 / 16) < 0.03           # a mega-batch holds 4 of 16 parts


OUTRE = {"policy": "outre", "parts_per_macro": 4, "memory_budget": "1500KB"}


def test_outre_trains_every_edge_once_an_epoch_in_the_macro_batch_of_an_endpoints_part(link16):
    """OUTRE's macro batches on a link store: each training edge trains once an epoch, in the macro batch holding
    its owning endpoint (u where u + v is even, else v: `distributed.edge_owner` over parts), which it loads the
    lists of on its first batch; batches hold at most B edges, the last of a macro batch may be short; the edges
    split about evenly between an edge's two endpoints' parts; negatives are drawn over the whole graph."""
    plan = make_plan(link16, TrainConfig.create(store=str(link16.path), batch_size=256, **OUTRE))
    sch = plan.schedule
    edges, n = sch.edge_batches.edges, link16.num_nodes
    home = np.where((edges[:, 0] + edges[:, 1]) % 2 == 0, edges[:, 0], edges[:, 1])
    assert np.mean(home == edges[:, 0]) == pytest.approx(0.5, abs=0.05)
    for epoch in range(2):
        groups = sch.groups(epoch)
        assert len(groups) == 4
        trained, outside = [], 0
        for step in sch.epoch(epoch):
            ranges, positions = groups[step.group]
            t = np.zeros(n, bool)
            for lo, hi in ranges:
                t[lo:hi] = True
            if step.enter_ranges:
                assert step.enter_ranges == ranges and step.data == ("adjacency",)
            u, v = step.link.edges.T
            assert t[np.where((u + v) % 2 == 0, u, v)].all() and len(u) <= 256
            assert step.visible is None
            outside += int((~t[step.link.negatives]).sum())
            trained.append(step.link.edges)
        trained = np.concatenate(trained)
        assert len(trained) == len(edges)
        assert np.array_equal(np.unique(trained, axis=0), np.unique(edges, axis=0))      # each edge once
        assert sum(len(p) for _, p in groups) == len(edges)
        assert outside > 0


def test_outre_trains_a_link_store_in_one_macro_batch_unless_asked(link16, fennel16):
    """--parts-per-macro auto: OUTRE's 20 parts a macro batch on a node store; on a link store every part, so an
    epoch is one macro batch of every training edge in random batches (a run's edges are not grouped by part);
    a number is taken as given on either, and anything else is refused with the flag's name."""
    cfg = TrainConfig.create(store=str(link16.path), batch_size=256, policy="outre", memory_budget="1500KB")
    plan = make_plan(link16, cfg)
    assert plan.options.parts_per_macro == "auto" and plan.parts_per_macro == link16.num_parts == 16
    assert len(plan.schedule.groups(0)) == 1 and len(plan.schedule.groups(0)[0][1]) == len(plan.schedule.edge_batches.edges)
    assert make_plan(link16, cfg.replace(parts_per_macro="4")).parts_per_macro == 4
    node = make_plan(fennel16, TrainConfig.create(store=str(fennel16.path), policy="outre", memory_budget="1MB"))
    assert node.parts_per_macro == 20 and node.schedule.n_per_macro == 20
    for bad in ("0", "half", "2.5"):
        with pytest.raises(UserError, match="parts_per_macro must be >= 1 or auto"):
            make_plan(link16, cfg.replace(parts_per_macro=bad))
    # the tuner tries OUTRE's macro batches of 10, 20 and 40 parts on a node store, only auto on a link store
    link_tried = candidates(link16, cfg, ["outre"])
    assert list(link_tried.knobs) == ["{}"] and list(link_tried.config) == ["outre"]
    node_tried = candidates(fennel16, node.cfg, ["outre"])
    assert [json.loads(k) for k in node_tried.knobs] == [{"parts_per_macro": k} for k in (10, 20, 40)]


COMPOSED = {"policy": "composed", "parts_per_megabatch": 4, "static_ratio": 0.02, "superbatch": 2,
            "memory_budget": "6MB"}


def test_composed_trains_every_edge_once_a_pass_in_a_mega_batch_sampled_over_the_graph(link16):
    """The composed policy's link mega-batches are HierBatching's, unrestricted: each training edge once a pass in
    the mega-batch holding its source (or its destination where the source is static), nothing read with a
    mega-batch but its parts, sampling and uniform negatives over the whole graph."""
    plan = make_plan(link16, TrainConfig.create(store=str(link16.path), batch_size=256, **COMPOSED, passes=2.0))
    sch = plan.schedule
    assert not sch.restricted and sch.negative_pool == 0
    edges, static, n = sch.edge_batches.edges, sch._static_mask, link16.num_nodes
    groups = sch.groups(0)
    trained, outside = [], 0
    for step in sch.epoch(0):
        ranges, _, outsiders, pool = groups[step.group]
        assert len(outsiders) == 0 and pool is None and step.visible is None and len(step.enter_ids) == 0
        t = np.zeros(n, bool)
        for lo, hi in ranges:
            t[lo:hi] = True
        src, dst = step.link.edges.T
        assert (t[src] | (static[src] & t[dst])).all()
        outside += int((~t[step.link.negatives]).sum())
        trained.append(step.link.edges)
    trained = np.concatenate(trained)
    assert len(trained) == 2 * len(edges) and outside > 0
    keys = np.sort(edges[:, 0] * n + edges[:, 1])
    assert (np.bincount(np.searchsorted(keys, trained[:, 0] * n + trained[:, 1]), minlength=len(edges)) == 2).all()
    assert plan.memory().get("induced", 0) == 0 and plan.group_rows() == plan._largest(plan._parts()[0], plan.n_d)


LINK_RUNS = {
    "hierbatching": {**HB, "passes": 2.0},
    "hierbatching-pool": {**HB, "negative_pool": 300},
    "hierbatching-disk": {**HB, "negative_pool": 300, "topology": "disk"},
    "hierbatching-sync": {"policy": "hierbatching", "parts_per_megabatch": 3, "static_ratio": 0.0, "passes": 1.5,
                          "pipeline": False, "memory_budget": "8MB"},
    "ginex": {"policy": "ginex", "superbatch": 2, "memory_budget": "3500KB"},
    "ginex-disk": {"policy": "ginex", "superbatch": 2, "memory_budget": "3500KB", "topology": "disk",
                   "neighbour_cache_ratio": 0.02},
    "macrobatch": {"policy": "macrobatch", "macrobatch": 2, "memory_budget": "8MB"},
    "macrobatch-disk": {"policy": "macrobatch", "macrobatch": 2, "memory_budget": "8MB", "topology": "disk",
                        "static_cache": True},
    "packed": {"policy": "packed", "memory_budget": "8MB"},
    "outre": OUTRE,
    "outre-disk": {**OUTRE, "topology": "disk", "history_ratio": 0.1, "staleness": 4, "feature_cache": "frequency"},
    "composed": COMPOSED,
    "composed-induced": {**COMPOSED, "induced": True, "history_ratio": 0.1, "staleness": 4, "memory_budget": "8MB"},
}


@pytest.mark.parametrize("name", LINK_RUNS)
def test_link_policies_read_what_simulate_counts(link16, tmp_path, name):
    """HierBatching's mega-batches (parts, then their outsiders), Ginex's Belady cache and BatchGNN's unions on a
    link store: executed feature and list reads (pages, requests, setup) equal the simulation's; the runtime holds
    what the plan declares and a mega-batch's subgraph (outsiders included) stays inside the plan's bound."""
    from oocgnn.runtime import Runtime
    from .test_executor import _assert_agree, _simulated
    cfg = _cfg(link16, tmp_path, epochs=2, batch_size=256, max_eval_nodes=200, **LINK_RUNS[name])
    run = train(cfg)
    _assert_agree(run, *_simulated(link16, cfg), exact=True)
    assert run["io"]["pages"] > 0
    if "history_ratio" in LINK_RUNS[name]:
        assert run["history_hits"] > 0                                   # OUTRE's histories prune reads
    plan = make_plan(link16, cfg)
    declared = plan.memory()
    induced = declared.pop("induced", None)
    runtime = Runtime(link16, plan)
    runtime.setup()
    assert runtime.memory() == declared
    for _, _, step in plan.steps(1):
        if step.enter_ranges and induced is not None:
            runtime.before(step, None)
            indptr, indices = runtime.sampler._subgraph
            assert plan.subgraphs() * (indptr.nbytes + indices.nbytes) <= induced
    runtime.close()


def test_hierbatching_on_a_disk_topology_trains_as_on_a_memory_one(link16, tmp_path):
    """A link mega-batch on a disk topology reads its parts' lists and then its outsiders' and pool's (one gather):
    the same samples, so the same losses and MRRs, as with every list in memory (whose run reads no list)."""
    runs = {}
    for topology in ("memory", "disk"):
        cfg = _cfg(link16, tmp_path, topology, epochs=2, batch_size=256, max_eval_nodes=200, threads=1,
                   negative_pool=300, topology=topology, **HB)
        assert make_plan(link16, cfg).topology == topology
        runs[topology] = (train(cfg), pd.read_csv(tmp_path / topology / "log.csv"))
    (mem, mem_log), (disk, disk_log) = runs["memory"], runs["disk"]
    cols = ["epoch", "step", "train_loss", "val_mrr", "test_mrr"]
    pd.testing.assert_frame_equal(mem_log[cols], disk_log[cols])
    assert disk["topology"] == "disk" and disk["topology_io"]["rows"] > 0 and mem["topology_io"]["rows"] == 0


@pytest.mark.parametrize("settings", [{"policy": "hierbatching", "parts_per_megabatch": 4, "static_ratio": 0.05},
                                      {"policy": "ginex", "superbatch": 2, "memory_budget": "600KB"},
                                      {"policy": "macrobatch", "macrobatch": 2, "memory_budget": "1MB"},
                                      {"policy": "packed", "memory_budget": "1MB"}, {"policy": "mmap"},
                                      {"policy": "outre", "parts_per_macro": 2, "memory_budget": "1MB"},
                                      {"policy": "composed", "parts_per_megabatch": 2, "memory_budget": "1MB"}],
                         ids=lambda s: s["policy"])
def test_link_policies_learn(parted_link, tmp_path, settings):
    """Each out-of-core policy that trains on a link store raises the validation MRR over 4 epochs."""
    s = train(_cfg(parted_link, tmp_path, epochs=4, eval_every=6, threads=1, **settings))
    mrr = pd.read_csv(tmp_path / "run" / "log.csv")["val_mrr"].dropna().to_numpy()
    print(f"{settings['policy']}: val MRR {mrr[0]:.3f} -> {mrr[-1]:.3f} (best {s['best_val_mrr']:.3f})")
    assert len(mrr) >= 3 and mrr[-1] > mrr[0] + 0.05, mrr


LINK_POLICIES = ["inmemory", "hierbatching", "ginex", "macrobatch", "marius", "outre", "composed"]


def test_tune_ranks_the_policies_that_train_a_link_store(link16, tmp_path):
    """On a link store the tuner predicts every candidate of the link-capable policies (the others are listed with
    why not), trains the fastest predicted policies and chooses by validation MRR; the choice trains."""
    cfg = TrainConfig.create(store=str(link16.path), memory_budget="8MB", epochs=1, batch_size=256, fanouts="5,5",
                             negatives=20, negative_chunks=4, max_eval_nodes=64, progress=False, threads=1)
    result = tune(cfg, out=tmp_path / "t", top=2, predict_steps=6, cache=tmp_path / "cache", progress=False,
                  log=lambda *a: None, policies=LINK_POLICIES)
    ranking = result["ranking"]
    assert set(ranking[ranking.fits].policy) <= set(LINK_POLICIES) and ranking[ranking.fits].policy.nunique() >= 3
    fits = ranking[ranking.fits]
    assert (fits.predicted_s.diff().dropna() >= 0).all() and (fits.predicted_s > 0).all()
    measured = ranking[ranking.measured_s.notna()]
    assert len(measured) == 2 and measured.best_val_mrr.notna().all() and measured.best_val_acc.isna().all()
    assert ranking.chosen.sum() == 1 and result["config"]["target_metric"] == "mrr"
    s = train(TrainConfig.create(**{**result["config"], "out": str(tmp_path / "chosen"), "max_steps": 2,
                                    "progress": False}))
    assert s["target_metric"] == "mrr" and s["policy"] == result["config"]["policy"]


def test_composed_draws_from_a_negative_pool_only_inside_its_mega_batches(link16):
    """Under --induced composed's link mega-batches are HierBatching's, its negative pool too (auto: --negatives x
    --negative-chunks nodes, read with each); sampling over the graph it has none, and asking for one is refused."""
    cfg = TrainConfig.create(store=str(link16.path), batch_size=256, **COMPOSED)
    assert make_plan(link16, cfg).schedule.negative_pool == 0
    induced = make_plan(link16, cfg.replace(induced=True, memory_budget="64MB"))
    assert induced.schedule.restricted and induced.schedule.negative_pool == cfg.negatives * cfg.negative_chunks
    with pytest.raises(UserError, match="--negative-pool draws negatives for mega-batches that sample inside"):
        make_plan(link16, cfg.replace(negative_pool=300))
