"""Figures shared by the CLI and the notebooks."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from .errors import UserError
from .metrics import METRICS, NAMES, SHARED_HITS, summary_keys
from .rundir import load_run


MIXING_COLUMNS = {"parts_mean": "mixing_parts", "tv_mean": "mixing_tv_mean", "tv_max": "mixing_tv_max"}
SUMMARY_METRICS = [key for m in METRICS for key in summary_keys(m)]   # best_val_acc, test_at_best_val, ...
LINK_METRICS = ("mrr", "hits@10", *SHARED_HITS)    # a link run's (`linktask`; Hits@20/50/100 with OGB's shared pairs)
LINK_SUMMARY_METRICS = [key for m in LINK_METRICS for key in summary_keys(m)]


def run_task(runs: pd.DataFrame) -> str:
    """'node' or 'link': the task of the runs of `load_runs` (refused when they mix both: their metrics differ)."""
    tasks = set(runs["task"])
    if len(tasks) > 1:
        raise UserError("these runs mix node classification and link prediction: report each task's runs apart")
    return tasks.pop()


def load_runs(run_dirs) -> pd.DataFrame:
    """Concatenate the log.csv of several finished run directories (checked: `rundir.load_run`),
    labelled by policy/model/seed, group (a `train --seeds` directory: its seeds' runs, one group) and
    the mixing of the run's groups (`oocgnn.mixing`)."""
    from .seeds import seed_runs  # torch: imported when used, not with this module
    frames = []
    for top, d in [(top, d) for top in map(Path, run_dirs) for d in seed_runs(top)]:
        cfg, log, summary = load_run(d)
        log = log.copy()
        log.insert(0, "run", d.name if d == top else f"{top.name}/{d.name}")
        log.insert(1, "group", top.name)
        log.insert(2, "policy", cfg["policy"])
        log.insert(3, "model", cfg["model"])
        log.insert(4, "seed", cfg["seed"])
        link = "val_mrr" in log.columns
        log.insert(5, "task", "link" if link else "node")
        for key in LINK_SUMMARY_METRICS if link else SUMMARY_METRICS:   # runs from before macro-F1 and ROC-AUC
            log[key] = summary.get(key)                                 # have none of theirs
        mix = summary.get("mixing") or {}          # runs from before `oocgnn.mixing` have none
        for key, col in MIXING_COLUMNS.items():
            log[col] = mix.get(key)
        frames.append(log)
    return pd.concat(frames, ignore_index=True)


def seed_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per group of `load_runs`: its policy, seeds, accuracies, macro-F1 and (binary labels)
    ROC-AUC as mean ± std over them; for link runs MRR and Hits@10 (and Hits@20/50/100 where OGB's shared
    negative pairs ranked them)."""
    from .seeds import format_mean_std, mean_std  # torch: imported when used, not with this module
    link = "task" in runs and run_task(runs) == "link"
    metrics, final = (LINK_METRICS, "test_mrr") if link else (METRICS, "test_acc")
    rows = []
    for group, g in runs.groupby("group" if "group" in runs else "run", sort=False):
        last = g.groupby("run", sort=False).tail(1)        # one row per run: its summary's values
        rows.append({"group": group, "policy": last["policy"].iloc[0], "seeds": ",".join(map(str, last["seed"])),
                     **{key: format_mean_std(mean_std(last[key])) for m in metrics for key in summary_keys(m)
                        if last[summary_keys(m)[0]].notna().any()},      # AUC: binary labels only
                     f"final_{final}": format_mean_std(mean_std(last[final]))})
    return pd.DataFrame(rows)


def plot_time_to_accuracy(runs: pd.DataFrame, ax=None, metric="val_acc", title=None):
    """Accuracy against training wall time: one line per run, or per group of seeds (`load_runs`) the
    seeds' mean at each evaluation with a ± std band (`seeds.aggregate_logs`)."""
    import matplotlib.pyplot as plt
    from .seeds import aggregate_logs  # torch: imported when used, not with this module
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    for group, g in runs.groupby("group" if "group" in runs else "run", sort=False):
        logs = [log for _, log in g.groupby("run", sort=False)]
        if len(logs) == 1:
            log = logs[0]
            ax.plot(log["wall_s"], log[metric], marker="o", ms=3, label=f"{log['policy'].iloc[0]} ({log['run'].iloc[0]})")
            continue
        a = aggregate_logs(logs)
        m, sd = a[f"{metric}_mean"], a[f"{metric}_std"]
        line, = ax.plot(a["wall_s_mean"], m, marker="o", ms=3,
                        label=f"{logs[0]['policy'].iloc[0]} ({group}, mean ± std of {len(logs)} seeds)")
        ax.fill_between(a["wall_s_mean"], m - sd, m + sd, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(title or "time to accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def link_curves(logs: pd.DataFrame, metric="mrr") -> pd.DataFrame:
    """Link runs' logs (log.csv rows of `linktask`, a `label` column naming the configuration and a `seed` column)
    reduced per label and evaluation: the seeds' mean and std (ddof 1, 0 for one seed) of the wall time and of
    val_/test_`metric`, and the epochs trained (evaluations at epochs' ends: the log's epoch + 1, 0 before the first
    step). Seeds are compared evaluation by evaluation (the same epochs)."""
    rows = []
    for label, g in logs.groupby("label", sort=False):
        runs = [r.reset_index(drop=True) for _, r in g.groupby("seed", sort=True)]
        n = min(len(r) for r in runs)
        for i in range(n):
            at = pd.DataFrame([r.iloc[i] for r in runs])
            row = {"label": label, "evaluation": i, "seeds": len(runs),
                   "epochs": int(at["epoch"].iloc[0]) + (1 if at["step"].iloc[0] > 0 else 0)}
            for col in ("wall_s", f"val_{metric}", f"test_{metric}"):
                values = at[col].astype(float)
                row[f"{col}_mean"] = values.mean()
                row[f"{col}_std"] = values.std(ddof=1) if len(values) > 1 else 0.0
            rows.append(row)
    return pd.DataFrame(rows)


def plot_link_curves(logs: pd.DataFrame, metric="mrr", title=""):
    """Validation and test `metric` (MRR, Hits@K) of link runs against training wall time and against epochs, one
    line per label (`link_curves`: the seeds' mean at each evaluation, a ± std band)."""
    import matplotlib.pyplot as plt
    curves = link_curves(logs, metric)
    name = NAMES.get(metric, metric)
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharey="row")
    for i, (label, c) in enumerate(curves.groupby("label", sort=False)):
        colour = plt.cm.tab10(i % 10)
        seeds = int(c["seeds"].iloc[0])
        for row, split in enumerate(("val", "test")):
            m, sd = c[f"{split}_{metric}_mean"], c[f"{split}_{metric}_std"]
            for col, x in enumerate((c["wall_s_mean"], c["epochs"])):
                ax = axes[row, col]
                ax.plot(x, m, marker="o", ms=3, color=colour,
                        label=label + (f" (mean ± std of {seeds} seeds)" if seeds > 1 else ""))
                ax.fill_between(x, m - sd, m + sd, color=colour, alpha=0.15)
    for row, split in enumerate(("validation", "test")):
        axes[row, 0].set_ylabel(f"{split} {name}")
        axes[row, 0].set_xlabel("training wall time (s; evaluation excluded)")
        axes[row, 1].set_xlabel("epochs")
        for ax in axes[row]:
            ax.grid(alpha=0.3)
    axes[0, 0].set_title(f"{name} against time")
    axes[0, 1].set_title(f"{name} against epochs")
    axes[0, 0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_comparison(table: pd.DataFrame, logs: pd.DataFrame, target=None, feature_bytes=None, title="",
                    note="", metric="acc"):
    """`compare.compare`'s answer in three panels: validation `metric` (its --target-metric) against
    training time per policy (the target dashed), the time each took to the target, and what each read per
    epoch (the feature file's size marked). A policy that did not run is named in the bar panels with its
    reason's start."""
    import matplotlib.pyplot as plt
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [5, 3, 3]})
    policies = list(table["policy"])
    colours = {p: plt.cm.tab10(i % 10) for i, p in enumerate(policies)}
    for p, log in logs.groupby("policy", sort=False):
        a.plot(log["wall_s"], log[f"val_{metric}"], marker="o", ms=3, color=colours[p], label=p)
    if target:
        a.axhline(target, color="k", ls="--", lw=0.8, label=f"target {target:.3f}")
    a.set_xlabel("training wall time (s)")
    a.set_ylabel(f"validation {NAMES[metric]}")
    a.set_title(f"time to {NAMES[metric]}")
    a.legend(fontsize=8)
    y = np.arange(len(table))[::-1]
    ran = table["status"].astype(str).str.startswith("ok").to_numpy()

    def bars(ax, values, label, fmt):
        vals = pd.to_numeric(values, errors="coerce").to_numpy(float)
        ax.barh(y, np.where(ran & np.isfinite(vals), vals, 0), color=[colours[p] for p in policies])
        for yi, v, ok, status in zip(y, vals, ran, table["status"]):
            text = fmt(v) if ok and np.isfinite(v) else "not reached" if ok else str(status).split(":")[0]
            if ok and np.isfinite(v) and v > 0:
                ax.text(v, yi, f" {text}", va="center", fontsize=7)
            else:                                 # at the axis' left edge, whatever its scale
                ax.text(0.01, yi, text, va="center", fontsize=7, transform=ax.get_yaxis_transform())
        ax.set_yticks(y, policies)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3, axis="x")
        ax.set_xlim(0, max(np.nanmax(np.where(ran, vals, 0), initial=0), 1e-9) * 1.35)

    bars(b, table["time_to_target_s"], "seconds", lambda v: f"{v:.1f} s")
    b.set_title(f"training time to val {target:.3f}" if target else "time to target")
    mib = pd.to_numeric(table["read_per_epoch"], errors="coerce") / 2**20
    bars(c, mib, "MiB read per epoch (setup excluded)", lambda v: f"{v:,.0f}" if v else "nothing")
    positive = mib[mib > 0]
    if len(positive) and positive.max() / positive.min() > 20:     # the bars span orders of magnitude
        c.set_xscale("log")
        c.set_xlim(positive.min() / 3, positive.max() * 4)
        c.set_xlabel("MiB read per epoch (setup excluded; log)")
    if feature_bytes:
        c.axvline(feature_bytes / 2**20, color="k", ls="--", lw=0.8)
        c.text(feature_bytes / 2**20, 1.0, " feature file", fontsize=7, va="bottom",
               transform=c.get_xaxis_transform())
        if c.get_xscale() == "linear":
            c.set_xlim(0, max(c.get_xlim()[1], feature_bytes / 2**20 * 1.35))
    c.set_title("bytes read")
    fig.suptitle(title, fontsize=10)
    if note:
        fig.text(0.5, -0.02, note, ha="center", fontsize=8, color="0.3")
    fig.tight_layout()
    return fig


