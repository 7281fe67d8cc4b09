"""Link prediction on ranks (`train --distributed` on a link store, `--rank-data shared`): each rank trains the
training edges it owns (`distributed.edge_owner`) through the policy's own plan (`disttrain.RankView`), reads
what the simulator predicts for that plan, and the ranks' evaluation counts sum to one process's MRR and Hits@K."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from oocgnn.disttrain import RankView, exchanges, rank_config
from oocgnn.distributed import edge_owner, owner_bounds
from oocgnn.errors import UserError
from oocgnn.policies import make_plan
from oocgnn.train import train

from .linkstores import link_cfg
from .test_executor import _assert_agree, _simulated

COMMON = {"epochs": 4, "batch_size": 256, "fanouts": "5,5", "hidden": 32, "negatives": 20, "negative_chunks": 4,
          "eval_every": 4, "lr": 0.01, "max_eval_nodes": 0, "device": "cpu"}
RUNS = {"inmemory": {},
        "marius": {"physical_parts": 8, "buffer_parts": 4, "topology": "disk", "memory_budget": "64MB"},
        "hierbatching": {"parts_per_megabatch": 4, "static_ratio": 0.05, "memory_budget": "8MB"},
        "ginex": {"superbatch": 2, "memory_budget": "600KB"},
        "outre": {"parts_per_macro": 2, "memory_budget": "1MB"},
        "composed": {"parts_per_megabatch": 2, "static_ratio": 0.02, "superbatch": 2, "memory_budget": "2MB"}}


def _torchrun(store, out, policy, settings, ranks=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "oocgnn", "train", str(store.path), "--distributed", "--policy", policy, "--out", str(out),
           "--no-progress", *(f"--{k.replace('_', '-')}={v}" for k, v in settings.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads((out / "summary.json").read_text()), r.stdout


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_split_the_training_edges_evenly_and_draw_their_own_negatives(parted_link, world):
    from oocgnn.edgeschedules import EdgeSchedule
    bounds = owner_bounds(parted_link.part_offsets, world)
    edges = parted_link.train_edges
    views = [RankView(parted_link, bounds, r) for r in range(world)]
    shares = [v.train_edges for v in views]
    together = np.concatenate(shares)
    assert len(together) == len(edges)                                  # disjoint, and every edge on one rank
    assert set(map(tuple, together.tolist())) == set(map(tuple, edges.tolist()))
    for r, share in enumerate(shares):
        assert (edge_owner(bounds, share) == r).all()
        rows = (bounds[r + 1] - bounds[r]) / parted_link.num_nodes     # a rank's share of the edges: of the rows
        assert abs(len(share) / len(edges) - rows) < 0.05, ([len(s) for s in shares], np.diff(bounds))
    # rank r's batch b draws (uniform) negatives keyed as one process's batch b·R + r: each rank its own
    firsts = [next(iter(EdgeSchedule(v, batch_size=128, seed=0, num_negatives=20, chunks=4).epoch(0))) for v in views]
    ones = list(EdgeSchedule(parted_link, batch_size=128, seed=0, num_negatives=20, chunks=4).epoch(0))[:world]
    for r in range(world):
        assert np.array_equal(firsts[r].link.negatives, ones[r].link.negatives)
    assert not np.array_equal(firsts[0].link.negatives, firsts[1].link.negatives)


def test_a_link_store_is_read_shared_by_its_ranks(parted_link, tmp_path):
    cfg = link_cfg(parted_link, tmp_path, distributed=True)
    assert exchanges(cfg) is False                                      # auto: shared, whatever the policy
    with pytest.raises(UserError, match="link store: its ranks read it shared"):
        exchanges(cfg.replace(rank_data="own"))
    from oocgnn.shards import write_shards
    with pytest.raises(UserError, match="link store"):
        write_shards(parted_link, 2, tmp_path / "shards", progress=False)
    assert not (tmp_path / "shards").exists()


@pytest.mark.parametrize("policy", list(RUNS))
def test_link_policies_train_per_rank_and_read_what_the_simulator_predicts(parted_link, tmp_path, policy):
    settings = {**COMMON, **RUNS[policy]}
    two, printed = _torchrun(parted_link, tmp_path / "two", policy, settings)
    cfg = link_cfg(parted_link, tmp_path, "one", policy=policy, **settings)
    train(cfg)
    assert two["world"] == 2 and len(two["ranks"]) == 2 and "best val MRR" in printed
    bounds = owner_bounds(parted_link.part_offsets, 2)
    for record in two["ranks"]:                   # the oracle: the simulator on the rank's share
        view = RankView(parted_link, bounds, record["rank"])
        rcfg = rank_config(cfg, 2)
        plan = make_plan(view, rcfg)
        _assert_agree(record, *_simulated(view, rcfg), plan.exact_io)
        assert record["own_steps"] == sum(1 for _ in plan.steps(settings["epochs"]))
    log, log1 = (pd.read_csv(tmp_path / d / "log.csv") for d in ("two", "one"))
    mrr = log["val_mrr"].to_numpy()
    print(f"{policy}: 2 ranks val MRR {mrr[0]:.3f} -> {mrr[-1]:.3f} (last three {log['val_mrr'].iloc[-3:].mean():.3f}), "
          f"one process {log1['val_mrr'].iloc[-1]:.3f} ({log1['val_mrr'].iloc[-3:].mean():.3f})")
    assert mrr[0] == pytest.approx(log1["val_mrr"].iloc[0], abs=1e-12)   # the same weights, evaluated alike
    assert mrr[-1] > mrr[0] + 0.05, mrr            # it learned
    # as one process does: the last three evaluations' mean (the best one's test MRR moves ~2 points here)
    last = [log["val_mrr"].iloc[-3:].mean(), log1["val_mrr"].iloc[-3:].mean()]
    assert abs(last[0] - last[1]) <= 0.03, last


@pytest.mark.parametrize("negatives", ["targets", "shared pairs", "one edge"])
def test_two_ranks_evaluate_the_link_metrics_of_one_process(parted_link, tmp_path, negatives):
    """The evaluation before any step (the same initial weights everywhere), full neighbourhoods: each rank ranks
    the held-out edges it owns and the summed counts are one process's MRR and Hits@K (OGB's shared negative pairs
    too, whose Hits@20, 50, 100 every rank counts against all the pairs); with one held-out edge a split, a rank
    that owns none adds nothing."""
    store = parted_link
    if negatives == "shared pairs":
        from oocgnn.cli import main
        from oocgnn.store import open_store
        from .test_linksplit import write_ogbl
        root, *_ = write_ogbl(tmp_path / "ogbl_toy", "edge", True)
        assert main(["prepare", str(root), "--task", "link", "--out", str(tmp_path / "ogb"), "--partitioner",
                     "random", "--parts", "4", "--quiet"]) == 0
        store = open_store(tmp_path / "ogb")
    settings = {**COMMON, "epochs": 1, "max_steps": 1, "eval_fanouts": "-1,-1", "eval_every": 0,
                "max_eval_nodes": 1 if negatives == "one edge" else 0}
    summary, _ = _torchrun(store, tmp_path / "two", "inmemory", settings)
    if negatives == "one edge":
        assert summary["eval_edges"] == {"val": 1, "test": 1}, summary["eval_edges"]
    train(link_cfg(store, tmp_path, "one", **settings))
    two, one = (pd.read_csv(tmp_path / d / "log.csv") for d in ("two", "one"))
    cols = [c for c in one.columns if c.startswith(("val_", "test_")) and c != "val_loss"]
    assert any("hits@20" in c for c in cols) == (negatives == "shared pairs")
    assert two[cols].iloc[0].notna().all()
    assert two[cols].iloc[0].tolist() == pytest.approx(one[cols].iloc[0].tolist(), abs=1e-12), cols


def test_a_killed_link_run_of_two_ranks_resumes_to_the_same_log(parted_link, tmp_path):
    """MariusGNN's buffer on each rank (a state's partitions and edge buckets resident) killed mid-epoch resumes
    to the log and reads of the run that was not killed."""
    from .test_distributed_policies import assert_resumes_to_the_same_log
    settings = {**COMMON, **RUNS["marius"], "epochs": 2, "eval_every": 0}
    common = ["train", str(parted_link.path), "--distributed", "--policy", "marius", "--no-progress",
              "--checkpoint-every", "3", "--threads", "1", *(f"--{k.replace('_', '-')}={v}" for k, v in settings.items())]
    assert_resumes_to_the_same_log(parted_link, common, tmp_path, 8, ["val_mrr", "test_mrr"], 6)
