"""Seeds aggregated: one run per seed, and the mean ± standard deviation of their results.

`train_seeds(cfg, seeds)` trains `cfg` once per seed into `<run dir>/seed<S>` and writes
`aggregate.json` (per summary metric: mean, std, n and the values) and `aggregate_log.csv` (per
evaluation index: the seeds' mean and std of wall time, accuracies, macro-F1 and ROC-AUC; on a link store MRR
and Hits@10, and Hits@20/50/100 where OGB gives shared negative pairs) to the run directory.
`aggregate_rows` is the same statistic over any table of runs (the sweep table's seeds axis).
The standard deviation is the sample one (ddof = 1; 0 for a single seed).
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from .config import SETTINGS
from .errors import UserError
from .metrics import SHARED_HITS, summary_keys
from .rundir import default_run_dir, load_run, resumed_config
from .train import train

METRICS = ("best_val_acc", "test_at_best_val", "best_val_f1", "test_f1_at_best_val", "best_val_auc",
           "test_auc_at_best_val", "final_val_acc", "final_test_acc", "train_s", "epoch_s", "time_to_target_s",
           "peak_rss", "best_val_mrr", "test_mrr_at_best_val", "best_val_hits@10", "test_hits@10_at_best_val",
           "final_val_mrr", "final_test_mrr",               # these six: a link store's (`linktask`)
           *(key for m in SHARED_HITS for key in summary_keys(m)))   # a store with OGB's shared negative pairs
SEEDS_CONFIG = "seeds_config.json"      # a --seeds job's settings, in its directory
CURVE = ("wall_s", "val_acc", "test_acc", "val_f1", "test_f1", "val_auc", "test_auc", "val_mrr", "test_mrr",
         "val_hits@10", "test_hits@10", *(f"{split}_{m}" for m in SHARED_HITS for split in ("val", "test")),
         "train_loss")


def mean_std(values) -> dict:
    """{mean, std (ddof 1; 0 for one value), n, values} of the values that are not None/NaN."""
    vals = [float(v) for v in values if v is not None and np.isfinite(float(v))]
    if not vals:
        return {"mean": None, "std": None, "n": 0, "values": []}
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
            "n": len(vals), "values": vals}


def aggregate(summaries: list) -> dict:
    """The seeds' summaries reduced: {metric: mean_std(...)} plus the seeds."""
    return {"seeds": [s["seed"] for s in summaries],
            **{m: mean_std([s.get(m) for s in summaries]) for m in METRICS}}


def aggregate_logs(logs: list) -> pd.DataFrame:
    """Per evaluation index (the seeds evaluate at the same steps): mean and std of the curves."""
    n = min(len(log) for log in logs)
    frame = pd.concat([log.iloc[:n].reset_index(drop=True).assign(i=range(n)) for log in logs])
    g = frame.groupby("i")
    out = pd.DataFrame({"epoch": g["epoch"].first(), "step": g["step"].first()})
    for col in (c for c in CURVE if c in frame and frame[c].notna().any()):   # AUC: binary labels only
        out[f"{col}_mean"] = g[col].mean()
        out[f"{col}_std"] = g[col].std(ddof=1).fillna(0.0)
    out["seeds"] = len(logs)
    return out.reset_index(drop=True)


def aggregate_rows(rows: pd.DataFrame, metrics=("best_val_acc", "test_at_best_val", "train_s")) -> pd.DataFrame:
    """A table of runs (a column `seed`, the others settings or results) reduced over seeds: one row
    per setting (the columns named like settings) with `<metric>_mean`, `<metric>_std` and `seeds` (the
    sweep table's seeds axis)."""
    keys = [c for c in rows.columns if (c in SETTINGS or c == "policy") and c != "seed" and c not in metrics]
    out = []
    for key, group in rows.groupby(keys, sort=False, dropna=False) if keys else [((), rows)]:
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for m in metrics:
            stat = mean_std(group[m])
            row[f"{m}_mean"], row[f"{m}_std"] = stat["mean"], stat["std"]
        row["seeds"] = len(group)
        out.append(row)
    return pd.DataFrame(out)


