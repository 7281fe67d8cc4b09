"""The cost model's parts against hand computations: the disk's linear model, the calibration's fit and
cache, phases and the overlap rule, and the I/O a prediction charges against the simulator's count."""
import json

import numpy as np
import pandas as pd
import pytest

from oocgnn import costmodel, disk
from oocgnn.config import TrainConfig
from oocgnn.costmodel import StepCosts
from oocgnn.disk import DiskRates
from oocgnn.errors import UserError
from oocgnn.io import PAGE
from oocgnn.policies import make_plan
from oocgnn.simulate import simulate

RATES = DiskRates(seq_bytes_s=1e9, iops=50_000, iops_qd1=10_000)
FREE_CPU = StepCosts(0.0, 0.0, 0.0)


def _cfg(store, **kw):
    return TrainConfig.create(store=str(store.path), batch_size=64, fanouts="5,5", progress=False,
                              max_eval_nodes=64, **kw)


def test_disk_seconds_is_latency_plus_bytes():
    lat = 1 / 50_000 - PAGE / 1e9
    assert RATES.seconds(10, 2) == pytest.approx(2 * lat + 10 * PAGE / 1e9)
    assert RATES.seconds(1, 1) == pytest.approx(1 / 50_000)           # one page: exactly the random rate
    assert RATES.seconds(1, 1, depth="qd1") == pytest.approx(1 / 10_000)
    np.testing.assert_allclose(RATES.seconds(np.array([0, 4]), np.array([0, 4])), [0, 4 / 50_000])


def test_measure_disk_is_cached_per_device(fennel16, tmp_path, monkeypatch):
    first = disk.measure_disk(fennel16, repeats=1, random_reads=256, seq_bytes=1 << 20, cache=tmp_path)
    assert first.seq_bytes_s > 0 and first.iops > 0 and first.iops_qd1 > 0
    saved = json.loads((tmp_path / "disk-rates.json").read_text())
    assert saved[first.device]["iops"] == first.iops
    monkeypatch.setattr(type(fennel16), "reader", lambda *a, **k: pytest.fail("measured again"))
    assert disk.measure_disk(fennel16, cache=tmp_path) == first


def test_fit_recovers_step_and_unit_costs():
    units = np.repeat([1000.0, 4000.0], 21) + np.tile(np.arange(21) * 10.0, 2)
    runs = np.repeat([0, 1], 21)
    seconds = 0.002 + 3e-7 * units
    assert costmodel._fit(units, seconds, runs) == pytest.approx((0.002, 3e-7))
    slowed = seconds.copy()
    slowed[[3, 5, 25, 30]] *= 5                              # steps the machine's load slowed
    assert costmodel._fit(units, slowed, runs) == pytest.approx((0.002, 3e-7), rel=0.01)
    assert costmodel._fit([1000, 1000], [1.0, 1.0], [0, 0]) == (0.0, pytest.approx(1e-3))   # one run: per unit
    assert costmodel._fit([1000, 4000], [1.0, 0.1], [0, 1]) == (pytest.approx(0.55), 0.0)    # per unit < 0
    assert costmodel._fit([1000, 4000], [0.1, 1.0], [0, 1]) == (0.0, pytest.approx(1.1 / 5000))   # constant < 0


def test_the_optimizers_step_is_charged_per_optimizer_step(fennel16):
    """Accumulated steps (`--accumulate on`) take the optimiser's step once per optimizer step, not per
    mini-batch: the compute predicted differs by exactly the steps saved; the simulator's `update` column is
    the plan's."""
    cfg = _cfg(fennel16, policy="hierbatching", memory_budget="3MB", parts_per_megabatch=2)
    costs = StepCosts(0.0, 0.0, 0.0, compute_step_s=1e-3, optimizer_step_s=4e-4)
    got = {}
    for acc in ("off", "on"):
        plan = make_plan(fennel16, cfg.replace(accumulate=acc))
        df = simulate(fennel16, plan, epochs=1, progress=False)
        assert list(df["update"]) == [step.update for _, _, step in plan.steps(1)]
        got[acc] = (costmodel.predict(fennel16, plan, RATES, costs, df=df)["compute"], len(df), df["update"].nunique())
    (off, batches, updates_off), (on, _, updates_on) = got["off"], got["on"]
    assert updates_off == batches > updates_on > 1
    assert off == pytest.approx(batches * 1e-3) and off - on == pytest.approx((batches - updates_on) * 4e-4)
    assert StepCosts(0.0, 0.0, 0.0, compute_step_s=1e-4, optimizer_step_s=4e-4).batch_seconds(df)["compute"].min() >= 0


