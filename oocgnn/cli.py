"""The `oocgnn` command: prepare stores, inspect them, train, and report time-to-accuracy.

Each command imports the modules it runs inside its function (torch, numba and pandas come with them):
`oocgnn --help` and a refused argument answer in under a second."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import UserError


def _cmd_prepare(args):
    from .prepare import run
    run(args)


def _cmd_info(args):
    from .atomicdir import describe_leftovers
    from .store import open_store
    from .store import upgrade_store
    if args.no_verify and (args.verify or args.upgrade):
        raise UserError(f"--no-verify contradicts {'--verify' if args.verify else '--upgrade'}")
    if args.upgrade:
        store = upgrade_store(args.store)
        print(f"oocgnn: upgraded {args.store} to store format version {store.meta['version']}", file=sys.stderr)
    else:
        store = open_store(args.store, verify="full" if args.verify else not args.no_verify)
    for line in describe_leftovers(Path(os.path.abspath(args.store))):
        print(f"oocgnn: note: {line}", file=sys.stderr)
    summary = store.summary()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        width = max(map(len, summary))
        for k, v in summary.items():
            print(f"{k:<{width}}  {v:,}" if isinstance(v, int) else f"{k:<{width}}  {v}")


def _settings_from(args) -> dict:
    """The settings given on the command line, over those of --config FILE.json (a run's config.json or
    `oocgnn tune`'s chosen.json) when one is given."""
    from .config import POLICY_OPTIONS, SETTINGS
    from .train import RUN_FACTS
    from .seeds import SEEDS_CONFIG
    given = {k: v for k, v in vars(args).items() if k in SETTINGS and v is not None}
    config = getattr(args, "config", None)
    if given.get("resume") and not config and (Path(given["resume"]) / SEEDS_CONFIG).is_file():
        config = str(Path(given["resume"]) / SEEDS_CONFIG)     # a --seeds job resumes with its own settings
    elif "store" not in given and given.get("resume"):   # a run to resume names its store
        from .rundir import RunDir, read_json
        given["store"] = read_json(RunDir.create(given["resume"], resume=True).path / "config.json").get("store", "")
    if not config:
        if "store" not in given:
            raise UserError("give a STORE (or --config FILE.json that names one, or --resume RUN)")
        return given
    try:
        saved = json.loads(Path(config).read_text())
    except FileNotFoundError:
        raise UserError(f"--config {config}: no such file") from None
    except (OSError, ValueError) as e:
        raise UserError(f"--config {config} is not a JSON config: {e}") from None
    if not isinstance(saved, dict):
        raise UserError(f"--config {config} is not a JSON object of settings")
    for fact in RUN_FACTS:                       # what a run's config.json records beside its settings
        saved.pop(fact, None)
    flat = {}
    for k, v in saved.items():                   # a saved config nests each policy's options
        flat.update(v if isinstance(v, dict) and k in POLICY_OPTIONS else {k: v})
    return {**flat, **given}


def _accuracy(value) -> str:
    return "- (no test nodes)" if value is None else f"{value:.4f}"


def _metrics_line(s, target_metric, show=_accuracy) -> str:
    """Macro-F1 and, for binary labels, ROC-AUC of a summary: best validation value and test value at the
    best evaluation, the one whose validation `target_metric` was the highest."""
    from .metrics import NAMES, summary_keys
    parts = []
    for m in ("f1", "auc"):
        val, test = summary_keys(m)
        if s.get(val) is not None:                 # AUC: binary labels only
            parts.append(f"{NAMES[m]} best val {show(s[val])}, test at best val {show(s.get(test))}")
    return f"  {'; '.join(parts)} (best evaluation by validation {NAMES[target_metric]})"


def _link_line(s) -> str:
    """A link run's summary in words: best validation MRR, test MRR at it, among what each edge was ranked."""
    among = f"all {s['eval_negatives']:,} shared negative pairs (OGB's)" if s.get("eval_shared_negatives") \
        else f"{s['eval_negatives']} negatives"
    ogb = "".join(f", test Hits@{k} {s[f'test_hits@{k}_at_best_val']:.4f}" for k in (20, 50, 100)
                  if f"test_hits@{k}_at_best_val" in s)
    return (f"best val MRR {s['best_val_mrr']:.4f}, test MRR at best val {s['test_mrr_at_best_val']:.4f} (each "
            f"held-out edge ranked among {among}{ogb})")


def _cmd_train(args):
    from .config import TrainConfig
    from .train import train
    cfg = TrainConfig.create(**_settings_from(args))
    if cfg.seeds:
        from .config import parse_seeds
        from .seeds import format_mean_std, train_seeds
        agg = train_seeds(cfg, parse_seeds(cfg.seeds))
        if agg["best_val_mrr"]["n"]:               # a link store's runs
            print(f"{agg['run_dir']}: seeds {','.join(map(str, agg['seeds']))}: best val MRR "
                  f"{format_mean_std(agg['best_val_mrr'], 1, 4)}, test MRR at best val "
                  f"{format_mean_std(agg['test_mrr_at_best_val'], 1, 4)}, train {format_mean_std(agg['train_s'], 1, 2)} s")
            _note_still_rising(agg["log"], "mrr", mean=True)
            return
        print(f"{agg['run_dir']}: seeds {','.join(map(str, agg['seeds']))}: best val "
              f"{format_mean_std(agg['best_val_acc'])}, test at best val {format_mean_std(agg['test_at_best_val'])}, "
              f"train {format_mean_std(agg['train_s'], 1, 2)} s")
        shown = {k: format_mean_std(v) for k, v in agg.items() if isinstance(v, dict) and v["n"]}
        print(_metrics_line(shown, cfg.target_metric, show=lambda v: v or "-"))
        _note_still_rising(agg["log"], cfg.target_metric, mean=True)
        return
    s = train(cfg)
    if s.get("distributed"):
        if s["run_dir"]:                           # rank 0
            moved = (f"exchanged {s['exchange']['rows_recv']:,} rows ({s['exchange']['bytes_recv'] / 2**20:.1f} MiB "
                     "received over all ranks)") if "exchange" in s else \
                f"read {s['io']['bytes_read'] / 2**20:.1f} MiB over all ranks"
            if "best_val_mrr" in s:                # a link store's ranks
                print(f"{s['run_dir']}: {s['world']} ranks, {s['epochs']} epochs in {s['train_s']:.1f} s, "
                      f"{_link_line(s)}, {moved}")
                return
            print(f"{s['run_dir']}: {s['world']} ranks, {s['epochs']} epochs in {s['train_s']:.1f} s, best val "
                  f"{s['best_val_acc']:.4f}, test at best val {_accuracy(s['test_at_best_val'])}, {moved}")
            print(_metrics_line(s, s["target_metric"]))
        return
    if "best_val_mrr" in s:                        # a link store's run (`linktask`)
        print(f"{s['run_dir']}: {s['epochs']} epochs in {s['train_s']:.1f} s, {_link_line(s)}, "
              f"read {s['io']['bytes_read'] / 2**20:.1f} MiB")
        _note_still_rising(s["log"], s["target_metric"])
        return
    print(f"{s['run_dir']}: {s['epochs']} epochs in {s['train_s']:.1f} s, best val "
          f"{s['best_val_acc']:.4f}, test at best val {_accuracy(s['test_at_best_val'])}, "
          f"read {s['io']['bytes_read'] / 2**20:.1f} MiB" +
          (f" ({s['read_amplification']:.1f}x the {s['feature_dtype']} rows' bytes)" if s.get("read_amplification") else "")
          + f", cap enforced: {s['memory_cap']['enforced']}")
    print(_metrics_line(s, s["target_metric"]))
    _note_still_rising(s["log"], s["target_metric"])
    m = s["mixing"]
    print(f"  mixing: {m['groups']:g} groups an epoch of {m['parts_mean']:.1f} parts (fewest {m['parts_min']}), label "
          f"distance from the training set {m['tv_mean']:.3f} on average, {m['tv_max']:.3f} at worst"
          + (f" (random groups of as many training nodes: {m['tv_random']:.3f})" if "tv_random" in m else "")
          + (f", drift {m['drift']:.2f} over {m['steps_per_group']:g} step(s) a group" if "drift" in m else "")
          + (f", {m['steps_per_epoch']:g} steps an epoch" if "steps_per_epoch" in m else "")
          + (" (warned)" if m["warning"] else ""))
    from .policies import POLICIES
    for line in POLICIES[s["policy"]].summary_lines(s):     # the policy's own knobs, as it words them
        print(f"  {line}")


def _note_still_rising(log, metric, mean=False):
    """A note on stderr when a run's validation `metric` in its `log` (`mean`: a --seeds run's mean curve) was
    still rising at the end (`metrics.still_rising`)."""
    from .metrics import NAMES, still_rising
    curve = log.get(f"val_{metric}_mean" if mean else f"val_{metric}")   # none where it is undefined (AUC, one class)
    rising = still_rising(curve) if curve is not None else None
    if rising:
        print(f"oocgnn: note: {'mean ' if mean else ''}validation {NAMES[metric]} was still rising at the end (its "
              f"best rose {rising[0]:.1f} points in the last " + (f"{rising[1]} evaluations" if rising[1] > 1 else "evaluation")
              + "); more --epochs may raise it",
              file=sys.stderr)


def _cmd_tune(args):
    from .config import TrainConfig
    from .tune import tune
    settings = _settings_from(args)
    cfg = TrainConfig.create(**settings)
    out = args.out or str(Path("runs") / f"tune-{Path(cfg.store).name}-{cfg.memory_budget}")
    policies = [p for p in args.policies.split(",") if p] if args.policies else None
    if policies:
        from .policies import POLICIES
        unknown = [p for p in policies if p not in POLICIES]
        if unknown:
            raise UserError(f"unknown policies {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    tune(cfg, out, top=args.top, time_limit=args.time_limit, predict_steps=args.predict_steps or None,
         policies=policies, cache=args.cache_dir or None, progress=cfg.progress, remeasure_disk=args.remeasure_disk)


def _cmd_compare(args):
    import matplotlib
    matplotlib.use("Agg")
    import pandas as pd
    from .compare import PRIMING, compare, default_budget, task_policies
    from .device import resolve_device
    from .config import TrainConfig, task_defaults
    from .metrics import summary_keys
    from .plots import plot_comparison, save_figure
    from .policies import POLICIES
    from .store import open_store
    from .units import format_size
    settings = _settings_from(args)
    store = open_store(settings["store"], verify=False)
    settings.setdefault("memory_budget", default_budget(store))
    cfg = task_defaults(TrainConfig.create(**settings), getattr(store, "task", "node"))
    policies = [p for p in args.policies.split(",") if p] if args.policies else task_policies(store)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or len(set(policies)) != len(policies):
        raise UserError(f"--policies: give distinct policies of {', '.join(POLICIES)}"
                        + (f" ({', '.join(unknown)} unknown)" if unknown else ""))
    out = Path(args.out or Path("runs") / f"compare-{Path(cfg.store).name}")
    table, logs, target = compare(cfg, policies, out, target_acc=cfg.target_acc or None, warm=not args.no_warm,
                                  progress=cfg.progress)
    feature_bytes = store.num_nodes * store.row_stride
    shown_metric, extra = ("mrr", ["test_hits@10_at_best_val"]) if getattr(store, "task", "node") == "link" else \
        ("acc", [])
    metrics = [*summary_keys(shown_metric), *extra]
    if cfg.target_metric != shown_metric:                   # and the best validation value the target is of
        metrics.append(summary_keys(cfg.target_metric)[0])
    shown = table[["policy", "epoch_s", "time_to_target_s", *metrics,
                   "read_per_epoch", "feature_files_per_epoch", "peak_rss", "status"]].copy()
    for col in ("read_per_epoch", "peak_rss"):
        shown[col] = [format_size(v) if pd.notna(v) else "-" for v in shown[col]]
    shown["status"] = [s if len(s) <= 48 else s[:45] + "..." for s in shown["status"].astype(str)]
    print(shown.rename(columns={"time_to_target_s": "s_to_target", "feature_files_per_epoch": "x_file"})
          .to_string(index=False, float_format=lambda v: f"{v:.3f}", na_rep="-"))
    title = (f"{store.path.name}: {store.num_nodes:,} nodes, features {format_size(feature_bytes)}; budget "
             f"{format_size(cfg.memory_budget_bytes)} ({cfg.memory_budget_bytes / feature_bytes:.0%} of them); "
             f"{cfg.model} {cfg.fanouts}, batch {cfg.batch_size}, {cfg.epochs} epochs, seed {cfg.seed}")
    note = ("evaluation and setup not timed; " + (PRIMING if not args.no_warm else "numba's cache NOT primed: "
            "the first runs include compiling") + f"; device {resolve_device(cfg.device)}")
    fig = plot_comparison(table, logs, target, feature_bytes, title, note, cfg.target_metric)
    written = []
    for path in [out / "comparison"] + ([Path(args.figure)] if args.figure else []):
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(path.with_suffix(".csv"), index=False)
        save_figure(fig, path.with_suffix(".png"))
        written += [str(path.with_suffix(".csv")), str(path.with_suffix(".png"))]
    print(f"time to val {cfg.target_metric} {target:.4f} measured" if target else "no policy ran",
          f"; wrote {', '.join(written)}")


def _cmd_report(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from .metrics import NAMES
    from .plots import load_runs, plot_time_to_accuracy, run_task, save_figure, seed_table
    out = Path(args.out)
    for run in map(Path, args.runs):              # never write into what is read: a run's own log.csv
        if run.is_dir() and out.resolve().parent.is_relative_to(run.resolve()):
            raise UserError(f"--out {args.out} is inside the run directory {run}, which report reads; "
                            "write the report elsewhere")
    runs = load_runs(args.runs)
    metric = "mrr" if run_task(runs) == "link" else "acc"
    table = seed_table(runs)
    print(table.to_string(index=False))
    out.parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out.with_suffix(".csv"), index=False)
    for run, log in runs.groupby("run", sort=False):  # one line a run: its metrics and its groups' mixing
        r = log.iloc[-1]
        mix = "" if pd.isna(r["mixing_tv_mean"]) else \
            f", groups of {r['mixing_parts']:.1f} parts, label TV {r['mixing_tv_mean']:.3f} (worst {r['mixing_tv_max']:.3f})"
        others = ("hits@10",) if metric == "mrr" else ("f1", "auc")
        more = "".join(f", {NAMES.get(m, m)} {log[f'val_{m}'].max():.4f}" for m in others   # none in older logs;
                       if f"val_{m}" in log and log[f"val_{m}"].notna().any())             # AUC: binary labels
        print(f"{run}: {r['policy']}, best val {NAMES[metric]} {log[f'val_{metric}'].max():.4f}{more}{mix}")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (split, name) in zip(axes, (("val", "validation"), ("test", "test"))):
        plot_time_to_accuracy(runs, ax, f"{split}_{metric}", f"{name} {NAMES[metric]} vs time")
    save_figure(fig, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.csv')} and {out.with_suffix('.png')}")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


_TYPES = {"int": (int, "N"), "float": (float, "X"), "str": (str, "TEXT"),
          "float | str": (str, "X|auto"), "int | str": (str, "N|auto")}       # a number or a word: the setting's dataclass parses it


def _non_negative(text) -> int:
    """An argparse type: an integer >= 0 (a seed; numpy's generators refuse negative ones)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_settings(parser, exclude=()):
    """One flag per setting of `config.SETTINGS` (`--batch-size` for batch_size), its help and default
    from the setting itself; each policy's options in a group of their own. Flags not given stay
    None, so the config's own defaults (or those of --config) apply."""
    from .config import SETTINGS
    from .policies import POLICIES
    groups = {}
    parser.add_argument("--config", metavar="FILE.json", default=None,
                        help="start from the settings in this file (a run's config.json, or the chosen.json "
                             "`oocgnn tune` writes); flags given override it (default: none)")
    for name, (owner, f) in SETTINGS.items():
        if name in exclude:
            continue
        if name == "store":
            parser.add_argument("store", nargs="?", default=None,
                                help=f"{f.metadata['help']} (may come from --config)")
            continue
        if owner is None:
            target = parser
        elif owner not in groups:
            target = groups[owner] = parser.add_argument_group(f"{owner} ({POLICIES[owner].source})")
        else:
            target = groups[owner]
        flag, help = "--" + name.replace("_", "-"), f.metadata["help"]
        # the type's name, whether the policy's module postpones annotations (a string) or not (a class)
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if kind == "bool":                          # on by default: --no-X turns it off
            off = f.default
            target.add_argument(f"--no-{flag[2:]}" if off else flag, dest=name, default=None,
                                action="store_false" if off else "store_true",
                                help=f"{'do not ' if off else ''}{help[0].lower()}{help[1:]}")
        else:
            kind, metavar = _TYPES[kind]
            target.add_argument(flag, dest=name, type=kind, default=None, metavar=metavar,
                                help=help if "default" in help else f"{help} (default {f.default!r})")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="oocgnn", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pr = sub.add_parser("prepare", help="write a store from a source",
                        description="Write an on-disk store from the synthetic generator, a .npz "
                                    "file (../shared/datasets format) or an OGB raw directory.")
    pr.add_argument("source", help="'synthetic', a .npz file, or an OGB node- or link-property raw directory")
    pr.add_argument("--preset", default="small", help="synthetic preset: tiny|small|medium|large|xlarge (default small; "
                                                       "xlarge's 28.7 GB of features exceed 24 GB of RAM)")
    pr.add_argument("--out", required=True, help="store directory to create")
    pr.add_argument("--seed", type=_non_negative, default=0, metavar="N",
                    help="generator seed (synthetic), --split random's and --edge-split's seed (default 0)")
    pr.add_argument("--split", default="given",
                    help="given (the source's splits) | random:TRAIN,VAL,TEST (seeded random fractions of the "
                         "labelled nodes, summing to <= 1, e.g. random:0.1,0.1,0.8; default given)")
    pr.add_argument("--task", default="node", choices=("node", "link"),
                    help="node: node classification; link: link prediction, the edges split by --edge-split, the "
                         "held-out ones removed from the topology (both directions) and kept in link_val.npy and "
                         "link_test.npy (default node)")
    pr.add_argument("--edge-split", default=None, metavar="TRAIN,VAL,TEST|given",
                    help="--task link: fractions of the undirected edges (each > 0, summing to 1), exact counts, "
                         "drawn by --seed from the edge set alone; or given: the source's own (OGB ogbl-*) "
                         "(default: the source's own if it has one, else 0.85,0.05,0.1)")
    pr.add_argument("--force", action="store_true",
                    help="replace an existing store (only a store: a directory with other files is refused)")
    pr.add_argument("--row-normalize", action="store_true",
                    help="scale each feature row to sum 1 (.npz sources; usual for bag-of-words)")
    pr.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true",
                    help="no progress bar (--no-progress: train's word for it)")
    pr.add_argument("--prepare-memory", default="auto",
                    help="bytes the prepare may hold: its per-node arrays (~144 B a node) first, the rest sorts "
                         "the edges in runs on disk merged by source range (the same store, the edge list never "
                         "held whole); peak RSS stays within it + 1 GiB. 0 sorts them all in memory (default "
                         "auto: a quarter of the RAM, at most 4GiB)")
    pr.add_argument("--partitioner", default="none",
                    help="metis | fennel | random | none (default none): relabel nodes so each part "
                         "is a contiguous store-id range; results cached in data/partitions")
    pr.add_argument("--parts", type=int,
                    help="number of parts K (default 1 for none; else enough that a HierBatching mega-batch "
                         "at the default --memory-budget holds 128 parts, in parts of 20 to 2000 nodes)")
    pr.add_argument("--feature-dtype", default="float32", choices=("float32", "float16", "int8"),
                    help="how feature rows are stored, read, cached and copied (F2CGT's compressed features): "
                         "float32; float16 (half the bytes); or int8 (a quarter; per-column scale and offset "
                         "kept beside the rows, error at most half a step of a column's range / 255). Rows are "
                         "decoded to float32 after the gather, on the GPU after the copy (default float32)")
    pr.add_argument("--shards", type=int, default=0,
                    help="also cut the store into R per-rank shards for `train --distributed` on R ranks, "
                         "written to <out>-shards<R>: rank r's directory holds only its rows, lists and "
                         "labels, so each machine needs only its ranks' shards (default 0: none)")
    pr.set_defaults(func=_cmd_prepare)

    inf = sub.add_parser("info", help="describe a store", description="Validate a store and print "
                         "N, E, D, classes, splits, partitions and bytes. Every open checks meta.json "
                         "and its checksum, sizes, the small files' CRC32 and invariants; features.bin "
                         "and indices.bin are CRC-checked once and then trusted while their size, mtime, "
                         "ctime and inode are unchanged (--verify checks them again).")
    inf.add_argument("store")
    inf.add_argument("--json", action="store_true", help="print JSON")
    inf.add_argument("--verify", action="store_true",
                     help="check the CRC32 of every file and every neighbour id now, even where a stamp "
                          "says features.bin and indices.bin were checked (default: off)")
    inf.add_argument("--upgrade", action="store_true",
                     help="upgrade a store written by an older oocgnn in place, after checking every "
                          "file (default: off)")
    inf.add_argument("--no-verify", action="store_true",
                     help="skip CRC32 checks (sizes, meta.json and invariants are still checked; default: off)")
    inf.set_defaults(func=_cmd_info)

    tr = sub.add_parser("train", help="train a model under a policy",
                        description="Train a GNN over a store; writes config.json, log.csv, steps.csv "
                                    "and summary.json to the run directory.")
    _add_settings(tr)
    tr.set_defaults(func=_cmd_train)

    tu = sub.add_parser("tune", help="rank policies and knobs for a budget, run the best few, choose one",
                        description="Predict the epoch time of every policy and knob setting that fits "
                                    "--memory-budget (the simulator's exact I/O at this disk's measured "
                                    "rates plus calibrated CPU costs), train the --top fastest predicted "
                                    "for --epochs (cut to fit --time-limit), and write ranking.csv, "
                                    "chosen.json (for `oocgnn train --config`), tune.json and "
                                    "predicted_vs_measured.png to --out. Disk rates and calibrations are "
                                    "cached (--cache-dir).")
    _add_settings(tu, exclude=("policy", "out", "resume", "max_steps", "checkpoint_every", "force",
                                  "distributed", "rank_data", "dist_timeout"))
    tu.add_argument("--out", default=None, help="tune directory (default runs/tune-<store>-<budget>)")
    tu.add_argument("--top", type=int, default=3, help="candidates trained after the prediction (default 3)")
    tu.add_argument("--time-limit", type=float, default=0.0,
                    help="seconds of training for all --top runs together; each is cut to its share at its "
                         "predicted step time (default 0: --epochs each)")
    tu.add_argument("--predict-steps", type=int, default=0,
                    help="predict from the first N batches of an epoch, extrapolated (default 0: a whole epoch)")
    tu.add_argument("--policies", default="", help="only these policies, comma-separated (default: all)")
    tu.add_argument("--cache-dir", default="", help="where disk rates and calibrations are kept "
                                                     "(default $OOCGNN_CACHE or ~/.cache/oocgnn)")
    tu.add_argument("--remeasure-disk", action="store_true",
                    help="measure the disk's rates now, not the cached ones (a virtual disk's random reads run "
                         "several times faster on a file its host read minutes ago than on one untouched for "
                         "days; default: off, the rates measured once per device)")
    tu.set_defaults(func=_cmd_tune)

    co = sub.add_parser("compare", help="train every policy at one budget: time to accuracy and bytes read",
                        description="Train the same model under each policy at one --memory-budget (default a "
                                    "third of the feature file), each in a fresh process, and write a table "
                                    "(CSV) and a figure (time to accuracy, time to a target, bytes read per "
                                    "epoch) to --out. A policy whose settings do not fit runs with the tuner's "
                                    "grid knobs that fit; one that cannot fit or fails is a row saying why. "
                                    "numba's cache is primed by untimed steps before any timing.")
    _add_settings(co, exclude=("policy", "out", "resume", "max_steps", "checkpoint_every", "force", "seeds",
                               "distributed", "rank_data", "dist_timeout"))
    co.add_argument("--policies", default="",
                    help="policies to compare, comma-separated (default: every policy that trains the store's "
                         "task, now all of them: inmemory,mmap,hierbatching,outre,ginex,macrobatch,marius,composed,"
                         "packed; a link store's are compared by MRR)")
    co.add_argument("--out", default=None, help="directory for the runs and comparison.{csv,png} "
                                                 "(default runs/compare-<store>)")
    co.add_argument("--figure", default="", help="also write the table and figure to this path, without "
                                                 "extension (default: none)")
    co.add_argument("--no-warm", action="store_true",
                    help="do not prime numba's cache before timing (default: primed)")
    co.set_defaults(func=_cmd_compare)

    rp = sub.add_parser("report", help="time-to-accuracy CSV and plot of runs",
                        description="Combine the log.csv of run directories into one CSV and a "
                                    "time-to-accuracy PNG; a `train --seeds` directory counts as its seeds' "
                                    "runs, shown as their mean with a ± std band, and the table printed "
                                    "gives each group's accuracies as mean ± std over its seeds.")
    rp.add_argument("runs", nargs="+", help="run directories (or `train --seeds` directories)")
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
    except BrokenPipeError:               # `oocgnn info --json | head`: the reader had enough; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # (Python would complain at exit)
        return 141                        # as a command killed by SIGPIPE
    except OSError as e:                  # the environment: a full or read-only disk, EIO, a path in the way
        print(f"oocgnn: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    return 0


def os_error_line(e: OSError) -> str:
    """One line for an environment error, naming the file and what the system said."""
    what = e.strerror or str(e) or type(e).__name__
    names = [n for n in (e.filename, e.filename2) if n is not None]
    return f"{what}: {' -> '.join(map(str, names))}" if names else what


if __name__ == "__main__":
    sys.exit(main())
