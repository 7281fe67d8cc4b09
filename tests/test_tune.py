"""`oocgnn tune`: candidates that fit, the choice rule, the run directory it writes, and `train --config`."""
import json

import numpy as np
import pandas as pd

from oocgnn.cli import main
from oocgnn.config import TrainConfig
from oocgnn.policies import make_plan
from oocgnn.tune import candidates, choose


def _cfg(store, **kw):
    return TrainConfig.create(store=str(store.path), batch_size=64, fanouts="5,5", progress=False,
                              max_eval_nodes=64, **kw)


def test_candidates_fit_the_budget_or_say_why(fennel16):
    cfg = _cfg(fennel16, memory_budget="2MB")
    df = candidates(fennel16, cfg)
    assert df.fits.any() and (~df.fits).any()
    for _, r in df.iterrows():
        if r.fits:
            plan = make_plan(fennel16, cfg.replace(policy=r.policy, **json.loads(r.knobs)))
            assert plan.resident_bytes() <= plan.budget, r.config
        else:
            assert r.reason, r.config
    assert not df[df.policy == "inmemory"].fits.any()          # 2.5 MiB of features: not in 2 MB
    hb = df[(df.policy == "hierbatching") & df.fits]
    assert hb.knobs.map(lambda k: json.loads(k)["parts_per_megabatch"]).nunique() <= 3


def test_candidates_never_propose_a_plan_that_warns(by_label):
    """Mega-batches of few parts (of a store ordered by label) fit the budget but mix poorly: the tuner drops
    them with the reason."""
    from oocgnn.mixing import mixing
    cfg = _cfg(by_label, memory_budget="2MB")
    df = candidates(by_label, cfg, policies=["hierbatching", "composed", "outre", "marius"])
    for _, r in df[df.fits].iterrows():
        assert mixing(make_plan(by_label, cfg.replace(policy=r.policy, **json.loads(r.knobs))))["warning"] == "", r.config
    poor = df[df.reason.str.startswith("mixes poorly")]
    assert len(poor), df[["config", "fits", "reason"]]
    for _, r in poor.iterrows():                   # each would warn, and would fit the budget
        plan = make_plan(by_label, cfg.replace(policy=r.policy, **json.loads(r.knobs)))
        assert mixing(plan)["warning"] and plan.resident_bytes() <= plan.budget


def test_a_baseline_whose_own_arrays_exceed_the_budget_is_no_candidate(fennel16):
    """mmap bounds its page cache by the budget, not its slot table and lists: at 1 KB they do not fit,
    so it is not proposed (it used to be "chosen" there)."""
    df = candidates(fennel16, _cfg(fennel16, memory_budget="1KB"), policies=["mmap", "inmemory"])
    assert not df.fits.any() and df.reason.str.contains("more than the budget").all(), df[["config", "reason"]]
    assert candidates(fennel16, _cfg(fennel16, memory_budget="2MB"), policies=["mmap"]).fits.all()


def test_candidates_only_the_policies_asked(fennel16):
    df = candidates(fennel16, _cfg(fennel16, memory_budget="2MB"), policies=["mmap", "outre"])
    assert set(df.policy) == {"mmap", "outre"}


def test_choose():
    m = pd.DataFrame({"measured_s": [1.0, 2.0, 0.5], "best_val_acc": [0.80, 0.81, 0.70],
                      "time_to_target_s": [np.nan, 3.0, 1.0]}, index=[4, 7, 9])
    assert choose(m, target_acc=0.7) == 9                      # soonest to the target
    assert choose(m) == 4                                      # no target: fastest within a point of the best
    assert choose(m.assign(time_to_target_s=np.nan), target_acc=0.9) == 4
    f1 = m.assign(best_val_f1=[0.60, 0.70, 0.695])                 # ranked by the target metric
    assert choose(f1, metric="f1") == 9 and choose(f1) == 4


def test_tune_refuses_auc_on_labels_that_are_not_binary(fennel16, tmp_path, capsys):
    assert main(["tune", str(fennel16.path), "--target-metric", "auc", "--out", str(tmp_path / "t"),
                 "--no-progress"]) == 2
    assert "needs binary labels" in capsys.readouterr().err and not (tmp_path / "t").exists()


