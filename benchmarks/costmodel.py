"""Predicted vs measured epoch time of every policy (`oocgnn.costmodel`), in one run.

Uses (or prepares) the partition-ordered store data/<preset>-fennel-<K> (as benchmarks/train.py),
measures this disk's rates (again before each configuration's run, unless --disk-once: a virtual
disk's random rate follows its host's cache, 7.5-9.4K reads/s on a file untouched for weeks against
50-65K on one read minutes ago, measured here) and calibrates the per-batch CPU costs (short inmemory
and HierBatching runs), then for each configuration: predicts an epoch's time from the simulator's exact I/O (of the
first `--steps` batches, extrapolated; 0: a whole epoch), and trains it in a fresh process; the
measured epoch time is the steady state (`steady_epoch_s`: the second of two epochs, or with --steps
the steps after a fresh process's first few, extrapolated). Prints a table
(predicted, measured, their ratio, within ±20 %, the predicted parts: CPU, random reads, loads,
foreground/background) and writes it with a figure to --out.

    .venv/bin/python benchmarks/costmodel.py [--preset small] [--parts 256] [--budget 80MB] [--steps 0]
        [--policies inmemory,mmap,hierbatching,outre,ginex,macrobatch,marius] [--out figures/07_cost_model]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import train as bench_train  # noqa: E402
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402

DEFAULT_POLICIES = "inmemory,mmap,hierbatching,outre,ginex,macrobatch,marius,marius-beta"


SKIP = 4      # with --steps: the first steps of a fresh process, run but not measured


def steady_epoch_s(summary, skip=0, column="seconds"):
    """A run's steady-state epoch seconds from its steps.csv: its second epoch's steps, or with `skip`
    (a run of a window of an epoch), the mean of the steps after the first `skip` times an epoch's steps.
    `column`: a stage's seconds (sample_s, gather_s, compute_s) instead of the steps'."""
    import pandas as pd
    per = pd.read_csv(Path(summary["run_dir"]) / "steps.csv")
    if not skip:
        return float(per[per.epoch == 1][column].sum())
    return float(per[column].iloc[skip:].mean() * summary["epoch_steps"])


def measure_disk(store, cache, indent=""):
    """The disk's rates, measured now (not the cached ones), printed."""
    from oocgnn import disk
    t = time.perf_counter()
    rates = disk.measure_disk(store, cache=cache, refresh=True)
    print(f"{indent}disk: sequential {rates.seq_bytes_s / 1e6:.0f} MB/s, random 4 KiB {rates.iops:,.0f}/s in flight, "
          f"{rates.iops_qd1:,.0f}/s one at a time ({time.perf_counter() - t:.1f} s)", flush=True)
    return rates


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="small", help="synthetic preset")
    ap.add_argument("--parts", type=int, default=256, help="FENNEL parts of the store")
    ap.add_argument("--budget", default="80MB", help="memory budget of every out-of-core policy")
    ap.add_argument("--steps", type=int, default=0, help="steps per run and per prediction (0: one epoch)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES, help="configurations (benchmarks/train.py's VARIANTS)")
    ap.add_argument("--batch-size", type=int, default=1024, help="mini-batch size")
    ap.add_argument("--fanouts", default="10,10", help="sampling fanouts")
    ap.add_argument("--physical-parts", type=int, default=16, help="marius p")
    ap.add_argument("--superbatch", type=int, default=16, help="ginex S")
    ap.add_argument("--macrobatch", type=int, default=4, help="macrobatch k")
    ap.add_argument("--eval-nodes", type=int, default=500, help="evaluation nodes per split (excluded from time)")
    ap.add_argument("--tolerance", type=float, default=0.2, help="the target: |predicted/measured - 1| <= this")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory")
    ap.add_argument("--cache-dir", default="", help="where disk rates and calibrations are cached "
                                                   "(default $OOCGNN_CACHE or ~/.cache/oocgnn)")
    ap.add_argument("--disk-once", action="store_true",
                    help="measure the disk's rates once, at the start, not again before each configuration's run "
                         "(a virtual disk's rates follow its host's cache: a file read minutes ago reads randomly "
                         "several times faster than one untouched for days, so a run's rates are those of its time)")
    ap.add_argument("--out", default="", help="write <out>.csv and <out>.png (default: print only)")
    add_csv_argument(ap, "bench/costmodel.csv under --data")
    args = ap.parse_args(argv)
    names = args.policies.split(",")
    unknown = [n for n in names if n not in bench_train.VARIANTS]
    if unknown:                                   # before the calibration, not after it
        ap.error(f"unknown configuration(s) {', '.join(unknown)}; choose from {', '.join(bench_train.VARIANTS)}")

    import pandas as pd
    from oocgnn import costmodel
    from oocgnn.config import TrainConfig
    from oocgnn.errors import UserError
    from oocgnn.policies import make_plan
    from oocgnn.train import train_fresh

    store, _ = bench_train.ensure_store(args.preset, args.parts, Path(args.data))
    base = {"store": str(store.path), "memory_budget": args.budget, "batch_size": args.batch_size,
            "fanouts": args.fanouts, "max_eval_nodes": args.eval_nodes, "progress": False, "force": True,
            "epochs": 1, "physical_parts": args.physical_parts, "superbatch": args.superbatch,
            "macrobatch": args.macrobatch, "static_ratio": 0.01}
    no_megabatch = None
    try:
        base["parts_per_megabatch"] = bench_train.choose_megabatch(store, base)
    except UserError as e:                      # the configurations with mega-batches are rows saying so
        no_megabatch = e
    cache = args.cache_dir or None
    print(f"store {store.path}: {store.num_nodes:,} nodes, budget {args.budget}, load {loadavg()}", flush=True)
    rates = measure_disk(store, cache) if args.disk_once else None     # else measured before each run
    costs = costmodel.calibrate(store, TrainConfig.create(**base), cache=cache, refresh=True)
    print(f"calibration ({costs.steps} inmemory steps): sample {costs.sample_step_s * 1e3:.2f} ms/step + "
          f"{costs.sample_s * 1e9:.0f} ns/expanded node, gather {costs.gather_step_s * 1e3:.2f} ms/step + "
          f"{costs.gather_s * 1e9:.0f} ns/row, compute {costs.compute_step_s * 1e3:.2f} ms/step + "
          f"{costs.compute_s * 1e9:.0f} ns/row, load {loadavg()}", flush=True)
    table = BenchTable(args.csv or Path(args.data) / "bench" / "costmodel.csv")
    with tempfile.TemporaryDirectory(prefix="oocgnn-costmodel-") as tmp:
        for name in names:
            policy, over = bench_train.VARIANTS[name]
            # steady state: a fresh process's first steps (allocations, thread pools) are not an epoch's,
            # nor is a window's first phase (its first group's load stands alone); both sides skip them
            cfg = TrainConfig.create(**{**base, **over, "policy": policy, "epochs": 1 if args.steps else 2,
                                        "out": str(Path(tmp) / name)})

            def one():
                nonlocal rates
                if no_megabatch and policy in ("hierbatching", "composed"):
                    raise no_megabatch
                plan = make_plan(store, cfg)          # a plan over the budget: its row says so
                if not args.disk_once:
                    rates = measure_disk(store, cache, indent="  ")
                skip, run_cfg = 0, cfg
                if args.steps:
                    first = costmodel.predict(store, plan, rates, costs, steps=args.steps)["first_phase_steps"]
                    skip = max(SKIP, first if first < args.steps else 0)
                    run_cfg = cfg.replace(max_steps=args.steps + skip)
                    plan = make_plan(store, run_cfg)
                pred = costmodel.predict(store, plan, rates, costs, steps=args.steps + skip if args.steps else None)
                load = loadavg()
                s = train_fresh(run_cfg)
                measured = steady_epoch_s(s, skip)
                check = costmodel.check_prediction(pred, measured, args.tolerance)
                row = {"steps": s["steps"], "epoch_steps": s["epoch_steps"],
                       "predicted_s": pred["epoch_s"], "measured_s": measured, "ratio": check["ratio"],
                       "within": check["within"], "cpu_s": pred["sample"] + pred["gather"] + pred["compute"],
                       "read_s": pred["read"], "load_s": pred["load"], "fg_s": pred["fg"], "bg_s": pred["bg"],
                       "exact_io": pred["exact_io"], "measured_stages": s["stage_s"], "load": load,
                       "disk_iops": rates.iops, "disk_iops_qd1": rates.iops_qd1}
                # where a miss comes from: each foreground stage, predicted (an epoch's) and measured (steady)
                scale = pred["epoch_s"] / max(pred["seconds"], 1e-12)
                stages = {k: (pred[k] * scale, steady_epoch_s(s, skip, f"{k}_s"))
                          for k in ("sample", "gather", "compute")}
                row.update({f"{k}_pred_s": a for k, (a, _) in stages.items()})
                row.update({f"{k}_meas_s": b for k, (_, b) in stages.items()})
                # the loads' processor time (residency copies, a group's subgraph), an epoch's: measured by thread_time
                st = s["stage_s"]
                bg_meas = ((st.get("bg_load_cpu", 0.0) + st.get("bg_subgraph_cpu", 0.0))
                           * s["epoch_steps"] / max(s["steps"], 1))
                row.update(load_cpu_pred_s=pred["load_cpu"] * scale, load_cpu_meas_s=bg_meas)
                print(f"  {name:<14} predicted {pred['epoch_s']:8.2f} s  measured {measured:8.2f} s  "
                      f"ratio {check['ratio']:.2f}  load {load}\n{'':16} " +
                      "  ".join(f"{k} {a:.2f}/{b:.2f}" for k, (a, b) in stages.items()) +
                      f"  (predicted/measured s); predicted reads {pred['read'] * scale:.2f}, loads "
                      f"{pred['load'] * scale:.2f} + CPU {pred['load_cpu'] * scale:.2f} s "
                      f"(measured CPU {bg_meas:.2f} s)",
                      flush=True)
                return row

            table.run(name, one)
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "status"} for r in table.rows if table.ok(r["config"])])
    if df.empty:
        print(f"no configuration ran (the rows above say why); table {table.path}")
        return df
    shown = df.drop(columns=["measured_stages"])
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for r in table.failed():
        print(f"{r['config']:>10} {r['status']}")
    print(f"within ±{args.tolerance:.0%}: {int(df['within'].sum())} of {len(df)}; median |ratio - 1| "
          f"{statistics.median(abs(df['ratio'] - 1)):.2f}; load {loadavg()}")
    print(f"table: {table.path}")
    if args.out:
        import matplotlib
        matplotlib.use("Agg")
        from oocgnn.plots import plot_prediction, save_figure
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shown.to_csv(out.with_suffix(".csv"), index=False)
        fig = plot_prediction(df, f"{Path(store.path).name}, budget {args.budget}", args.tolerance)
        save_figure(fig, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.png')}")
    return df


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
