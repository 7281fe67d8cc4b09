"""The executor against its oracles: simulated I/O for every plan, memory from the plan, pipelining
on/off, budgets, and runs that see what they promise."""
import numpy as np
import torch
import pandas as pd
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.policies import POLICIES, make_plan
from oocgnn.runtime import Runtime
from oocgnn.sampler import Sampler
from oocgnn.simulate import simulate, summarize
from oocgnn.train import train

# each policy at settings that make it do its thing on the tiny store (16 FENNEL parts); variants
# reach the other paths: the topology on disk, no pipelining with fractional passes, the frequency cache
RUNS = {
    "inmemory": {},
    "mmap": {"memory_budget": "32MB"},
    "mmap-disk": {"policy": "mmap", "memory_budget": "32MB", "topology": "disk"},
    "hierbatching": {"parts_per_megabatch": 4, "static_ratio": 0.02, "passes": 2.0},
    "hierbatching-disk": {"policy": "hierbatching", "parts_per_megabatch": 4, "static_ratio": 0.02,
                          "passes": 2.0, "topology": "disk"},
    "hierbatching-sync": {"policy": "hierbatching", "parts_per_megabatch": 3, "static_ratio": 0.0,
                          "passes": 1.5, "pipeline": False, "topology": "disk"},
    "outre": {"parts_per_macro": 4, "memory_budget": "1MB", "history_ratio": 0.2, "staleness": 5},
    "outre-disk": {"policy": "outre", "parts_per_macro": 4, "memory_budget": "1MB", "history_ratio": 0.2,
                   "staleness": 5, "topology": "disk"},
    "outre-frequency": {"policy": "outre", "parts_per_macro": 4, "memory_budget": "900KB", "history_ratio": 0.1,
                        "history_by": "degree", "feature_cache": "frequency", "staleness": 1000,
                        "topology": "disk"},
    "ginex": {"superbatch": 4, "memory_budget": "3MB"},
    "ginex-disk": {"policy": "ginex", "superbatch": 3, "memory_budget": "3MB", "topology": "disk",
                   "neighbour_cache_ratio": 0.02},
    "macrobatch": {"macrobatch": 4, "memory_budget": "8MB"},
    "macrobatch-disk": {"policy": "macrobatch", "macrobatch": 3, "memory_budget": "8MB", "static_cache": True,
                        "topology": "disk"},
    "marius": {"memory_budget": "2MB"},
    "marius-beta": {"policy": "marius", "ordering": "beta", "physical_parts": 8, "buffer_parts": 3,
                    "topology": "disk"},
    "marius-dense": {"policy": "marius", "sampler": "dense", "fanouts": "5,10,15", "memory_budget": "2MB"},
    "marius-sequential-sync": {"policy": "marius", "ordering": "sequential", "buffer_parts": 5, "prefetch": False},
    # mega-batches, a Belady cache of what chunks read outside them (chunks cut at mega-batch edges), histories
    "composed": {"parts_per_megabatch": 4, "static_ratio": 0.02, "passes": 1.5, "superbatch": 3,
                 "history_ratio": 0.2, "staleness": 5, "memory_budget": "4500KB"},
    "composed-disk-sync": {"policy": "composed", "parts_per_megabatch": 3, "static_ratio": 0.0, "passes": 1.0,
                           "superbatch": 4, "pipeline": False, "topology": "disk", "history_ratio": 0.1,
                           "history_by": "degree", "staleness": 1000, "memory_budget": "3500KB"},
    "composed-induced": {"policy": "composed", "parts_per_megabatch": 4, "static_ratio": 0.02, "induced": True,
                         "history_ratio": 0.2, "staleness": 5, "topology": "disk"},
    # DiskGNN: 2 epochs packed beside the store, a hot cache of half what the budget leaves
    "packed": {"memory_budget": "8MB", "hot_share": 0.5},
    "packed-disk": {"policy": "packed", "memory_budget": "8MB", "topology": "disk",
                    "neighbour_cache_ratio": 0.02},
}


def test_runs_cover_the_registry():
    assert {kw.get("policy", name) for name, kw in RUNS.items()} == set(POLICIES)
    topologies = {}
    for name, kw in RUNS.items():
        topologies.setdefault(kw.get("policy", name), set()).add(kw.get("topology", "auto"))
    assert all("disk" in t for p, t in topologies.items() if p != "inmemory"), "each on a disk topology too"


