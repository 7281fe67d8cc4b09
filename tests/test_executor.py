"""The executor against its oracles: simulated I/O, pipelining on/off, budgets, policies learn."""
import numpy as np
import pandas as pd
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.partition import order_from_assignment, partition
from oocgnn.policies import make_policy
from oocgnn.simulate import simulate, summarize
from oocgnn.store import write_store
from oocgnn.train import train


@pytest.fixture(scope="module")
def parted(tmp_path_factory, tiny_data):
    """The tiny graph partition-ordered into 16 FENNEL parts."""
    assignment, _ = partition(tiny_data, "fennel", 16, cache_dir=False)
    order, offsets = order_from_assignment(assignment, 16)
    return write_store(tiny_data, tmp_path_factory.mktemp("parted") / "tiny16", order=order,
                       part_offsets=offsets, partitioner="fennel", progress=False)


def _cfg(store, tmp_path, **kw):
    kw = {"epochs": 1, "batch_size": 128, "max_eval_nodes": 100, "progress": False,
          "out": str(tmp_path / kw.get("policy", "run")), "memory_budget": "64MB", **kw}
    return TrainConfig(store=str(store.path), **kw)


def _simulated(store, cfg):
    policy = make_policy(store, cfg)
    feature_cache = policy.static_ids if cfg.policy == "outre" else None
    df = simulate(store, policy.schedule, cfg.fanout_list, epochs=cfg.epochs, seed=cfg.seed,
                  feature_cache=feature_cache, progress=False)
    policy.close()
    return summarize(df).sum()


@pytest.mark.parametrize("policy, kw", [
    ("hierbatching", {"parts_per_megabatch": 4, "static_ratio": 0.02, "passes": 2.0}),
    ("hierbatching", {"parts_per_megabatch": 3, "static_ratio": 0.0, "passes": 1.5, "pipeline": False}),
    ("outre", {"parts_per_macro": 4, "history_ratio": 0.0, "memory_budget": "1MB"}),
    ("outre", {"parts_per_macro": 4, "history_ratio": 0.0, "memory_budget": "200KB", "epochs": 2}),
])
def test_executed_io_equals_simulated(parted, tmp_path, policy, kw):
    """For the same seed, the bytes, pages and requests read equal the simulator's prediction."""
    cfg = _cfg(parted, tmp_path, policy=policy, **kw)
    run = train(cfg)
    executed = run["io"]
    sim = _simulated(parted, cfg)
    pages = sim["feature_pages_read"] + sim["load_feature_pages"]
    requests = sim["feature_requests"] + sim["load_feature_requests"]
    assert executed["pages"] == pages and executed["bytes_read"] == pages * 4096
    assert executed["requests"] == requests
    if policy == "hierbatching":
        assert sim["feature_pages_read"] == 0, "every sampled node is resident in a mega-batch"
        assert executed["rows"] == sim["load_feature_rows"]
    else:
        assert executed["unique_rows"] == sim["feature_rows_read"]
    per_step = pd.read_csv(f"{run['run_dir']}/steps.csv")
    assert len(per_step) == run["steps"]
    if policy == "outre":                             # every read happens inside a step
        assert per_step["pages"].sum() == executed["pages"]
    else:                                             # background loads may finish between steps
        assert per_step["pages"].sum() <= executed["pages"]


def test_background_loads_during_evaluation_still_count(parted, tmp_path, monkeypatch):
    """Evaluating while the next mega-batch loads: its reads belong to training, not to evaluation."""
    import time
    from oocgnn import policies
    read = policies._GroupLoader._read

    def slow_read(self, step, half):
        time.sleep(0.05)                              # still loading when the evaluation starts
        return read(self, step, half)

    monkeypatch.setattr(policies._GroupLoader, "_read", slow_read)
    cfg = _cfg(parted, tmp_path, policy="hierbatching", parts_per_megabatch=4, static_ratio=0.02,
               epochs=2, eval_every=1)
    sim = _simulated(parted, cfg)
    assert train(cfg)["io"]["pages"] == sim["feature_pages_read"] + sim["load_feature_pages"]


def test_pipelining_changes_time_not_training(parted, tmp_path):
    a = train(_cfg(parted, tmp_path / "a", policy="hierbatching", parts_per_megabatch=4, pipeline=True))
    b = train(_cfg(parted, tmp_path / "b", policy="hierbatching", parts_per_megabatch=4, pipeline=False))
    np.testing.assert_array_equal(a["log"]["train_loss"], b["log"]["train_loss"])
    assert a["io"]["pages"] == b["io"]["pages"]
    assert a["memory"]["feature_rows"] > b["memory"]["feature_rows"], "two buffers instead of one"


