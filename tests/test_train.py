"""The baseline executor: run files, the mmap-vs-inmemory oracle, the memory cap, models."""
import json
import time
import subprocess
import sys
import os

import numpy as np
import pandas as pd
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.memcap import probe
from oocgnn.rundir import EVAL_LOG_COLUMNS, LOG_COLUMNS, METRIC_LOG_COLUMNS, STEP_COLUMNS
from oocgnn.train import train


def _run(store, tmp_path, **kw):
    kw = {"epochs": 2, "out": str(tmp_path / kw.get("policy", "inmemory")), "progress": False,
          "batch_size": 256, "max_eval_nodes": 200, **kw}
    return train(TrainConfig.create(store=str(store.path), **kw))


def test_run_directory_contents(tiny_store, tmp_path):
    s = _run(tiny_store, tmp_path)
    run = tmp_path / "inmemory"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["policy"] == "inmemory" and cfg["fanouts"] == "10,10" and cfg["memory_budget_bytes"] == 256_000_000
    log = pd.read_csv(run / "log.csv")
    assert list(log.columns) == LOG_COLUMNS + METRIC_LOG_COLUMNS + EVAL_LOG_COLUMNS + ["run_id"]
    assert log["run_id"].nunique() == 1
    assert list(log["step"]) == [0, 2, 4], "time 0, then one evaluation per epoch (2 steps each)"
    assert log["wall_s"].is_monotonic_increasing and log["wall_s"].iloc[0] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["memory_cap"]["enforced"] is False
    assert summary["best_val_acc"] == log["val_acc"].max()
    assert s["log"]["val_acc"].iloc[-1] > 1.5 / tiny_store.num_classes, "it learns"
    steps = pd.read_csv(run / "steps.csv")
    assert list(steps.columns) == STEP_COLUMNS + ["run_id"] and list(steps["epoch"]) == [0, 0, 1, 1]
    assert steps["seconds"].sum() == pytest.approx(summary["train_s"], abs=1e-2)
    assert summary["epoch_steps"] == 2 and summary["setup_s"] > 0


def test_max_steps_stops_early_and_extrapolates_the_epoch(tiny_store, tmp_path):
    s = _run(tiny_store, tmp_path, epochs=3, max_steps=3)     # 2 steps an epoch: stop inside epoch 2
    assert s["steps"] == 3 and s["epoch_steps"] == 2
    assert list(s["log"]["step"]) == [0, 2, 3], "evaluated at the end of epoch 1 and where it stopped"
    assert s["epoch_s"] == pytest.approx(s["train_s"] * 2 / 3, abs=2e-3)
    full = _run(tiny_store, tmp_path / "full", epochs=2, max_steps=99)   # more than the run: no cut
    assert full["steps"] == 4 and full["epoch_s"] == pytest.approx(full["train_s"] / 2, abs=2e-3)


def test_mmap_trains_exactly_like_inmemory(tiny_store, tmp_path):
    """Out-of-core oracle: same seed, same batches, same features -> the same trajectory."""
    a = _run(tiny_store, tmp_path, policy="inmemory")
    b = _run(tiny_store, tmp_path, policy="mmap", memory_budget="32MB")
    np.testing.assert_allclose(a["log"]["train_loss"], b["log"]["train_loss"], rtol=1e-5)
    assert list(a["log"]["val_acc"]) == list(b["log"]["val_acc"])
    assert b["io"]["bytes_read"] > 0 and a["io"]["bytes_read"] == 0


def test_mmap_cap_is_enforced_when_possible(tiny_store, tmp_path):
    s = _run(tiny_store, tmp_path, policy="mmap", memory_budget="32MB", epochs=1)
    cap = s["memory_cap"]
    if not probe()["possible"]:
        assert cap["enforced"] is False and cap["reason"]
        pytest.skip("this process may not create a memory cgroup: " + probe()["reason"])
    assert cap["enforced"] is True
    assert cap["limit"] == 32_000_000 + int(1.25 * cap["working_set"]) + (16 << 20)
    assert cap["peak"] <= cap["limit"]


