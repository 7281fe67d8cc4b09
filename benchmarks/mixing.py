"""Mixing against accuracy: where HierBatching's accuracy starts to fall as its mega-batches mix worse.

For each dataset and split (the graph's own, and a random 10/10/80 one via `GraphData.resplit`), a
METIS store is written per number of parts; `inmemory` is trained as the reference, then
`hierbatching` at a budget of --budget-frac of the feature file for every PARTS:N_D of --configs that
fits it (N_D = 0: the default, what the budget allows), and each of --policies (outre, marius, composed,
...) at its defaults on the --policy-parts store. Each row gives the plan's mixing
(`oocgnn.mixing`: parts per mega-batch, mean and worst label TV distance; no I/O), test accuracy at
the best validation step (mean ± std over --seeds) and its difference from inmemory's, and whether
the run warned, with the statistic it warns on: the excess of a group's distance over a random draw of as
many labelled nodes (`tv_random`), times the optimizer steps taken in a group (`drift`, warned above
`oocgnn.mixing.MAX_DRIFT`, which was read off this table and issue 37's 7-seed runs).
A seed's run already finished under --data with the same settings is reused, not trained again
(a table re-run after a stop, or with rows added; on the CPU a seed's run is deterministic).
Issue 37's table (README, "Accuracy on small labelled sets") is, with `oocgnn train`'s own batch size and
evaluation subset so that a seed's run equals `oocgnn train`'s to the digit:

    .venv/bin/python benchmarks/mixing.py --configs 0:0 --policies outre,marius,composed \
        --seeds 0,1,2,3,4,5,6 --random-seeds 0,1,2 --epochs 100 --fanouts 25,10 --hidden 512 \
        --batch-size 1024 --eval-nodes 20000 --threads 1

    .venv/bin/python benchmarks/mixing.py --datasets cora,citeseer,amazon_photo,coauthor_cs \\
        --configs 16:2,64:8,128:16,256:32 --seeds 0,1,2 --epochs 50
    .venv/bin/python benchmarks/mixing.py --preset tiny --configs 16:2,16:4 --seeds 0 --epochs 2 \
        --policies outre --policy-parts 16                                                     # smoke
    .venv/bin/python benchmarks/mixing.py --datasets cora --splits random --configs 0:0 \\
        --hb-variants "static_ratio=0.05;passes=1,static_ratio=0.05;pipeline=false"      # knobs at the default K
"""
import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
DATASETS = REPO.parent / "shared" / "datasets"


def source(name, preset):
    from oocgnn.prepare import load_source
    from oocgnn.synthetic import generate
    if name == "synthetic":
        return generate(preset)
    path = Path(name) if name.endswith(".npz") else DATASETS / f"{name}.npz"
    return load_source(path)


def store_for(data, parts, root, label):
    """A METIS store of `data` with `parts` parts, written once. The METIS assignment is cached in
    `root`/partitions, so a machine without DGL (the GPU box) reuses one computed elsewhere; with
    neither DGL nor a cached one, FENNEL."""
    from oocgnn.partition import cache_path, order_from_assignment, partition, CSRSource
    from oocgnn.store import open_store
    from oocgnn.storewrite import write_store
    path, cache = Path(root) / f"{label}-k{parts}", Path(root) / "partitions"
    if (path / "meta.json").exists():
        return open_store(path, verify=False)
    method = "metis"
    if not cache_path(CSRSource.of(data), method, parts, 0, cache_dir=cache).is_file():
        try:
            import dgl  # noqa: F401
        except ImportError:
            method = "fennel"
    assignment, _ = partition(data, method, parts, seed=0, cache_dir=cache)
    order, offsets = order_from_assignment(assignment, parts)
    return write_store(data, path, order=order, part_offsets=offsets, partitioner=method, progress=False)


def variants(text) -> list:
    """[{knob: value}] from 'k=v,k=v;k=v', each value read as its setting's type (`widgets.parse_values`,
    as the sweep widget reads them)."""
    from oocgnn.config import SETTINGS, TrainConfig
    from oocgnn.errors import UserError
    from oocgnn.widgets import parse_values
    defaults = TrainConfig(store="", policy="hierbatching")
    out = []
    for group in filter(None, (g.strip() for g in text.split(";"))):
        knobs = {}
        for pair in filter(None, (p.strip() for p in group.split(","))):
            key, sep, value = (part.strip() for part in pair.partition("="))
            if not sep or key not in SETTINGS:
                raise SystemExit(f"--hb-variants: {pair!r} is not SETTING=VALUE")
            try:
                knobs[key] = parse_values(value, type(defaults.get(key)), key)[0]
            except UserError as e:
                raise SystemExit(f"--hb-variants: {e}") from None
        out.append(knobs)
    return out