def test_hierbatching_with_all_static_and_one_part_per_group_equals_full_batches(parted, tmp_path):
    """With r_s = 1 every node is visible to every mega-batch: sampling sees the full graph."""
    s = train(_cfg(parted, tmp_path, policy="hierbatching", parts_per_megabatch=16, static_ratio=1.0,
                   static_scope="all", passes=1.0, epochs=2))
    assert s["io"]["pages"] > 0 and s["final_val_acc"] > 0.3


def test_budget_is_enforced_by_accounting(parted, tmp_path):
    with pytest.raises(UserError, match="needs .* resident .* but --memory-budget is"):
        make_policy(parted, _cfg(parted, tmp_path, policy="hierbatching", parts_per_megabatch=8,
                                 memory_budget="100KB"))


def test_unpartitioned_store_is_refused(tiny_store, tmp_path):
    for policy in ("hierbatching", "outre"):
        with pytest.raises(UserError, match="partitioned store"):
            make_policy(tiny_store, _cfg(tiny_store, tmp_path, policy=policy))


def test_outre_history_reuses_and_saves_reads(parted, tmp_path):
    kw = {"policy": "outre", "parts_per_macro": 4, "memory_budget": "1MB", "epochs": 2, "history_ratio": 0.2}
    fresh = train(_cfg(parted, tmp_path / "b", staleness=1000, **kw))
    never = train(_cfg(parted, tmp_path / "c", staleness=1, **kw))
    assert never["history_hits"] == 0 and fresh["history_hits"] > 0, "staleness 1 disables reuse"
    assert fresh["io"]["rows"] < never["io"]["rows"], "skipped sub-trees are not read"
    assert fresh["memory"]["history"] == never["memory"]["history"] > 0
    # the histories' bytes come out of the feature cache's share of the budget
    assert fresh["resident_bytes"] <= 1_000_000


@pytest.mark.slow
def test_executed_io_equals_simulated_on_small(tmp_path):
    """The same agreement on the 200K-node graph, for both out-of-core policies."""
    from oocgnn.partition import partitioned_store
    from oocgnn.synthetic import generate
    store = partitioned_store(generate("small"), tmp_path / "small", "fennel", 128, cache_dir=False)
    for policy, kw in (("hierbatching", {"parts_per_megabatch": 16}),
                       ("outre", {"history_ratio": 0.0, "memory_budget": "20MB"})):
        cfg = _cfg(store, tmp_path, policy=policy, batch_size=1024, **kw)
        executed, sim = train(cfg)["io"], _simulated(store, cfg)
        assert executed["pages"] == sim["feature_pages_read"] + sim["load_feature_pages"]
        assert executed["requests"] == sim["feature_requests"] + sim["load_feature_requests"]


def test_hb_minus_scattered_loads_agree_with_simulation(tiny_store, parted, tmp_path):
    """HB−: the same FENNEL mega-batches on the unpartitioned store are row gathers, not range reads."""
    kw = {"policy": "hierbatching", "parts_per_megabatch": 4, "passes": 1.0, "static_ratio": 0.0}
    minus = _cfg(tiny_store, tmp_path / "minus", regroup="fennel:16", **kw)
    executed, sim = train(minus)["io"], _simulated(tiny_store, minus)
    assert executed["pages"] == sim["load_feature_pages"] and sim["feature_pages_read"] == 0
    assert executed["requests"] == sim["load_feature_requests"]
    seq = train(_cfg(parted, tmp_path / "seq", **kw))["io"]
    assert executed["rows"] == seq["rows"], "the same rows are loaded"
    assert executed["requests"] > 3 * seq["requests"], "but scattered: many more requests"


def test_memory_account_counts_the_sampling_graph(parted, tmp_path):
    """The topology a policy reports is what the sampler holds: DGL's int64 CSC, not indices.bin."""
    policy = make_policy(parted, _cfg(parted, tmp_path, policy="hierbatching", parts_per_megabatch=4))
    indptr, indices, _ = parted.graph().adj_tensors("csc")
    assert policy.memory()["topology"] == indptr.numel() * indptr.element_size() + indices.numel() * 8
    index_bytes = np.dtype(parted.meta["index_dtype"]).itemsize * parted.num_edges
    assert policy.rule()["B"] == parted.indptr.nbytes + index_bytes, "App. B's B: the stored topology"
    policy.close()