def _cfg(store, tmp_path, **kw):
    kw = {"epochs": 2, "batch_size": 128, "max_eval_nodes": 100, "progress": False,
          "out": str(tmp_path / kw.get("policy", "run")), "memory_budget": "64MB", **kw}
    return TrainConfig.create(store=str(store.path), **kw)


def _simulated(store, cfg):
    """(per-epoch sums, setup loads) of simulating the run's plan."""
    df = simulate(store, make_plan(store, cfg), epochs=cfg.epochs, progress=False)
    return summarize(df).sum(), df.attrs["setup"]


def _assert_agree(run, sim, setup, exact):
    """Executed training and setup reads, of features and of the topology, against the simulation of
    the same plan."""
    assert run["topology_io"]["pages"] == sim["neighbour_pages_read"] + sim["load_adjacency_pages"]
    assert run["topology_io"]["requests"] == sim["neighbour_requests"] + sim["load_adjacency_requests"]
    assert run["topology_io_setup"]["pages"] == setup["load_adjacency_pages"]
    assert run["topology_io_setup"]["requests"] == setup["load_adjacency_requests"]
    pages = sim["feature_pages_read"] + sim["load_feature_pages"]
    requests = sim["feature_requests"] + sim["load_feature_requests"]
    if not exact:                                     # the page cache only saves reads
        assert 0 < run["io"]["pages"] <= pages
        return
    assert run["io"]["pages"] == pages and run["io"]["bytes_read"] == pages * 4096
    assert run["io"]["requests"] == requests
    assert run["io_setup"]["pages"] == setup["load_feature_pages"]
    assert run["io_setup"]["requests"] == setup["load_feature_requests"]
    assert run["io_setup"]["rows"] == setup["load_feature_rows"]
    assert run["history_hits"] == sim.get("history_hits", 0)


@pytest.mark.parametrize("name", RUNS)
def test_executed_io_equals_simulated(fennel16, tmp_path, name):
    """For the same seed, the pages, bytes and requests read (in training and in setup) and the
    history hits equal the simulation of the same plan; per-step reads add up to the run's."""
    cfg = _cfg(fennel16, tmp_path, **{"policy": name, **RUNS[name]})
    run = train(cfg)
    _assert_agree(run, *_simulated(fennel16, cfg), make_plan(fennel16, cfg).exact_io)
    per_step = pd.read_csv(f"{run['run_dir']}/steps.csv")
    assert len(per_step) == run["steps"]
    assert per_step["pages"].sum() <= run["io"]["pages"], "background loads may finish between steps"


@pytest.mark.parametrize("name", RUNS)
def test_memory_comes_from_the_plan(fennel16, tmp_path, name):
    """What the plan declares resident is what the runtime allocates, before anything is read; the
    subgraphs a group induces stay inside the plan's bound for them."""
    cfg = _cfg(fennel16, tmp_path, **{"policy": name, **RUNS[name]})
    plan = make_plan(fennel16, cfg)
    declared = plan.memory()
    runtime = Runtime(fennel16, plan)
    induced, buckets = declared.pop("induced", None), declared.get("buckets")
    assert runtime.io().calls == runtime.topology_io().calls == 0, "building the runtime reads nothing"
    runtime.setup()
    assert runtime.memory() == declared
    for i, (_, _, step) in enumerate(plan.steps(1)):
        if step.enter_ranges:
            runtime.before(step, None)
        if buckets is not None:                       # held per state: inside the plan's bound
            assert runtime.loader.nbytes <= buckets
        if induced is not None and step.visible is not None:
            indptr, indices = runtime.sampler._subgraph
            assert plan.subgraphs() * (indptr.nbytes + indices.nbytes) <= induced
    runtime.close()


def test_background_loads_during_evaluation_still_count(fennel16, tmp_path, monkeypatch):
    """Evaluating while the next mega-batch loads: its reads belong to training, not to evaluation."""
    import time
    from oocgnn import runtime
    read = runtime.RangeLoader._read

    def slow_read(self, step, half):
        time.sleep(0.05)                              # still loading when the evaluation starts
        return read(self, step, half)

    monkeypatch.setattr(runtime.RangeLoader, "_read", slow_read)
    cfg = _cfg(fennel16, tmp_path, policy="hierbatching", parts_per_megabatch=4, static_ratio=0.02, eval_every=1)
    sim, _ = _simulated(fennel16, cfg)
    assert train(cfg)["io"]["pages"] == sim["feature_pages_read"] + sim["load_feature_pages"]


