"""Where marius COMET's link-prediction MRR gap to in-memory comes from (issue 39): one factor at a time.

`inmemory` and `marius` are trained on a partitioned link store, then in-memory training (every feature and
list resident) fed marius's own batches (`EdgeBufferSchedule`: each edge bucket's edges in the buffer state
COMET assigns it, a state's edges shuffled and cut into batches) with MariusGNN's two in-buffer restrictions
switched on or off one at a time:

- `neg`: uniform negatives over the state's resident nodes (MariusGNN's randint(num_nodes_in_memory)) or over
  every node (in-memory's);
- `restrict`: neighbour sampling inside the buffer's subgraph, or over the whole graph. With negatives from
  every node and sampling restricted, the batch's outside negatives are visible too (their lists cut to the
  buffer), else they could not be sampled;
- `shuffle`: marius's batches in a random order across states (not something a buffer can do: it would
  reload states).

Both restrictions on is marius exactly (the same batches, negatives and samples: the rows agree to the last
digit); both off isolates the batches' grouping by state. Evaluation is the same full-graph one for all.

    .venv/bin/python benchmarks/comet_gap.py --store data/cora-link-fennel8 --parts 8 --buffer 4 --seeds 0,1,2
"""
import argparse
import contextlib
import sys
from functools import cached_property
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.edgeschedules import EdgeBufferSchedule  # noqa: E402
from oocgnn.schedules import Visible, _cut, _ids_of_ranges  # noqa: E402

VARIANTS = {"marius-batches": ("all", False, False), "+buffer negatives": ("buffer", False, False),
            "+buffer sampling": ("all", True, False), "+both (= marius)": ("buffer", True, False),
            "marius-batches shuffled": ("all", False, True)}


class MariusBatches(EdgeBufferSchedule):
    """marius's batches for an in-memory run, each restriction a switch (the module docstring)."""

    def __init__(self, *args, neg="buffer", restrict=True, shuffle=False, **kw):
        super().__init__(*args, **kw)
        self.neg, self.restrict, self.shuffle = neg, restrict, shuffle

    def epoch(self, epoch):
        rng, batches = self.rng(epoch, 1), []
        for g, (state, positions) in enumerate(self.groups(epoch)):
            ranges = self.ranges_of(state)
            visible, nodes = Visible(self.visible, ranges), _ids_of_ranges(ranges)
            batches += [(g, batch, visible, nodes) for batch in _cut(rng.permutation(positions), self.batch_size)]
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True, help="a partitioned link store (prepare --task link --partitioner ...)")
    ap.add_argument("--parts", type=int, default=8, help="p: physical partitions")
    ap.add_argument("--buffer", type=int, default=4, help="c: partitions in the buffer")
    ap.add_argument("--logical", type=int, default=0, help="l: COMET's logical partitions (0: 2p/c)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--out", default="/tmp/comet_gap")
    a = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    from oocgnn.config import TrainConfig
    from oocgnn.train import train
    base = dict(store=a.store, epochs=a.epochs, batch_size=1000, lr=0.01, weight_decay=0.0, fanouts="10,10",
                progress=False, force=True, threads=1)
    marius = dict(policy="marius", physical_parts=a.parts, buffer_parts=a.buffer, logical_parts=a.logical,
                  ordering="comet", topology="disk")
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        def run(name, **kw):
            s = train(TrainConfig.create(out=f"{a.out}/{name.replace(' ', '_')}-s{seed}", seed=seed, **base, **kw))
            rows.append((name, seed, s["best_val_mrr"], s["test_mrr_at_best_val"]))
            print(f"{name:26s} seed {seed}  val {rows[-1][2]:.4f}  test {rows[-1][3]:.4f}", flush=True)
        run("inmemory")
        run("marius comet", **marius)
        for name, (neg, restrict, shuffle) in VARIANTS.items():
            with inmemory_with(a.parts, a.buffer, a.logical, neg=neg, restrict=restrict, shuffle=shuffle):
                run(name)
    print("\nmean over seeds (best val MRR, test MRR at it)")
    for name in ["inmemory", "marius comet", *VARIANTS]:
        v = np.array([(r[2], r[3]) for r in rows if r[0] == name])
        print(f"{name:26s} {v[:, 0].mean():.4f} {v[:, 1].mean():.4f}")


if __name__ == "__main__":
    main()
