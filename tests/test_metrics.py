"""Macro-F1 and ROC-AUC against scikit-learn's (the oracle), the tallies evaluation keeps, and the metrics
in a run: log.csv, summary.json, --target-metric, `report` over a log from before them."""
import json
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

from oocgnn.cli import main
from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.metrics import (Tally, accuracy, check_target, confusion, macro_f1, metrics, positive_score,
                            roc_auc, still_rising, summary_keys)
from oocgnn.rundir import METRIC_LOG_COLUMNS
from oocgnn.train import train


def _sklearn(fn, *args, **kw):
    with warnings.catch_warnings():              # an ill-defined precision, a single class: warned, not raised
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


@pytest.mark.parametrize("seed", range(4))
def test_macro_f1_and_accuracy_equal_sklearns(seed):
    """Random labels and predictions: imbalanced, classes missing from the predictions or from the labels,
    a single class, one node."""
    rng = np.random.default_rng(seed)
    for _ in range(150):
        c, n = int(rng.integers(1, 9)), int(rng.integers(1, 300))
        p_true, p_pred = rng.dirichlet(np.full(c, 0.3)), rng.dirichlet(np.full(c, 0.3))
        y, pred = rng.choice(c, n, p=p_true), rng.choice(c, n, p=p_pred)
        if rng.random() < 0.3:                     # mostly right, as a trained model is
            pred = np.where(rng.random(n) < 0.8, y, pred)
        conf = confusion(pred, y, c)
        assert conf.sum() == n and conf.shape == (c, c)
        assert macro_f1(conf) == pytest.approx(_sklearn(f1_score, y, pred, average="macro"), abs=1e-12)
        assert accuracy(conf) == pytest.approx(accuracy_score(y, pred), abs=1e-15)


def test_macro_f1_of_the_majority_class():
    """22 % positives, every node predicted negative: 78 % accuracy, macro-F1 (0.876 + 0) / 2."""
    y, pred = np.r_[np.ones(22), np.zeros(78)].astype(int), np.zeros(100, int)
    conf = confusion(pred, y, 2)
    assert accuracy(conf) == 0.78 and macro_f1(conf) == pytest.approx(_sklearn(f1_score, y, pred, average="macro"))
    assert macro_f1(conf) == pytest.approx(0.78 / 0.89 / 2)
    assert np.isnan(macro_f1(np.zeros((3, 3), np.int64))) and np.isnan(accuracy(np.zeros((3, 3), np.int64)))


@pytest.mark.parametrize("seed", range(4))
def test_roc_auc_equals_sklearns(seed):
    """Continuous scores, scores with many ties (a few distinct values), float32 logit differences; from
    one positive in a hundred to one negative in a hundred."""
    rng = np.random.default_rng(100 + seed)
    for i in range(150):
        n = int(rng.integers(2, 400))
        share = rng.choice([0.01, 0.22, 0.5, 0.9, 0.99])
        y = (rng.random(n) < share).astype(int)
        y[:2] = [0, 1]                             # both classes
        kind = i % 3
        if kind == 0:
            scores = rng.normal(y * rng.random(), 1.0)
        elif kind == 1:
            scores = rng.integers(0, int(rng.integers(1, 6)), n) + y * rng.integers(0, 2)   # ties
        else:
            logits = torch.from_numpy(rng.normal(0, 3, (n, 2)).astype(np.float32))
            scores = positive_score(logits)
        want = _sklearn(roc_auc_score, y, scores)
        assert roc_auc(scores, y) == pytest.approx(want, abs=1e-12), (n, kind)


def test_roc_auc_is_nan_for_one_class_and_a_half_for_one_score():
    assert np.isnan(roc_auc([0.1, 0.4, 0.3], [1, 1, 1])) and np.isnan(roc_auc([0.1, 0.4], [0, 0]))
    assert np.isnan(roc_auc([], []))
    assert roc_auc([2.0] * 5, [0, 1, 0, 1, 1]) == 0.5
    assert roc_auc([0.1, 0.9], [0, 1]) == 1.0 and roc_auc([0.1, 0.9], [1, 0]) == 0.0


