"""DENSE (MariusGNN §4.1) against per-hop sampling, measured in one run.

On the store data/<preset> (prepared when missing), every list resident, for the same seed batches
(--batch-size training nodes) at 1, 2 and 3 layers of --fanout neighbours each (MariusGNN Table 6's
shape; and --nc-fanouts, its node-classification 30,20,10 ordered input layer first), both samplers
are oocgnn.sampler.Sampler with the same keys: per hop (every layer draws all its destinations'
neighbours, as DGL) and dense (a node's draw is reused by the inner layers; only each layer's new
nodes are drawn). Prints per configuration the median draws, input rows and milliseconds per batch,
and the per-hop/dense ratios (the paper: 3.7-26x faster sampling at 3-5 layers on Papers100M with
its GPU-side co-design; on 2 CPU cores expect the draw ratio to bound the time ratio), with the load.

    .venv/bin/python benchmarks/dense.py [--preset large] [--batches 30] [--batch-size 1024]
        [--fanout 10] [--nc-fanouts 10,20,30] [--threads 2] [--data data/] [--store PATH]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402


def measure(lists, fanouts, batches, seed=7):
    """{kind: (median draws, median input rows, median seconds)} per batch, per hop and dense, interleaved."""
    from oocgnn.sampler import Sampler
    samplers = {"per-hop": Sampler(lists, fanouts, seed), "dense": Sampler(lists, fanouts, seed, dense=True)}
    out = {k: ([], [], []) for k in samplers}
    for i, seeds in enumerate(batches):
        for kind, sampler in samplers.items():
            t = time.perf_counter()
            blocks = sampler.sample(seeds, 0, i).blocks
            seconds = time.perf_counter() - t
            # per hop, every block's edges are draws; DENSE's blocks[0] holds each draw once (the inner
            # blocks' edges are its prefix, reused)
            draws = blocks[0].num_edges if kind == "dense" else sum(b.num_edges for b in blocks)
            for lst, v in zip(out[kind], (draws, blocks[0].num_src, seconds)):
                lst.append(v)
    return {k: tuple(statistics.median(v) for v in vals) for k, vals in out.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--preset", default="large", help="synthetic preset of data/<preset> (default large)")
    ap.add_argument("--batches", type=int, default=30, help="batches timed per configuration (default 30)")
    ap.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    ap.add_argument("--fanout", type=int, default=10, help="neighbours per layer at 1, 2, 3 layers (default 10)")
    ap.add_argument("--nc-fanouts", default="10,20,30", help="a node-classification configuration, input layer "
                                                             "first (default 10,20,30: MariusGNN's 30,20,10)")
    ap.add_argument("--threads", type=int, default=2, help="numba threads (default 2)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    ap.add_argument("--store", default="", help="an existing store to sample instead of data/<preset> (default: none)")
    add_csv_argument(ap, "bench/dense.csv under --data")
    args = ap.parse_args(argv)
    import numba
    import numpy as np
    from oocgnn.topology import NeighbourLists
    from benchmarks import sampler as bench      # its store preparation and load report
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    if args.store:
        from oocgnn.store import open_store
        store = open_store(args.store, verify=False)
    else:
        store = bench.ensure_store(args.preset, Path(args.data))
    lists = NeighbourLists.resident(store)
    rng = np.random.default_rng(0)
    batches = [rng.choice(store.train_idx, min(args.batch_size, len(store.train_idx)), replace=False)
               for _ in range(args.batches)]
    configs = [[args.fanout] * k for k in (1, 2, 3)] + [[int(f) for f in args.nc_fanouts.split(",")]]
    print(f"{store.path.name}: N={store.num_nodes:,} E={store.num_edges:,}, {args.batches} batches of "
          f"{args.batch_size}, {args.threads} threads, load {bench.loadavg()}")
    print(f"{'fanouts':>10} {'draws per-hop':>14} {'dense':>10} {'ratio':>6} {'rows per-hop':>13} {'dense':>10} "
          f"{'ms per-hop':>11} {'dense':>8} {'ratio':>6}")
    table = BenchTable(args.csv or Path(args.data) / "bench" / "dense.csv")
    rows = []
    for fanouts in configs:
        def one():
            m = measure(lists, fanouts, batches)
            (d0, r0, s0), (d1, r1, s1) = m["per-hop"], m["dense"]
            rows.append({"fanouts": fanouts, "draw_ratio": d0 / d1, "time_ratio": s0 / s1})
            print(f"{','.join(map(str, fanouts)):>10} {d0:>14,.0f} {d1:>10,.0f} {d0 / d1:>5.2f}x {r0:>13,.0f} "
                  f"{r1:>10,.0f} {1e3 * s0:>11.2f} {1e3 * s1:>8.2f} {s0 / s1:>5.2f}x")
            return {"draws_per_hop": d0, "draws_dense": d1, "draw_ratio": d0 / d1, "rows_per_hop": r0, "rows_dense": r1,
                    "ms_per_hop": 1e3 * s0, "ms_dense": 1e3 * s1, "time_ratio": s0 / s1}

        table.run(",".join(map(str, fanouts)), one)     # a failed one is its line in the table
    print(f"load after: {bench.loadavg()}")
    return rows


if __name__ == "__main__":
    main()
