"""Every policy at one budget, side by side: time to accuracy and bytes read (`oocgnn compare`, `make run`).
On a link store: time to MRR, among the policies that train link prediction.

Each policy trains in a fresh process (`train.train_fresh`: its peak RSS and an mmap run's cgroup are
its own) on the same store with the same settings and memory budget. A policy whose defaults do not
fit the budget runs with the knobs of the tuner's grid (`tune.grid_for`) that fit and keep the most
resident (its largest superbatch, macrobatch or mega-batch); one with none that fits, or whose run
fails, is a row saying why, and the others still run.

Compile and warm-up are not measured: before the first timed run, one throwaway process runs two
steps of every policy, which compiles the numba kernels they use into numba's on-disk cache (on a
fresh clone that compile takes ~20 s, more than an epoch of `small`); each timed process then loads
them from the cache. Evaluation and each policy's one-off setup (its static caches, OUTRE's
profiling) are outside the training time too, as in every run (`train.train`).
"""
from __future__ import annotations

import multiprocessing
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from .benchtable import BenchTable
from .config import TrainConfig, task_defaults
from .errors import UserError
from .metrics import SHARED_HITS, check_target, shared_negatives, summary_keys
from .policies import POLICIES, make_plan
from .store import open_store
from .tune import grid_for
from .units import format_size

DEFAULT_POLICIES = tuple(POLICIES)      # every registered policy, in its `listed` order
TARGET_SHARE = 0.95       # without --target-acc: time to 95 % of the best validation metric any policy reached
PRIMING = "numba's cache primed before timing (2 untimed steps of each policy in a throwaway process)"
METRIC_COLUMNS = ("best_val_acc", "test_at_best_val", "best_val_f1", "best_val_auc", "final_test_acc",
                  "best_val_mrr", "test_mrr_at_best_val", "best_val_hits@10", "test_hits@10_at_best_val",
                  *(key for m in SHARED_HITS for key in summary_keys(m)))   # a run has its task's (the others empty)
TABLE_COLUMNS = ["policy", "status", "knobs", "epochs", "steps", "epoch_s", "train_s", "time_to_target_s",
                 *METRIC_COLUMNS, "bytes_read",
                 "read_per_epoch", "feature_files_per_epoch", "setup_bytes", "resident_bytes", "peak_rss",
                 "cap_enforced", "mixing_warns", "setup_s", "run_dir"]


def task_policies(store, policies=DEFAULT_POLICIES) -> list:
    """The policies of `policies` that train the store's task (a link store: those whose plans batch edges)."""
    task = getattr(store, "task", "node")
    return [p for p in policies if task in POLICIES[p].tasks]


