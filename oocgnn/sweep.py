"""Sweeps: train the same configuration over values of one knob, and collect the results.

The library call behind the notebooks' widgets (static-cache ratio, passes, staleness, ...):
headless runs call `sweep` with the same arguments a widget would.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .config import SETTINGS, TrainConfig
from .errors import UserError
from .mixing import mixing
from .policies import make_plan
from .seeds import aggregate_rows
from .store import open_store
from .train import train

SUMMARY_COLUMNS = ["train_s", "epoch_s", "best_val_acc", "test_at_best_val", "best_val_f1", "test_f1_at_best_val",
                   "best_val_auc", "test_auc_at_best_val", "final_val_acc", "final_test_acc", "time_to_target_s",
                   "resident_bytes", "peak_rss", "history_hits"]
LINK_SUMMARY_COLUMNS = ["train_s", "epoch_s", "best_val_mrr", "test_mrr_at_best_val", "best_val_hits@10",
                        "test_hits@10_at_best_val", "final_val_mrr", "final_test_mrr", "resident_bytes", "peak_rss"]


def run_grid(base: TrainConfig, grid: dict, seeds=(0,), out_root="runs/sweep",
             on_run=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train `base` with every combination in `grid` ({setting: [values]}) and every seed.

    Returns (logs, summaries): every run's log.csv rows labelled by its settings, and one row per run
    with its summary (time, accuracy, macro-F1, ROC-AUC, bytes read, stage seconds; on a link store MRR and
    Hits@10 in place of the node metrics and the label mixing). `on_run(i, n,
    settings)`, if given, is called before run i of n (a widget's progress bar).
    """
    bad = set(grid) - set(SETTINGS)
    if bad:
        raise UserError(f"unknown setting(s) {', '.join(sorted(bad))} to sweep; "
                        f"the settings are {', '.join(SETTINGS)}")
    combos = [{}]
    for key, values in grid.items():
        combos = [{**c, key: v} for c in combos for v in values]
    logs, rows = [], []
    runs = [(combo, seed) for combo in combos for seed in seeds]
    for i, (combo, seed) in enumerate(runs):
        if on_run is not None:
            on_run(i, len(runs), {**combo, "seed": seed})
        label = "-".join(f"{k}={v}" for k, v in combo.items()) or "base"
        out = Path(out_root) / f"{base.policy}-{label}-s{seed}"
        s = train(base.replace(**combo, seed=seed, out=str(out), force=True))   # the sweep's own directories
        settings = {"policy": base.policy, **combo, "seed": seed}
        logs.append(s["log"].assign(**settings))
        mix = s["mixing"]                          # None on a link store: no labels to mix
        rows.append({**settings, **{k: s[k] for k in (LINK_SUMMARY_COLUMNS if mix is None else SUMMARY_COLUMNS)},
                     "bytes_read": s["io"]["bytes_read"],
                     **({f"mixing_{k}": mix[k] for k in ("parts_mean", "tv_mean", "tv_max")} if mix else {}),
                     **({"mixing_warns": bool(mix["warning"])} if mix else {}),
                     **{f"{k}_s": v for k, v in s["stage_s"].items()}})
    return pd.concat(logs, ignore_index=True), pd.DataFrame(rows)


def seed_table(summary: pd.DataFrame, metrics=("best_val_acc", "test_at_best_val", "train_s")) -> pd.DataFrame:
    """The sweep table over its seeds axis: one row per setting, `<metric>_mean`, `<metric>_std`, `seeds`."""
    return aggregate_rows(summary, metrics)


def mixing_warnings(base: TrainConfig, grid: dict) -> list:
    """["setting=value, ...: warning"] for each combination of `grid` whose plan mixes poorly
    (`oocgnn.mixing.check`), from the plans alone (nothing read, nothing trained): what a widget shows
    before a sweep runs. Combinations whose plan does not build are left to the run to report."""
    store, out = open_store(base.store, verify=False), []
    if getattr(store, "task", "node") == "link":            # no labels to mix
        return out
    combos = [{}]
    for key, values in grid.items():
        combos = [{**c, key: v} for c in combos for v in values]
    for combo in combos:
        try:
            warning = mixing(make_plan(store, base.replace(**combo)))["warning"]
        except UserError:
            continue
        if warning:
            out.append(f"{', '.join(f'{k}={v}' for k, v in combo.items()) or base.policy}: {warning}")
    return out


def sweep(base: TrainConfig, param: str, values, seeds=(0,), out_root="runs/sweep", on_run=None):
    """One knob: `run_grid(base, {param: values}, seeds)`."""
    return run_grid(base, {param: list(values)}, seeds, out_root, on_run)
