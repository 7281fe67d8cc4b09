"""Cache-policy replay speed and Ginex's changeset precomputation vs the naive O(S²) Belady.

Builds (or reuses, under data/traces) a Zipf-like trace: --nodes ids, --iterations iterations of
--size distinct ids each (or replays a recorded trace given with --trace). Measures, medians of
--reps runs in this process:
  1. replay throughput (accesses/s) of every policy at one capacity, with hit ratio, rows and pages
     read; targets: belady and lru >= 10 M accesses/s. Baselines from the same run: a pure-NumPy
     LRU (per-iteration stamp arrays + argpartition, on a prefix) and, for Belady, Ginex's
     changeset path (ptr/iters + heap) and the naive Belady (on a prefix);
  2. changeset precomputation (Ginex §3.4, O(S) passes) vs the naive simulation (O(S²)) for
     superbatches of S = 2, 4, 8, ... iterations: seconds, ratio, and that both give equal hits;
  3. macrobatch fetch volume (BatchGNN): rows and pages fetched vs k, no cache.

    .venv/bin/python benchmarks/cache.py [--nodes 1000000] [--iterations 2000] [--size 30000]
        [--capacity 0.1] [--sizes 2,4,8,16,32,64] [--reps 3] [--trace data/traces/<file>]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.belady import belady_changesets, belady_naive, changeset_hits  # noqa: E402
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
from oocgnn.cache import CACHE_POLICIES, replay  # noqa: E402
from oocgnn.macrobatch import macrobatch_fetch  # noqa: E402
from oocgnn.trace import Trace, cached_trace, synthetic_trace  # noqa: E402


def loadavg():
    return open("/proc/loadavg").read().split()[0]


def timed(fn, reps):
    """(median seconds, last result) of `reps` calls."""
    ts, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def numpy_lru(trace: Trace, cap: int, stop: int) -> np.ndarray:
    """Baseline: the same iteration-granular LRU (ties by id) with whole-array NumPy operations."""
    n = trace.num_nodes
    stamp, size, hits = np.full(n, -1, np.int64), 0, np.zeros(stop, np.int64)
    for i in range(stop):
        ids = trace[i]
        old = stamp[ids]
        hits[i] = np.count_nonzero(old >= 0)
        size += len(ids) - hits[i]
        stamp[ids] = i
        if size > cap:
            cached = np.flatnonzero(stamp >= 0)
            k = size - cap
            victims = cached[np.argpartition(stamp[cached] * n + cached, k - 1)[:k]]
            stamp[victims] = -1
            size = cap
    return hits


def policy_kwargs(name, trace):
    if name == "static-degree":     # no graph here: a noisy proxy of popularity stands in for degree
        rng = np.random.default_rng(0)
        return {"degrees": trace.counts() * rng.uniform(0.5, 1.5, trace.num_nodes)}
    if name == "static-frequency":  # profiled on the first half, OUTRE's profiling epoch
        return {"counts": trace.slice(0, len(trace) // 2).counts()}
    return {}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--size", type=int, default=30_000, help="distinct ids per iteration")
    ap.add_argument("--alpha", type=float, default=0.9, help="Zipf exponent of id popularity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace", type=Path, help="replay this recorded trace (.npz or directory) instead")
    ap.add_argument("--capacity", type=float, default=0.1, help="cache rows as a fraction of the nodes")
    ap.add_argument("--horizon", type=int, default=250, help="Belady superbatch S for the horizon row")
    ap.add_argument("--sizes", default="2,4,8,16,32,64", help="superbatch sizes S for the changeset test")
    ap.add_argument("--prefix", type=int, default=100, help="iterations replayed by the slow baselines")
    ap.add_argument("--macrobatch", default="1,4,16,64,0", help="macrobatch sizes k (0 = whole trace)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache-dir", type=Path, default=REPO / "data" / "traces")
    add_csv_argument(ap, "data/bench/cache.csv")
    args = ap.parse_args(argv)
    table = BenchTable(args.csv or REPO / "data" / "bench" / "cache.csv")

    t = time.perf_counter()
    if args.trace:
        trace = Trace.load(args.trace)
    else:
        params = {"name": "zipf", "num_nodes": args.nodes, "iterations": args.iterations,
                  "size": args.size, "alpha": args.alpha, "seed": args.seed}
        trace = cached_trace(params, args.cache_dir, fmt="dir", build_fn=lambda: synthetic_trace(
            args.nodes, args.iterations, args.size, args.alpha, args.seed))
    n, acc = trace.num_nodes, trace.accesses
    cap = int(args.capacity * n)
    print(f"trace: N={n:,}, {len(trace):,} iterations, {acc:,} accesses "
          f"({'loaded' if args.trace or trace.cached else 'built'} in {time.perf_counter() - t:.1f} s); "
          f"capacity {cap:,} rows; reps {args.reps}; load {loadavg()}")

    # warm up the JIT (numba caches compiled code on disk, but loading it takes a moment)
    small = trace.slice(0, 3)
    for name in CACHE_POLICIES:
        try:
            replay(small, CACHE_POLICIES[name](10, n, **policy_kwargs(name, small)))
        except Exception:       # noqa: BLE001  the policy's own row below says why
            pass
    try:
        belady_changesets(small, 10)
    except Exception:           # noqa: BLE001  the changeset rows say why
        pass

    print(f"\n1. replay throughput at capacity {cap:,} (median of {args.reps})")
    replays = {}
    variants = [(name, {}) for name in CACHE_POLICIES if name not in ("belady", "page-lru")]
    variants += [("belady", {}), ("belady", {"horizon": args.horizon}), ("belady", {"prefetch": False})]
    for name, kw in variants + [("page-lru", {})]:
        label = name + "".join(f" {k}={v}" for k, v in kw.items())

        def one():
            c = cap * trace.row_bytes // 4096 if name == "page-lru" else cap   # same bytes, pages
            sec, r = timed(lambda: replay(trace, CACHE_POLICIES[name](c, n, **kw, **policy_kwargs(name, trace))),
                           args.reps)
            replays[label] = r
            print(f"  {label:<24} {sec:7.2f} s {acc / sec / 1e6:7.1f} M acc/s  hit {r.hit_ratio:.3f}  "
                  f"rows read {r.misses:>12,}  pages {r.pages_read:>11,}  init rows {r.init_rows:>10,}", flush=True)
            return {"seconds": sec, "acc_per_s": acc / sec, "hit_ratio": r.hit_ratio, "rows_read": r.misses,
                    "pages_read": r.pages_read, "init_rows": r.init_rows}

        table.run(f"replay {label}", one)

    stop = min(args.prefix, len(trace))
    pre = trace.slice(0, stop)
    nv = min(32, stop)

    def numpy_baseline():
        sec_np, np_hits = timed(lambda: numpy_lru(trace, cap, stop), 1 if args.reps < 3 else 2)
        lru_pre = replay(pre, CACHE_POLICIES["lru"](cap, n), per_iteration=True)
        assert np.array_equal(np_hits, lru_pre.per_iteration.hits), "NumPy LRU disagrees with numba LRU"
        return {"seconds": sec_np, "acc_per_s": pre.accesses / sec_np, "iterations": stop}

    def ginex_baseline():
        sec_cs, (init, sets) = timed(lambda: belady_changesets(trace, cap), args.reps)
        ginex_hits = changeset_hits(trace, init, sets, cap).sum() if acc <= 100_000_000 else None
        bel = replays.get("belady")
        same = "not checked" if ginex_hits is None or bel is None else "equal" if ginex_hits == bel.hits else "DIFFER"
        return {"seconds": sec_cs, "acc_per_s": acc / sec_cs, "hits": same, "iterations": len(trace)}

    def naive_baseline():
        sec_nv, _ = timed(lambda: belady_naive(trace, cap, 0, nv), 1)
        return {"seconds": sec_nv, "acc_per_s": int(trace.offsets[nv]) / sec_nv, "iterations": nv}

    for name, fn in (("numpy-lru", numpy_baseline), ("ginex-changesets", ginex_baseline),
                     ("naive-belady", naive_baseline)):
        table.run(f"baseline {name}", fn)
    np_lru, ginex, naive = (table.ok(f"baseline {b}") for b in ("numpy-lru", "ginex-changesets", "naive-belady"))
    print("\n  baselines (same run):")
    print(f"  NumPy LRU, {stop} iterations     " + (f"{np_lru['acc_per_s'] / 1e6:7.2f} M acc/s  (hits equal "
                                                   "numba's: yes)" if np_lru else table.na("baseline numpy-lru")))
    print("  Ginex changesets, whole trace " + (f"{ginex['acc_per_s'] / 1e6:7.2f} M acc/s  ({ginex['seconds']:.2f} "
                                                 f"s; hits {ginex['hits']})" if ginex
                                                 else table.na("baseline ginex-changesets")))
    print(f"  naive Belady, {nv} iterations    " + (f"{naive['acc_per_s'] / 1e6:7.3f} M acc/s  "
                                                  f"({naive['seconds']:.2f} s)" if naive
                                                  else table.na("baseline naive-belady")))
    print(f"\n  ratios: lru {table.ratio('replay lru', 'baseline numpy-lru', 'acc_per_s', '{:.0f}x')[1]} the NumPy "
          f"LRU; belady {table.ratio('replay belady', 'baseline ginex-changesets', 'acc_per_s', '{:.1f}x')[1]} "
          f"Ginex's changeset path, {table.ratio('replay belady', 'baseline naive-belady', 'acc_per_s', '{:.0f}x')[1]} "
          "the naive Belady")
    for label in ("belady", "lru"):
        row = table.ok(f"replay {label}")
        verdict = (f"{row['acc_per_s'] / 1e6:.1f} M -> {'ok' if row['acc_per_s'] >= 10e6 else 'MISSED'}" if row
                   else table.na(f"replay {label}"))
        print(f"  target {label} >= 10 M accesses/s: {verdict}")

    print(f"\n2. changeset precomputation, superbatch of S iterations from iteration 0 (median of {args.reps})")
    print(f"  {'S':>4} {'accesses':>10} {'changeset s':>12} {'naive s':>9} {'naive/changeset':>16} {'hits equal':>11}")
    for s in (int(x) for x in args.sizes.split(",")):
        s = min(s, len(trace))

        def one():
            t_cs, (i1, c1) = timed(lambda: belady_changesets(trace, cap, 0, s), args.reps)
            t_nv, (i2, c2) = timed(lambda: belady_naive(trace, cap, 0, s), args.reps)
            same = np.array_equal(changeset_hits(trace, i1, c1, cap), changeset_hits(trace, i2, c2, cap))
            print(f"  {s:>4} {int(trace.offsets[s]):>10,} {t_cs:>12.4f} {t_nv:>9.3f} {t_nv / t_cs:>16.1f} "
                  f"{'yes' if same else 'NO':>11}", flush=True)
            return {"accesses": int(trace.offsets[s]), "changeset_s": t_cs, "naive_s": t_nv,
                    "naive_over_changeset": t_nv / t_cs, "hits_equal": same}

        table.run(f"changesets S={s}", one)

    print("\n3. macrobatch fetch (BatchGNN): one deduplicated fetch per k iterations, no cache")

    def macrobatch():
        ks = [int(k) if int(k) > 0 else len(trace) for k in args.macrobatch.split(",")]
        t = time.perf_counter()
        df = macrobatch_fetch(trace, ks)
        df["pages_vs_k1"] = df.fetched_pages / df.fetched_pages.iloc[0]
        print(df[["k", "macrobatches", "fetched_rows", "fetched_pages", "max_union_rows", "rows_vs_k1",
                  "pages_vs_k1"]].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(f"  ({time.perf_counter() - t:.1f} s)  load {loadavg()}")
        for rec in df.to_dict("records"):
            table.add(f"macrobatch k={rec['k']}", **{k: v for k, v in rec.items() if k != "k"})

    if not table.run("macrobatch", macrobatch):
        print(f"  load {loadavg()}")
    print(f"  table: {table.path}" + (f" ({len(table.failed())} rows failed)" if table.failed() else ""))


if __name__ == "__main__":
    main()
