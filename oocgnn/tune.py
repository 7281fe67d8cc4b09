"""Which policy and knobs for this graph, budget and disk? Predict every candidate, run the best few.

`tune(cfg, out)` (`oocgnn tune`) walks a grid of (policy, knobs) (`GRID`), keeps the candidates whose
plan fits the memory budget and whose groups mix well enough not to warn (`oocgnn.mixing`; both asked
of the plan: nothing is read), predicts each one's epoch time with
the cost model (`oocgnn.costmodel`: the simulator's exact I/O at this disk's measured rates, plus the
calibrated CPU costs, overlapped as the policy pipelines), and trains the `top` fastest predicted ones
for a short run each — the fastest knobs of the `top` fastest predicted policies, since what the cost
model cannot see is accuracy — for `cfg.epochs`, cut so that all of them fit `time_limit`. The choice is the run
that reached `cfg.target_acc` soonest (or, without a target or when none reached it, the fastest
epoch among those within a point of the best), in the validation metric `cfg.target_metric` (accuracy,
macro-F1 or ROC-AUC: `oocgnn.metrics`; on a link store MRR, the candidates the policies that train link stores,
each asked of its plan as on a node store: the others are listed with why not). The run directory gets `ranking.csv` (every
candidate: fits or why not, predicted and, for the runs, measured), `chosen.json` (a config for
`oocgnn train --config`), `tune.json` and `predicted_vs_measured.png`.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .config import task_defaults
from .costmodel import calibrate, predict
from .disk import measure_disk
from .errors import UserError
from .metrics import LINK_METRICS, METRICS, NAMES, SHARED_HITS, check_target, shared_negatives, summary_keys
from .mixing import mixing
from .plots import save_figure
from .policies import POLICIES, make_plan
from .store import open_store
from .units import parse_size

# knobs tried per policy (each plan's `grid`; on a link store see `grid_for`); a knob's values whose plans do not fit the budget are dropped
GRID = {name: [dict(k) for k in plan.grid] for name, plan in POLICIES.items()}
TUNE_FILES = {"tune.json", "ranking.csv", "chosen.json", "predicted_vs_measured.png", "runs"}   # what it writes
MEGABATCH_KEEP = 3      # mega-batch policies: only the largest N_d that fit (more parts per mega-batch mix better)
RESULTS = ["measured_s", "ratio", *(key for m in METRICS + LINK_METRICS + SHARED_HITS for key in summary_keys(m)),
           "time_to_target_s"]    # measured (a run has its task's metrics: NaN for the others)


def grid_for(policy: str, task: str = "node") -> list:
    """The knobs the tuner tries for `policy` on a store of `task`: on a link store its plan's `link_grid`
    where it has one (OUTRE's macro batches of 10, 20 or 40 parts would group a link store's edges, which lost
    MRR and read no less: only its default there, one macro batch), else `GRID`'s."""
    link = getattr(POLICIES.get(policy), "link_grid", None) if task == "link" else None
    return [dict(k) for k in link] if link is not None else GRID.get(policy, [])


def _label(policy, knobs) -> str:
    return policy + "".join(f" {k}={v:g}" if isinstance(v, float) else f" {k}={v}" for k, v in knobs.items())


def candidates(store, cfg, policies=None) -> pd.DataFrame:
    """Every (policy, knobs) of `grid_for` for `cfg`'s store and budget: whether its plan fits and, if not, why."""
    return _candidates(store, cfg, policies)[0]


def _candidates(store, cfg, policies=None) -> tuple:
    """`candidates`, and the plans of the fitting ones by row (built once: OUTRE's profiles its split)."""
    rows, plans = [], {}
    for policy in GRID:
        if policy not in POLICIES or (policies and policy not in policies):
            continue
        for knobs in grid_for(policy, store.task):
            row = {"config": _label(policy, knobs), "policy": policy, "knobs": json.dumps(knobs)}
            try:
                c = cfg.replace(policy=policy, **knobs)
                plan = make_plan(store, c)
                if not plan.budgeted and plan.resident_bytes() > plan.budget:   # a baseline's own arrays
                    raise UserError(f"{policy} holds {plan.resident_bytes() / 2**20:.0f} MiB, more than the budget")
                if policy == "hierbatching" and not plan.rule()["holds"]:
                    raise UserError("HierBatching App. B rule 2(r_s + r_d)(A + B) <= C does not hold")
                warning = mixing(plan)["warning"] if plan.task == "node" else ""   # would warn: may lose accuracy
                if warning:
                    raise UserError(f"mixes poorly ({warning.split(';')[0].split('mix poorly: ', 1)[-1]})")
                row.update(fits=True, reason="", resident_bytes=int(plan.resident_bytes()))
                plans[len(rows)] = plan
            except UserError as e:
                row.update(fits=False, reason=str(e).split(";")[0], resident_bytes=0)
            rows.append(row)
    df = pd.DataFrame(rows)
    for policy in ("hierbatching", "composed"):     # keep the largest mega-batches only
        hb = df[(df.policy == policy) & df.fits]
        if len(hb):
            nd = hb.knobs.map(lambda k: json.loads(k)["parts_per_megabatch"])
            keep = set(sorted(nd.unique())[-MEGABATCH_KEEP:])
            drop = hb.index[~nd.isin(keep)]
            df.loc[drop, ["fits", "reason"]] = [False, "a larger N_d fits"]
    return df, plans


