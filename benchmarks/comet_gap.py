"""Where marius COMET's link-prediction MRR gap to in-memory comes from (issue 39): one factor at a time.

`inmemory` and `marius` (its default: a state's edges in batches of equal sizes; with MariusGNN's short last
batch a state, `--state-batches full`; and the states' edges cut every B, a batch spanning a state change one
accumulated optimizer step, `--state-batches carry`) are trained on a partitioned link store, then in-memory training (every
feature and list resident) fed MariusGNN's batches (`EdgeBufferSchedule`: each edge bucket's edges in the buffer state
COMET assigns it, a state's edges shuffled and cut into batches) with MariusGNN's two in-buffer restrictions
switched on or off one at a time:

- `neg`: uniform negatives over the state's resident nodes (MariusGNN's randint(num_nodes_in_memory)) or over
  every node (in-memory's);
- `restrict`: neighbour sampling inside the buffer's subgraph, or over the whole graph. With negatives from
  every node and sampling restricted, the batch's outside negatives are visible too (their lists cut to the
  buffer), else they could not be sampled;
- `shuffle`: marius's batches in a random order across states (not something a buffer can do: it would
  reload states);
- `cut`: how a state's edges become batches: `full` (batches of B, the last one short: MariusGNN's), `even`
  (as many batches, of equal sizes: marius's default), or `sizes` (not a state's edges at all: every training
  edge shuffled and cut into MariusGNN's batch sizes, so only the count and sizes of its steps differ from
  in-memory's).

Two rows switch off Adam's momentum (`--adam-beta1 0`) in `inmemory` and `marius`: how much of the gap is
momentum's, which in-memory training profits from and a state's correlated batches cancel.

Both restrictions on is marius `--state-batches full` exactly (the same batches, negatives and samples: the rows
agree to the last digit); both off isolates the batches' grouping by state. Evaluation is the same full-graph one for all.

Each configuration is a row of the table (--csv): its best validation MRR and the test MRR at it, means over
--seeds (each seed's too), and their ratio and difference to `inmemory`'s of the same run. Without --store, a
synthetic link store of --preset is prepared under --data (--partitioner into --parts parts) when missing.

    .venv/bin/python benchmarks/comet_gap.py --store data/cora-link-fennel8 --parts 8 --buffer 4 --seeds 0,1,2
    .venv/bin/python benchmarks/comet_gap.py --preset tiny --epochs 1 --data /tmp/cg   # smoke
"""
import argparse
import contextlib
import os
import subprocess
import sys
import time
from functools import cached_property
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
from oocgnn.edgeschedules import EdgeBufferSchedule  # noqa: E402
from oocgnn.schedules import Visible, _cut, _even_cut, _ids_of_ranges  # noqa: E402

VARIANTS = {"marius-batches": ("all", False, False), "+buffer negatives": ("buffer", False, False),
            "+buffer sampling": ("all", True, False), "+both (= marius short batches)": ("buffer", True, False),
            "marius-batches shuffled": ("all", False, True), "marius-batches even-sized": ("all", False, False, "even"),
            "random edges in marius's sizes": ("all", False, False, "sizes")}


class MariusBatches(EdgeBufferSchedule):
    """marius's batches for an in-memory run, each restriction a switch (the module docstring)."""

    def __init__(self, *args, neg="buffer", restrict=True, shuffle=False, cut="full", **kw):
        super().__init__(*args, **kw)
        self.neg, self.restrict, self.shuffle, self.cut = neg, restrict, shuffle, cut

    def epoch(self, epoch):
        rng, batches = self.rng(epoch, 1), []
        cut = _even_cut if self.cut == "even" else _cut
        for g, (state, positions) in enumerate(self.groups(epoch)):
            ranges = self.ranges_of(state)
            visible, nodes = Visible(self.visible, ranges), _ids_of_ranges(ranges)
            batches += [(g, batch, visible, nodes) for batch in cut(rng.permutation(positions), self.batch_size)]
        if self.cut == "sizes":                            # marius's sizes, edges drawn over the whole graph
            every = np.random.default_rng([self.seed, epoch, 98]).permutation(len(self.edge_batches.edges))
            ends = np.cumsum([len(b[1]) for b in batches])
            batches = [(g, every[end - len(batch):end], visible, nodes)
                       for (g, batch, visible, nodes), end in zip(batches, ends)]
        if self.shuffle:
            batches = [batches[i] for i in np.random.default_rng([self.seed, epoch, 99]).permutation(len(batches))]
        for b, (g, batch, visible, nodes) in enumerate(batches):
            step = self.edge_batches.batch(self.edge_batches.edges[batch], epoch, b, nodes if self.neg == "buffer" else None)
            step.group = g
            if self.restrict:
                step.group_visible = visible if self.neg == "buffer" else \
                    Visible(lambda r, x=step.seeds, n=nodes: np.union1d(n, x), None)
            yield step


