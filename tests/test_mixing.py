"""The mixing statistic (`oocgnn.mixing`) against a brute-force count over the plans' step streams."""
from collections import Counter

import numpy as np
import pytest

from oocgnn.config import TrainConfig
from oocgnn.mixing import (MAX_DRIFT, MAX_EPOCH_STEPS, MIN_PARTS, WARN_EPOCHS, check, group_stats, mixing,
                           random_draw_tv)
from oocgnn.policies import HierBatchingPlan, make_plan


def _cfg(store, tmp_path, **kw):
    kw = {"epochs": 1, "batch_size": 64, "max_eval_nodes": 100, "progress": False, "out": str(tmp_path / "run"),
          "memory_budget": "64MB", **kw}
    return TrainConfig.create(store=str(store.path), **kw)


def _brute_force(store, plan, epochs=1):
    """Per group of the first epochs' steps: (training nodes, parts, TV, optimizer steps), by Python loops over
    the steps' seeds."""
    seeds, updates = {}, {}
    for e, _, step in plan.steps(epochs):
        seeds.setdefault((e, step.group), set()).update(int(s) for s in step.seeds)
        updates.setdefault((e, step.group), set()).add(step.update)
    off, labels = [int(o) for o in store.part_offsets], [int(x) for x in store.labels]
    whole = Counter(labels[i] for i in store.train_idx)
    total = sum(whole.values())
    out = []
    for g in sorted(seeds):
        nodes = seeds[g]
        parts = {next(k for k in range(len(off) - 1) if off[k] <= i < off[k + 1]) for i in nodes}
        mine = Counter(labels[i] for i in nodes)
        tv = 0.5 * sum(abs(mine[c] / len(nodes) - whole[c] / total) for c in set(whole) | set(mine))
        out.append((len(nodes), len(parts), tv, len(updates[g])))
    return out


@pytest.mark.parametrize("policy,kw", [
    ("hierbatching", {"parts_per_megabatch": 3}), ("hierbatching", {"parts_per_megabatch": 5, "passes": 1.5}),
    ("outre", {"parts_per_macro": 4, "history_ratio": 0.0}), ("composed", {"parts_per_megabatch": 4}),
    ("marius", {"physical_parts": 8, "buffer_parts": 4}), ("inmemory", {})])
def test_group_stats_match_a_brute_force_count_of_the_step_stream(by_label, tmp_path, policy, kw):
    plan = make_plan(by_label, _cfg(by_label, tmp_path, policy=policy, **kw))
    got = group_stats(plan, 2)
    want = _brute_force(by_label, plan, 2)
    assert len(got) == len(want)
    assert got["train_nodes"].tolist() == [w[0] for w in want]
    assert got["parts"].tolist() == [w[1] for w in want]
    assert np.allclose(got["tv"], [w[2] for w in want])
    whole = np.bincount(np.asarray(by_label.labels)[by_label.train_idx])
    assert np.allclose(got["tv_random"], [random_draw_tv(w[0], whole) for w in want])
    m = mixing(plan, 2)
    assert mixing(plan) == mixing(plan, WARN_EPOCHS)
    w = np.array([x[0] for x in want], float)
    assert m["tv_mean"] == pytest.approx(np.average([x[2] for x in want], weights=w), abs=1e-4)
    assert m["tv_max"] == pytest.approx(max(x[2] for x in want), abs=1e-4)
    assert m["parts_min"] == min(x[1] for x in want)
    assert got["steps"].tolist() == [w[3] for w in want]
    steps = np.array([x[3] for x in want], float)        # a bias repeats per step, a random draw's deviation not
    drift = np.array([x[2] for x in want]) * steps - got["tv_random"].to_numpy() * np.sqrt(steps)
    assert m["drift"] == pytest.approx(np.average(drift, weights=w), abs=1e-4)
    assert m["steps_per_epoch"] == pytest.approx(steps.sum() / 2, abs=0.01)
    if policy == "inmemory":               # one group: the training set itself
        assert len(want) == 2 and m["groups"] == 1 and m["tv_mean"] == 0 and m["warning"] == ""