def test_tune_writes_a_choice_that_trains(fennel16, tmp_path, capsys):
    out = tmp_path / "tune"
    (out / "runs" / "mmap").mkdir(parents=True)       # an interrupted tune's leftovers: its --out is taken again
    rc = main(["tune", str(fennel16.path), "--memory-budget", "2MB", "--epochs", "1", "--top", "2",
               "--batch-size", "256", "--fanouts", "5,5", "--max-eval-nodes", "64", "--no-progress",
               "--policies", "mmap,outre,hierbatching", "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert rc == 0, capsys.readouterr().err
    ranking = pd.read_csv(out / "ranking.csv")
    assert ranking.chosen.sum() == 1 and ranking.measured_s.notna().sum() == 2
    fits = ranking[ranking.fits]
    assert (fits.predicted_s.diff().dropna() >= 0).all()       # ranked by predicted epoch time
    assert ranking.loc[ranking.chosen, "measured_s"].notna().all()   # the choice was measured
    chosen = json.loads((out / "chosen.json").read_text())
    assert chosen["memory_budget"] == "2MB" and chosen["out"] == ""
    assert chosen["store"] == str(fennel16.path.resolve())     # the config works from any directory
    assert (out / "predicted_vs_measured.png").stat().st_size > 0
    assert json.loads((out / "tune.json").read_text())["chosen"] == ranking.loc[ranking.chosen, "config"].item()
    run = tmp_path / "run"
    assert main(["train", "--config", str(out / "chosen.json"), "--out", str(run), "--no-progress"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["policy"] == chosen["policy"] and config[chosen["policy"]] == chosen[chosen["policy"]]


def test_tune_takes_the_cached_disk_rates_unless_asked_to_remeasure(fennel16, tmp_path, capsys):
    """Disk rates are cached per device; --remeasure-disk measures them again (and caches the new ones)."""
    from oocgnn.disk import CACHE_VERSION, device_key
    cache = tmp_path / "cache"
    cache.mkdir()
    key = device_key(fennel16.features_path)
    stale = {"seq_bytes_s": 1e6, "iops": 1.0, "iops_qd1": 1.0, "device": key}
    (cache / "disk-rates.json").write_text(json.dumps({"version": CACHE_VERSION, key: stale}))
    args = ["tune", str(fennel16.path), "--memory-budget", "2MB", "--epochs", "1", "--top", "1",
            "--batch-size", "256", "--fanouts", "5,5", "--max-eval-nodes", "64", "--no-progress",
            "--policies", "outre", "--cache-dir", str(cache)]
    assert main(args + ["--out", str(tmp_path / "cached")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "cached" / "tune.json").read_text())["disk"]["iops"] == 1.0
    assert main(args + ["--out", str(tmp_path / "now"), "--remeasure-disk"]) == 0, capsys.readouterr().err
    measured = json.loads((tmp_path / "now" / "tune.json").read_text())["disk"]
    assert measured["iops"] > 100 and measured["seq_bytes_s"] > 1e6
    assert json.loads((cache / "disk-rates.json").read_text())[key]["iops"] == measured["iops"]


def test_train_config_file_and_overrides(fennel16, tmp_path, capsys):
    first = tmp_path / "a"
    assert main(["train", str(fennel16.path), "--policy", "hierbatching", "--parts-per-megabatch", "4",
                 "--epochs", "1", "--batch-size", "256", "--max-eval-nodes", "64", "--memory-budget", "8MB",
                 "--out", str(first), "--no-progress"]) == 0
    again = tmp_path / "b"
    assert main(["train", "--config", str(first / "config.json"), "--passes", "1", "--out", str(again)]) == 0
    a, b = (json.loads((d / "config.json").read_text()) for d in (first, again))
    assert b["hierbatching"] == {**a["hierbatching"], "passes": 1.0}
    assert b["composed"] == {**a["composed"], "passes": 1.0}      # one flag sets every policy sharing it
    skip = ("hierbatching", "composed", "out", "run_id", "schedule", "host")
    assert {k: v for k, v in b.items() if k not in skip} == {k: v for k, v in a.items() if k not in skip}


def test_train_config_errors(tmp_path, capsys):
    assert main(["train"]) == 2 and "give a STORE" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "none.json")]) == 2 and "no such file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["train", "--config", str(tmp_path / "bad.json")]) == 2 and "JSON object" in capsys.readouterr().err
    (tmp_path / "typo.json").write_text('{"store": "x", "pases": 2}')
    assert main(["train", "--config", str(tmp_path / "typo.json")]) == 2 and "pases" in capsys.readouterr().err


def test_tune_refuses_an_out_that_holds_other_files(fennel16, tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "notes.txt").write_text("mine")
    assert main(["tune", str(fennel16.path), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "holds other files (notes.txt)" in capsys.readouterr().err
    assert (tmp_path / "o" / "notes.txt").read_text() == "mine"