def test_calibration_measures_the_optimizers_step(fennel16):
    s = costmodel._calibrate_optimizer_step(fennel16, _cfg(fennel16, hidden=64), repeats=3)
    assert 0 < s < 1


def test_batch_seconds_adds_the_constant(fennel16):
    df = simulate(fennel16, make_plan(fennel16, _cfg(fennel16)), epochs=1, progress=False)
    c = StepCosts(1e-6, 2e-6, 3e-6, 0.01, 0.02, 0.03)
    s = c.batch_seconds(df)
    expanded = df["unique_l0"] + df["unique_l1"]              # two layers: the output and middle nodes
    np.testing.assert_allclose(s["sample"], 0.01 + 1e-6 * expanded)
    np.testing.assert_allclose(s["compute"], 0.03 + 3e-6 * df["input_nodes"])


def test_calibrate_is_cached_and_keyed_by_model(fennel16, tmp_path):
    cfg = _cfg(fennel16, hidden=16)
    costs = costmodel.calibrate(fennel16, cfg, steps=4, cache=tmp_path)
    assert costs.steps == 8 and min(costs.sample_s, costs.gather_s, costs.compute_s) >= 0
    assert costs.compute_step_s + costs.compute_s > 0
    # the loader thread's processor time per row and per induced node: charged, and less than a
    # millisecond each (the disk's wait is not in it)
    assert 0 < costs.load_row_s < 1e-3 and 0 < costs.subgraph_s < 1e-3 and 0 < costs.slot_row_s < 1e-3
    assert costmodel.calibrate(fennel16, cfg, cache=tmp_path) == costs           # cached: not re-run
    assert len(json.loads((tmp_path / "calibration.json").read_text())) == 2     # version + one key
    assert costmodel._calibration_key(fennel16, cfg.replace(hidden=32)) != costs.key


@pytest.mark.parametrize("policy, kw", [("outre", {"history_ratio": 0.0, "memory_budget": "400KB"}), ("hierbatching", {"parts_per_megabatch": 4, "memory_budget": "3MB"}),
                                        ("ginex", {"superbatch": 4, "memory_budget": "3MB"}),
                                        ("macrobatch", {"macrobatch": 2, "memory_budget": "6MB"})])
def test_prediction_charges_the_simulated_io(fennel16, policy, kw):
    """With free CPU, a prediction is the simulator's pages and requests at the disk's rates, overlapped as
    the plan pipelines: never more than their sum, never less than the foreground's."""
    plan = make_plan(fennel16, _cfg(fennel16, policy=policy, **kw))
    df = simulate(fennel16, plan, epochs=1, progress=False)
    p = costmodel.predict(fennel16, plan, RATES, FREE_CPU, df=df)
    read = RATES.seconds(df.feature_pages_read, df.feature_requests).sum() + \
        RATES.seconds(df.neighbour_pages_read, df.neighbour_requests).sum()
    load = RATES.seconds(df.load_pages, df.load_feature_requests + df.load_adjacency_requests).sum()
    assert p["read"] == pytest.approx(read) and p["load"] == pytest.approx(load)
    assert p["disk_bytes"] == (df.feature_pages_read.sum() + df.neighbour_pages_read.sum() + df.load_pages.sum()) * PAGE
    assert p["fg"] + p["bg"] == pytest.approx(read + load)
    assert max(p["fg"], p["bg"]) - 1e-12 <= p["seconds"] <= read + load + 1e-12
    if not (plan.lookahead or plan.pipeline):
        assert p["seconds"] == pytest.approx(read + load)
    assert p["steps"] == len(df) == p["epoch_steps"]
    # the steady epoch hides the first load behind the previous epoch's end: never longer than a cold start
    assert max(p["fg"], p["bg"]) - 1e-12 <= p["epoch_s"] <= p["seconds"] + 1e-12
    if not (plan.lookahead or plan.pipeline):
        assert p["epoch_s"] == pytest.approx(p["seconds"])