def test_a_random_draws_distance_is_the_mean_over_every_draw():
    """random_draw_tv against the expectation over all 3^6 label sequences of 6 draws (with replacement)."""
    from itertools import product
    hist = np.array([5.0, 3.0, 2.0])
    q = hist / hist.sum()
    want = 0.0
    for seq in product(range(3), repeat=6):
        counts = np.bincount(seq, minlength=3)
        want += np.prod(q[list(seq)]) * 0.5 * np.abs(counts / 6 - q).sum()
    assert random_draw_tv(6, hist) == pytest.approx(want, rel=1e-12)
    assert random_draw_tv(10_000, hist) < 0.01 and random_draw_tv(0, hist) == 0.0
    assert random_draw_tv(7, [0, 4, 0]) == 0.0                      # one class: every draw is exact


def test_the_warning_fires_on_drift_and_says_when_more_parts_cannot_help():
    """It fires when groups are farther from the training set than random draws of their size, over
    enough consecutive steps (drift above MAX_DRIFT), whatever their parts or raw distance; groups whose
    few training nodes each come from their own part are told that more parts cannot mix them; groups of
    too few parts how many parts give N_d = MIN_PARTS at this budget's share; groups of enough parts but
    far labels, twice the parts."""
    from types import SimpleNamespace
    plan = SimpleNamespace(name="hierbatching", num_groupable=128, n_d=8)
    sparse = {"groups": 8, "train_mean": 15.0, "parts_mean": 15.1, "parts_min": 12, "tv_mean": 0.47,
              "tv_max": 0.6, "tv_random": 0.24, "steps_per_group": 2.0, "drift": 0.46}
    line = check(sparse, plan)
    assert "cannot mix it further" in line and "0.24" in line and "--parts" not in line and "--accumulate on" in line
    assert check({**sparse, "drift": MAX_DRIFT}, plan) == ""        # as far as random draws: quiet
    assert check({**sparse, "groups": 1}, plan) == ""
    # the same drift in epochs of many steps (measured on `small`: no loss at 0.61-0.92 over 87-512 steps an epoch)
    assert check({**sparse, "steps_per_epoch": MAX_EPOCH_STEPS + 1}, plan) == ""
    assert "in epochs of 64 steps" in check({**sparse, "steps_per_epoch": MAX_EPOCH_STEPS}, plan)
    clustered = {**sparse, "train_mean": 200.0, "parts_mean": 4.0}
    assert f"prepare --parts {128 * MIN_PARTS // 8} or more" in check(clustered, plan)
    far = {**clustered, "parts_mean": 20.0}                         # enough parts, far labels: twice as many
    assert "prepare --parts 256 or more" in check(far, plan)
    # labelled nodes in few of the parts (n_d 19 of 128: MIN_PARTS would need 108 < 128): never advise fewer
    # parts than the store has (cora's given split was told 108)
    wide = SimpleNamespace(name="hierbatching", num_groupable=128, n_d=19)
    line = check(clustered, wide)
    assert "prepare --parts 256 or more" in line and "108" not in line


def test_groups_of_more_parts_mix_better(by_label, tmp_path):
    """On a store ordered by label, larger mega-batches are closer to the training set, and the warning
    follows the thresholds (a step per mini-batch: accumulated steps would mix the pairs)."""
    small, large = (mixing(make_plan(by_label, _cfg(by_label, tmp_path, policy="hierbatching", accumulate="off",
                                                    parts_per_megabatch=k))) for k in (2, 16))
    assert small["tv_mean"] > large["tv_mean"] and small["drift"] > MAX_DRIFT
    assert small["parts_mean"] < MIN_PARTS and "--parts-per-megabatch" in small["warning"]
    # a given N_d stays N_d parts whatever K is: the advice is a larger N_d, never more (smaller) parts
    assert "a larger --parts-per-megabatch (now 2)" in small["warning"] and "prepare --parts" not in small["warning"]
    composed = mixing(make_plan(by_label, _cfg(by_label, tmp_path, policy="composed", accumulate="off",
                                               parts_per_megabatch=2)))
    assert "a larger --parts-per-megabatch (now 2)" in composed["warning"] and "prepare" not in composed["warning"]
    assert large["groups"] == 1 and large["warning"] == ""