def rank(store, cfg, rates, costs, policies=None, steps=None, progress=True) -> pd.DataFrame:
    """`candidates` with each fitting one's predicted epoch time (`costmodel.predict`, over the first
    `steps` batches when given), fastest first."""
    from tqdm.auto import tqdm
    df, plans = _candidates(store, cfg, policies)
    out = []
    for i, row in tqdm(df.iterrows(), total=len(df), desc="predicting", disable=not progress, leave=False):
        row = row.to_dict()
        if row["fits"]:
            p = predict(store, plans[i], rates, costs, steps=steps)
            row.update(predicted_s=p["epoch_s"], predicted_step_s=p["seconds"] / max(1, p["steps"]),
                       epoch_steps=p["epoch_steps"], cpu_s=p["sample"] + p["gather"] + p["compute"],
                       read_s=p["read"], load_s=p["load"], disk_mib=p["disk_bytes"] / 2**20,
                       exact_io=p["exact_io"])
        out.append(row)
    df = pd.DataFrame(out)
    if "predicted_s" not in df:
        df["predicted_s"] = np.nan
    df = df.sort_values(["fits", "predicted_s"], ascending=[False, True], na_position="last").reset_index(drop=True)
    df.insert(0, "rank", np.where(df.fits, np.arange(1, len(df) + 1), 0))
    return df


def choose(measured: pd.DataFrame, target_acc=0.0, metric="acc") -> int:
    """Index of the chosen run: the soonest to `target_acc` (of `metric`: the runs' time_to_target_s); else
    the fastest epoch among the runs within a point of the best validation `metric`."""
    reached = measured[measured.time_to_target_s.notna()] if target_acc else measured.iloc[:0]
    if len(reached):
        return int(reached.time_to_target_s.idxmin())
    best = measured[summary_keys(metric)[0]]
    good = measured[best >= best.max() - 0.01]
    return int(good.measured_s.idxmin())


def run_candidates(cfg, ranking, which, out, seconds=0.0, log=print) -> pd.DataFrame:
    """Train the candidates `which` (index labels of a `rank` frame) for `cfg.epochs` each, in fresh
    processes, each cut to about `seconds` at its predicted step time when given; `ranking` with their
    measured epoch seconds, predicted/measured ratio, metrics and time to `cfg.target_acc` filled in."""
    from .train import train_fresh  # torch: imported when used, not with this module
    ranking = ranking.copy()
    for col in RESULTS:
        ranking[col] = ranking.get(col, np.nan)
    ranking["run_dir"] = ranking.get("run_dir", "")
    for i in which:
        r = ranking.loc[i]
        full = int(r.epoch_steps * cfg.epochs)
        steps = min(full, max(1, math.floor(seconds / r.predicted_step_s))) if seconds else full
        c = cfg.replace(policy=r.policy, **json.loads(r.knobs), max_steps=steps if steps < full else 0,
                        out=str(Path(out) / r.config.replace(" ", "_").replace("=", "")), force=True,
                        progress=False, resume="", checkpoint_every=0)
        log(f"training {r.config} for {steps} steps ...")
        s = train_fresh(c)
        values = {"measured_s": s["epoch_s"], "ratio": r.predicted_s / s["epoch_s"], **s}
        ranking.loc[i, RESULTS] = [np.nan if values.get(k) is None else values[k] for k in RESULTS]
        ranking.loc[i, "run_dir"] = s["run_dir"]
        best = summary_keys(cfg.target_metric)[0]
        log(f"  measured {s['epoch_s']:.2f} s/epoch (predicted {r.predicted_s:.2f}), best val "
            f"{NAMES[cfg.target_metric]} {s[best]:.4f}"
            + (f", target in {s['time_to_target_s']:.1f} s" if s["time_to_target_s"] is not None else ""))
    return ranking