def test_overlap_rule_by_hand(fennel16):
    """bg[0] + sum max(fg[i], bg[i+1]) on a pipelined plan's phases, computed here from the frame."""
    plan = make_plan(fennel16, _cfg(fennel16, policy="hierbatching", parts_per_megabatch=4, memory_budget="3MB"))
    df = simulate(fennel16, plan, epochs=1, progress=False)
    costs = StepCosts(1e-6, 1e-6, 5e-6, 1e-3, 0.0, 2e-3)
    p = costmodel.predict(fennel16, plan, RATES, costs, df=df)
    ph = costmodel.phases(plan, df)
    assert ph.max() + 1 == df.group.nunique() == p["phases"]      # a phase per mega-batch loaded
    cpu = costs.batch_seconds(df)
    fg = pd.Series(cpu["sample"] + cpu["gather"] + cpu["compute"]
                   + RATES.seconds(df.feature_pages_read, df.feature_requests)
                   + RATES.seconds(df.neighbour_pages_read, df.neighbour_requests)).groupby(ph).sum().to_numpy()
    bg = pd.Series(RATES.seconds(df.load_pages, df.load_feature_requests + df.load_adjacency_requests)) \
        .groupby(ph).sum().to_numpy()
    want = bg[0] + sum(max(fg[i], bg[i + 1] if i + 1 < len(bg) else 0.0) for i in range(len(fg)))
    assert p["seconds"] == pytest.approx(want)
    # in the steady state the pipeline wraps around: the first group loads during the last one's training
    assert p["epoch_s"] == pytest.approx(sum(max(fg[i], bg[(i + 1) % len(bg)]) for i in range(len(fg))))
    assert p["first_phase_steps"] == int((ph == 0).sum())
    # a window of the epoch: its phases after the first, at their rate
    k = int(np.searchsorted(ph, 3))                               # the first three phases
    w = costmodel.predict(fennel16, plan, RATES, costs, steps=k)
    rest = sum(max(fg[i], bg[i + 1] if i < 2 else 0.0) for i in (1, 2))
    assert w["epoch_s"] == pytest.approx(rest * len(df) / (k - p["first_phase_steps"]))


def test_steps_extrapolate_to_an_epoch(fennel16):
    plan = make_plan(fennel16, _cfg(fennel16, policy="outre", history_ratio=0.0, memory_budget="400KB"))
    full = costmodel.predict(fennel16, plan, RATES, StepCosts(1e-6, 1e-6, 1e-6, 1e-3, 1e-3, 1e-3))
    part = costmodel.predict(fennel16, plan, RATES, StepCosts(1e-6, 1e-6, 1e-6, 1e-3, 1e-3, 1e-3), steps=3)
    assert part["steps"] == 3 and part["epoch_steps"] == full["epoch_steps"] == full["steps"] > 3
    assert part["epoch_s"] == pytest.approx(part["seconds"] * full["steps"] / 3)


def test_check_prediction():
    c = costmodel.check_prediction({"epoch_s": 1.1}, 1.0)
    assert c["within"] and c["ratio"] == pytest.approx(1.1)
    assert not costmodel.check_prediction({"epoch_s": 1.3}, 1.0)["within"]
    with pytest.raises(UserError):
        costmodel.check_prediction({"epoch_s": 1.0}, 0.0)


