"""`oocgnn compare`: every policy at one budget, a row per policy whatever happened to it."""
import subprocess
import sys

import pandas as pd
import pytest

from oocgnn.compare import compare, default_budget, fitting_settings, time_to
from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.policies import make_plan
from oocgnn.tune import GRID


def _cfg(store, **kw):
    return TrainConfig.create(store=str(store.path), batch_size=256, epochs=1, max_eval_nodes=200, progress=False,
                              **kw)


def test_defaults_that_fit_are_kept(fennel16):
    assert fitting_settings(fennel16, _cfg(fennel16, memory_budget="4MB"), "hierbatching") == ({}, "")


def test_a_policy_whose_defaults_do_not_fit_gets_the_fitting_grid_knobs_holding_the_most(fennel16):
    cfg = _cfg(fennel16, memory_budget="4MB", superbatch=64)   # defaults fit now: a setting given that does not
    with pytest.raises(UserError):
        make_plan(fennel16, cfg.replace(policy="ginex"))
    knobs, note = fitting_settings(fennel16, cfg, "ginex")
    fits = {}                                       # the oracle: every grid point, built and checked
    for point in GRID["ginex"]:
        try:
            fits[tuple(point.items())] = make_plan(fennel16, cfg.replace(policy="ginex", **point)).resident_bytes()
        except UserError:
            pass
    assert fits and knobs == dict(max(fits, key=fits.get))
    assert "superbatch=" in note


def test_a_policy_that_cannot_fit_raises_its_own_refusal(fennel16):
    cfg = _cfg(fennel16, memory_budget="1MB")
    with pytest.raises(UserError, match="macrobatch"):
        fitting_settings(fennel16, cfg, "macrobatch")


def test_time_to_is_the_first_evaluation_at_the_target():
    log = pd.DataFrame({"wall_s": [0.0, 1.0, 2.0, 3.0], "val_acc": [0.1, 0.5, 0.8, 0.7]})
    assert time_to(log, 0.5) == 1.0 and time_to(log, 0.75) == 2.0 and time_to(log, 0.9) is None
    assert time_to(log.assign(val_f1=[0.1, 0.3, 0.4, 0.6]), 0.5, "f1") == 3.0      # of --target-metric


def test_compare_keeps_a_row_for_every_policy(fennel16, tmp_path, monkeypatch):
    from oocgnn import train as train_module
    real = train_module.train_fresh

    def flaky(cfg):                                # one policy's run fails: the others still report
        if cfg.policy == "marius":
            raise UserError("the disk went away")
        return real(cfg)
    monkeypatch.setattr(train_module, "train_fresh", flaky)
    cfg = _cfg(fennel16, memory_budget="4MB")
    table, logs, target = compare(cfg, ["inmemory", "hierbatching", "macrobatch", "marius"], tmp_path,
                                  warm=False, progress=False, echo=lambda *a: None)
    assert list(table.policy) == ["inmemory", "hierbatching", "macrobatch", "marius"]
    status = dict(zip(table.policy, table.status))
    assert status["inmemory"] == status["hierbatching"] == "ok"
    assert status["macrobatch"].startswith("does not fit:") and status["marius"] == "failed: the disk went away"
    best = table.set_index("policy")["best_val_acc"]
    assert target == pytest.approx(round(0.95 * best.max(), 4))
    for p in ("inmemory", "hierbatching"):         # the time to the target is read off the run's own log
        log = pd.read_csv(tmp_path / p / "log.csv")
        got, want = table.set_index("policy").loc[p, "time_to_target_s"], time_to(log, target)
        assert got == want if want is not None else pd.isna(got)
        assert set(logs[logs.policy == p]["wall_s"]) == set(log["wall_s"])
    assert table.time_to_target_s.notna().any()    # the best run reaches 95 % of its own best
    saved = pd.read_csv(tmp_path / "comparison.csv")     # written as each policy ended
    assert list(saved.policy) == list(table.policy) and list(saved.status) == list(table.status)
    hb = table.set_index("policy").loc["hierbatching"]
    assert hb["read_per_epoch"] > 0 and table.set_index("policy").loc["inmemory", "read_per_epoch"] == 0


def test_the_command_writes_the_table_and_the_figure(fennel16, tmp_path):
    r = subprocess.run([sys.executable, "-m", "oocgnn", "compare", str(fennel16.path), "--policies", "inmemory,ginex",
                        "--epochs", "1", "--batch-size", "256", "--max-eval-nodes", "200", "--no-progress",
                        "--out", str(tmp_path / "cmp"), "--figure", str(tmp_path / "fig" / "00")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    table = pd.read_csv(tmp_path / "fig" / "00.csv")
    assert list(table.policy) == ["inmemory", "ginex"]
    assert (tmp_path / "fig" / "00.png").stat().st_size > 10_000 and (tmp_path / "cmp" / "comparison.png").is_file()
    # the budget defaults to a third of the feature file
    saved = pd.read_json(tmp_path / "cmp" / "inmemory" / "config.json", typ="series")
    assert saved["memory_budget"] == default_budget(fennel16)
    assert "priming numba's cache" in r.stdout


def test_the_command_refuses_unknown_policies(fennel16):
    r = subprocess.run([sys.executable, "-m", "oocgnn", "compare", str(fennel16.path), "--policies", "inmemory,nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr


def test_a_link_store_is_compared_by_mrr_among_the_policies_that_train_it(link16, tmp_path, monkeypatch):
    """On a link store the target is validation MRR, each row holds its run's MRR and Hits@10 (its summary's),
    and a policy that trains node stores only (every policy trains both now: outre made one here) is a row
    saying so; the command's default policies are those that train link prediction."""
    from oocgnn.compare import task_policies
    from oocgnn.policies import POLICIES
    assert "link" in POLICIES["outre"].tasks
    monkeypatch.setattr(POLICIES["outre"], "tasks", ("node",))
    cfg = _cfg(link16, memory_budget="8MB", parts_per_megabatch=4, static_ratio=0.02)
    table, logs, target = compare(cfg, ["inmemory", "hierbatching", "outre"], tmp_path, warm=False, progress=False,
                                  echo=lambda *a: None)
    rows = table.set_index("policy")
    assert rows.loc["inmemory", "status"] == rows.loc["hierbatching", "status"] == "ok"
    assert rows.loc["outre", "status"].startswith("not for link stores")
    for p in ("inmemory", "hierbatching"):
        s = pd.read_json(tmp_path / p / "summary.json", typ="series")
        assert rows.loc[p, "best_val_mrr"] == pytest.approx(s["best_val_mrr"]) and pd.isna(rows.loc[p, "best_val_acc"])
        assert rows.loc[p, "test_hits@10_at_best_val"] == pytest.approx(s["test_hits@10_at_best_val"])
        got, want = rows.loc[p, "time_to_target_s"], time_to(pd.read_csv(tmp_path / p / "log.csv"), target, "mrr")
        assert got == want if want is not None else pd.isna(got)
    assert rows["time_to_target_s"].notna().any()
    assert target == pytest.approx(round(0.95 * rows["best_val_mrr"].max(), 4))
    assert set(logs.policy) == {"inmemory", "hierbatching"} and "val_mrr" in logs
    able = task_policies(link16)
    assert "outre" not in able and "composed" in able and "marius" in able
    assert able == [p for p in POLICIES if "link" in POLICIES[p].tasks]