def default_budget(store) -> str:
    """A third of the store's feature file, in bytes: every out-of-core policy must leave two thirds on disk."""
    return str(store.num_nodes * store.row_stride // 3)


def fitting_settings(store, cfg: TrainConfig, policy: str) -> tuple[dict, str]:
    """(settings, note) that make `policy`'s plan fit `cfg`'s budget: {} and "" when its defaults do, else
    the grid point of `tune.grid_for` that fits with the most resident bytes. Raises UserError (the
    defaults' own message) when none fits."""
    try:
        make_plan(store, cfg.replace(policy=policy))
        return {}, ""
    except UserError as e:
        refusal = e
    fits = []
    for knobs in grid_for(policy, store.task):
        try:
            plan = make_plan(store, cfg.replace(policy=policy, **knobs))
        except UserError:
            continue
        fits.append((plan.resident_bytes(), knobs))
    if not fits:
        raise refusal
    knobs = max(fits, key=lambda f: f[0])[1]
    return knobs, "its settings do not fit; " + _knobs_text(knobs)


def _knobs_text(knobs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


def _prime(cfgs):
    """Two steps of each configuration, in this (throwaway) process: numba compiles what they call and
    writes it to its on-disk cache."""
    from .train import train  # torch: imported when used, not with this module
    with tempfile.TemporaryDirectory(prefix="oocgnn-prime-") as tmp:
        for i, cfg in enumerate(cfgs):
            train(cfg.replace(max_steps=2, epochs=1, max_eval_nodes=64, eval_every=0, target_acc=0.0,
                              checkpoint_every=0, progress=False, force=True, out=str(Path(tmp) / str(i))))


def prime(cfgs):
    """Run `_prime(cfgs)` in a fresh interpreter (spawned: nothing of this process carried over)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_prime, list(cfgs)).result()


def time_to(log: pd.DataFrame, target: float, metric="acc"):
    """Training seconds at the first evaluation whose validation `metric` reached `target` (None if none)."""
    hit = log[log[f"val_{metric}"] >= target]
    return float(hit["wall_s"].iloc[0]) if len(hit) else None


def _row(policy, knobs, note, s, feature_bytes) -> dict:
    """A run's row: its node metrics, or its link metrics on a link store (the others empty)."""
    io = s["io"]["bytes_read"]
    epochs = s["steps"] / max(1, s["epoch_steps"])
    return {"policy": policy, "status": "ok" + (f" ({note})" if note else ""),
            "knobs": _knobs_text(knobs), "epochs": s["epochs"], "steps": s["steps"],
            "epoch_s": s["epoch_s"], "train_s": s["train_s"], **{k: s.get(k) for k in METRIC_COLUMNS},
            "bytes_read": io, "read_per_epoch": io / epochs, "feature_files_per_epoch": io / epochs / feature_bytes,
            "setup_bytes": s["io_setup"]["bytes_read"], "resident_bytes": s["resident_bytes"],
            "peak_rss": s["peak_rss"], "cap_enforced": bool(s["memory_cap"].get("enforced")),
            "mixing_warns": bool(s["mixing"] and s["mixing"]["warning"]), "setup_s": s["setup_s"],
            "run_dir": s["run_dir"]}


def compare(cfg: TrainConfig, policies=DEFAULT_POLICIES, out="runs/compare", target_acc=None, warm=True,
            progress=True, echo=print) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """Train `cfg` under each policy at `cfg.memory_budget` into `<out>/<policy>`; `<out>/comparison.csv`
    holds the rows so far as each policy ends (a killed comparison keeps them).

    Returns (table, logs, target): one row per policy (`TABLE_COLUMNS`: its status — ok, or why it did
    not fit or failed —, epoch time, time to `target`, accuracy, bytes read, memory), every run's log.csv
    rows labelled by policy, and the validation value of `cfg.target_metric` the times are measured to
    (`target_acc`, else `TARGET_SHARE` of the best any policy reached). `warm`: prime numba's cache first
    (`prime`). On a link store the target metric is MRR (`config.task_defaults`) and a policy that does not train
    link prediction is a row saying so."""
    from .train import train_fresh  # torch: imported when used, not with this module
    from tqdm.auto import tqdm
    store = open_store(cfg.store, verify=False)
    task = getattr(store, "task", "node")
    cfg = task_defaults(cfg, task)
    check_target(cfg.target_metric, store.num_classes, task, shared_negatives(store))
    able = task_policies(store, policies)
    feature_bytes = store.num_nodes * store.row_stride
    runnable = []
    saved = BenchTable(Path(out) / "comparison.csv", TABLE_COLUMNS, key="policy", echo=False)
    for p in policies:                          # in their order; what a kill leaves says what never ran
        saved.add(p, "not run")
    for p in policies:
        if p not in able:
            saved.add(p, f"not for {task} stores: it trains {' and '.join(POLICIES[p].tasks)} tasks")
            echo(f"{p}: does not train {task} prediction (a {task} store)")
            continue
        try:
            knobs, note = fitting_settings(store, cfg, p)
        except UserError as e:
            saved.add(p, f"does not fit: {e}")
            echo(f"{p}: does not fit the {format_size(cfg.memory_budget_bytes)} budget: {e}")
            continue
        runnable.append((p, knobs, note, cfg.replace(policy=p, **knobs, out=str(Path(out) / p), force=True,
                                                     progress=False)))
    if warm and runnable:
        echo(f"priming numba's cache: 2 untimed steps of {', '.join(p for p, *_ in runnable)}")
        prime([c for *_, c in runnable])
    logs = []
    for p, knobs, note, c in tqdm(runnable, desc="compare", unit="policy", disable=not progress):
        try:
            s = train_fresh(c)
        except UserError as e:
            saved.add(p, f"failed: {e}", knobs=_knobs_text(knobs))
            echo(f"{p}: failed: {e}")
            continue
        row = _row(p, knobs, note, s, feature_bytes)
        saved.add(p, **{k: v for k, v in row.items() if k != "policy"})
        logs.append(s["log"].assign(policy=p))
        echo(f"{p}: {s['epoch_s']:.2f} s an epoch, best val {cfg.target_metric} "
             f"{s[summary_keys(cfg.target_metric)[0]]:.4f}, read "
             f"{format_size(row['read_per_epoch'])} an epoch" + (f" ({note})" if note else ""))
    metric, best = cfg.target_metric, summary_keys(cfg.target_metric)[0]
    logs = pd.concat(logs, ignore_index=True) if logs else pd.DataFrame(columns=["policy", "wall_s", f"val_{metric}"])
    reached = [r[best] for r in saved.rows if r.get(best) is not None]
    target = target_acc or (round(TARGET_SHARE * max(reached), 4) if reached else None)
    if target:
        for p, log in logs.groupby("policy", sort=False):
            saved.add(p, saved.status(p), time_to_target_s=time_to(log, target, metric))
    table = pd.DataFrame(saved.rows, columns=TABLE_COLUMNS)
    return table, logs, target
