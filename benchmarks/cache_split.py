"""OUTRE's automatic cache split (§4.4, Eq. 5) against a brute-force α sweep, in one run.

For each budget, the outre plan with --history-ratio auto picks α (the histories' share of what the
budget leaves after the topology) from its profiling epochs; OUTRE's plain Eq. 5 (saved_I/O_hist =
the first-discoverer saved_gather, every meeting a hit, no overlap, counted on the epoch that chose
the caches) is shown beside it. Then, for α = 0, 0.1, ..., 0.9, the plan with the histories that α
buys (a fixed --history-ratio; the feature cache gets the rest) is simulated for --epochs epochs
(`oocgnn.simulate`: exact reads, no data read): disk pages (features + lists + loads), feature rows
read and history hits, beside the rows auto's Eq. 5 predicts saved; the last row is the auto plan
itself. Prints the brute-force best α and the machine load (the sweep reads nothing, so its numbers do not depend on it).

    .venv/bin/python benchmarks/cache_split.py --store PATH --budgets 32MB,80MB [--epochs 5]
        [--batch-size 1024] [--parts-per-macro 20] [--staleness 100]
    .venv/bin/python benchmarks/cache_split.py --preset small --parts 64 [--data data/]   # FENNEL store
"""
import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402


def plain_eq5(plan):
    """α of OUTRE's Eq. 5 as the paper computes it, from the plan's own profiling epoch."""
    from oocgnn.importance import choose_history_split
    o, n, prof = plan.options, plan.store.num_nodes, plan.profile
    share = plan.split["split_budget"]
    return choose_history_split(prof["accesses"].to_numpy(), prof["saved_gather"].to_numpy(), share,
                                plan.store.row_bytes, plan._history_dim() * 4 + 8, table_hist=4 * n,
                                feat_score=plan.store.degrees() if o.feature_cache == "degree" else None)[0]


def sweep(store, cfg, epochs):
    """(auto plan, plain Eq. 5 α, rows of the α sweep)."""
    import numpy as np
    from oocgnn.policies import make_plan
    from oocgnn.simulate import simulate, summarize
    t0 = time.perf_counter()
    auto = make_plan(store, cfg)
    build_s = time.perf_counter() - t0
    table, n, rows = auto.split_table, store.num_nodes, []
    for a in np.arange(10) / 10:
        at = table.loc[np.isclose(table["alpha"], a)].iloc[0] if table is not None else None
        k = int(at["history_rows"]) if at is not None else 0
        plan = make_plan(store, cfg.replace(history_ratio=(k + 0.5) / n if k else 0.0))
        s = summarize(simulate(store, plan, epochs=epochs, progress=False))
        rows.append({"alpha": a, "history_rows": k, "cache_rows": plan.cache_rows,
                     "predicted_saved": None if at is None else float(at["benefit"]),
                     "disk_pages": int(s["disk_pages"].sum()), "feature_rows_read": int(s["feature_rows_read"].sum()),
                     "history_hits": int(s["history_hits"].sum()) if "history_hits" in s else 0})
    s = summarize(simulate(store, auto, epochs=epochs, progress=False))
    rows.append({"alpha": auto.cache_split, "history_rows": auto.split["history_rows"], "cache_rows": auto.cache_rows,
                 "predicted_saved": None if table is None else float(table["benefit"].max()), "auto": True,
                 "disk_pages": int(s["disk_pages"].sum()), "feature_rows_read": int(s["feature_rows_read"].sum()),
                 "history_hits": int(s["history_hits"].sum()) if "history_hits" in s else 0})
    return auto, build_s, (plain_eq5(auto) if table is not None else 0.0), rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--store", help="a partitioned store (default: data/<preset>-fennel-<parts>, prepared)")
    ap.add_argument("--preset", default="small", help="synthetic preset when no --store (default small)")
    ap.add_argument("--parts", type=int, default=64, help="FENNEL parts when no --store (default 64)")
    ap.add_argument("--data", default=str(REPO / "data"), help="where a prepared store goes (default data/)")
    ap.add_argument("--budgets", default="32MB,80MB", help="memory budgets, comma-separated (default 32MB,80MB)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the run (auto's and simulated; default 5)")
    ap.add_argument("--batch-size", type=int, default=1024, help="training nodes per micro-batch (default 1024)")
    ap.add_argument("--parts-per-macro", type=int, default=20, help="parts per macro batch (default 20)")
    ap.add_argument("--staleness", type=int, default=100, help="history staleness in iterations (default 100)")
    add_csv_argument(ap, "bench/cache_split.csv under --data")
    args = ap.parse_args(argv)
    from benchmarks.sampler import loadavg
    if args.store:
        from oocgnn.store import open_store
        store = open_store(args.store, verify=False)
    else:
        from benchmarks.train import ensure_store
        store = ensure_store(args.preset, args.parts, Path(args.data))[0]
    print(f"{store}, epochs {args.epochs}, batch {args.batch_size}, {args.parts_per_macro} parts/macro, "
          f"staleness {args.staleness}, load {loadavg()}")
    table = BenchTable(args.csv or Path(args.data) / "bench" / "cache_split.csv")
    for budget in args.budgets.split(","):
        table.run(budget, lambda: one_budget(store, budget, args))
    for r in table.failed():
        print(f"\nbudget {r['config']}: {r['status']}")
    print(f"load after: {loadavg()}")


def one_budget(store, budget, args):
    """Sweep one budget, print its table; the CSV row: auto's choice against the brute-force best."""
    from oocgnn.config import TrainConfig
    cfg = TrainConfig.create(store=str(store.path), policy="outre", memory_budget=budget, epochs=args.epochs,
                             batch_size=args.batch_size, parts_per_macro=args.parts_per_macro,
                             staleness=args.staleness)
    auto, build_s, plain, rows = sweep(store, cfg, args.epochs)
    s = auto.split
    print(f"\nbudget {budget}: split budget {s['split_budget'] / 2**20:.1f} MiB; auto alpha {s['cache_split']:.2f} "
          f"({s['history_rows']:,} history rows, {s['cache_rows']:,} cache rows; plan built in {build_s:.1f} s); "
          f"OUTRE's plain Eq. 5 alpha {plain:.2f}")
    print(f"{'alpha':>5} {'hist rows':>9} {'cache rows':>10} {'pred. saved':>11} {'disk pages':>10} "
          f"{'feat rows read':>14} {'hist hits':>9}")
    for r in rows:
        pred = "-" if r["predicted_saved"] is None else f"{r['predicted_saved']:,.0f}"
        print(f"{r['alpha']:>5.{2 if r.get('auto') else 1}f} {r['history_rows']:>9,} {r['cache_rows']:>10,} {pred:>11} {r['disk_pages']:>10,} "
              f"{r['feature_rows_read']:>14,} {r['history_hits']:>9,}")
    best = min(rows[:-1], key=lambda r: r["disk_pages"])
    print(f"brute-force best alpha {best['alpha']:.1f} (fewest disk pages); auto {s['cache_split']:.2f}, "
          f"plain Eq. 5 {plain:.2f}")
    return {"split_budget": s["split_budget"], "auto_alpha": s["cache_split"], "history_rows": s["history_rows"],
            "cache_rows": s["cache_rows"], "plan_s": build_s, "plain_eq5_alpha": plain, "best_alpha": best["alpha"],
            "best_disk_pages": best["disk_pages"], "auto_disk_pages": rows[-1]["disk_pages"]}


if __name__ == "__main__":
    main()