@pytest.mark.parametrize("model", ["gat", "gin", "mlp"])
def test_other_models_learn(tiny_store, tmp_path, model):
    """Every model gets well above chance, and its loss falls from the first epoch to the last."""
    s = _run(tiny_store, tmp_path, model=model, epochs=3, hidden=32)
    loss, val = s["log"]["train_loss"], s["log"]["val_acc"]
    assert loss.iloc[-1] < loss.iloc[1], "the loss falls"
    assert val.iloc[-1] > 1.5 / tiny_store.num_classes and val.iloc[-1] > val.iloc[0] + 0.1


def test_three_layers_and_eval_every(tiny_store, tmp_path):
    s = _run(tiny_store, tmp_path, fanouts="5,5,5", eval_every=1, epochs=1)
    assert list(s["log"]["step"]) == [0, 1, 2]


def test_time_to_target(tiny_store, tmp_path):
    """The time to a target is the training time of the first evaluation that reaches it."""
    log = _run(tiny_store, tmp_path / "a", epochs=3)["log"]
    target = round((log["val_acc"].iloc[0] + log["val_acc"].max()) / 2, 4)    # reached after t = 0
    s = _run(tiny_store, tmp_path / "b", epochs=3, target_acc=target)
    first = s["log"][s["log"]["val_acc"] >= target].iloc[0]
    assert first["step"] > 0 and s["time_to_target_s"] == first["wall_s"] > 0
    assert _run(tiny_store, tmp_path / "c", epochs=1, target_acc=1.0)["time_to_target_s"] is None


def test_peak_rss_is_the_runs_own(tiny_store, tmp_path):
    """A sweep's runs share one process: each reports its own peak, not the process's past one."""
    from oocgnn.units import peak_rss
    big = np.ones(1 << 27)                                    # 1 GiB, touched, then freed
    high = peak_rss()
    del big
    s = _run(tiny_store, tmp_path)
    assert s["peak_rss"] < high - (512 << 20), (s["peak_rss"], high)


@pytest.mark.parametrize("kw, msg", [
    ({"max_steps": -1}, "max_steps"),
    ({"policy": "magic"}, "unknown policy 'magic'"),
    ({"model": "bert"}, "unknown model 'bert'"),
    ({"fanouts": "10,x"}, "bad fanouts"),
    ({"fanouts": "10,10", "layers": 3}, "does not match 2 fanouts"),
    ({"memory_budget": "lots"}, "bad size 'lots'"),
    ({"epochs": 0}, "epochs must be >= 1"),
    ({"weight_decay": -1e-4}, "weight_decay >= 0"),
    ({"adam_beta1": 1.0}, r"adam_beta1 must be in \[0, 1\)"),
    ({"adam_beta1": -0.1}, r"adam_beta1 must be in \[0, 1\)"),
])
def test_config_rejects_bad_input(kw, msg):
    with pytest.raises(UserError, match=msg):
        TrainConfig.create(store="x", **kw)


def test_config_routes_settings_by_name_and_round_trips():
    """A policy's options are set by their names; config.json (nested) reads back to the same config."""
    import dataclasses
    cfg = TrainConfig.create(store="x", policy="hierbatching", passes=1.5, staleness=7, memory_budget="1GiB")
    assert cfg.hierbatching.passes == 1.5 and cfg.outre.staleness == 7 and cfg.memory_budget_bytes == 2**30
    assert cfg.get("passes") == 1.5 and cfg.get("epochs") == 5
    other = cfg.replace(passes=3.0, epochs=2)
    assert (other.hierbatching.passes, other.epochs, cfg.hierbatching.passes) == (3.0, 2, 1.5)
    saved = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert TrainConfig.create(**saved) == cfg
    with pytest.raises(UserError, match="unknown setting 'warp'"):
        cfg.replace(warp=9)
    with pytest.raises(UserError, match="passes must be >= 1"):
        cfg.replace(passes=0.5)