def save_figure(fig, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


REPO = Path(__file__).resolve().parents[1]


def setup_notebook(seed: int = 0):
    """The one setup call of every notebook: seeds, plot style, table display (3 decimals, wide tables),
    paths independent of the cwd."""
    import matplotlib.pyplot as plt
    import torch
    np.random.seed(seed)
    torch.manual_seed(seed)
    for option, value in {"display.precision": 3, "display.width": 200, "display.max_colwidth": 90,
                          "display.max_columns": 30}.items():
        pd.set_option(option, value)
    plt.rcParams.update({"figure.figsize": (6.4, 4.0), "figure.dpi": 100, "axes.grid": True,
                         "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False})
    paths = SimpleNamespace(repo=REPO, data=REPO / "data", figures=figures_dir())
    paths.data.mkdir(exist_ok=True)
    paths.figures.mkdir(exist_ok=True)
    return paths


def figures_dir() -> Path:
    """figures/, or $OOCGNN_FIGURES (the notebook tests set it, so checking leaves figures/ alone)."""
    return Path(os.environ.get("OOCGNN_FIGURES") or REPO / "figures")


def savefig(fig, name: str):
    """Save a notebook figure as <figures>/<name>.png (name like '01_edge_cut')."""
    save_figure(fig, figures_dir() / f"{name}.png")


def plot_sweep(logs: pd.DataFrame, summary: pd.DataFrame, param: str, metric="acc", zoom=0.02):
    """Two panels: validation `metric` (acc, f1 or auc: `metrics.METRICS`) against training time per value
    of `param`, and its test value at the best validation vs `param`. `zoom`: the time-to-accuracy axis
    starts this far below the first evaluation after t = 0 (every run starts near chance at t = 0); None
    shows it all."""
    import matplotlib.pyplot as plt
    curve, name = f"val_{metric}", NAMES[metric]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for value, log in logs.groupby(param, sort=True):
        mean = log.groupby("step")[["wall_s", curve]].mean()
        std = log.groupby("step")[curve].std(ddof=1).fillna(0.0)      # over seeds: a ± std band
        line, = a.plot(mean["wall_s"], mean[curve], marker="o", ms=3, label=f"{param}={value}")
        a.fill_between(mean["wall_s"], mean[curve] - std, mean[curve] + std, color=line.get_color(), alpha=0.2)
    a.set_xlabel("training wall time (s)")
    a.set_ylabel(f"validation {name}")
    a.set_title(f"time to {name}")
    a.legend(fontsize=8)
    if zoom is not None and (logs["step"] > 0).any():
        a.set_ylim(logs.loc[logs["step"] > 0, curve].min() - zoom, None)
    agg = summary.groupby(param)[summary_keys(metric)[1]].agg(["mean", "std"]).reset_index()
    b.errorbar(agg[param].astype(str), agg["mean"], yerr=agg["std"].fillna(0), marker="o", capsize=3)
    b.set_xlabel(param)
    b.set_ylabel(f"test {name} at best validation")
    b.set_title(f"{name} vs {param}")
    return fig


def plot_prediction(df: pd.DataFrame, title="", tolerance=0.2):
    """Predicted vs measured epoch seconds per configuration (`costmodel`): bars side by side on a log
    scale, the ratio written above each pair, and the ±tolerance band in a second panel."""
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    x = np.arange(len(df))
    ax.bar(x - 0.2, df["predicted_s"], 0.4, label="predicted")
    ax.bar(x + 0.2, df["measured_s"], 0.4, label="measured")
    ax.set_yscale("log")
    ax.set_xticks(x, df["config"], rotation=30, ha="right")
    ax.set_ylabel("epoch seconds")
    ax.set_title(f"epoch time, predicted vs measured{': ' + title if title else ''}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    bx.axhspan(1 - tolerance, 1 + tolerance, color="tab:green", alpha=0.15, label=f"±{tolerance:.0%}")
    bx.axhline(1, color="k", lw=0.8)
    bx.scatter(x, df["ratio"], color=["tab:blue" if w else "tab:red" for w in df["within"]], zorder=3)
    bx.set_xticks(x, df["config"], rotation=30, ha="right")
    bx.set_ylabel("predicted / measured")
    bx.set_title("ratio")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_policy_map(pm: pd.DataFrame, measured: pd.DataFrame | None = None, graph_label="graph"):
    """`tune.policy_map`'s answer as a map: per graph (rows) and budget (columns), the cell coloured by the
    predicted best policy and labelled with its knobs and epoch seconds (and, where `measured` has the cell,
    the measured best, marked ✓ when it agrees); beside it, each policy's best predicted epoch time against
    the budget, one line style per graph."""
    import matplotlib.pyplot as plt
    graphs, fractions = list(dict.fromkeys(pm["graph"])), sorted(pm["fraction"].unique())
    policies = sorted(pm["policy"].unique())
    colours = {p: plt.cm.tab10(i % 10) for i, p in enumerate(policies)}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 1.2 + 1.1 * len(graphs)), gridspec_kw={"width_ratios": [3, 2]})
    for i, g in enumerate(graphs):
        for j, f in enumerate(fractions):
            cell = pm[(pm["graph"] == g) & (pm["fraction"] == f)]
            if cell.empty:
                continue
            best = cell.loc[cell["predicted_s"].idxmin()]
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, color=colours[best["policy"]], alpha=0.45))
            text = f"{best['config']}\n{best['predicted_s']:.2f} s"
            if measured is not None:
                m = measured[(measured["graph"] == g) & (measured["fraction"] == f)]
                if len(m):
                    top = m.loc[m["measured_s"].idxmin()]
                    text += f"\nmeasured: {top['config'].split()[0]} {top['measured_s']:.2f} s" + \
                        (" ✓" if top["config"] == best["config"] else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.5, len(fractions) - 0.5)
    ax.set_ylim(len(graphs) - 0.5, -0.5)
    ax.set_xticks(range(len(fractions)), [f"{f:.0%}" for f in fractions])
    ax.set_yticks(range(len(graphs)), [str(g) for g in graphs])
    ax.set_xlabel("memory budget (share of the feature file)")
    ax.set_ylabel(graph_label)
    ax.set_title("predicted best policy per graph and budget")
    ax.grid(False)
    styles = ["-", "--", ":", "-."]
    for i, g in enumerate(graphs):
        sub = pm[pm["graph"] == g].groupby(["policy", "fraction"])["predicted_s"].min().reset_index()
        for p, line in sub.groupby("policy"):
            bx.plot(line["fraction"], line["predicted_s"], styles[i % 4], marker="o", ms=3, color=colours[p],
                    label=p if i == 0 else None)
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xlabel("memory budget (share of the feature file)")
    bx.set_ylabel("predicted epoch seconds (best knobs)")
    bx.set_title(f"each policy's best; line style: {graph_label} " + ", ".join(
        f"{g} {styles[i % 4]}" for i, g in enumerate(graphs)), fontsize=9)
    bx.legend(fontsize=7)
    fig.tight_layout()
    return fig
