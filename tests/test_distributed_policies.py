"""Every registered policy per rank (`--distributed --rank-data shared`, the one training loop of
`oocgnn.loop`): 2 ranks on localhost train as one process does, and each rank reads what the simulator
predicts for its plan (the policy over the rank's own training nodes, `disttrain.RankView`)."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from oocgnn.config import TrainConfig
from oocgnn.disttrain import RankView, rank_config
from oocgnn.distributed import owner_bounds
from oocgnn.policies import POLICIES, make_plan
from oocgnn.train import train

from .test_distributed import _spawn
from .test_executor import RUNS, _assert_agree, _simulated

# each policy at the executor test's settings, its topology on disk where it has such a variant (the
# reads of lists are compared too)
SETTINGS = {p: {k: v for k, v in RUNS.get(f"{p}-disk", RUNS[p]).items() if k != "policy"} for p in POLICIES}
EPOCHS = 12
COMMON = {"batch_size": 64, "fanouts": "5,5", "max_eval_nodes": 0, "epochs": EPOCHS, "device": "cpu",
          "memory_budget": "64MB"}


def _flags(settings) -> list:
    out = []
    for k, v in settings.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif v is False:
            out.append(f"--no-{k.replace('_', '-')}")
        else:
            out += [flag, str(v)]
    return out


def _torchrun(store, out, policy, settings, ranks=2, timeout=600):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "oocgnn", "train", str(store), "--distributed", "--rank-data", "shared", "--policy", policy,
           "--out", str(out), "--no-progress", *_flags({**COMMON, **settings})]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_settings_cover_the_registry():
    assert set(SETTINGS) == set(POLICIES)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_trains_per_rank_as_in_one_process_and_reads_what_the_simulator_predicts(
        fennel16, tmp_path, policy):
    two = _torchrun(fennel16.path, tmp_path / "two", policy, SETTINGS[policy])
    cfg = TrainConfig.create(store=str(fennel16.path), policy=policy, progress=False, out=str(tmp_path / "one"),
                             **{**COMMON, **SETTINGS[policy]})
    train(cfg)
    assert two["world"] == 2 and len(two["ranks"]) == 2
    bounds = owner_bounds(fennel16.part_offsets, 2)
    for record in two["ranks"]:                   # the oracle: the simulator on the rank's share
        view = RankView(fennel16, bounds, record["rank"])
        rcfg = rank_config(cfg, 2)
        _assert_agree(record, *_simulated(view, rcfg), make_plan(view, rcfg).exact_io)
    assert two["io"]["bytes_read"] == sum(r["io"]["bytes_read"] for r in two["ranks"])
    log, log1 = (pd.read_csv(tmp_path / d / "log.csv") for d in ("two", "one"))
    assert log["step"].iloc[-1] == two["steps"] and two["steps"] >= max(r["own_steps"] for r in two["ranks"])
    assert two["best_val_acc"] > 0.5, "it learned (8 classes)"
    # the last three evaluations' mean (the best one's test accuracy moves ~5 points with the seed; this,
    # within 1 over 3 seeds), within the tolerance set for HierBatching's rank plan
    acc = [log["test_acc"].iloc[-3:].mean(), log1["test_acc"].iloc[-3:].mean()]
    assert abs(acc[0] - acc[1]) <= 0.03, acc


def _worker(rank, world, port, argv, crash_at, result):  # for test_distributed._spawn
    """One rank running `oocgnn` argv; with crash_at, interrupted at the run's crash_at-th step."""
    from oocgnn import cli, disttrain
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    if crash_at:                                  # every rank averages gradients once a step, padding too
        average, calls = disttrain.TorchRanks.average_gradients, [0]

        def crashing(self, model):
            calls[0] += 1
            if calls[0] == crash_at:
                raise KeyboardInterrupt
            return average(self, model)
        disttrain.TorchRanks.average_gradients = crashing
    code = cli.main(argv)
    with open(f"{result}.{rank}", "w") as f:
        f.write(str(code))


def test_a_killed_run_of_every_rank_resumes_to_the_same_log(fennel16, tmp_path):
    """OUTRE per rank (histories, a cache, partition micro-batches: state a checkpoint must keep for
    each rank) killed mid-epoch resumes to the log and I/O of the run that was not killed."""
    common = ["train", str(fennel16.path), "--distributed", "--rank-data", "shared", "--policy", "outre",
              "--no-progress", "--checkpoint-every", "5", "--threads", "1",   # equal logs need one thread
              *_flags({**COMMON, **SETTINGS["outre"], "epochs": 3, "max_eval_nodes": 200})]
    assert_resumes_to_the_same_log(fennel16, common, tmp_path, 12, ["val_acc", "test_acc"], 10)


def assert_resumes_to_the_same_log(store, common, tmp_path, crash_at, metrics, resumed_at):
    """`common` (`oocgnn train` argv but --out) on 2 spawned ranks run whole, and killed at its crash_at-th step
    then resumed: the same log (steps, loss, `metrics`, reads) and every rank's reads; resumed at `resumed_at`."""
    assert _spawn(common + ["--out", str(tmp_path / "whole")], tmp_path, "whole", worker=_worker) == [0, 0]
    killed = tmp_path / "killed"
    assert _spawn(common + ["--out", str(killed)], tmp_path, "killed", crash_at=crash_at, worker=_worker) == [130, 130]
    assert (killed / "checkpoint.pt").exists() and not (killed / "summary.json").exists()
    assert _spawn(["train", str(store.path), "--distributed", "--resume", str(killed), "--no-progress"],
                  tmp_path, "resumed", worker=_worker) == [0, 0]
    a, b = (pd.read_csv(d / "log.csv") for d in (tmp_path / "whole", killed))
    cols = ["epoch", "step", "train_loss", *metrics, "bytes_read", "requests"]
    pd.testing.assert_frame_equal(a[cols], b[cols], rtol=1e-6)
    s = [json.loads((d / "summary.json").read_text()) for d in (tmp_path / "whole", killed)]
    assert [r["io"]["bytes_read"] for r in s[0]["ranks"]] == [r["io"]["bytes_read"] for r in s[1]["ranks"]]
    assert s[1]["resumed_at"] == resumed_at