@pytest.mark.parametrize("policy", ["hierbatching", "mmap"])
def test_layerwise_evaluation_equals_one_batch_evaluation_in_a_run(fennel16, tmp_path, policy):
    """The same run evaluated layer-wise and per batch in one batch (the same neighbourhoods): the same
    accuracies at every evaluation, the same training, the same counted reads (evaluation's are not).
    Through the page cache (mmap) the counted reads differ: per-batch evaluation's mmap reads leave pages
    that training then finds cached; layer-wise evaluation's direct reads leave none."""
    kw = {"policy": policy, "memory_budget": "3MB", "parts_per_megabatch": 4, "epochs": 2, "eval_every": 2,
          "max_eval_nodes": 300}
    a = _run(fennel16, tmp_path / "lw", eval_mode="layerwise", **kw)
    b = _run(fennel16, tmp_path / "b", eval_mode="batch", eval_batch_size=10_000, **kw)
    assert a["eval_mode"] == "layerwise" and b["eval_mode"] == "batch" and len(a["log"]) >= 3
    for col in ("val_acc", "test_acc") + (("bytes_read", "requests") if policy != "mmap" else ()):
        assert list(a["log"][col]) == list(b["log"][col]), col
    np.testing.assert_allclose(a["log"]["train_loss"], b["log"]["train_loss"], rtol=1e-6)
    assert a["eval_memory"]["input_rows"] > 0
    # evaluation holds what a budgeted plan leaves of the budget (a baseline's: the budget); the rest spills
    left = a["memory_budget"] - a["resident_bytes"] if policy != "mmap" else a["memory_budget"]
    assert a["eval_budget"] == max(0, left)
    if policy == "hierbatching":
        assert a["eval_budget"] < a["eval_memory"]["input_rows"] and "input_rows" in a["eval_spilled"]


def test_a_rows_reads_do_not_depend_on_how_fast_the_disk_is(fennel16, tmp_path, monkeypatch):
    """A row of the log counts every load issued so far, the one running ahead included: a disk slow
    enough that the next mega-batch is still loading at every evaluation logs the same reads."""
    import oocgnn.runtime as rt
    kw = {"policy": "hierbatching", "memory_budget": "3MB", "parts_per_megabatch": 4, "epochs": 2,
          "eval_every": 2, "max_eval_nodes": 300}
    fast = _run(fennel16, tmp_path / "fast", **kw)
    read = rt.RangeLoader._read

    def slow(self, step, half):
        time.sleep(0.3)
        return read(self, step, half)

    monkeypatch.setattr(rt.RangeLoader, "_read", slow)
    slow_run = _run(fennel16, tmp_path / "slow", **kw)
    assert slow_run["stage_s"]["load"] > 1.0, "the slow run waited for its loads"
    for col in ("bytes_read", "requests", "val_acc"):
        assert list(fast["log"][col]) == list(slow_run["log"][col]), col


def test_train_fresh_runs_in_a_new_process_and_trains_the_same(tiny_store, tmp_path):
    from oocgnn.train import train_fresh
    kw = {"epochs": 1, "progress": False, "batch_size": 256, "max_eval_nodes": 200, "store": str(tiny_store.path)}
    here = train(TrainConfig.create(out=str(tmp_path / "here"), **kw))
    fresh = train_fresh(TrainConfig.create(out=str(tmp_path / "fresh"), **kw))
    assert fresh["log"]["train_loss"].iloc[1:].tolist() == pytest.approx(here["log"]["train_loss"].iloc[1:].tolist())
    assert fresh["log"]["val_acc"].tolist() == here["log"]["val_acc"].tolist()


