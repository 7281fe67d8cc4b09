"""A new policy is one module: dropped into `oocgnn/policies/`, it is registered, configured, trained,
simulated (= executed), tuned and listed by `--help`, with no other file touched. The package is copied
to a temporary directory with the new module beside the others, and exercised in a fresh interpreter."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import oocgnn

TOY = '''"""PaGraph's static cache of the highest-degree rows, under random batches (a policy in one module)."""
from dataclasses import dataclass

import numpy as np

from ..ranking import top_ids
from ..schedules import Step
from .base import Plan, register, setting


@register
class DegreeCachePlan(Plan):
    """Random batches; the `cache_share` of what the budget leaves holds the highest-degree rows (setup);
    the other rows are read directly when a batch needs them."""
    name, source = "degreecache", "PaGraph (static degree cache)"
    grid = ({"cache_share": 0.5}, {"cache_share": 1.0})

    @dataclass
    class Options:
        cache_share: float = setting(1.0, "share of what the budget leaves that the degree cache holds")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.rows = 0
        self._choose_topology()
        left = max(0, self.budget - self.resident_bytes())
        self.rows = int(min(store.num_nodes, left * self.options.cache_share // store.row_bytes))

    def setup(self):
        ids = top_ids(self.store.degrees(), self.rows)
        return super().setup() + [Step(seeds=np.empty(0, np.int64), enter_ids=ids, data=("features",))]

    def setup_rows(self):
        return self.rows
'''

SCRIPT = '''
import json, subprocess, sys
from oocgnn.config import TrainConfig
from oocgnn.policies import POLICIES, make_plan
from oocgnn.simulate import executed_vs_simulated, simulate
from oocgnn.store import open_store
from oocgnn.train import train
from oocgnn.tune import candidates
store_path, out = sys.argv[1], sys.argv[2]
cfg = TrainConfig.create(store=store_path, policy="degreecache", memory_budget="400KB", cache_share=0.5, epochs=1,
                         batch_size=128, max_eval_nodes=100, progress=False, out=out)
run = train(cfg)
store = open_store(store_path)
plan = make_plan(store, cfg)
pairs = executed_vs_simulated(run, simulate(store, plan, epochs=1, steps=run["steps"]))
grid = candidates(store, cfg, ["degreecache"])
helptext = subprocess.run([sys.executable, "-m", "oocgnn", "train", "--help"], capture_output=True, text=True).stdout
print(json.dumps({"policies": list(POLICIES), "cache_share": cfg.degreecache.cache_share, "rows": plan.rows,
                  "read": run["io"]["bytes_read"], "setup_read": run["io_setup"]["bytes_read"],
                  "val": run["best_val_acc"], "pairs": pairs, "grid": grid[["knobs", "fits"]].astype(str).values.tolist(),
                  "help": "degreecache" in helptext and "--cache-share" in helptext}))
'''


def test_a_policy_in_one_new_module_trains_simulates_tunes_and_is_listed(tiny_store, tmp_path):
    pkg = tmp_path / "pkg"
    shutil.copytree(Path(oocgnn.__file__).parent, pkg / "oocgnn", ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "oocgnn" / "policies" / "degreecache.py").write_text(TOY)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_store.path), str(tmp_path / "run")],
                          capture_output=True, text=True, env={"PYTHONPATH": str(pkg), "PATH": "/usr/bin:/bin"},
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["policies"][-1] == "degreecache" and got["policies"][0] == "inmemory"
    assert got["cache_share"] == 0.5 and 0 < got["rows"] < tiny_store.num_nodes
    assert got["setup_read"] > 0 and got["read"] > 0 and got["val"] > 0
    for counter, (executed, simulated) in got["pairs"].items():
        assert executed == simulated, counter
    assert [(json.loads(k), fits) for k, fits in got["grid"]] == [({"cache_share": 0.5}, "True"),
                                                                  ({"cache_share": 1.0}, "True")], got["grid"]
    assert got["help"]


def test_a_policy_in_one_new_module_runs_per_rank(fennel16, tmp_path):
    """The same module, and nothing else, runs per rank under torchrun (`--rank-data shared`), each rank
    reading what the simulator predicts for its share."""
    pkg = tmp_path / "pkg"
    shutil.copytree(Path(oocgnn.__file__).parent, pkg / "oocgnn", ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "oocgnn" / "policies" / "degreecache.py").write_text(TOY)
    out = tmp_path / "ranks"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "oocgnn", "train", str(fennel16.path), "--distributed", "--policy", "degreecache",
                           "--memory-budget", "400KB", "--epochs", "1", "--batch-size", "128", "--max-eval-nodes", "100",
                           "--device", "cpu", "--no-progress", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PYTHONPATH": str(pkg), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    check = '''
import json, sys
from oocgnn.config import TrainConfig
from oocgnn.disttrain import RankView, rank_config
from oocgnn.distributed import owner_bounds
from oocgnn.policies import make_plan
from oocgnn.simulate import simulate, summarize
from oocgnn.store import open_store
store = open_store(sys.argv[1])
cfg = rank_config(TrainConfig.create(store=sys.argv[1], policy="degreecache", memory_budget="400KB", epochs=1,
                                     batch_size=128, progress=False), 2)
out = []
for r in range(2):
    view = RankView(store, owner_bounds(store.part_offsets, 2), r)
    df = simulate(view, make_plan(view, cfg), epochs=1, progress=False)
    sim = summarize(df).sum()
    out.append(int(sim["feature_pages_read"] + sim["load_feature_pages"]))
print(json.dumps(out))
'''
    sim = subprocess.run([sys.executable, "-c", check, str(fennel16.path)], capture_output=True, text=True,
                         env={"PYTHONPATH": str(pkg), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert sim.returncode == 0, sim.stderr[-3000:]
    assert s["policy"] == "degreecache" and s["world"] == 2 and s["best_val_acc"] > 0
    assert [r["io"]["pages"] for r in s["ranks"]] == json.loads(sim.stdout.strip().splitlines()[-1])
