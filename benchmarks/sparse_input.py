"""Bag-of-words input rows multiplied as CSR (`oocgnn.sparserows`) against the dense product, one run.

On the store data/<preset> (prepared when missing), blocks are sampled by our sampler for --batches
training batches (--batch-size seeds, --fanouts). Their input rows are bag-of-words features: the rows
of --store when given (e.g. a store of coauthor_cs, 6,805 columns, 0.9 % non-zero), else random counts
of --width columns at --density (coauthor_cs's by default). Per model (--models, at --hidden), the
same weights and rows run:

  sparse   the first layer's projection as a sparse matmul (the default below SPARSE_BELOW density)
  dense    the dense product (SPARSE_BELOW set to 0)

a training step (forward + backward) and an evaluation forward (no gradient), median over the batches,
and the ratio dense time / sparse time (> 1: the sparse product pays), with the machine load.

    .venv/bin/python benchmarks/sparse_input.py [--preset large] [--store S] [--width 6805]
        [--density 0.0088] [--batches 10] [--batch-size 1024] [--fanouts 25,10] [--hidden 512]
        [--models sage,gat,mlp] [--threads 0] [--data data/]
"""
import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from benchmarks import sampler as _shared    # noqa: E402  its store preparation and load report are shared
from benchmarks.models import input_rows, sampled_batches  # noqa: E402  the batches models.py measures on
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
loadavg, ensure_store = _shared.loadavg, _shared.ensure_store


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--preset", default="large", help="synthetic preset whose topology is sampled (default large)")
    ap.add_argument("--store", default="", help="a store whose feature rows are the input (default: none, "
                    "random counts at --width and --density); its topology is sampled instead of --preset's")
    ap.add_argument("--width", type=int, default=6805, help="columns of the random rows (default 6805)")
    ap.add_argument("--density", type=float, default=0.0088, help="non-zero fraction of the random rows "
                    "(default 0.0088, coauthor_cs's)")
    ap.add_argument("--batches", type=int, default=10, help="batches timed per configuration (default 10)")
    ap.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    ap.add_argument("--fanouts", default="25,10", help="per-layer fanouts, input layer first (default 25,10)")
    ap.add_argument("--hidden", type=int, default=512, help="hidden width (default 512)")
    ap.add_argument("--models", default="sage,gat,mlp", help="models to measure (default sage,gat,mlp)")
    ap.add_argument("--threads", type=int, default=0, help="torch/numba threads (default 0: all cores)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    add_csv_argument(ap, "bench/sparse_input.csv under --data")
    args = ap.parse_args(argv)

    import numba
    import torch
    from oocgnn import sparserows
    from oocgnn.models import build_model
    from oocgnn.store import open_store

    if args.threads:
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        torch.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    print(f"loadavg at start: {loadavg()}  (cpus {os.cpu_count()}, torch threads {torch.get_num_threads()}, "
          f"numba threads {numba.get_num_threads()})", flush=True)
    store = open_store(args.store) if args.store else ensure_store(args.preset, Path(args.data))
    samples = sampled_batches(store, fanouts, args.batches, args.batch_size)
    if args.store:
        xs = input_rows(store, samples)
    else:
        g = torch.Generator().manual_seed(0)
        xs = [torch.randint(1, 5, (len(s.input_nodes), args.width), generator=g).float()
              * (torch.rand(len(s.input_nodes), args.width, generator=g) < args.density) for s in samples]
    width = xs[0].shape[1]
    density = float(sum(int(torch.count_nonzero(x)) for x in xs) / sum(x.numel() for x in xs))
    print(f"{store.path.name}: {len(samples)} batches of {args.batch_size} seeds, fanouts {fanouts}: "
          f"{samples[0].blocks[0].num_src:,} input rows of {width} columns, density {density:.4f}", flush=True)

    def timed(fn):
        """Median seconds of fn(i) over the batches (after one untimed call)."""
        return _shared.timed(lambda i, _: fn(i), range(len(samples)))

    table = BenchTable(args.csv or Path(args.data) / "bench" / "sparse_input.csv")
    results = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = build_model(name, width, args.hidden, store.num_classes, len(fanouts), dropout=0.0)

        def step(i):
            model.zero_grad()
            model(samples[i].blocks, xs[i]).sum().backward()

        def forward(i):
            with torch.no_grad():
                model(samples[i].blocks, xs[i])

        for what, fn in (("step", step), ("eval", forward)):
            def one():
                sparse = timed(fn)
                below, sparserows.SPARSE_BELOW = sparserows.SPARSE_BELOW, 0.0
                try:
                    dense = timed(fn)
                finally:
                    sparserows.SPARSE_BELOW = below
                results.append((f"{name} {what}", dense / sparse))
                print(f"  {name:4s} {what:4s}: sparse {sparse * 1e3:8.1f} ms, dense {dense * 1e3:8.1f} ms: "
                      f"dense/sparse {dense / sparse:.2f}  (load {loadavg()})", flush=True)
                return {"sparse_ms": sparse * 1e3, "dense_ms": dense * 1e3, "dense_over_sparse": dense / sparse,
                        "density": density, "width": width}

            table.run(f"{name} {what}", one)

    print("\ndense time / sparse time (> 1: the sparse product pays): "
          + ", ".join([f"{n} {r:.2f}" for n, r in results]
                      + [f"{r['config']} n/a (above)" for r in table.failed()]))


if __name__ == "__main__":
    main()
