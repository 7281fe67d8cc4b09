"""Our torch-native layers against DGL's on the CPU, on blocks of a real run, measured in one run.

On the store data/<preset> (prepared when missing), blocks are sampled by our sampler for --batches
training batches (--batch-size seeds, --fanouts), the way a run samples them. Per model (SAGE, GAT,
GIN at --hidden) and per layer of it, the same weights run:

  ours   oocgnn.models' SAGEConv/GATConv/GINConv on the Block (numba kernels with their own backward)
  DGL    dgl.nn's SAGEConv("mean")/GATConv/GINConv("sum", learn_eps) on block.to_dgl(), the layers
         the models used before (block conversion included: it was part of every DGL step)

forward + backward (gradient of a fixed random projection of the output), median over the batches,
and the ratio DGL time / our time (target >= 1: ours at least as fast), with the machine load.
Also the whole model's step (forward, backward) both ways.

    .venv/bin/python benchmarks/models.py [--preset large] [--batches 10] [--batch-size 1024]
        [--fanouts 10,10] [--hidden 128] [--models sage,gat,gin] [--threads 0] [--data data/]
"""
import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from benchmarks import sampler as _shared    # noqa: E402  its store preparation and load report are shared
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
loadavg, ensure_store = _shared.loadavg, _shared.ensure_store


def timed(fn, items):
    """Median seconds of fn(item) (after one untimed call: compilation, caches)."""
    return _shared.timed(lambda i, item: fn(item), items)


def sampled_batches(store, fanouts, batches, batch_size):
    """Our sampler's blocks for `batches` training batches of `batch_size` seeds (a fixed shuffle), as a run
    samples them; empty batches dropped."""
    import numpy as np
    from oocgnn.sampler import Sampler
    from oocgnn.topology import NeighbourLists
    train = np.random.default_rng(0).permutation(store.train_idx)
    sampler = Sampler(NeighbourLists.resident(store), fanouts, 7)
    samples = [sampler.sample(np.sort(train[i * batch_size:(i + 1) * batch_size]), 0, i) for i in range(batches)]
    return [s for s in samples if len(s.output_nodes)]


def input_rows(store, samples):
    """Each sample's input rows (float32 tensors), read from the store by direct reads."""
    import torch
    reader = store.reader("direct")
    try:
        return [torch.from_numpy(reader.read_rows(s.input_nodes)) for s in samples]
    finally:
        reader.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--preset", default="large", help="synthetic preset of data/<preset> (default large)")
    ap.add_argument("--batches", type=int, default=10, help="batches timed per configuration (default 10)")
    ap.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    ap.add_argument("--fanouts", default="10,10", help="per-layer fanouts, input layer first (default 10,10)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (default 128, the run default)")
    ap.add_argument("--models", default="sage,gat,gin", help="models to measure (default sage,gat,gin)")
    ap.add_argument("--threads", type=int, default=0, help="torch/numba/DGL threads (default 0: all cores)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    add_csv_argument(ap, "bench/models.csv under --data")
    args = ap.parse_args(argv)

    import numba
    import torch
    from oocgnn.models import build_model, dgl_twin

    if args.threads:
        import dgl
        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        torch.set_num_threads(args.threads)
        dgl.utils.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    print(f"loadavg at start: {loadavg()}  (cpus {os.cpu_count()}, torch threads {torch.get_num_threads()}, "
          f"numba threads {numba.get_num_threads()})", flush=True)
    store = ensure_store(args.preset, Path(args.data))
    samples = sampled_batches(store, fanouts, args.batches, args.batch_size)
    xs = input_rows(store, samples)
    b0 = samples[0].blocks
    print(f"{store.path.name}: D={store.feat_dim}, {len(samples)} batches of {args.batch_size} seeds, fanouts "
          f"{fanouts}: blocks[0] {b0[0].num_src:,} src -> {b0[0].num_dst:,} dst ({b0[0].num_edges:,} edges), "
          f"blocks[-1] {b0[-1].num_src:,} -> {b0[-1].num_dst:,}", flush=True)

    table = BenchTable(args.csv or Path(args.data) / "bench" / "models.csv")
    results = []
    for name in args.models.split(","):
        built = {}

        def build():                                 # a model that cannot be built is its row; no other row
            torch.manual_seed(0)
            built["model"] = build_model(name, store.feat_dim, args.hidden, store.num_classes, len(fanouts),
                                         dropout=0.0)
            built["twin"] = dgl_twin(built["model"])

        if not table.run(name, build):
            continue
        model, twin = built["model"], built["twin"]
        # per layer: the layer's own input (the previous layer's output of the same batch)
        for li, layer in enumerate(model.layers):
            def one():
                inputs = []
                with torch.no_grad():
                    for s, x in zip(samples, xs):
                        h = x
                        for j in range(li):
                            h = model.layer(j, s.blocks[j], h)
                        inputs.append((s.blocks[li], h.contiguous()))
                proj = {}

                def step(item, fn):
                    block, h = item
                    h = h.detach().requires_grad_()
                    out = fn(block, h)
                    p = proj.setdefault(out.shape[1:], torch.randn(out.shape[1:]))
                    (out * p).sum().backward()

                a = timed(lambda it: step(it, layer), inputs)
                b = timed(lambda it: step(it, twin.layers[li]), inputs)
                results.append((f"{name} layer {li}", a, b))
                print(f"  {name:4s} layer {li} ({type(layer).__name__}, {inputs[0][1].shape[1]} -> ...): ours "
                      f"{a * 1e3:7.1f} ms, DGL {b * 1e3:7.1f} ms: DGL/ours {b / a:.2f}  (load {loadavg()})",
                      flush=True)
                return {"ours_ms": a * 1e3, "dgl_ms": b * 1e3, "dgl_over_ours": b / a}

            table.run(f"{name} layer {li}", one)

        def whole(i, fn):
            out = fn(samples[i].blocks, xs[i])
            out.sum().backward()

        def one():
            idx = list(range(len(samples)))
            a, b = timed(lambda i: whole(i, model), idx), timed(lambda i: whole(i, twin), idx)
            results.append((f"{name} model", a, b))
            print(f"  {name:4s} whole model fwd+bwd: ours {a * 1e3:7.1f} ms, DGL {b * 1e3:7.1f} ms: DGL/ours "
                  f"{b / a:.2f}  (load {loadavg()})", flush=True)
            return {"ours_ms": a * 1e3, "dgl_ms": b * 1e3, "dgl_over_ours": b / a}

        table.run(f"{name} model", one)

    print("\nDGL time / our time (>= 1: ours at least as fast): "
          + ", ".join([f"{n} {b / a:.2f}" for n, a, b in results]
                      + [f"{r['config']} n/a (above)" for r in table.failed()]))
    print(f"loadavg at end: {loadavg()}")


if __name__ == "__main__":
    sys.exit(main())