def test_outre_is_told_more_parts_per_macro_batch_never_more_parts(by_label, tmp_path):
    """A macro batch is --parts-per-macro parts whatever K is, so more (smaller) parts would shrink it: OUTRE's
    advice names a larger --parts-per-macro, and no K."""
    plan = make_plan(by_label, _cfg(by_label, tmp_path, policy="outre", parts_per_macro=2, history_ratio=0.0,
                                    accumulate="off"))
    m = mixing(plan)
    assert m["drift"] > MAX_DRIFT
    assert "--parts-per-macro (now 2; 4 halves" in m["warning"] and "prepare --parts" not in m["warning"]


def test_marius_is_told_its_buffer_and_partitions(by_label, tmp_path):
    """MariusGNN's advice names its buffer (c of p) and a p that doubles the partitions a state mixes."""
    plan = make_plan(by_label, _cfg(by_label, tmp_path, policy="marius", physical_parts=8, buffer_parts=2,
                                    accumulate="off", batch_size=16))
    m = mixing(plan)
    assert m["drift"] > MAX_DRIFT, m
    assert "a larger --buffer-parts (now 2 of 8) or more, smaller partitions (--physical-parts 16)" in m["warning"]


def _train_cli(store, tmp_path, capsys, *flags):
    from oocgnn.cli import main
    assert main(["train", str(store.path), "--policy", "hierbatching", "--epochs", "1", "--max-steps", "2",
                 "--batch-size", "64", "--max-eval-nodes", "50", "--no-progress", "--out", str(tmp_path / "run"),
                 "--force", *flags]) == 0
    return capsys.readouterr()


def test_the_warning_fires_on_16_parts_in_pairs_and_not_with_the_defaults(fennel16, by_label, tmp_path, capsys):
    import json
    bad = _train_cli(by_label, tmp_path, capsys, "--parts-per-megabatch", "2", "--accumulate", "off")
    lines = [line for line in bad.err.splitlines() if "mix poorly" in line]
    assert len(lines) == 1 and lines[0].startswith("oocgnn: warning: hierbatching") and "--parts-per-megabatch" in lines[0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mixing"]["parts_mean"] == 2 and summary["mixing"]["warning"]
    assert "mixing: 8 groups an epoch of 2.0 parts" in bad.out and "random groups of as many training nodes" in bad.out
    good = _train_cli(fennel16, tmp_path, capsys)
    assert "mix poorly" not in good.err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["parts_per_megabatch"] == 16 and summary["mixing"]["groups"] == 1
    # the same pairs with label-balanced steps (auto is on: their groups hold fewer labelled nodes than a batch):
    # the mixing is each optimizer step's, which sees as many labelled nodes as a batch
    _train_cli(fennel16, tmp_path, capsys, "--parts-per-megabatch", "2", "--accumulate", "auto")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["optimizer_steps"]["accumulate"] and summary["mixing"]["unit"] == "optimizer step"
    assert summary["optimizer_steps"]["target"] == 64
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", parts_per_megabatch=2, accumulate="auto",
                                    max_eval_nodes=50, memory_budget=TrainConfig.create(store=".").memory_budget))
    assert mixing(plan) == summary["mixing"]
    steps = group_stats(plan, WARN_EPOCHS)
    for _, epoch in steps.groupby("epoch"):       # a step sees a batch of labelled nodes, but before a mini-batch
        n = epoch["train_nodes"].to_numpy()        # of a batch or more (a step of its own) or at the epoch's end
        assert all(n[i] >= 64 or n[i + 1] >= 64 for i in range(len(n) - 1)) and n.sum() % len(fennel16.train_idx) == 0


