"""The mixing statistic (`oocgnn.mixing`) against a brute-force count over the plans' step streams."""
from collections import Counter

import numpy as np
import pytest

from oocgnn.config import TrainConfig
from oocgnn.mixing import MAX_TV, MIN_PARTS, group_stats, mixing
from oocgnn.policies import make_plan


@pytest.fixture(scope="module")
def by_label(tiny_data, tmp_path_factory):
    """The tiny graph in an order that follows the labels (parts of few classes, like METIS's on a
    homophilous graph), cut into 16 uneven parts."""
    from oocgnn.store import write_store
    n = tiny_data.num_nodes
    noise = np.random.default_rng(3).random(n)
    order = np.lexsort((noise, np.asarray(tiny_data.labels))).astype(np.int64)
    cuts = np.sort(np.random.default_rng(4).choice(np.arange(1, n), 15, replace=False))
    return write_store(tiny_data, tmp_path_factory.mktemp("stores") / "bylabel", order=order,
                       part_offsets=np.concatenate([[0], cuts, [n]]), progress=False)


def _cfg(store, tmp_path, **kw):
    kw = {"epochs": 1, "batch_size": 64, "max_eval_nodes": 100, "progress": False, "out": str(tmp_path / "run"),
          "memory_budget": "64MB", **kw}
    return TrainConfig.create(store=str(store.path), **kw)


def _brute_force(store, plan):
    """Per group of epoch 0's steps: (training nodes, parts, TV), by Python loops over the steps' seeds."""
    seeds = {}
    for e, _, step in plan.steps(1):
        seeds.setdefault(step.group, set()).update(int(s) for s in step.seeds)
    off, labels = [int(o) for o in store.part_offsets], [int(x) for x in store.labels]
    whole = Counter(labels[i] for i in store.train_idx)
    total = sum(whole.values())
    out = []
    for g in sorted(seeds):
        nodes = seeds[g]
        parts = {next(k for k in range(len(off) - 1) if off[k] <= i < off[k + 1]) for i in nodes}
        mine = Counter(labels[i] for i in nodes)
        tv = 0.5 * sum(abs(mine[c] / len(nodes) - whole[c] / total) for c in set(whole) | set(mine))
        out.append((len(nodes), len(parts), tv))
    return out


@pytest.mark.parametrize("policy,kw", [
    ("hierbatching", {"parts_per_megabatch": 3}), ("hierbatching", {"parts_per_megabatch": 5, "passes": 1.5}),
    ("outre", {"parts_per_macro": 4, "history_ratio": 0.0}), ("composed", {"parts_per_megabatch": 4}),
    ("marius", {"physical_parts": 8, "buffer_parts": 4}), ("inmemory", {})])
def test_group_stats_match_a_brute_force_count_of_the_step_stream(by_label, tmp_path, policy, kw):
    plan = make_plan(by_label, _cfg(by_label, tmp_path, policy=policy, **kw))
    got = group_stats(plan)
    want = _brute_force(by_label, plan)
    assert len(got) == len(want)
    assert got["train_nodes"].tolist() == [w[0] for w in want]
    assert got["parts"].tolist() == [w[1] for w in want]
    assert np.allclose(got["tv"], [w[2] for w in want])
    m = mixing(plan)
    w = np.array([x[0] for x in want], float)
    assert m["tv_mean"] == pytest.approx(np.average([x[2] for x in want], weights=w), abs=1e-4)
    assert m["tv_max"] == pytest.approx(max(x[2] for x in want), abs=1e-4)
    assert m["parts_min"] == min(x[1] for x in want)
    if policy == "inmemory":               # one group: the training set itself
        assert len(want) == 1 and m["tv_mean"] == 0 and m["warning"] == ""


def test_groups_of_more_parts_mix_better(by_label, tmp_path):
    """On a store ordered by label, larger mega-batches are closer to the training set, and the warning
    follows the thresholds."""
    small, large = (mixing(make_plan(by_label, _cfg(by_label, tmp_path, policy="hierbatching",
                                                    parts_per_megabatch=k))) for k in (2, 16))
    assert small["tv_mean"] > large["tv_mean"]
    assert small["parts_mean"] < MIN_PARTS and "--parts-per-megabatch" in small["warning"]
    assert large["groups"] == 1 and large["warning"] == ""
    assert (large["tv_mean"] > MAX_TV) is False