def test_pipelining_changes_time_not_training(fennel16, tmp_path):
    a = train(_cfg(fennel16, tmp_path / "a", policy="hierbatching", parts_per_megabatch=4, pipeline=True))
    b = train(_cfg(fennel16, tmp_path / "b", policy="hierbatching", parts_per_megabatch=4, pipeline=False))
    np.testing.assert_array_equal(a["log"]["train_loss"], b["log"]["train_loss"])
    assert a["io"]["pages"] == b["io"]["pages"]
    assert a["memory"]["feature_rows"] > b["memory"]["feature_rows"], "two buffers instead of one"


def test_hierbatching_with_every_node_static_samples_the_full_graph(fennel16, tmp_path):
    """With r_s = 1 and scope all, every node is visible to every mega-batch: each batch's sample is
    the one of the same seeds on the whole graph, and training reads only the one mega-batch's load."""
    cfg = _cfg(fennel16, tmp_path, policy="hierbatching", parts_per_megabatch=16, static_ratio=1.0,
               static_scope="all", passes=1.0, epochs=1)
    plan = make_plan(fennel16, cfg)
    sampler = Sampler(fennel16.neighbour_lists(), plan.fanouts, plan.seed)
    steps = list(plan.steps(1))
    assert steps and all(len(s.visible) == fennel16.num_nodes for _, _, s in steps)
    for e, b, s in steps:
        inside, whole = sampler.sample(s.seeds, e, b, s.visible), sampler.sample(s.seeds, e, b)
        np.testing.assert_array_equal(inside.input_nodes, whole.input_nodes)
        for x, y in zip(inside.blocks, whole.blocks):
            np.testing.assert_array_equal(x.indices, y.indices)
    run = train(cfg)
    assert run["io_setup"]["rows"] == run["io"]["rows"] == fennel16.num_nodes
    assert run["io"]["calls"] == 1, "the 16 adjacent parts are one range read; no batch reads a row"


def test_budget_is_enforced_by_accounting(fennel16, tmp_path):
    """The refusal says what would fit: a smaller explicit mega-batch, or the budget the plan needs."""
    from oocgnn.policies.base import either
    with pytest.raises(UserError, match="needs .* resident .* but --memory-budget is .*; lower --parts-per-megabatch "
                                        "or give --memory-budget .* or more"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", parts_per_megabatch=8,
                                 memory_budget="100KB"))
    with pytest.raises(UserError) as e:
        make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", parts_per_megabatch=1,
                                 memory_budget="100KB"))
    need = str(e.value).split(" needs ")[1].split(" resident")[0]
    assert str(e.value).endswith(f"; give --memory-budget {need} or more") and "--parts-per-megabatch" not in str(e.value)
    assert [either(x) for x in (["a"], ["a", "b"], ["a", "b", "c"])] == ["a", "a or b", "a, b, or c"]


def test_unpartitioned_store_is_refused(tiny_store, tmp_path):
    for policy in ("hierbatching", "outre"):
        with pytest.raises(UserError, match="partitioned store"):
            make_plan(tiny_store, _cfg(tiny_store, tmp_path, policy=policy))


def test_outre_history_reuses_and_saves_reads(fennel16, tmp_path):
    kw = {"policy": "outre", "parts_per_macro": 4, "memory_budget": "1MB", "history_ratio": 0.2, "accumulate": "off"}
    fresh = train(_cfg(fennel16, tmp_path / "b", staleness=1000, **kw))
    never = train(_cfg(fennel16, tmp_path / "c", staleness=1, **kw))
    assert never["history_hits"] == 0 and fresh["history_hits"] > 0, "staleness 1 disables reuse"
    # staleness counts optimizer steps: where they accumulate mini-batches, 1 reuses within a step (same weights)
    within = train(_cfg(fennel16, tmp_path / "d", staleness=1, **{**kw, "accumulate": "on"}))
    assert within["optimizer_steps"]["per_epoch"] < within["epoch_steps"] and within["history_hits"] > 0
    assert fresh["io"]["rows"] < never["io"]["rows"], "skipped sub-trees are not read"
    assert fresh["memory"]["history"] == never["memory"]["history"] > 0
    # the histories' bytes come out of the feature cache's share of the budget
    assert fresh["resident_bytes"] <= 1_000_000