def train_seeds(cfg, seeds) -> dict:
    """Train `cfg` once per seed into <run dir>/seed<S>; write and return the aggregate (with the runs, and their
    mean curves as `log`: aggregate_log.csv). With `cfg.resume`
    naming such a directory (a killed `--seeds` job; `oocgnn train --resume DIR` reads its settings from
    DIR/seeds_config.json), the seeds that finished are kept, the one killed
    resumes from its checkpoint (`--checkpoint-every`) and the others run: the same aggregate as a job
    never interrupted."""
    if cfg.resume:
        root = Path(cfg.resume)
        if not root.is_dir() or not any((root / f"seed{s}").is_dir() for s in seeds):
            raise UserError(f"{root} holds no --seeds runs to resume (no seed<S> directory for seeds "
                            f"{','.join(map(str, seeds))})")
    else:
        root = Path(cfg.out) if cfg.out else default_run_dir(cfg).with_name(
            default_run_dir(cfg).name.rsplit("-s", 1)[0] + "-seeds" + "_".join(map(str, seeds)))
    root.mkdir(parents=True, exist_ok=True)
    if not cfg.resume:                                  # what `--resume <root>` alone continues with
        (root / SEEDS_CONFIG).write_text(json.dumps(cfg.replace(out=str(root)).to_dict(), indent=2))
    summaries = []
    for seed in seeds:
        run, fresh = root / f"seed{seed}", cfg.replace(seed=seed, seeds="", resume="", out=str(root / f"seed{seed}"))
        if cfg.resume and (run / "summary.json").is_file():           # finished before the job was killed
            resumed_config(cfg.replace(seed=seed, seeds="", resume=str(run), out=""), SimpleNamespace(path=run))
            _, log, summary = load_run(run)
            summaries.append({**summary, "run_dir": str(run), "log": log})
            continue
        if cfg.resume and (run / "checkpoint.pt").is_file():          # killed in this seed
            fresh = cfg.replace(seed=seed, seeds="", resume=str(run), out="")
        elif cfg.resume:                                               # not started, or killed before a checkpoint
            fresh = fresh.replace(force=True)
        summaries.append(train(fresh))
    agg = {"run_dir": str(root), "policy": cfg.policy, "model": cfg.model, **aggregate(summaries)}
    (root / "aggregate.json").write_text(json.dumps(agg, indent=2))
    mean_log = aggregate_logs([s["log"] for s in summaries])
    mean_log.to_csv(root / "aggregate_log.csv", index=False)
    return {**agg, "runs": summaries, "log": mean_log}


def seed_runs(path) -> list:
    """The per-seed run directories of a `--seeds` directory (one with aggregate.json), else [path]."""
    path = Path(path)
    if not (path / "aggregate.json").is_file():
        return [path]
    seeds = json.loads((path / "aggregate.json").read_text())["seeds"]
    return [path / f"seed{s}" for s in seeds]


def format_mean_std(stat: dict, scale=100.0, digits=1) -> str:
    """'80.1 ± 1.0 (3 seeds)' of a mean_std (accuracies in points by default)."""
    if not stat["n"]:
        return "-"
    return f"{stat['mean'] * scale:.{digits}f} ± {stat['std'] * scale:.{digits}f} ({stat['n']} seed" \
           f"{'s' if stat['n'] > 1 else ''})"


def points(a, b) -> float:
    """a − b in points (accuracies as fractions), to one decimal."""
    return round(100 * (a - b), 1)


def format_difference(a, b, key="test_at_best_val") -> str:
    """'+0.3 ± 1.2 (3 seeds)': a − b of `key` in points, the two runs' stds combined, over the fewer seeds;
    `a`, `b` rows with `key` (a mean over seeds), `std` and `seeds`."""
    return f"{points(a[key], b[key]):+.1f} ± {100 * np.hypot(a['std'], b['std']):.1f} " \
           f"({int(min(a['seeds'], b['seeds']))} seeds)"