def test_positive_score_ranks_as_class_1s_softmax_probability():
    """The logit difference orders nodes as class 1's probability does (where float64 does not saturate)."""
    rng = np.random.default_rng(7)
    logits = torch.from_numpy(rng.normal(0, 2, (500, 2)))
    y = rng.integers(0, 2, 500)
    prob = torch.softmax(logits, 1)[:, 1].numpy()
    assert roc_auc(positive_score(logits), y) == pytest.approx(roc_auc_score(y, prob), abs=1e-12)


def test_a_tally_adds_batches_and_gives_the_metrics_of_the_whole():
    rng = np.random.default_rng(3)
    for c in (2, 5):
        logits, y = torch.from_numpy(rng.normal(0, 1, (300, c)).astype(np.float32)), torch.from_numpy(
            rng.integers(0, c, 300))
        whole, batches = Tally(c), Tally(c)
        whole.add(logits, y)
        for lo in range(0, 300, 64):
            batches.add(logits[lo:lo + 64], y[lo:lo + 64])
        assert np.array_equal(whole.confusion, batches.confusion)
        got = metrics(batches.confusion, *batches.scored())
        pred = logits.argmax(1).numpy()
        assert got["acc"] == accuracy_score(y, pred)
        assert got["f1"] == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-12)
        if c == 2:
            assert got["auc"] == pytest.approx(roc_auc_score(y, torch.softmax(logits.double(), 1)[:, 1]), abs=1e-12)
        else:
            assert np.isnan(got["auc"]) and len(batches.scored()[0]) == 0


def _run(store, tmp_path, **kw):
    kw = {"epochs": 3, "batch_size": 256, "fanouts": "5,5", "max_eval_nodes": 0, "progress": False,
          "out": str(tmp_path / "run"), **kw}
    return train(TrainConfig.create(store=str(store.path), **kw))


def test_a_run_logs_the_metrics_and_picks_its_best_evaluation_by_the_target_metric(binary, tmp_path):
    """On binary labels every evaluation logs macro-F1 and ROC-AUC; --target-metric picks the evaluation
    whose test values are reported and which --target-acc times."""
    s = _run(binary, tmp_path, target_metric="auc", target_acc=0.6)
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    assert set(METRIC_LOG_COLUMNS) <= set(log.columns) and log[METRIC_LOG_COLUMNS].notna().all().all()
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    best = int(log["val_auc"].idxmax())
    for m in ("acc", "f1", "auc"):
        val, test = summary_keys(m)
        assert saved[val] == pytest.approx(log[f"val_{m}"].max()) and 0 <= saved[val] <= 1
        assert saved[test] == pytest.approx(log[f"test_{m}"][best])
    assert saved["target_metric"] == "auc" and saved["best_val_auc"] > 0.6, "it learns"
    assert saved["time_to_target_s"] == log.loc[log["val_auc"] >= 0.6, "wall_s"].iloc[0]
    assert s["log"]["val_auc"].tolist() == pytest.approx(log["val_auc"].tolist())


