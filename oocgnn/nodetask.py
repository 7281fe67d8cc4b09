"""Node classification, the task of a node store: a batch's loss is the cross-entropy of its seeds' logits
against their labels, and evaluation scores the store's validation and test nodes (accuracy, macro-F1,
ROC-AUC: `metrics`), sampled mini-batch by mini-batch (`evaluate`) or layer-wise (`evaluation.LayerwiseEval`).
`linktask.LinkTask` is the same contract for a link store; `loop.run_loop` drives either."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .device import autocast
from .evaluation import LayerwiseEval, eval_budget
from .metrics import METRICS, Tally, metrics
from .models import build_model, hidden_width
from .rundir import LOG_COLUMNS, METRIC_LOG_COLUMNS
from .sampler import Sampler


def evaluate(model, sampler, gather, labels, nodes, batch_size, num_classes, device="cpu", precision="fp32") -> Tally:
    """Sampled mini-batch inference on `nodes` (features through `gather`, the model on `device`), tallied
    (`metrics.Tally`); batch i is sampled with the sampler's key (seed, 0, i), the same at every evaluation."""
    model.eval()
    tally = Tally(num_classes)
    device = torch.device(device)
    with torch.no_grad():
        for i, lo in enumerate(range(0, len(nodes), batch_size)):
            input_nodes, output_nodes, blocks = sampler.sample(nodes[lo:lo + batch_size], 0, i)
            with autocast(device, precision):
                logits = model(blocks, gather(input_nodes).to(device)).cpu()
            tally.add(logits, labels[torch.from_numpy(output_nodes)])
    model.train()
    return tally


class SampledEvaluation:
    """Evaluation of a run or a rank: its own validation and test nodes, sampled mini-batches through
    the runtime's rows (`evaluate`), or layer-wise within what the plan leaves of the budget
    (`evaluation.LayerwiseEval`, the default for GNNs). `tallies(model)`: a `metrics.Tally` per split."""

    def __init__(self, cfg, plan, runtime, store, sets, labels, device):
        self.cfg, self.runtime, self.labels, self.device = cfg, runtime, labels, device
        self.sets, self.num_classes = sets, store.num_classes
        fanouts = [int(f) for f in cfg.eval_fanouts.split(",")]
        self.sampler = Sampler(runtime.eval_topology, fanouts, cfg.seed + 7)
        self.layerwise = None if cfg.eval_mode == "batch" or cfg.model == "mlp" else LayerwiseEval(
            self.sampler, fanouts, np.concatenate(list(sets.values())), store.feat_dim, runtime.stream_rows,
            eval_budget(plan), widths=[store.feat_dim] + [hidden_width(cfg.model, cfg.hidden)] * (len(fanouts) - 1))

    @property
    def reads_in_run(self) -> bool:
        """Whether its reads go through the run's own reader (then the loop takes them out of the run's)."""
        return self.layerwise is None and self.runtime.eval_reader is None

    def tallies(self, model) -> dict:
        cfg = self.cfg
        if self.layerwise is not None:             # its reads: its own reader, never the run's
            return self.layerwise.tallies(model, self.labels, self.sets, self.num_classes, self.device,
                                          cfg.precision)
        return {s: evaluate(model, self.sampler, self.runtime.eval_rows, self.labels, ids, cfg.eval_batch_size,
                            self.num_classes, self.device, cfg.precision)
                for s, ids in self.sets.items()}

    def describe(self) -> dict:
        lw = self.layerwise
        return {"eval_mode": "layerwise" if lw is not None else "batch",
                "eval_memory": lw.memory() if lw is not None else None,
                "eval_budget": lw.budget if lw is not None else None,
                "eval_spilled": lw.spilled if lw is not None else None}


class NodeTask:
    """Node classification: the model's logits of a batch's seeds against their labels (cross-entropy),
    evaluated on the store's validation and test nodes (accuracy, macro-F1, ROC-AUC: `metrics`)."""
    metrics, primary = METRICS, "acc"
    columns = LOG_COLUMNS + METRIC_LOG_COLUMNS

    def __init__(self, cfg, store, runtime, ranks):
        self.cfg, self.store, self.ranks = cfg, store, ranks
        self.labels = runtime.labels()             # indexed by store id
        self.sets = {}
        for split, ids in (("val", store.val_idx), ("test", store.test_idx)):
            if cfg.max_eval_nodes and len(ids) > cfg.max_eval_nodes:
                ids = np.sort(np.random.default_rng(cfg.seed + 1).choice(ids, cfg.max_eval_nodes, replace=False))
            self.sets[split] = ranks.owns(ids)

    def build_model(self):
        cfg, store = self.cfg, self.store
        return build_model(cfg.model, store.feat_dim, cfg.hidden, store.num_classes, cfg.layers, cfg.dropout)

    def evaluator(self, evaluation, plan, runtime, device):
        return evaluation(self.cfg, plan, runtime, self.store, self.sets, self.labels, device)

    def evaluate(self, evaluator, model) -> dict:
        """{split: {acc, f1, auc}} of the model: the ranks' confusion counts summed, their scores gathered (an
        empty split has no metrics: NaN in the log, not 0)."""
        ranks = self.ranks
        tallies = evaluator.tallies(model)
        c = self.store.num_classes
        sums = ranks.sum(np.concatenate([tallies[s].confusion.ravel() for s in self.sets]).tolist())
        confs = np.asarray(sums, dtype=np.int64).reshape(len(self.sets), c, c)
        every = ranks.gather({s: tallies[s].scored() for s in self.sets}) if c == 2 else None
        out = {}
        for s, conf in zip(self.sets, confs):
            scored = [np.concatenate(a) for a in zip(*(r[s] for r in every))] if every else [None, None]
            out[s] = metrics(conf, *scored)
        return out

    def targets(self, step, sample) -> list:
        """The batch's tensors the loss needs beside the model's output: the seeds' labels."""
        return [self.labels[torch.from_numpy(sample.output_nodes)].long()]

    def loss(self, model, out, y):
        return F.cross_entropy(out.float(), y)
