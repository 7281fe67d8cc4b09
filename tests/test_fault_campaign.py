"""A new user's faults, one command each, in one place: every one ends in one line and exit 2 (or, where
the input is fine, exit 0), never a traceback. `pytest tests/test_fault_campaign.py -q` gives the count
by outcome (issue 36's closing note)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from oocgnn.cli import main

S = "{store}"                 # the tiny store (partitioned into 16 FENNEL parts where a policy needs parts)
T = "{tmp}"                   # a fresh temporary directory
TRAIN = ["train", S, "--epochs", "1", "--batch-size", "512", "--max-eval-nodes", "100", "--no-progress",
         "--out", f"{T}/run"]

# (name, argv, what the single error line says; None: the command must succeed)
FAULTS = [
    # prepare
    ("unknown preset", ["prepare", "synthetic", "--preset", "nope", "--out", f"{T}/s"], "nope"),
    ("negative parts", ["prepare", "synthetic", "--preset", "tiny", "--partitioner", "fennel", "--parts", "-1",
                        "--out", f"{T}/s"], "parts"),
    ("missing source", ["prepare", f"{T}/none.npz", "--out", f"{T}/s"], "does not exist"),
    ("row-normalize on synthetic", ["prepare", "synthetic", "--preset", "tiny", "--row-normalize", "--out", f"{T}/s"],
     "--row-normalize"),
    ("unknown partitioner", ["prepare", "synthetic", "--preset", "tiny", "--partitioner", "xyz", "--out", f"{T}/s"],
     "xyz"),
    ("prepare memory too small", ["prepare", "synthetic", "--preset", "tiny", "--prepare-memory", "10KB",
                                  "--out", f"{T}/s"], "1MiB"),
    ("prepare memory not a size", ["prepare", "synthetic", "--preset", "tiny", "--prepare-memory", "lots",
                                   "--out", f"{T}/s"], "lots"),
    ("split over 1", ["prepare", "synthetic", "--preset", "tiny", "--split", "0.5,0.6", "--out", f"{T}/s"], "split"),
    ("split not numbers", ["prepare", "synthetic", "--preset", "tiny", "--split", "a,b", "--out", f"{T}/s"], "split"),
    ("negative seed at prepare", ["prepare", "synthetic", "--preset", "tiny", "--seed", "-1", "--out", f"{T}/s"],
     "seed"),
    ("shards without parts", ["prepare", "synthetic", "--preset", "tiny", "--shards", "3", "--out", f"{T}/s"],
     "--shards 3"),
    ("prepare over a store", ["prepare", "synthetic", "--preset", "tiny", "--out", S], "already"),
    ("nan features", ["prepare", f"{T}/nan.npz", "--out", f"{T}/s"], "NaN"),
    ("label beyond the classes", ["prepare", f"{T}/label.npz", "--out", f"{T}/s"], "class indices"),
    ("prepare a good npz", ["prepare", f"{T}/good.npz", "--out", f"{T}/s", "--quiet"], None),
    # train: numbers
    *[(f"train {flag} {value}", TRAIN + [flag, value], word) for flag, value, word in [
        ("--epochs", "0", "epochs"), ("--epochs", "-1", "epochs"), ("--epochs", "1.5", "--epochs"),
        ("--batch-size", "0", "batch_size"), ("--lr", "0", "lr"), ("--lr", "nan", "lr"), ("--lr", "inf", "lr"),
        ("--lr", "-1", "lr"), ("--dropout", "1", "dropout"), ("--dropout", "nan", "dropout"),
        ("--hidden", "0", "hidden"), ("--hidden", "99999999999", "hidden"), ("--seed", "-1", "seed"),
        ("--seed", str(2**40), "seed"), ("--threads", "-1", "threads"), ("--threads", "1000000", "threads"),
        ("--fanouts", "0", "fanouts"), ("--fanouts", "a,b", "fanouts"), ("--fanouts", "5,-2", "fanouts"),
        ("--eval-fanouts", "5", "eval fanouts"), ("--layers", "3", "--layers 3"),
        ("--memory-budget", "abc", "abc"), ("--precision", "fp8", "precision"), ("--eval-mode", "all", "eval_mode"),
        ("--sampler", "uniform", "sampler"), ("--topology", "ssd", "topology"),
        ("--neighbour-cache-ratio", "2", "neighbour_cache_ratio"), ("--target-acc", "2", "target_acc"),
        ("--max-steps", "-1", "max_steps"), ("--checkpoint-every", "-1", "checkpoint_every"),
        ("--dist-timeout", "0", "dist_timeout"), ("--rank-data", "all", "rank_data"), ("--seeds", "1,1", "seeds"),
        ("--seeds", "a", "seeds"), ("--eval-every", "-2", "eval_every")]],
    # train: a policy's settings
    ("passes under 1", TRAIN + ["--policy", "hierbatching", "--passes", "0.5"], "passes"),
    ("static ratio over 1", TRAIN + ["--policy", "hierbatching", "--static-ratio", "2"], "static_ratio"),
    ("history ratio negative", TRAIN + ["--policy", "outre", "--history-ratio", "-1"], "history_ratio"),
    ("unknown policy", TRAIN + ["--policy", "nope"], "nope"),
    ("unknown model", TRAIN + ["--model", "nope"], "nope"),
    ("a budget a policy cannot fit", TRAIN + ["--policy", "hierbatching", "--memory-budget", "1KB"], "budget"),
    # train: files
    ("config file missing", ["train", "--config", f"{T}/none.json", "--no-progress"], "no such file"),
    ("config not JSON", ["train", "--config", f"{T}/bad.json", "--no-progress"], "not a JSON config"),
    ("config of the wrong type", ["train", "--config", f"{T}/five.json", "--no-progress"], "epochs"),
    ("config with an unknown setting", ["train", "--config", f"{T}/unknown.json", "--no-progress"], "unknown setting"),
    ("no store given", ["train", "--epochs", "1"], "STORE"),
    ("store missing", ["train", f"{T}/none", "--epochs", "1", "--no-progress", "--out", f"{T}/r3"], "none"),
    ("store is a file", ["train", f"{T}/good.npz", "--epochs", "1", "--no-progress", "--out", f"{T}/r2"], "good.npz"),
    ("resume nothing", ["train", "--resume", f"{T}/none", "--no-progress"], "no run to resume"),
    ("out is a file", TRAIN[:-1] + [f"{T}/good.npz"], "good.npz"),
    ("out holds a run", TRAIN + ["--out", f"{T}/done"], "already holds a run"),
    ("a GPU that is not there", TRAIN + ["--device", "cuda:7"], "cuda"),
    ("train a fine run", TRAIN, None),
    # the other commands
    ("tune --top 0", ["tune", S, "--top", "0", "--out", f"{T}/t"], "--top"),
    ("tune --predict-steps -3", ["tune", S, "--predict-steps", "-3", "--out", f"{T}/t"], "--predict-steps"),
    ("tune --time-limit nan", ["tune", S, "--time-limit", "nan", "--out", f"{T}/t"], "--time-limit"),
    ("tune unknown policies", ["tune", S, "--policies", "nope", "--out", f"{T}/t"], "nope"),
    ("tune into other files", ["tune", S, "--out", f"{T}/mine"], "other files"),
    ("compare unknown policies", ["compare", S, "--policies", "nope", "--out", f"{T}/c"], "nope"),
    ("report a missing run", ["report", f"{T}/none", "--out", f"{T}/rep"], "none"),
    ("report into the run it reads", ["report", f"{T}/done", "--out", f"{T}/done/log"], "inside the run"),
    ("info of a missing store", ["info", f"{T}/none"], "none"),
    ("info of a store", ["info", S], None),
]


@pytest.fixture(scope="module")
def setup(fennel16, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("campaign")
    rng = np.random.default_rng(0)
    n = 60
    base = {"src": rng.integers(0, n, 200), "dst": rng.integers(0, n, 200),
            "feat": rng.standard_normal((n, 6)).astype(np.float32), "label": rng.integers(0, 3, n),
            "train_idx": np.arange(20), "val_idx": np.arange(20, 30), "test_idx": np.arange(30, 40)}
    np.savez(tmp / "good.npz", **base)
    feat = base["feat"].copy()
    feat[3, 1] = np.nan
    np.savez(tmp / "nan.npz", **{**base, "feat": feat})
    label = base["label"].copy()
    label[7] = 10**12
    np.savez(tmp / "label.npz", **{**base, "label": label})
    (tmp / "bad.json").write_text("{epochs: 3")
    (tmp / "five.json").write_text(json.dumps({"store": str(fennel16.path), "epochs": "five"}))
    (tmp / "unknown.json").write_text(json.dumps({"store": str(fennel16.path), "epocs": 3}))
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("mine")
    assert main(["train", str(fennel16.path), "--epochs", "1", "--batch-size", "512", "--max-eval-nodes", "100",
                 "--no-progress", "--out", str(tmp / "done")]) == 0
    return {"store": str(fennel16.path), "tmp": str(tmp)}


def test_the_campaign_is_large():
    assert len(FAULTS) >= 60 and len({name for name, _, _ in FAULTS}) == len(FAULTS)


@pytest.mark.parametrize("name, argv, words", FAULTS, ids=[f[0] for f in FAULTS])
def test_each_fault_ends_in_one_line(setup, capsys, name, argv, words):
    argv = [a.format(**setup) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:                       # argparse's usage errors
        code = e.code
    out = capsys.readouterr()
    err = out.err.strip()
    assert "Traceback" not in err, err
    if words is None:
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 0 and words in err, (code, err)
    if argv[0] == "train" and "--out" in argv and name != "out holds a run":     # no run came of it
        out = Path(argv[len(argv) - argv[::-1].index("--out")])
        assert not (out / "summary.json").exists()
        if name in ("store missing", "store is a file"):
            assert not out.exists(), "a bad store is refused before --out is made"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