def test_a_plan_larger_than_the_machine_is_refused_before_any_read(tiny_store, tmp_path, monkeypatch):
    """inmemory on a graph larger than the available memory (xlarge here: 28.7 GB of features on 24 GB) is
    refused with the reason; simulating it is not; mmap, whose resident arrays fit, still runs."""
    from oocgnn import units
    from oocgnn.errors import UserError
    from oocgnn.simulate import simulate
    from oocgnn.policies import make_plan
    feature_bytes = tiny_store.num_nodes * tiny_store.row_stride
    assert 0 < units.available_memory() < os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    monkeypatch.setattr(units, "available_memory", lambda: feature_bytes // 2)
    with pytest.raises(UserError, match=r"policy inmemory needs .* resident \(feature_rows .*this machine has .* "
                                        r"available: choose an out-of-core policy"):
        _run(tiny_store, tmp_path, policy="inmemory", epochs=1)
    cfg = TrainConfig.create(store=str(tiny_store.path), policy="inmemory", epochs=1)
    assert len(simulate(tiny_store, make_plan(tiny_store, cfg), epochs=1, progress=False))
    assert _run(tiny_store, tmp_path, policy="mmap", epochs=1, max_steps=2)["steps"] == 2


def test_the_constructor_takes_a_policys_settings_and_refuses_a_negative_seed():
    """`TrainConfig(parts_per_megabatch=4)` is `TrainConfig.create`'s config (it was a bare TypeError); an unknown
    name or a negative seed is one UserError line (numpy refused the seed with a traceback)."""
    cfg = TrainConfig(store="x", policy="hierbatching", parts_per_megabatch=4, passes=1.5)
    assert cfg == TrainConfig.create(store="x", policy="hierbatching", parts_per_megabatch=4, passes=1.5)
    assert cfg.replace(passes=3.0).hierbatching.passes == 3.0
    with pytest.raises(UserError, match="unknown setting 'warp'"):
        TrainConfig(store="x", warp=1)
    with pytest.raises(UserError, match="seed must be >= 0"):
        TrainConfig(store="x", seed=-1)


def test_prepare_and_train_refuse_a_negative_seed_in_one_line(tmp_path):
    for argv in (["prepare", "synthetic", "--seed", "-1", "--out", str(tmp_path / "s")],
                 ["train", str(tmp_path / "none"), "--seed", "-1"]):
        done = subprocess.run([sys.executable, "-m", "oocgnn", *argv], capture_output=True, text=True)
        assert done.returncode != 0 and "Traceback" not in done.stderr and ">= 0" in done.stderr, done.stderr


def test_weight_decay_reaches_the_optimizer(tiny_store, tmp_path):
    """--weight-decay is Adam's L2 term: the same run without it ends at other losses, and the optimizer
    state a checkpoint keeps records the value."""
    import torch
    a = _run(tiny_store, tmp_path, out=str(tmp_path / "a"), weight_decay=0.0)
    b = _run(tiny_store, tmp_path, out=str(tmp_path / "b"), weight_decay=0.05, checkpoint_every=1)
    assert a["log"]["train_loss"].iloc[-1] != b["log"]["train_loss"].iloc[-1]
    groups = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["opt"]["param_groups"]
    assert {g["weight_decay"] for g in groups} == {0.05}


def test_adam_beta1_reaches_the_optimizer(tiny_store, tmp_path):
    """--adam-beta1 is Adam's first beta: without momentum the same run ends at other losses, and the
    optimizer state a checkpoint keeps records it."""
    import torch
    a = _run(tiny_store, tmp_path, out=str(tmp_path / "a"))
    b = _run(tiny_store, tmp_path, out=str(tmp_path / "b"), adam_beta1=0.0, checkpoint_every=1)
    assert a["log"]["train_loss"].iloc[-1] != b["log"]["train_loss"].iloc[-1]
    groups = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["opt"]["param_groups"]
    assert {tuple(g["betas"]) for g in groups} == {(0.0, 0.999)}


def test_the_first_row_is_at_zero_seconds_when_nothing_loads_ahead(tiny_store, tmp_path, monkeypatch):
    """A row waits for a load running ahead (`settle`); with none running it times nothing, however slow
    asking is (here 50 ms), so step 0's row of an in-memory run stays at 0 s."""
    import time as _time
    from oocgnn.runtime import RangeLoader
    asked = RangeLoader.pending_io

    def slow(self):
        _time.sleep(0.05)
        return asked(self)
    monkeypatch.setattr(RangeLoader, "pending_io", slow)
    _run(tiny_store, tmp_path)
    log = pd.read_csv(tmp_path / "inmemory" / "log.csv")
    assert log["wall_s"].iloc[0] == 0 and log["wall_s"].is_monotonic_increasing
