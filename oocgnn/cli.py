"""The `oocgnn` command: prepare stores, inspect them, train, and report time-to-accuracy."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

from .errors import UserError


def _cmd_prepare(args):
    from .datasets import load_source
    from .store import write_store
    from .synthetic import generate
    from .partition import check_args, order_from_assignment, partition, peak_rss
    out = Path(args.out)
    if out.exists() and not args.force:
        raise UserError(f"a store already exists at {out} (use --force to replace it)")
    method = args.partitioner
    check_args(method, 1 if args.parts is None else args.parts)
    t0 = time.perf_counter()
    if args.source == "synthetic":
        data = generate(args.preset, seed=args.seed)
    elif args.row_normalize:
        data = load_source(args.source, row_normalize=True)
    else:
        data = load_source(args.source)
    t_load = time.perf_counter() - t0
    parts = args.parts or (1 if method == "none" else max(1, data.num_nodes // 2000))
    check_args(method, parts, data.num_nodes)
    order = offsets = None
    if method != "none" or parts > 1:
        assignment, report = partition(data, method, parts, seed=args.seed)
        order, offsets = order_from_assignment(assignment, parts)
        row = json.loads(report.to_json(orient="records"))[0]     # saved in meta.json, shown by `info`
        data.info["partition"] = {k: row[k] for k in ("method", "parts", "nonempty_parts", "edge_cut",
                                                      "size_balance", "train_balance", "seconds")}
        shown = report.drop(columns=["dataset", "balance_train", "peak_rss"]).assign(
            peak_rss_mib=report.peak_rss / 2**20)
        print(shown.to_string(index=False, float_format="%.4g"))
    store = write_store(data, out, order=order, part_offsets=offsets, partitioner=method,
                        force=args.force, progress=not args.quiet)
    print(f"wrote {store} in {time.perf_counter() - t0:.1f} s "
          f"(source {t_load:.1f} s, peak RSS {peak_rss() / 2**30:.2f} GiB)")


def _cmd_info(args):
    from .store import open_store
    summary = open_store(args.store, verify=not args.no_verify).summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        width = max(map(len, summary))
        for k, v in summary.items():
            print(f"{k:<{width}}  {v:,}" if isinstance(v, int) else f"{k:<{width}}  {v}")


def _cmd_train(args):
    from .config import TrainConfig
    from .train import train
    names = {f.name for f in fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in names and v is not None})
    s = train(cfg)
    print(f"{s['run_dir']}: {s['epochs']} epochs in {s['train_s']:.1f} s, best val "
          f"{s['best_val_acc']:.4f}, test at best val {s['test_at_best_val']:.4f}, "
          f"read {s['io']['bytes_read'] / 2**20:.1f} MiB, cap enforced: {s['memory_cap']['enforced']}")


def _cmd_report(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .plots import load_runs, plot_time_to_accuracy, save_figure
    runs = load_runs(args.runs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out.with_suffix(".csv"), index=False)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    plot_time_to_accuracy(runs, axes[0], "val_acc", "validation accuracy vs time")
    plot_time_to_accuracy(runs, axes[1], "test_acc", "test accuracy vs time")
    save_figure(fig, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.png')}")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oocgnn", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pr = sub.add_parser("prepare", help="write a store from a source",
                        description="Write an on-disk store from the synthetic generator, a .npz "
                                    "file (../shared/datasets format) or an OGB raw directory.")
    pr.add_argument("source", help="'synthetic', a .npz file, or an OGB node-property raw directory")
    pr.add_argument("--preset", default="small", help="synthetic preset: tiny|small|medium|large")
    pr.add_argument("--out", required=True, help="store directory to create")
    pr.add_argument("--seed", type=int, default=0, help="generator seed (synthetic)")
    pr.add_argument("--force", action="store_true", help="replace an existing store")
    pr.add_argument("--row-normalize", action="store_true",
                    help="scale each feature row to sum 1 (.npz sources; usual for bag-of-words)")
    pr.add_argument("--quiet", action="store_true", help="no progress bar")
    pr.add_argument("--partitioner", default="none",
                    help="metis | fennel | random | none (default none): relabel nodes so each part "
                         "is a contiguous store-id range; results cached in data/partitions")
    pr.add_argument("--parts", type=int,
                    help="number of parts K (default 1 for none, else N/2000)")
    pr.set_defaults(func=_cmd_prepare)

    inf = sub.add_parser("info", help="describe a store", description="Validate a store and print "
                         "N, E, D, classes, splits, partitions and bytes.")
    inf.add_argument("store")
    inf.add_argument("--json", action="store_true", help="print JSON")
    inf.add_argument("--no-verify", action="store_true", help="skip checksum verification")
    inf.set_defaults(func=_cmd_info)

    tr = sub.add_parser("train", help="train a model under a policy",
                        description="Train a GNN over a store; writes config.json, log.csv and "
                                    "summary.json to the run directory.")
    tr.add_argument("store")
    tr.add_argument("--policy", help="inmemory | mmap | hierbatching | outre (default inmemory)")
    tr.add_argument("--model", help="sage | gat | gin | mlp (default sage)")
    tr.add_argument("--epochs", type=int, help="epochs to train (default 5)")
    tr.add_argument("--max-steps", dest="max_steps", type=int,
                    help="stop after this many steps (default 0: all epochs); epoch_s is then extrapolated")
    tr.add_argument("--fanouts", help="per-layer fanouts, e.g. 10,10 (default)")
    tr.add_argument("--layers", type=int, help="number of layers (must match the fanouts)")
    tr.add_argument("--batch-size", dest="batch_size", type=int)
    tr.add_argument("--hidden", type=int)
    tr.add_argument("--lr", type=float)
    tr.add_argument("--dropout", type=float)
    tr.add_argument("--memory-budget", dest="memory_budget",
                    help="bytes the policy may keep resident, e.g. 256MB (default)")
    tr.add_argument("--eval-every", dest="eval_every", type=int,
                    help="evaluate every N steps (default: each epoch)")
    tr.add_argument("--eval-fanouts", dest="eval_fanouts",
                    help="fanouts of evaluation (default: the training fanouts; -1 = all)")
    tr.add_argument("--eval-batch-size", dest="eval_batch_size", type=int,
                    help="evaluation batch size (default 1024)")
    tr.add_argument("--max-eval-nodes", dest="max_eval_nodes", type=int,
                    help="evaluate on a fixed subset of this many nodes per split (0: all)")
    tr.add_argument("--target-acc", dest="target_acc", type=float,
                    help="report the time to reach this validation accuracy")
    hb = tr.add_argument_group("hierbatching (HierBatching Alg. 1)")
    hb.add_argument("--parts-per-megabatch", dest="parts_per_megabatch", type=int, help="N_d (default 8)")
    hb.add_argument("--static-ratio", dest="static_ratio", type=float,
                    help="r_s: fraction of nodes (top degree) resident all run (default 0.01)")
    hb.add_argument("--passes", type=float, help="p: passes over each mega-batch (default 2)")
    hb.add_argument("--static-scope", dest="static_scope", help="adjacent | all (default adjacent)")
    hb.add_argument("--no-pipeline", dest="pipeline", action="store_false", default=None,
                    help="load mega-batches synchronously (no double buffering)")
    hb.add_argument("--regroup", help="METHOD:PARTS: mega-batches from this partition of the store "
                    "instead of its own parts; on an unpartitioned store this is HB- (scattered loads)")
    ou = tr.add_argument_group("outre (OUTRE §4.2-4.3)")
    ou.add_argument("--parts-per-macro", dest="parts_per_macro", type=int, help="parts per macro batch (default 20)")
    ou.add_argument("--feature-cache", dest="feature_cache", help="degree | frequency (default degree)")
    ou.add_argument("--history-ratio", dest="history_ratio", type=float,
                    help="fraction of nodes with historical embeddings (default 0.1; 0 disables)")
    ou.add_argument("--history-by", dest="history_by", help="importance | degree (default importance)")
    ou.add_argument("--staleness", type=int, help="reuse histories younger than this many iterations (default 100)")
    tr.add_argument("--threads", type=int, help="torch threads (default: library default)")
    tr.add_argument("--out", help="run directory (default runs/<store>-<policy>-<model>-s<seed>)")
    tr.add_argument("--seed", type=int)
    tr.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    tr.set_defaults(func=_cmd_train)

    rp = sub.add_parser("report", help="time-to-accuracy CSV and plot of runs",
                        description="Combine the log.csv of run directories into one CSV and a "
                                    "time-to-accuracy PNG.")
    rp.add_argument("runs", nargs="+", help="run directories")
    rp.add_argument("--out", default="figures/00_time_to_accuracy",
                    help="output path without extension (.csv and .png are written)")
    rp.set_defaults(func=_cmd_report)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as e:
        print(f"oocgnn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("oocgnn: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