def test_background_cpu_takes_the_cores_of_a_cpu_model(fennel16):
    """A pipelined group's copy and subgraph (on its visible nodes) run beside training, but on a CPU they take
    from its cores: the foreground pays them divided by the cores the step keeps busy (the disk time of the
    load stays hidden)."""
    plan = make_plan(fennel16, _cfg(fennel16, policy="hierbatching", parts_per_megabatch=4, memory_budget="3MB",
                                    device="cpu"))
    df = simulate(fennel16, plan, epochs=1, progress=False)
    costs = StepCosts(0.0, 0.0, 0.0, load_row_s=1e-6, subgraph_s=1e-7)
    p = costmodel.predict(fennel16, plan, RATES, costs, df=df)
    starts = np.r_[True, df.group.to_numpy()[1:] != df.group.to_numpy()[:-1]]
    want = 1e-6 * df.load_feature_rows.sum() + 1e-7 * df.visible_nodes[starts].sum()
    assert want > 0 and p["load_cpu"] == pytest.approx(want)
    free = costmodel.predict(fennel16, plan, RATES, FREE_CPU, df=df)
    cores = costmodel._model_cores(plan.cfg)
    assert p["fg"] == pytest.approx(free["fg"] + want / cores) and p["bg"] == pytest.approx(free["bg"] + want)
    one = costmodel.predict(fennel16, make_plan(fennel16, plan.cfg.replace(threads=1)), RATES, costs, df=df)
    assert one["fg"] == pytest.approx(free["fg"] + want), "one thread: the step pays all of it"


def test_a_partition_buffer_pays_its_subgraph_per_edge_of_its_buckets(fennel16):
    """MariusGNN builds a state's subgraph from the edge buckets among its partitions, not by inducing it
    from adjacency lists: the charge is per edge with both ends in the state (counted here on the store's
    own lists), at each state's first batch; its loaded rows at `slot_row_s` (whole partitions copied
    into slots), not HierBatching's `load_row_s`."""
    plan = make_plan(fennel16, _cfg(fennel16, policy="marius", buffer_parts=4, physical_parts=8,
                                    memory_budget="4MB", device="cpu"))
    df = simulate(fennel16, plan, epochs=1, progress=False)
    costs = StepCosts(0.0, 0.0, 0.0, load_row_s=1.0, subgraph_s=1.0, bucket_edge_s=1e-7, slot_row_s=1e-6)
    p = costmodel.predict(fennel16, plan, RATES, costs, df=df)
    indptr, indices = np.asarray(fennel16.indptr), np.asarray(fennel16.indices)
    bounds = plan.schedule.buckets.bounds
    src = np.repeat(np.arange(fennel16.num_nodes), np.diff(indptr))
    part_src, part_dst = (np.searchsorted(bounds, x, side="right") - 1 for x in (src, indices))
    want = 1e-6 * df.load_feature_rows.sum()
    starts = np.r_[True, df.group.to_numpy()[1:] != df.group.to_numpy()[:-1]]
    for i, (_, _, step) in enumerate(plan.schedule.steps(1)):
        if starts[i]:
            state = list(step.buffer)
            want += 1e-7 * int((np.isin(part_src, state) & np.isin(part_dst, state)).sum())
    assert starts.sum() > 1 and p["load_cpu"] == pytest.approx(want)


def test_bucket_calibration_is_a_small_positive_cost(fennel16):
    assert 0 < costmodel._calibrate_buckets(fennel16) < 1e-5


def test_slot_calibration_is_a_small_positive_cost_per_row(fennel16):
    """A partition read whole into a slot: the loader's processor time per row, beyond the disk's wait."""
    assert 0 < costmodel._calibrate_slot_rows(fennel16) < 1e-4


def test_compute_unit_is_the_one_that_explains_the_runs():
    """Two in-memory runs cannot tell expanded nodes from input rows apart (both scale with the batch);
    a grouped run, with far fewer rows per expanded node, can: the fit keeps the unit that explains all."""
    runs = np.repeat(["b", "b4", "grouped"], 5)
    expanded = np.repeat([10_000.0, 2_600.0, 5_400.0], 5)
    rows = np.repeat([57_000.0, 15_000.0, 14_000.0], 5)
    for truth, x in (("expanded", expanded), ("rows", rows)):
        seconds = 0.01 + 6e-6 * x
        c0, c1, unit = costmodel._fit_unit({"rows": rows, "expanded": expanded}, seconds, runs)
        assert unit == truth and c0 == pytest.approx(0.01) and c1 == pytest.approx(6e-6)