def run(store, base, seeds, root, **settings):
    """(mixing dict, accuracies) of `settings` over `seeds`; a plan that does not fit raises UserError."""
    from oocgnn.mixing import mixing
    from oocgnn.policies import make_plan
    from oocgnn.train import train
    cfg = base.replace(store=str(store.path), **settings)
    mix = mixing(make_plan(store, cfg))
    accs = []
    for s in seeds:
        knobs = "".join(f"-{k}{v}" for k, v in settings.items() if k not in ("policy", "parts_per_megabatch"))
        name = f"{Path(store.path).name}-{cfg.policy}-{settings.get('parts_per_megabatch', 0)}{knobs}-s{s}"
        out = Path(root) / "runs" / name
        run_cfg = cfg.replace(seed=s, out=str(out), force=True)
        accs.append((finished(out, run_cfg, store) or train(run_cfg))["test_at_best_val"])
    return mix, accs


def finished(out, cfg, store):
    """The summary of a run finished in `out` with the same settings, after the store was written (a table
    re-run after a stop or with more rows reuses it: on the CPU a seed's run is deterministic), else None."""
    import json
    try:
        saved = json.loads((out / "config.json").read_text())
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    from oocgnn.policies import POLICIES
    now = {k: v for k, v in cfg.to_dict().items() if k not in ("out", "force", "progress")
           and (k not in POLICIES or k == cfg.policy)}           # other policies' options do not touch this run
    same = _same(saved, now)
    older = (Path(store.path) / "meta.json").stat().st_mtime < (out / "summary.json").stat().st_mtime
    return summary if same and older else None     # a store written again since: run again


RESOLVED = ("topology", "device")     # saved as the run resolved them: "auto" asked matches what it became


