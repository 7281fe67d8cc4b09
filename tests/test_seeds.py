"""Seeds aggregated: the statistic against hand-computed means, `train --seeds`, `report` over seeds."""
import json
import math

import pandas as pd
import pytest

from oocgnn.cli import main
from oocgnn.config import parse_seeds
from oocgnn.errors import UserError
from oocgnn.seeds import aggregate_logs, aggregate_rows, format_difference, mean_std, points


def test_mean_std_by_hand():
    s = mean_std([0.80, 0.82, 0.87])
    assert s["n"] == 3 and s["mean"] == pytest.approx(0.83)
    # sample std: sqrt(((-.03)^2 + (-.01)^2 + .04^2) / 2) = sqrt(0.0026 / 2)
    assert s["std"] == pytest.approx(math.sqrt(0.0013))
    assert mean_std([0.5]) == {"mean": 0.5, "std": 0.0, "n": 1, "values": [0.5]}
    assert mean_std([None, float("nan"), 2.0])["mean"] == 2.0


def test_aggregate_rows_and_logs_by_hand():
    rows = pd.DataFrame({"policy": ["hb"] * 4, "passes": [1, 1, 2, 2], "seed": [0, 1, 0, 1],
                         "best_val_acc": [0.6, 0.8, 0.7, 0.7], "test_at_best_val": [0.5, 0.7, 0.9, 0.7],
                         "train_s": [1.0, 3.0, 2.0, 2.0]})
    t = aggregate_rows(rows).set_index("passes")
    assert t.loc[1, "best_val_acc_mean"] == pytest.approx(0.7) and t.loc[1, "best_val_acc_std"] == pytest.approx(math.sqrt(0.02))
    assert t.loc[2, "test_at_best_val_mean"] == pytest.approx(0.8) and t.loc[2, "train_s_std"] == 0.0
    assert list(t["seeds"]) == [2, 2]
    logs = [pd.DataFrame({"epoch": [0, 1], "step": [0, 5], "wall_s": [0.0, w], "val_acc": [0.1, v],
                          "test_acc": [0.1, v], "train_loss": [2.0, 1.0]}) for w, v in ((1.0, 0.5), (3.0, 0.7))]
    a = aggregate_logs(logs)
    assert list(a["wall_s_mean"]) == [0.0, 2.0] and a["val_acc_mean"][1] == pytest.approx(0.6)
    assert a["val_acc_std"][1] == pytest.approx(math.sqrt(0.02)) and a["val_acc_std"][0] == 0.0


@pytest.mark.parametrize("text", ["", "0,0", "a", "-1,2"])
def test_parse_seeds_rejects(text):
    with pytest.raises(UserError, match="--seeds"):
        parse_seeds(text)


def test_train_seeds_and_report(tiny_store, tmp_path, capsys):
    """`train --seeds 0,1,2` runs one run per seed; aggregate.json holds their summaries' mean and std
    (checked against each seed's summary.json); `report` shows the group as mean ± std."""
    out = tmp_path / "runs"
    assert main(["train", str(tiny_store.path), "--epochs", "1", "--batch-size", "512", "--max-eval-nodes", "200",
                 "--seeds", "0,1,2", "--out", str(out), "--no-progress"]) == 0
    agg = json.loads((out / "aggregate.json").read_text())
    got = [json.loads((out / f"seed{s}" / "summary.json").read_text()) for s in (0, 1, 2)]
    assert [g["seed"] for g in got] == [0, 1, 2] == agg["seeds"]
    for m in ("best_val_acc", "test_at_best_val", "best_val_f1", "test_f1_at_best_val", "train_s"):
        vals = [g[m] for g in got]
        mean = sum(vals) / 3
        assert agg[m]["mean"] == pytest.approx(mean)
        assert agg[m]["std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in vals) / 2))
    assert agg["best_val_auc"]["n"] == 0, "8 classes: no ROC-AUC"
    curves = pd.read_csv(out / "aggregate_log.csv")
    assert len(curves) == len(pd.read_csv(out / "seed0" / "log.csv"))
    assert "val_f1_mean" in curves and "val_auc_mean" not in curves
    capsys.readouterr()
    assert main(["report", str(out), "--out", str(tmp_path / "fig" / "r")]) == 0
    printed = capsys.readouterr().out
    want = agg["test_at_best_val"]
    assert f"{want['mean'] * 100:.1f} ± {want['std'] * 100:.1f} (3 seeds)" in printed
    assert (tmp_path / "fig" / "r.png").is_file()
    assert set(pd.read_csv(tmp_path / "fig" / "r.csv")["seed"]) == {0, 1, 2}


def test_a_killed_seeds_job_resumes_to_the_same_aggregate(fennel16, tmp_path, monkeypatch, capsys):
    """`train --seeds 0,1,2` killed in seed 1's 5th step (checkpoints every 3): `--resume` on its directory
    keeps seed 0, resumes seed 1 from its checkpoint and runs seed 2; the per-seed logs and the aggregate
    equal a job never interrupted. `--resume DIR` alone continues with the job's settings; a command line
    that gives settings must agree with the runs it continues."""
    from oocgnn import runtime
    args = ["train", str(fennel16.path), "--epochs", "2", "--batch-size", "64", "--max-eval-nodes", "100",
            "--checkpoint-every", "3", "--seeds", "0,1,2", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "whole")]) == 0
    per_seed = len(pd.read_csv(tmp_path / "whole" / "seed0" / "steps.csv"))
    forward, calls = runtime.Runtime.forward, []

    def killed(self, *a, **k):
        calls.append(1)
        if len(calls) == per_seed + 5:
            raise KeyboardInterrupt
        return forward(self, *a, **k)
    monkeypatch.setattr(runtime.Runtime, "forward", killed)
    assert main(args + ["--out", str(tmp_path / "killed")]) == 130
    monkeypatch.setattr(runtime.Runtime, "forward", forward)
    assert (tmp_path / "killed" / "seed0" / "summary.json").is_file()
    assert not (tmp_path / "killed" / "seed1" / "summary.json").exists()
    assert not (tmp_path / "killed" / "seed2").exists()
    capsys.readouterr()
    assert main(args + ["--lr", "0.5", "--resume", str(tmp_path / "killed")]) == 2
    assert "differs" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0   # its own settings
    cols = ["epoch", "step", "train_loss", "val_acc", "test_acc"]
    for s in (0, 1, 2):
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "killed" / f"seed{s}" / "log.csv")[cols],
                                      pd.read_csv(tmp_path / "whole" / f"seed{s}" / "log.csv")[cols])
    got, want = (json.loads((tmp_path / d / "aggregate.json").read_text()) for d in ("killed", "whole"))
    assert got["test_at_best_val"] == want["test_at_best_val"] and got["seeds"] == [0, 1, 2]
    assert main(args + ["--resume", str(tmp_path / "nothing")]) == 2
    assert "no --seeds runs to resume" in capsys.readouterr().err


def test_a_difference_in_points_with_the_stds_combined():
    a = {"test_at_best_val": 0.812, "std": 0.03, "seeds": 3}
    b = {"test_at_best_val": 0.80, "std": 0.04, "seeds": 7}
    assert points(0.812, 0.80) == 1.2 and points(0.80, 0.812) == -1.2
    assert format_difference(a, b) == "+1.2 ± 5.0 (3 seeds)"      # hypot(3, 4) = 5 points