def test_executed_io_equals_simulated_on_small(tmp_path):
    """The same agreement on the 200K-node graph, for every out-of-core policy (histories included)."""
    from oocgnn.partition import partitioned_store
    from oocgnn.synthetic import generate
    store = partitioned_store(generate("small"), tmp_path / "small", "fennel", 128, cache_dir=False)
    for policy, kw in (("hierbatching", {"parts_per_megabatch": 16}),
                       ("outre", {"history_ratio": 0.05, "memory_budget": "20MB", "staleness": 50}),
                       ("ginex", {"superbatch": 8, "memory_budget": "96MB", "topology": "disk",
                                  "neighbour_cache_ratio": 0.1}),
                       ("macrobatch", {"macrobatch": 4, "memory_budget": "256MB", "topology": "disk"})):
        cfg = _cfg(store, tmp_path, policy=policy, batch_size=1024, epochs=1, **kw)
        _assert_agree(train(cfg), *_simulated(store, cfg), exact=True)


def test_hb_minus_scattered_loads_agree_with_simulation(tiny_store, fennel16, tmp_path):
    """HB−: the same FENNEL mega-batches on the unpartitioned store are row gathers, not range reads."""
    kw = {"policy": "hierbatching", "parts_per_megabatch": 4, "passes": 1.0, "static_ratio": 0.0}
    minus = _cfg(tiny_store, tmp_path / "minus", regroup="fennel:16", **kw)
    run = train(minus)
    sim, setup = _simulated(tiny_store, minus)
    _assert_agree(run, sim, setup, exact=True)
    assert sim["feature_pages_read"] == 0
    seq = train(_cfg(fennel16, tmp_path / "seq", **kw))["io"]
    assert run["io"]["rows"] == seq["rows"], "the same rows are loaded"
    assert run["io"]["requests"] > 3 * seq["requests"], "but scattered: many more requests"


def test_hierbatching_rule_uses_the_stored_topology(fennel16, tmp_path):
    """App. B's B is indptr + indices as stored (int32 here), not the sampler's int64 copy."""
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", parts_per_megabatch=4))
    index_bytes = np.dtype(fennel16.meta["index_dtype"]).itemsize * fennel16.num_edges
    assert plan.rule()["B"] == fennel16.indptr.nbytes + index_bytes


@pytest.mark.parametrize("name", ["ginex", "composed"])
def test_a_run_cut_mid_chunk_reads_what_simulate_counts_for_its_steps(fennel16, tmp_path, name):
    """--max-steps inside a chunk: the run's last chunk is cut, and simulate(steps=k) cuts it alike."""
    cfg = _cfg(fennel16, tmp_path, **{"policy": name, **RUNS[name], "max_steps": 7})
    df = simulate(fennel16, make_plan(fennel16, cfg), epochs=cfg.epochs, steps=7, progress=False)
    _assert_agree(train(cfg), summarize(df).sum(), df.attrs["setup"], exact=True)


def test_setup_rows_read_in_chunks_are_one_calls_reads(fennel16, tmp_path):
    """The setup reads a static cache a chunk at a time (never holding its rows twice), cut where the reader
    starts a request anyway: the rows land in the same slots, with the same pages and requests as one
    `read_rows` of them all (what the simulator counts), here in chunks of ~8 rows."""
    from oocgnn.direct import DirectReader
    cfg = _cfg(fennel16, tmp_path, policy="outre", history_ratio=0.0)
    plan = make_plan(fennel16, cfg)
    runtime = Runtime(fennel16, plan)
    ids = np.random.default_rng(0).permutation(fennel16.num_nodes)[:300]
    runtime.cached.read_into(ids, 5, chunk_bytes=8 * fennel16.row_stride)
    got = runtime.cached.gather(torch.from_numpy(ids)).numpy()
    with DirectReader(fennel16.path / "features.bin", fennel16.num_nodes, fennel16.feat_dim,
                      row_stride=fennel16.row_stride) as one:
        want = one.read_rows(ids)
        assert np.array_equal(got, want)
        assert np.array_equal(runtime.cached.slot[ids], 5 + np.arange(len(ids)))
        chunked = runtime.io()
        assert (chunked.pages, chunked.requests) == (one.stats.pages, one.stats.requests) and chunked.calls > 1
    runtime.close()