def tune(cfg, out, top=3, time_limit=0.0, predict_steps=None, policies=None, cache=None, progress=True,
         log=print, remeasure_disk=False) -> dict:
    """Rank every candidate under `cfg`'s budget, train the `top` fastest predicted, write the choice to
    `out` (see the module docstring) and return {chosen, ranking, config}. `remeasure_disk`: measure the
    disk's rates now instead of taking the cached ones (a virtual disk's random rate follows its host's cache)."""
    if top < 1:
        raise UserError(f"--top must be >= 1, got {top}")
    if not 0 <= time_limit < float("inf"):
        raise UserError(f"--time-limit must be a finite number of seconds >= 0 (0: no limit), got {time_limit}")
    if predict_steps is not None and predict_steps < 0:
        raise UserError(f"--predict-steps must be >= 0 (0: a whole epoch), got {predict_steps}")
    out = Path(out)
    others = sorted(p.name for p in out.iterdir() if p.name not in TUNE_FILES) if out.is_dir() else []
    if others:                                     # an interrupted tune left only its own: taken again
        raise UserError(f"{out} holds other files ({', '.join(others[:3])}); give --out a new or a tune directory")
    store = open_store(cfg.store)
    cfg = task_defaults(cfg, store.task)           # a link store's defaults where not given
    check_target(cfg.target_metric, store.num_classes, store.task, shared_negatives(store))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rates = measure_disk(store, cache=cache, refresh=remeasure_disk)
    log(f"disk{'' if remeasure_disk else ' (cached per device; --remeasure-disk to measure it now)'}: "
        f"{rates.seq_bytes_s / 1e6:.0f} MB/s sequential, {rates.iops:,.0f} random 4 KiB reads/s in flight, "
        f"{rates.iops_qd1:,.0f}/s one at a time")
    costs = calibrate(store, cfg, cache=cache)
    log(f"calibrated {cfg.model} (hidden {cfg.hidden}, fanouts {cfg.fanouts}, batch {cfg.batch_size}) "
        f"on {costs.steps} in-memory steps")
    ranking = rank(store, cfg, rates, costs, policies, predict_steps, progress)
    fits = ranking[ranking.fits]
    if fits.empty:
        ranking.to_csv(out / "ranking.csv", index=False)
        raise UserError(f"no candidate fits --memory-budget {cfg.memory_budget} (see {out / 'ranking.csv'})")
    log(f"{len(fits)} of {len(ranking)} candidates fit {cfg.memory_budget}; predicted epoch seconds:")
    for _, r in fits.iterrows():
        log(f"  {r['rank']:>3}. {r.config:<44} {r.predicted_s:8.2f} s")
    runs = list(fits.drop_duplicates("policy").index[:top])       # each policy's fastest knobs
    share = time_limit / len(runs) if time_limit else 0.0
    ranking = run_candidates(cfg, ranking, runs, out / "runs", seconds=share, log=log)
    chosen = choose(ranking.loc[runs], cfg.target_acc, cfg.target_metric)
    ranking["chosen"] = ranking.index == chosen
    pick = ranking.loc[chosen]
    config = cfg.replace(policy=pick.policy, **json.loads(pick.knobs), out="", force=False, resume="",
                         max_steps=0, store=str(Path(cfg.store).resolve())).to_dict()   # usable from anywhere
    config.pop("memory_budget_bytes", None)
    (out / "chosen.json").write_text(json.dumps(config, indent=1))
    ranking.to_csv(out / "ranking.csv", index=False)
    best = summary_keys(cfg.target_metric)[0]
    summary = {"chosen": pick.config, "store": str(store.path), "memory_budget": cfg.memory_budget,
               "target_metric": cfg.target_metric, "target_acc": cfg.target_acc, "time_limit": time_limit, "top": top,
               "seconds": time.perf_counter() - t0, "disk": rates.__dict__, "calibration": costs.__dict__,
               "measured": ranking.loc[runs, ["config", "predicted_s", "measured_s", "ratio", best,
                                              "time_to_target_s"]].to_dict("records")}
    (out / "tune.json").write_text(json.dumps(summary, indent=1, default=str))
    _figure(ranking, out / "predicted_vs_measured.png", f"{Path(store.path).name}, budget {cfg.memory_budget}")
    log(f"chose {pick.config}: wrote {out / 'chosen.json'}, ranking.csv, tune.json; "
        f"train it with `oocgnn train --config {out / 'chosen.json'}`")
    return {"chosen": pick.config, "ranking": ranking, "config": config, "out": str(out)}


def _figure(ranking, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fits = ranking[ranking.fits]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.28 * len(fits))))
    y = np.arange(len(fits))[::-1]
    ax.barh(y, fits.predicted_s, color="tab:blue", alpha=0.6, label="predicted")
    if "measured_s" in fits:
        m = fits.measured_s.notna()
        ax.scatter(fits.measured_s[m], y[m.to_numpy()], color="tab:orange", zorder=3, label="measured")
    if "chosen" in fits:
        for yy, c in zip(y, fits.chosen):
            if c:
                ax.annotate("chosen", (0, yy), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(y, fits.config, fontsize=8)
    ax.set_xlabel("epoch seconds")
    ax.set_title(f"tune: {title}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def policy_map(stores: dict, fractions, cfg, policies=None, steps=None, cache=None, progress=True) -> pd.DataFrame:
    """The predicted best policy per (graph, budget): `stores` maps a label (e.g. the graph's mixing) to a
    store, `fractions` are budgets as fractions of each store's feature file. One row per fitting candidate
    and cell, ranked within the cell (`rank`); `best` marks each cell's fastest."""
    out = []
    for label, store in stores.items():
        rates = measure_disk(store, cache=cache)
        c = cfg.replace(store=str(store.path))
        costs = calibrate(store, c, cache=cache)
        for f in fractions:
            budget = f"{int(f * store.num_nodes * store.row_stride)}B"
            df = rank(store, c.replace(memory_budget=budget), rates, costs, policies, steps, progress)
            df = df[df.fits].assign(graph=label, fraction=f, budget_bytes=parse_size(budget))
            df["best"] = df["rank"] == df["rank"].min()
            out.append(df)
    return pd.concat(out, ignore_index=True)
