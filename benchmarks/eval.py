"""Out-of-core evaluation against the in-memory evaluation of the same nodes, measured in one run.

On the store data/<preset> (prepared when missing), the evaluated nodes are a run's (val and test,
each capped at --eval-nodes by the run's seeded subset), the model a freshly initialised --model
(evaluation time does not depend on its weights), the neighbourhoods the eval fanouts. Per
evaluation of val and test, median of --reps:

  inmemory    per-batch evaluation (`nodetask.evaluate`, --batch-size seeds a batch), every feature row in
              RAM: the baseline, what `--policy inmemory` does
  per-row     the same through direct per-row reads of each batch's input rows (the old out-of-core path)
  layerwise   `oocgnn.evaluation.LayerwiseEval` reading through direct reads, each input row once, in
              store order, its tables bounded by --budget (blocks planned once per run: not timed
              again; the first evaluation's planning is reported apart)
  layerwise-ram  the same with the rows in RAM (how much of it is reading)

and the ratios to inmemory (goal: layerwise <= 2). Also the accuracy of each (equal up to the draws).

    .venv/bin/python benchmarks/eval.py [--preset small] [--eval-nodes 20000] [--fanouts 10,10]
        [--batch-size 1024] [--model sage] [--hidden 128] [--budget 0] [--reps 3] [--data data/] [--store PATH]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import sampler as _shared    # noqa: E402  its store preparation and load report are shared
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
loadavg, ensure_store = _shared.loadavg, _shared.ensure_store


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--preset", default="small", help="synthetic preset of data/<preset>: small | large (default small)")
    ap.add_argument("--eval-nodes", type=int, default=20_000,
                    help="evaluated nodes per split, a run's --max-eval-nodes (default 20000)")
    ap.add_argument("--fanouts", default="10,10", help="eval fanouts, input layer first (default 10,10)")
    ap.add_argument("--batch-size", type=int, default=1024, help="per-batch evaluation batch size (default 1024)")
    ap.add_argument("--model", default="sage", help="sage | gat | gin (default sage)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (default 128)")
    ap.add_argument("--budget", default="0", help="layer-wise memory budget (default 0: a third of the feature file)")
    ap.add_argument("--reps", type=int, default=3, help="timed evaluations per path (default 3)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    ap.add_argument("--store", default="", help="an existing store to evaluate on instead of data/<preset> "
                                                "(default none)")
    add_csv_argument(ap, "bench/eval.csv under --data")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from oocgnn.evaluation import LayerwiseEval
    from oocgnn.io import drop_file_cache
    from oocgnn.models import build_model
    from oocgnn.sampler import Sampler
    from oocgnn.topology import NeighbourLists
    from oocgnn.nodetask import evaluate
    from oocgnn.metrics import accuracy
    from oocgnn.units import format_size, parse_size

    print(f"loadavg at start: {loadavg()}  (cpus {os.cpu_count()}, torch threads {torch.get_num_threads()})",
          flush=True)
    if args.store:
        from oocgnn.store import open_store
        store = open_store(args.store, verify=False)
    else:
        store = ensure_store(args.preset, Path(args.data))
    fanouts = [int(f) for f in args.fanouts.split(",")]
    sets = {}
    for split, ids in (("val", store.val_idx), ("test", store.test_idx)):     # as train.py picks them
        if args.eval_nodes and len(ids) > args.eval_nodes:
            ids = np.sort(np.random.default_rng(1).choice(ids, args.eval_nodes, replace=False))
        sets[split] = ids
    nodes = np.unique(np.concatenate(list(sets.values())))
    file_bytes = store.num_nodes * store.row_stride
    budget = parse_size(args.budget) or file_bytes // 3
    labels = torch.from_numpy(store.compact_labels())
    torch.manual_seed(0)
    model = build_model(args.model, store.feat_dim, args.hidden, store.num_classes, len(fanouts))
    sampler = Sampler(NeighbourLists.resident(store), fanouts, 7)
    print(f"{store.path.name}: N={store.num_nodes:,}, D={store.feat_dim}, features {format_size(file_bytes)}; "
          f"{len(nodes):,} evaluated nodes (val {len(sets['val']):,}, test {len(sets['test']):,}), fanouts "
          f"{fanouts}, {args.model} hidden {args.hidden}, layer-wise budget {format_size(budget)}", flush=True)

    feats = store.codec.decode(torch.from_numpy(np.ascontiguousarray(store.reader("memory").read_range(0, store.num_nodes))))
    direct = store.reader("direct")

    def per_batch(gather):
        return lambda: {s: accuracy(evaluate(model, sampler, gather, labels, ids, args.batch_size,
                                             store.num_classes).confusion) for s, ids in sets.items()}

    def layerwise(ev):
        return {s: accuracy(t.confusion) for s, t in ev.tallies(model, labels, sets, store.num_classes).items()}

    ram_rows = lambda ids: feats[torch.from_numpy(ids)]                          # noqa: E731
    disk_rows = lambda ids: store.codec.decode(torch.from_numpy(direct.read_rows(ids)))   # noqa: E731
    table = BenchTable(args.csv or Path(args.data) / "bench" / "eval.csv")
    lw = lw_ram = plan_s = None

    def plan():                                                                  # both layer-wise paths' blocks
        nonlocal lw, lw_ram, plan_s
        lw = LayerwiseEval(sampler, fanouts, nodes, store.feat_dim, disk_rows, budget)
        t = time.perf_counter()
        lw.memory()                                                              # plans (samples) once
        plan_s = time.perf_counter() - t
        lw_ram = LayerwiseEval(sampler, fanouts, nodes, store.feat_dim, ram_rows, budget)
        lw_ram.layers, lw_ram.input_ids = lw.layers, lw.input_ids

    paths = {"inmemory": per_batch(ram_rows), "per-row": per_batch(disk_rows),
             "layerwise": lambda: layerwise(lw), "layerwise-ram": lambda: layerwise(lw_ram)}
    if not table.run("layerwise", plan):                                        # neither layer-wise path runs
        table.add("layerwise-ram", table.status("layerwise"))
        del paths["layerwise"], paths["layerwise-ram"]
    times, accs = {k: [] for k in paths}, {}

    def warm_up(name, fn):
        accs[name] = fn()                                                        # compilation

    def timed(name, fn):
        drop_file_cache(store.features_path)
        io0 = direct.stats.snapshot()
        t = time.perf_counter()
        fn()
        times[name].append(time.perf_counter() - t)
        io = direct.stats - io0
        row = {"median_s": statistics.median(times[name]), "reps": len(times[name]),
               "val_acc": accs[name]["val"], "test_acc": accs[name]["test"]}
        if name in ("per-row", "layerwise"):
            accs[name + " read"] = (io.bytes_read, io.requests)
            row.update(bytes_read=io.bytes_read, requests=io.requests)
        return row

    for name, fn in list(paths.items()):
        if not table.run(name, lambda: warm_up(name, fn)):                       # a failed path runs no more
            del paths[name]
    for _ in range(args.reps):                                                   # interleaved: same load
        for name, fn in list(paths.items()):
            if not table.run(name, lambda: timed(name, fn)):
                del paths[name]
    if lw is not None:
        mem = lw.memory()
        print(f"layer-wise: {len(lw.input_ids):,} input rows ({format_size(mem['input_rows'])}), blocks "
              f"{format_size(mem['blocks'])}, planned in {plan_s:.2f} s (once per run); spilled: "
              f"{lw.spilled or 'nothing'}")
    print(f"{'path':14s} {'median s':>9s} {'ratio':>6s}  val / test acc   read")
    for name in ("inmemory", "per-row", "layerwise", "layerwise-ram"):
        r = table.ok(name)
        if not r:
            print(f"{name:14s} {table.status(name)}")
            continue
        x, ratio = table.ratio(name, "inmemory", "median_s", "{:6.2f}")
        if x is not None:
            table.add(name, vs_inmemory=x)
        read = accs.get(name + " read")
        extra = f"  {format_size(read[0])} in {read[1]:,} requests" if read else ""
        print(f"{name:14s} {r['median_s']:9.3f} {ratio}  {r['val_acc']:.4f} / {r['test_acc']:.4f}{extra}")
    print(f"ratio layerwise / inmemory: {table.ratio('layerwise', 'inmemory', 'median_s', '{:.2f}')[1]} (goal <= 2); "
          f"per-row / inmemory: {table.ratio('per-row', 'inmemory', 'median_s', '{:.2f}')[1]}; "
          f"loadavg at end: {loadavg()}")
    direct.close()


if __name__ == "__main__":
    main()