def _same(saved, now) -> bool:
    """Whether a saved config has the settings `now` asks for (a policy's options exactly: its "auto" is
    saved as "auto", and one saved as a number was another default)."""
    return all(saved.get(k) == v or (k in RESOLVED and v == "auto") for k, v in now.items())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--datasets", default="cora,citeseer,amazon_photo,coauthor_cs",
                    help="names in ../shared/datasets or .npz paths, or 'synthetic' (default the four small graphs)")
    ap.add_argument("--preset", default="", help="synthetic preset: replaces --datasets by 'synthetic' (default none)")
    ap.add_argument("--splits", default="given,random", help="given (the graph's own) and/or random (10/10/80, "
                                                               "seed 0) (default given,random)")
    ap.add_argument("--configs", default="16:2,64:8,128:16,256:32",
                    help="PARTS:N_D pairs; PARTS 0 is `prepare`'s default K, N_D 0 the default (what the budget "
                         "holds) (default 16:2,64:8,128:16,256:32)")
    ap.add_argument("--policies", default="", help="also train these policies at their defaults, comma-separated "
                                                    "(e.g. outre,marius,composed) (default none)")
    ap.add_argument("--policy-parts", type=int, default=0, help="--policies train on a store of this many parts, 0: "
                                                                  "prepare's default K (default 0)")
    ap.add_argument("--hb-variants", default="",
                    help="also train hierbatching on the first config's store with these knobs changed: sets of "
                         "KEY=VALUE joined by ',', sets separated by ';', e.g. 'static_ratio=0.05;passes=1,"
                         "static_ratio=0.05;pipeline=false' (default none)")
    ap.add_argument("--budget-frac", type=float, default=1 / 3, help="budget as a fraction of the feature file "
                                                                       "(default 1/3)")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds (default 0,1,2)")
    ap.add_argument("--random-seeds", default="", help="training seeds on the random split (default: --seeds; the "
                                                         "random split varies less between seeds)")
    ap.add_argument("--epochs", type=int, default=50, help="epochs per run (default 50)")
    ap.add_argument("--fanouts", default="10,10", help="fanouts (default 10,10)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden width (default 128)")
    ap.add_argument("--batch-size", type=int, default=256, help="training nodes per batch (default 256)")
    ap.add_argument("--lr", type=float, default=0.01, help="Adam learning rate (default 0.01)")
    ap.add_argument("--eval-nodes", type=int, default=2000, help="val/test nodes evaluated per epoch (default 2000)")
    ap.add_argument("--data", default=str(REPO / "data" / "mixing"), help="stores and runs go here (default data/mixing)")
    ap.add_argument("--device", default="auto", help="where the models train: auto | cpu | cuda (default auto)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run, 0: the library default "
                                                            "(default 0)")
    add_csv_argument(ap, "mixing.csv under --data")
    args = ap.parse_args(argv)
    import numpy as np
    import pandas as pd
    from benchmarks.sampler import loadavg
    from oocgnn.config import TrainConfig
    from oocgnn.mixing import default_parts
    from oocgnn.policies import POLICIES
    given_seeds = [int(s) for s in args.seeds.split(",") if s]
    random_seeds = [int(s) for s in args.random_seeds.split(",") if s] or given_seeds
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        ap.error(f"--policies: unknown {', '.join(unknown)} (known: {', '.join(sorted(POLICIES))})")
    configs = [tuple(int(x) for x in c.split(":")) for c in args.configs.split(",") if c]
    names = ["synthetic"] if args.preset else [d for d in args.datasets.split(",") if d]
    hb_variants = variants(args.hb_variants)      # a malformed one stops here, before any training
    table, t0 = BenchTable(args.csv or Path(args.data) / "mixing.csv"), time.perf_counter()
    for name in names:
        loaded = {}                                 # the dataset, read once for its splits
        for split in [s for s in args.splits.split(",") if s]:
            label = f"{Path(name).stem}-{split}"
            seeds = random_seeds if split == "random" else given_seeds
            setup = {}

            def prepare():                         # the dataset, its first store and the budget: no row when ok
                data0 = loaded["data"] if loaded else loaded.setdefault("data", source(name, args.preset or "tiny"))
                data = data0 if split == "given" else data0.resplit(0.1, 0.1, seed=0)
                k_default = default_parts(data.num_nodes, data.num_edges, data.feat_dim)
                first = store_for(data, configs[0][0] or k_default, args.data, label)
                budget = int(args.budget_frac * first.num_nodes * first.row_stride)
                base = TrainConfig(store=str(first.path), epochs=args.epochs, fanouts=args.fanouts,
                                   hidden=args.hidden, batch_size=args.batch_size, lr=args.lr,
                                   max_eval_nodes=args.eval_nodes, progress=False, memory_budget=f"{budget}B",
                                   device=args.device, threads=args.threads)
                setup.update(data=data, k_default=k_default, first=first, base=base)

            if not table.run(label, prepare):
                continue
            data, k_default, first, base = (setup[k] for k in ("data", "k_default", "first", "base"))

            def reference():
                _, ref = run(first, base, seeds, args.data, policy="inmemory")
                row = {"dataset": label, "policy": "inmemory", "parts": first.num_parts, "n_d": "",
                       "acc": np.mean(ref), "std": np.std(ref), "delta": 0.0}
                print(row, flush=True)
                return row

            ref_key = f"{label} inmemory"
            table.run(ref_key, reference, dataset=label, policy="inmemory", parts=first.num_parts, n_d="")
            runs = [("hierbatching", parts or k_default, n_d, {}) for parts, n_d in configs]
            runs += [("hierbatching", first.num_parts, 0, v) for v in hb_variants]
            runs += [(policy, args.policy_parts or k_default, 0, {}) for policy in policies]
            for policy, parts, n_d, knobs in runs:
                row = {"dataset": label, "policy": policy, "parts": parts,
                       "n_d": n_d or ("auto" if policy == "hierbatching" else ""),
                       "knobs": ",".join(f"{k}={v}" for k, v in knobs.items())}

                def one():
                    store = store_for(data, parts, args.data, label)
                    mix, accs = run(store, base, seeds, args.data, policy=policy,
                                    **({"parts_per_megabatch": n_d} if n_d else {}), **knobs)
                    ref = table.ok(ref_key)                  # no reference: no delta (the end says why)
                    out = {**row, "groups": mix["groups"], "parts_mean": mix["parts_mean"],
                           "tv_mean": mix["tv_mean"], "tv_max": mix["tv_max"], "tv_random": mix["tv_random"],
                           "steps_per_group": mix["steps_per_group"], "drift": mix["drift"], "acc": np.mean(accs),
                           "std": np.std(accs), "delta": np.mean(accs) - ref["acc"] if ref else None,
                           "warns": bool(mix["warning"])}
                    print(out, flush=True)
                    return out

                key = " ".join(x for x in (label, policy, f"k{parts}", row["n_d"] and f"n_d={row['n_d']}",
                                           row["knobs"]) if x)
                table.run(key, one, **row)
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "config"} for r in table.rows if "dataset" in r])
    if not df.empty:
        df = df[[c for c in df.columns if c != "status"] + ["status"]]
        df["status"] = df["status"].str.slice(0, 80)                   # the CSV keeps the whole line
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(df.to_string(index=False, float_format="%.3f"))
    for r in table.failed():
        if "dataset" not in r or r["policy"] == "inmemory":
            print(f"{r['config']}: {r['status']}" + (" (no delta for its rows)" if "dataset" in r else ""))
    print(f"{time.perf_counter() - t0:.0f} s, load average {loadavg()}")


if __name__ == "__main__":
    main()