@contextlib.contextmanager
def inmemory_with(p, c, l, **switches):
    """`inmemory` plans on link stores walk `MariusBatches` while inside."""
    from oocgnn.policies import baselines

    def schedule(plan):
        cfg = plan.cfg
        return MariusBatches(plan.store, cfg.batch_size, physical_parts=p, buffer_parts=c, ordering="comet",
                             logical_parts=l, seed=plan.seed, num_negatives=cfg.negatives, chunks=cfg.negative_chunks,
                             degree_fraction=cfg.negative_degree_fraction, **switches)
    prop = cached_property(schedule)
    prop.__set_name__(baselines.InMemoryPlan, "schedule")
    baselines.InMemoryPlan.schedule = prop
    try:
        yield
    finally:
        del baselines.InMemoryPlan.schedule


def link_store(preset, partitioner, parts, data: Path) -> str:
    """<data>/<preset>-link-<partitioner><parts>, a synthetic link store written by `oocgnn prepare` when missing
    (its partition cached in <data>/partitions unless $OOCGNN_PARTITION_CACHE says where)."""
    path = data / f"{preset}-link-{partitioner}{parts}"
    if not (path / "meta.json").is_file():
        print(f"preparing {path} ...", flush=True)
        env = {**os.environ, "OOCGNN_PARTITION_CACHE": os.environ.get("OOCGNN_PARTITION_CACHE",
                                                                       str(data / "partitions"))}
        r = subprocess.run([sys.executable, "-m", "oocgnn", "prepare", "synthetic", "--preset", preset, "--task", "link",
                            "--partitioner", partitioner, "--parts", str(parts), "--out", str(path), "--quiet",
                            "--force"], capture_output=True, text=True, cwd=REPO, env=env)
        if r.returncode:
            raise SystemExit(f"prepare failed: {(r.stdout + r.stderr)[-2000:]}")
    return str(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--store", default="", help="a partitioned link store (prepare --task link --partitioner ...) "
                                                "(default none: --preset's under --data)")
    ap.add_argument("--preset", default="tiny", help="synthetic preset of the store prepared without --store "
                                                     "(default tiny)")
    ap.add_argument("--partitioner", default="fennel", help="the prepared store's partitioner: fennel | random | "
                                                            "metis (default fennel)")
    ap.add_argument("--data", default=str(REPO / "data"), help="where the store is prepared, and the CSV "
                                                               "(default data/)")
    ap.add_argument("--parts", type=int, default=8, help="p: physical partitions (default 8)")
    ap.add_argument("--buffer", type=int, default=4, help="c: partitions in the buffer (default 4)")
    ap.add_argument("--logical", type=int, default=0, help="l: COMET's logical partitions (default 0: 2p/c)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, each a run of every row (default 0)")
    ap.add_argument("--epochs", type=int, default=30, help="training epochs of each run (default 30)")
    ap.add_argument("--out", default="/tmp/comet_gap", help="run directories go here (default /tmp/comet_gap)")
    ap.add_argument("--only", default="", help="comma-separated rows to run, the CSV's other rows kept as they are "
                                               "(default: every row)")
    add_csv_argument(ap, "bench/comet_gap.csv under --data")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from oocgnn.config import TrainConfig
    from oocgnn.train import train
    from benchmarks.sampler import loadavg
    print(f"loadavg at start: {loadavg()}  (cpus {os.cpu_count()}, torch threads {torch.get_num_threads()})",
          flush=True)
    t0 = time.perf_counter()
    table = BenchTable(a.csv or Path(a.data) / "bench" / "comet_gap.csv",
                       columns=("val_mrr", "test_mrr", "val_ratio", "test_ratio", "val_diff", "test_diff",
                                "seeds", "val_mrrs", "test_mrrs"), keep=bool(a.only))
    stores = []
    if not table.run("store", lambda: stores.append(a.store or link_store(a.preset, a.partitioner, a.parts,
                                                                            Path(a.data)))):
        print(f"{time.perf_counter() - t0:.0f} s, load average {loadavg()}")
        return
    base = dict(store=stores[0], epochs=a.epochs, batch_size=1000, lr=0.01, weight_decay=0.0, fanouts="10,10",
                progress=False, force=True, threads=1)
    marius = dict(policy="marius", physical_parts=a.parts, buffer_parts=a.buffer, logical_parts=a.logical,
                  ordering="comet", topology="disk")
    names = ["inmemory", "marius comet", "marius comet (short batches)", "marius comet (carried batches)", *VARIANTS,
             "inmemory (no momentum)", "marius comet (no momentum)"]
    runs = {name: [] for name in names}                    # (seed, best val MRR, test MRR at it) per name
    for seed in [int(s) for s in a.seeds.split(",")]:
        def run(name, **kw):
            s = train(TrainConfig.create(out=f"{a.out}/{name.replace(' ', '_')}-s{seed}", seed=seed, **base, **kw))
            runs[name].append((seed, s["best_val_mrr"], s["test_mrr_at_best_val"]))
            print(f"{name:26s} seed {seed}  val {runs[name][-1][1]:.4f}  test {runs[name][-1][2]:.4f}", flush=True)
            v = np.array([r[1:] for r in runs[name]], dtype=float)
            return {"val_mrr": v[:, 0].mean(), "test_mrr": v[:, 1].mean(), "seeds": [r[0] for r in runs[name]],
                    "val_mrrs": v[:, 0].tolist(), "test_mrrs": v[:, 1].tolist()}

        only = set(a.only.split(",")) - {""}
        unknown = only - set(names)
        if unknown:
            raise SystemExit(f"--only: unknown rows {sorted(unknown)}; the rows are {names}")

        def one(name, **kw):                               # a row that failed once runs no more
            if (not only or name in only) and table.status(name) in (None, "ok"):
                table.run(name, lambda: run(name, **kw))
        one("inmemory")
        one("marius comet", **marius)
        one("marius comet (short batches)", **marius, state_batches="full")
        one("marius comet (carried batches)", **marius, state_batches="carry")
        for name, (neg, restrict, shuffle, *cut) in VARIANTS.items():
            with inmemory_with(a.parts, a.buffer, a.logical, neg=neg, restrict=restrict, shuffle=shuffle,
                               cut=cut[0] if cut else "full"):
                one(name)
        one("inmemory (no momentum)", adam_beta1=0.0)
        one("marius comet (no momentum)", **marius, adam_beta1=0.0)
    ref = table.ok("inmemory")
    for name in names:                                     # the ratios and differences to inmemory's
        row = table.ok(name)
        if row and ref:
            table.add(name, **{f"{k}_ratio": row[f"{k}_mrr"] / ref[f"{k}_mrr"] if ref[f"{k}_mrr"] else None
                               for k in ("val", "test")},
                      **{f"{k}_diff": row[f"{k}_mrr"] - ref[f"{k}_mrr"] for k in ("val", "test")})
    print(f"\nmean over seeds {a.seeds} (best val MRR, test MRR at it; ratio and difference to inmemory's)")
    print(f"{'config':26s} {'val':>6s} {'test':>6s}  {'val/inm':>7s} {'test/inm':>8s} {'val-inm':>8s} {'test-inm':>8s}")
    for name in names:
        row = table.ok(name)
        if not row:
            print(f"{name:26s} {table.status(name) or 'not run'}")
            continue
        cells = [table.ratio(name, "inmemory", f"{k}_mrr", "{:.3f}x")[1] for k in ("val", "test")]
        cells += [f"{row[f'{k}_diff']:+.4f}" if "val_diff" in row else table.na("inmemory") for k in ("val", "test")]
        print(f"{name:26s} {row['val_mrr']:.4f} {row['test_mrr']:.4f}  {cells[0]:>7s} {cells[1]:>8s} "
              f"{cells[2]:>8s} {cells[3]:>8s}")
    print(f"{time.perf_counter() - t0:.0f} s, load average {loadavg()}")


if __name__ == "__main__":
    main()
