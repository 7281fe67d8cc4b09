"""METIS vs streaming FENNEL on a synthetic store: seconds, peak RSS, edge cut, balance.

Generates (or reuses) the store data/<preset> (source order), then partitions it with each
method in a fresh subprocess, so each peak RSS (the child's VmHWM, imports included) belongs to
one method alone; the child's ru_maxrss would also carry this process's RSS at fork. FENNEL
streams indices.bin in chunks; METIS loads the whole CSR. Also runs METIS, FENNEL and random
on the `small` graph. Prints the table and the ratios against METIS with targets:
FENNEL edge cut <= 1.5x METIS's, FENNEL peak RSS <= 0.5x METIS's, METIS <= 90 s on `medium`,
METIS's cut well below random's on `small`.

    .venv/bin/python benchmarks/partition.py [--preset medium] [--parts 256] [--fennel-passes 1,3]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument, check_process  # noqa: E402


def loadavg():
    return open("/proc/loadavg").read().split()[0]


def ensure_store(preset, data_dir: Path):
    """data/<preset> if it holds that preset (seed 0), else write it there."""
    from oocgnn.store import open_store
    from oocgnn.storewrite import write_store
    from oocgnn.synthetic import generate, preset as get_preset
    path = data_dir / preset
    cfg = get_preset(preset)
    if (path / "meta.json").is_file():
        src = json.loads((path / "meta.json").read_text()).get("source", {})
        meta = json.loads((path / "meta.json").read_text())
        if (src.get("num_nodes") == cfg.num_nodes and src.get("seed") == cfg.seed
                and meta.get("partitioner") == "none"):   # source order: no locality for FENNEL to ride
            print(f"reusing {path}", flush=True)
            return open_store(path, verify=False)
        path = data_dir / "bench" / f"partition-{preset}"
        if (path / "meta.json").is_file():
            print(f"reusing {path}", flush=True)
            return open_store(path, verify=False)
    t = time.perf_counter()
    store = write_store(generate(cfg), path, force=True)
    print(f"wrote {store} in {time.perf_counter() - t:.0f} s", flush=True)
    return store


def worker(args):
    """One partition run in this (fresh) process; prints the report row as JSON."""
    import resource
    from oocgnn.partition import partition, peak_rss
    from oocgnn.store import open_store
    rss0 = peak_rss()
    store = open_store(args.store, verify=False)
    _, report = partition(store, args.method, args.parts, passes=args.passes, cache_dir=False)
    row = report.iloc[0].to_dict()
    row["peak_rss"] = peak_rss()     # VmHWM: ru_maxrss would include the parent's RSS at fork
    row["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row["rss_after_imports"] = rss0
    print("RESULT " + json.dumps({k: getattr(v, "item", lambda: v)() for k, v in row.items()}))


def run(store, method, parts, passes=1):
    cmd = [sys.executable, __file__, "--worker", "--store", str(store.path), "--method", method,
           "--parts", str(parts), "--passes", str(passes)]
    load = loadavg()
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    wall = time.perf_counter() - t
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    check_process(r)
    if not lines:
        raise RuntimeError("the worker printed no RESULT line")
    row = json.loads(lines[-1][7:])
    row.update(graph=store.path.name, wall=wall, load=load)
    print(f"  {store.path.name:>8} {method:>6} k={parts} passes={passes}: {row['seconds']:.1f} s, "
          f"cut {row['edge_cut']:.3f}, peak RSS {row['peak_rss'] / 2**20:.0f} MiB (load {load})", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--preset", default="medium", help="synthetic preset for METIS vs FENNEL (default medium)")
    ap.add_argument("--parts", type=int, default=256, help="parts K (default 256)")
    ap.add_argument("--fennel-passes", default="1,3", help="FENNEL streaming passes to run (default 1,3)")
    ap.add_argument("--small-parts", type=int, default=256, help="K for METIS vs random on `small` (default 256)")
    ap.add_argument("--no-small", action="store_true", help="skip the METIS vs random run on `small`")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    add_csv_argument(ap, "bench/partition.csv under --data")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    ap.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    import pandas as pd
    data_dir = Path(args.data)
    table = BenchTable(args.csv or data_dir / "bench" / "partition.csv")
    store = ensure_store(args.preset, data_dir)
    print(f"{args.preset}: N={store.num_nodes:,} E={store.num_edges:,} (directed CSR entries), K={args.parts}")
    main_runs = [("metis", 1)] + [("fennel", int(p)) for p in args.fennel_passes.split(",")] + [("random", 1)]
    for method, passes in main_runs:
        table.run(f"{store.path.name} {method} passes={passes}", lambda: run(store, method, args.parts, passes))
    small = {}

    def write_small():                            # its store is a row only if it cannot be written
        small["store"] = ensure_store("small", data_dir)

    if not args.no_small and table.run("small", write_small):
        for m in ("metis", "fennel", "random"):
            table.run(f"{small['store'].path.name} {m} passes=1", lambda: run(small["store"], m, args.small_parts))

    rows = [{k: v for k, v in r.items() if k not in ("config", "status")} for r in table.rows if r["status"] == "ok"]
    df = pd.DataFrame(rows)
    if df.empty:
        print("\nno partition ran:\n" + "\n".join(f"  {r['config']}: {r['status']}" for r in table.failed()))
        return
    df["peak_rss_mib"] = df.peak_rss / 2**20
    df["imports_mib"] = df.rss_after_imports / 2**20
    cols = ["graph", "method", "parts", "passes", "seconds", "peak_rss_mib", "imports_mib", "edge_cut",
            "size_balance", "train_balance", "nbr_in_megabatch", "load"]
    print()
    print(df[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}" if x < 10 else f"{x:.0f}"))

    for r in table.failed():
        print(f"{r['config']}: {r['status']}")

    metis = f"{store.path.name} metis passes=1"
    print(f"\nratios against METIS on {args.preset} (K={args.parts}):")
    for method, passes in main_runs:
        if method != "fennel":
            continue
        fennel = f"{store.path.name} fennel passes={passes}"
        what = f"FENNEL ({passes} pass{'es' if passes > 1 else ''})"
        if table.na(fennel, metis):
            print(f"  {what}: {table.na(fennel, metis)}")
            continue
        cut, rss, secs = (table.ratio(fennel, metis, key)[0] for key in ("edge_cut", "peak_rss", "seconds"))
        print(f"  {what}: edge cut {cut:.2f}x "
              f"(target <= 1.5: {'ok' if cut <= 1.5 else 'MISSED'}), peak RSS {rss:.2f}x "
              f"(target <= 0.5: {'ok' if rss <= 0.5 else 'MISSED'}), time {secs:.2f}x")
    if args.preset == "medium":
        m = table.ok(metis)
        print("  METIS on medium: " + (f"{m['seconds']:.1f} s (target <= 90 s: "
                                     f"{'ok' if m['seconds'] <= 90 else 'MISSED'})" if m else table.na(metis)))
    if not args.no_small and not small:
        print(f"  small (K={args.small_parts}): {table.na('small')}")
    elif not args.no_small:
        keys = {m: f"{small['store'].path.name} {m} passes=1" for m in ("metis", "fennel", "random")}
        cuts = {m: table.ok(k)["edge_cut"] for m, k in keys.items() if table.ok(k)}
        print(f"  small (K={args.small_parts}): edge cut " + ", ".join(
            f"{m if m == 'random' else m.upper()} {cuts[m]:.3f}" if m in cuts else f"{m} {table.na(keys[m])}"
            for m in keys) + f" (METIS/random {table.ratio(keys['metis'], keys['random'], 'edge_cut')[1]})")


if __name__ == "__main__":
    sys.exit(main())