def test_multiclass_runs_log_no_auc_and_refuse_it_as_the_target(tiny_store, tmp_path, capsys):
    with pytest.raises(UserError, match="binary labels"):
        _run(tiny_store, tmp_path, target_metric="auc")
    assert not (tmp_path / "run").exists(), "refused before the run directory is made"
    with pytest.raises(UserError, match="binary labels"):
        check_target("auc", 8)
    with pytest.raises(UserError, match="target_metric must be one of acc, f1, auc"):
        TrainConfig(store=str(tiny_store.path), target_metric="recall")
    assert main(["train", str(tiny_store.path), "--target-metric", "auc", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "needs binary labels" in err and err.count("\n") == 1
    s = _run(tiny_store, tmp_path, epochs=1, target_metric="f1")
    assert s["log"]["val_auc"].isna().all() and s["best_val_auc"] is None and s["best_val_f1"] > 0
    assert s["test_at_best_val"] == s["log"]["test_acc"][int(s["log"]["val_f1"].idxmax())]


def test_report_reads_a_log_from_before_the_metrics(tiny_store, tmp_path, capsys):
    """A run written before macro-F1 and ROC-AUC (no such columns, no such summary keys) still reports;
    a new run beside it reports its macro-F1."""
    old, new = tmp_path / "old", tmp_path / "new"
    for out in (old, new):
        assert main(["train", str(tiny_store.path), "--epochs", "1", "--batch-size", "512", "--max-eval-nodes", "200",
                     "--out", str(out), "--no-progress"]) == 0
    assert "macro-F1 best val" in capsys.readouterr().out
    log = pd.read_csv(old / "log.csv")
    log.drop(columns=METRIC_LOG_COLUMNS).to_csv(old / "log.csv", index=False)
    summary = json.loads((old / "summary.json").read_text())
    for m in ("f1", "auc"):
        for key in summary_keys(m):
            del summary[key]
    (old / "summary.json").write_text(json.dumps(summary))
    assert main(["report", str(old), str(new), "--out", str(tmp_path / "fig" / "r")]) == 0
    printed = capsys.readouterr().out
    runs = pd.read_csv(tmp_path / "fig" / "r.csv")
    assert set(METRIC_LOG_COLUMNS) <= set(runs.columns)
    assert runs.loc[runs.run == "old", "val_f1"].isna().all() and runs.loc[runs.run == "new", "val_f1"].notna().all()
    lines = {line.split(":")[0]: line for line in printed.splitlines() if line.startswith(("old:", "new:"))}
    assert "macro-F1" not in lines["old"] and "macro-F1" in lines["new"] and "ROC-AUC" not in lines["new"]


def test_still_rising_compares_the_best_of_the_last_quarter_with_the_best_before():
    rising = [0.0, 0.40, 0.50, 0.55, 0.56, 0.57, 0.58, 0.59, 0.60]        # 8 evaluations: the last 2 against 7
    assert still_rising(rising) == pytest.approx((2.0, 2))
    assert still_rising(rising, points=2.5) is None
    noisy = [0.0, 0.5, 0.58, 0.56, 0.575, 0.57, 0.58, 0.565, 0.583]        # a plateau: +0.3 points is noise
    assert still_rising(noisy) is None
    falling = [0.0, 0.5, 0.6, 0.59, 0.58, 0.57, 0.56, 0.55, 0.54]
    assert still_rising(falling) is None
    assert still_rising([0.0, 0.2, 0.4, 0.6]) is None                      # fewer than 5 evaluations
    assert still_rising([0.0, np.nan, 0.2, 0.3, 0.4, 0.5]) == pytest.approx((10.0, 1))   # NaNs skipped


def test_train_notes_a_validation_curve_still_rising_at_the_end(tiny_store, tmp_path, capsys):
    """One epoch evaluated every few steps rises from an untrained model's accuracy: the note says so;
    the same run's log cut to a flat curve gives no note."""
    from oocgnn.cli import _note_still_rising
    out = tmp_path / "r"
    assert main(["train", str(tiny_store.path), "--epochs", "1", "--batch-size", "32", "--eval-every", "3",
                 "--max-eval-nodes", "200", "--out", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "validation accuracy was still rising at the end" in err and "more --epochs" in err
    log = pd.read_csv(out / "log.csv")
    assert len(log) >= 5
    log["val_acc"] = 0.5
    _note_still_rising(log, "acc")
    assert "still rising" not in capsys.readouterr().err
    assert main(["train", str(tiny_store.path), "--epochs", "1", "--batch-size", "32", "--eval-every", "3",
                 "--max-eval-nodes", "200", "--seeds", "0,1", "--out", str(tmp_path / "s"), "--no-progress"]) == 0
    assert "mean validation accuracy was still rising at the end" in capsys.readouterr().err
    _note_still_rising(pd.read_csv(tmp_path / "s" / "aggregate_log.csv"), "auc", mean=True)   # no AUC curve
    assert "still rising" not in capsys.readouterr().err