def test_the_default_mega_batch_is_the_most_the_budget_holds(fennel16, tmp_path):
    """N_d = 0 (the default): the largest N_d whose plan fits beside its static rows, evened out over as few
    mega-batches."""
    for budget in ("1MB", "2MB", "3MB"):
        plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", memory_budget=budget))
        fits = [k for k in range(1, 17) if HierBatchingPlan(fennel16, _cfg(     # unchecked: it may not fit
            fennel16, tmp_path, policy="hierbatching", memory_budget=budget, parts_per_megabatch=k,
            static_ratio=str(plan.static_ratio), topology=plan.topology)).resident_bytes() <= plan.budget]
        most = max(fits)
        assert plan.n_d == -(-16 // -(-16 // most)) and plan.n_d in fits, (budget, fits, plan.n_d)
        assert plan.schedule.parts_per_megabatch == plan.n_d


def test_prepare_chooses_parts_that_a_mega_batch_holds_many_of():
    from oocgnn.mixing import MAX_PART_NODES, MIN_PART_NODES, TARGET_PARTS, default_parts
    assert default_parts(2708, 10556, 1433) == TARGET_PARTS                 # cora: all of it fits 256MB
    assert default_parts(1000, 4000, 16) == 1000 // MIN_PART_NODES          # parts no smaller than that
    n, e, d, budget = 10_000_000, 200_000_000, 128, 256 * 10**6
    k = default_parts(n, e, d, budget)
    a, b = n * 512, (n + 1) * 8 + e * 4                                     # 128 floats: a 512-byte stride
    r_d = budget / (2 * (a + b)) - 0.01                                     # the paper's r_s (default_parts')
    assert k >= n / MAX_PART_NODES and round(r_d * k) >= TARGET_PARTS


def test_simulate_carries_the_plans_mixing(by_label, tmp_path):
    from oocgnn.simulate import simulate
    plan = make_plan(by_label, _cfg(by_label, tmp_path, policy="hierbatching", parts_per_megabatch=3))
    assert simulate(by_label, plan, steps=2, progress=False).attrs["mixing"] == mixing(plan)


def _fits(store, tmp_path, budget, static_ratio) -> bool:
    from oocgnn.errors import UserError
    try:
        make_plan(store, _cfg(store, tmp_path, policy="hierbatching", memory_budget=f"{budget}B",
                              static_ratio=static_ratio))
        return True
    except UserError:
        return False


def test_the_default_static_ratio_is_fifteen_percent_capped_at_a_share_of_the_budget(fennel16, tmp_path):
    """--static-ratio auto: r_s = 0.15 where the budget holds a third of the features or more, else
    STATIC_SHARE of the budget's share (so the static rows never take more than that of the budget);
    a number given on the command line is that number."""
    from oocgnn.errors import UserError
    from oocgnn.policies import STATIC_SHARE, static_ratio_for
    a = fennel16.num_nodes * fennel16.row_stride
    assert static_ratio_for(a // 3 + 3, a) == 0.15 and static_ratio_for(a, a) == 0.15
    assert static_ratio_for(a // 20, a) == pytest.approx(STATIC_SHARE / 20, rel=1e-3)
    for budget in (a, 2 * a):             # the tiny graph's overheads: at a / 2 r_s gives way (below)
        plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", memory_budget=f"{budget}B"))
        r_s = static_ratio_for(plan.budget, a)
        assert plan.static_ratio == r_s and plan.setup_rows() == int(r_s * fennel16.num_nodes)
        assert len(plan.schedule.static_ids) == plan.setup_rows() and plan.rule()["r_s"] == r_s
        assert plan.setup_rows() * fennel16.row_stride <= STATIC_SHARE * plan.budget
    # a budget that holds no mega-batch beside r_s auto: the static rows give way (halved until one fits);
    # the same r_s given is refused
    tight = next(b for b in range(a, a // 8, -(a // 64)) if not _fits(fennel16, tmp_path, b, str(static_ratio_for(b, a))))
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", memory_budget=f"{tight}B"))
    assert 0 < plan.static_ratio < static_ratio_for(tight, a) and plan.n_d >= 1
    assert not _fits(fennel16, tmp_path, tight, str(2 * plan.static_ratio)), "the largest halving that fits"
    pairs = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", memory_budget=f"{tight}B",
                                     parts_per_megabatch=plan.n_d))          # N_d given: the same way
    assert pairs.static_ratio == plan.static_ratio
    given = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="hierbatching", static_ratio="0.02"))
    assert given.static_ratio == 0.02 and given.setup_rows() == int(0.02 * fennel16.num_nodes)
    with pytest.raises(UserError, match="static_ratio is a fraction"):
        _cfg(fennel16, tmp_path, policy="hierbatching", static_ratio="many")


def test_the_mixing_check_leaves_no_int64_label_copy_resident(by_label, tmp_path):
    """A run's mixing check reads the labels without caching the store's int64 copy (224 MB on xlarge)."""
    from oocgnn.store import open_store
    store = open_store(by_label.path)
    mixing(make_plan(store, _cfg(store, tmp_path, policy="hierbatching", parts_per_megabatch=4)))
    assert "labels" not in store.__dict__
