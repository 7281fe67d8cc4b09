"""Link prediction as a task of the training loop: the model, the loss and the evaluation of a link store.

* The model (`LinkModel`): the run's GNN (`models`) as an encoder whose last layer outputs embeddings of the
  hidden width (no class head), and a decoder scoring an edge from its two endpoints' embeddings: `dot` (their
  dot product) or `mlp` (OGB's LinkPredictor, examples/linkproppred/collab/gnn.py: an MLP on their elementwise
  product; it returns the logit, not the sigmoid, which ranks the same).
* The loss: MariusGNN's SoftmaxCrossEntropy (src/cpp/src/nn/loss.cpp, its default): each positive's score
  against the scores of its chunk's shared negatives (`edgeschedules.EdgeSchedule`, `negatives.batch_negatives`),
  −pos + logsumexp([pos, negs]), averaged over the batch's positives. A degree-drawn negative that is the
  positive's own destination is masked out (MariusGNN's DEG local filter). A softmax over [pos, negs] trains the
  ranking that MRR measures.
* The evaluation (`LinkEvaluation`): each held-out validation and test edge (a seeded subset of at most
  --max-eval-nodes edges per split) ranked among its own `eval_negatives` corrupted destinations
  (`negatives.eval_targets_at`, keyed by the edge's position and `EVAL_SEED`: every run of a store ranks
  against the same ones; OGB's own per-edge negatives where the store has them), OGB's ogbl-citation2 'mrr'
  evaluator: MRR and Hits@1, 3, 10 (`linkmetrics.RankMetrics`). Where OGB gives negative pairs shared by every
  held-out edge (ogbl-collab, -ppa, -ddi), each edge is ranked among all of them (the same MRR and Hits@1, 3, 10)
  and OGB's 'hits@K' evaluator adds Hits@20, 50 and 100 (`linkmetrics.SharedHits`: a hit scores above the K-th
  highest negative). The endpoints' and negatives' embeddings are
  computed layer-wise (`evaluation.LayerwiseEval`: each input row read once, within the budget) or by sampled
  batches (`--eval-mode batch`, the MLP), then scored in chunks of edges, each destination as one more candidate
  beside its negatives (the same arithmetic), near-ties made ties (`linkmetrics.snap_ties`); when most validation
  edges tie with all their negatives (a collapsed model) the run is warned.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .device import autocast
from .errors import UserError
from .evaluation import LayerwiseEval, eval_budget
from .linkmetrics import TIE_RTOL, RankMetrics, SharedHits, snap_ties
from .metrics import LINK_METRICS, SHARED_HITS, shared_negatives
from .models import build_model, hidden_width
from .negatives import eval_targets_at
from .rundir import LINK_LOG_COLUMNS, SHARED_LOG_COLUMNS
from .sampler import Sampler

EVAL_SEED = 0                # the evaluation negatives' key: the same for every run of a store
SCORE_BYTES = 32 << 20       # the gathered candidate embeddings one scoring chunk holds
COLLAPSED = 0.5              # warn when this share of validation edges ties with all its negatives


class DotDecoder(nn.Module):
    """score(u, v) = u · v."""

    def forward(self, u, v):
        return (u * v).sum(-1)

    def pairs(self, u, v):
        """[b, K] scores of every u [b, D] with every v [K, D]: one matmul."""
        return u @ v.T

    def many(self, u, v):
        """[B, K] scores of each u [B, D] with its own v [B, K, D]."""
        return torch.bmm(v, u[:, :, None]).squeeze(-1)


class MLPDecoder(nn.Module):
    """OGB's LinkPredictor: Linear(D, D), ReLU, Linear(D, 1) on u ⊙ v (the logit)."""

    def __init__(self, dim):
        super().__init__()
        self.lins = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))

    def forward(self, u, v):
        return self.lins(u * v).squeeze(-1)

    def pairs(self, u, v):
        return self(u[:, None, :], v[None])

    def many(self, u, v):
        return self(u[:, None, :], v)


class LinkModel(nn.Module):
    """An encoder (a `models` GNN whose output is the embedding) and an edge decoder; `forward`, `layer` and
    the projection of `layer`'s input rows are the encoder's, so the loop, histories and layer-wise evaluation run it as any model."""

    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, blocks, x):
        return self.encoder(blocks, x)

    def layer(self, i, block, h):
        return self.encoder.layer(i, block, h)

    def projection_width(self, i) -> int:
        return self.encoder.projection_width(i)

    def project(self, i, h):
        return self.encoder.project(i, h)

    def layer_from_projection(self, i, block, p):
        return self.encoder.layer_from_projection(i, block, p)


def build_link_model(cfg, feat_dim) -> LinkModel:
    """The encoder (`cfg.model`, embeddings of width `cfg.hidden`) and `cfg.decoder`, initialised in that order."""
    encoder = build_model(cfg.model, feat_dim, cfg.hidden, cfg.hidden, cfg.layers, cfg.dropout)
    return LinkModel(encoder, MLPDecoder(cfg.hidden) if cfg.decoder == "mlp" else DotDecoder())


def chunk_scores(decoder, src, negatives):
    """[B, K] scores of each positive's source `src` [B, D] with its chunk's negatives `negatives` [C, K, D]
    (chunk c: positives c·ceil(B/C) ..)."""
    size = -(-len(src) // len(negatives))
    return torch.cat([decoder.pairs(src[c * size:(c + 1) * size], negatives[c]) for c in range(len(negatives))])


def softmax_loss(pos, neg, filt):
    """MariusGNN's SoftmaxCrossEntropy, averaged: −pos + logsumexp([pos, negs]) per positive, the (positive,
    column) pairs of `filt` masked out."""
    logits = torch.cat([pos[:, None], neg], 1)
    if len(filt):
        logits = logits.index_put((filt[:, 0], filt[:, 1] + 1), torch.tensor(float("-inf"), device=logits.device))
    return F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long, device=logits.device))


class LinkTask:
    """Link prediction (`nodetask.NodeTask`'s contract): a step's loss over its edges and their chunk-shared
    negatives; evaluation by MRR and Hits@K on the held-out edges (`LinkEvaluation`)."""
    metrics, primary = LINK_METRICS, "mrr"
    columns = LINK_LOG_COLUMNS

    def __init__(self, cfg, store, runtime, ranks):
        self.cfg, self.store, self.ranks = cfg, store, ranks
        if shared_negatives(store):                            # OGB's shared negatives: its Hits@K as well
            self.metrics, self.columns = LINK_METRICS + SHARED_HITS, LINK_LOG_COLUMNS + SHARED_LOG_COLUMNS

    def build_model(self):
        return build_link_model(self.cfg, self.store.feat_dim)

    def evaluator(self, evaluation, plan, runtime, device):
        return LinkEvaluation(self.cfg, plan, runtime, self.store, device, self.ranks)

    def evaluate(self, evaluator, model) -> dict:
        return evaluator.evaluate(model)

    def targets(self, step, sample) -> list:
        """Where the batch's edges' endpoints [B, 2] and its negatives [C, K] sit among its seeds (the model's
        output rows), and the pairs to mask [F, 2]."""
        seeds, link = sample.output_nodes, step.link
        return [torch.from_numpy(np.searchsorted(seeds, link.edges)), torch.from_numpy(np.searchsorted(seeds, link.negatives)),
                torch.from_numpy(link.filter)]

    def loss(self, model, out, edges, negatives, filt):
        h = out.float()
        src = h[edges[:, 0]]
        return softmax_loss(model.decoder(src, h[edges[:, 1]]), chunk_scores(model.decoder, src, h[negatives]), filt)


def held_out(store, split, limit, k, seed) -> tuple:
    """(edges int64 [M, 2], negatives int64 [M, K]) of a split: at most `limit` edges (a seeded subset, in
    order; 0: all), each with its negative destinations (OGB's where given, else `eval_targets_at`); with OGB's
    shared negatives, negatives are those pairs (int64 [K, 2], all of them: OGB's Hits@K needs every one)."""
    edges = store.link_edges(split)
    positions = np.arange(len(edges))
    if limit and len(edges) > limit:
        positions = np.sort(np.random.default_rng(seed).choice(len(edges), limit, replace=False))
    kind = store.meta["link"]["negatives"]
    if kind == "pairs":
        return np.asarray(edges[positions], dtype=np.int64), np.asarray(store.link_negatives(split), dtype=np.int64)
    negs = np.asarray(store.link_negatives(split)[positions], dtype=np.int64) if kind == "targets" else \
        eval_targets_at(positions, store.num_nodes, k, EVAL_SEED)
    return np.asarray(edges[positions], dtype=np.int64), negs


class LinkEvaluation:
    """MRR and Hits@K of a model on a link store's held-out edges (the module docstring); `describe` and
    `reads_in_run` as `nodetask.SampledEvaluation`'s. Among `ranks` (`loop.Ranks`) each ranks the held-out
    edges it owns (`owns_edges`) and their counts are summed: one process's metrics."""

    def __init__(self, cfg, plan, runtime, store, device, ranks):
        self.cfg, self.runtime, self.device, self.ranks = cfg, runtime, device, ranks
        self.tied, self.warned = {}, False       # per split: the share of edges tied with all their negatives
        self.shared = shared_negatives(store)
        self.sets, self.evaluated = {}, {}       # this rank's (edges, negatives), and every rank's count
        for split in ("val", "test"):
            edges, negs = held_out(store, split, cfg.max_eval_nodes, cfg.eval_negatives, cfg.seed + 1)
            mine = self.ranks.owns_edges(edges)
            self.sets[split], self.evaluated[split] = (edges[mine], negs if self.shared else negs[mine]), len(edges)
        self.nodes = np.unique(np.concatenate([a.ravel() for pair in self.sets.values() for a in pair]))
        fanouts = [int(f) for f in cfg.eval_fanouts.split(",")]
        self.sampler = Sampler(runtime.eval_topology, fanouts, cfg.seed + 7)
        self.layerwise = None if cfg.eval_mode == "batch" or cfg.model == "mlp" else LayerwiseEval(
            self.sampler, fanouts, self.nodes, store.feat_dim, runtime.stream_rows, eval_budget(plan),
            widths=[store.feat_dim] + [hidden_width(cfg.model, cfg.hidden)] * (len(fanouts) - 1))

    @property
    def reads_in_run(self) -> bool:
        return self.layerwise is None and self.runtime.eval_reader is None

    def embeddings(self, model) -> torch.Tensor:
        """[len(self.nodes), D] float32 on the CPU: the model's output for the evaluated nodes (sorted)."""
        cfg, device = self.cfg, torch.device(self.device)
        if self.layerwise is not None:
            return self.layerwise.logits(model, device, cfg.precision).float()
        was = model.training
        model.eval()
        out = []
        try:
            with torch.no_grad():
                for i, lo in enumerate(range(0, len(self.nodes), cfg.eval_batch_size)):
                    input_nodes, _, blocks = self.sampler.sample(self.nodes[lo:lo + cfg.eval_batch_size], 0, i)
                    with autocast(device, cfg.precision):
                        out.append(model(blocks, self.runtime.eval_rows(input_nodes).to(device)).float().cpu())
        finally:
            model.train(was)
        return torch.cat(out)

    def evaluate(self, model) -> dict:
        """{split: {mrr, hits@1, hits@3, hits@10}}, the edges scored in chunks against their negatives; among
        ranks, every rank's counts summed."""
        h = self.embeddings(model)
        device, decoder = torch.device(self.device), model.decoder
        was = decoder.training
        decoder.eval()
        tallies = {}
        try:
            with torch.no_grad():
                for split, (edges, negs) in self.sets.items():
                    if self.shared:
                        tallies[split] = self.shared_tallies(h, decoder, edges, negs)
                        continue
                    ranked, tied = RankMetrics(ks=(1, 3, 10)), 0
                    step = max(1, SCORE_BYTES // max(1, (negs.shape[1] + 1) * h.shape[1] * 4))
                    for lo in range(0, len(edges), step):
                        e = np.searchsorted(self.nodes, edges[lo:lo + step])
                        n = np.searchsorted(self.nodes, negs[lo:lo + step])
                        src = h[torch.from_numpy(e[:, 0])].to(device)
                        # the destination scored as one more candidate: the same arithmetic as its negatives'
                        scores = decoder.many(src, h[torch.from_numpy(np.hstack([e[:, 1:], n]))].to(device)).float().cpu()
                        neg, all_tied = snap_ties(scores[:, 0], scores[:, 1:])
                        ranked.add(scores[:, 0], neg)
                        tied += round(all_tied * len(e))
                    tallies[split] = (ranked, None, tied)
        finally:
            decoder.train(was)
        out = {}
        for split, (ranked, hits, tied) in tallies.items():     # every rank's counts, summed
            n = len(ranked.totals())
            every = self.ranks.sum([tied, *ranked.totals(), *(hits.totals() if hits is not None else [])])
            ranked.set_totals(every[1:1 + n])
            out[split] = ranked.result()
            if hits is not None:
                hits.set_totals(every[1 + n:])
                out[split].update(hits.result())
            self.tied[split] = every[0] / ranked.count
        self.warn_collapse()
        return out

    def score_pairs(self, h, decoder, pairs) -> torch.Tensor:
        """[len(pairs)] float32 scores of the (source, destination) `pairs`, in chunks."""
        step = max(1, SCORE_BYTES // max(1, 2 * h.shape[1] * 4))
        out = [torch.zeros(0)]                   # a rank may own none of a split's edges
        for lo in range(0, len(pairs), step):
            e = torch.from_numpy(np.searchsorted(self.nodes, pairs[lo:lo + step]))
            out.append(decoder(h[e[:, 0]].to(self.device), h[e[:, 1]].to(self.device)).float().cpu())
        return torch.cat(out)

    def shared_tallies(self, h, decoder, edges, pairs) -> tuple:
        """(RankMetrics, SharedHits, tied) of the edges `edges` each ranked among all the shared negative pairs
        (MRR and Hits@1, 3, 10) and OGB's Hits@20, 50, 100 (a hit scores above the K-th highest negative); an edge
        within rounding of every negative is tied."""
        neg, pos = self.score_pairs(h, decoder, pairs), self.score_pairs(h, decoder, edges)
        ranked, hits = RankMetrics(ks=(1, 3, 10)), SharedHits(ks=tuple(int(m.split("@")[1]) for m in SHARED_HITS))
        ranked.add_shared(pos, neg)
        hits.add_negatives(neg)
        hits.add_positives(pos)
        lo, hi = neg.min(), neg.max()
        near = lambda v: (v - pos).abs() <= TIE_RTOL * torch.maximum(v.abs(), pos.abs())   # noqa: E731
        return ranked, hits, int((near(lo) & near(hi)).sum())

    def warn_collapse(self):
        """Say once when most validation edges score equal to all their negatives: the model's embeddings have
        collapsed to one vector (the loss then sits at ln(1 + negatives)), and its MRR is that of ties."""
        share = self.tied.get("val", 0.0)
        if share >= COLLAPSED and not self.warned:
            self.warned = True
            if self.ranks.rank:                  # rank 0 says it for every rank
                return
            print(f"oocgnn: warning: the model's scores have collapsed: {share:.0%} of the validation edges score "
                  f"the same as all their negatives (its embeddings are alike). Lower --lr (now {self.cfg.lr}); "
                  "bag-of-words features want prepare --row-normalize", file=sys.stderr)

    def describe(self) -> dict:
        lw, negs = self.layerwise, self.sets["val"][1]
        return {"eval_mode": "layerwise" if lw is not None else "batch",
                "eval_memory": lw.memory() if lw is not None else None,
                "eval_budget": lw.budget if lw is not None else None,
                "eval_spilled": lw.spilled if lw is not None else None,
                "eval_negatives": int(len(negs) if self.shared else negs.shape[1]),
                "eval_shared_negatives": self.shared,
                "eval_edges": dict(self.evaluated)}


def check_settings(cfg, store):
    """Refuse what a link run cannot be: label-balanced optimizer steps (--accumulate on: there are no labels to
    balance; auto accumulates only marius's carried batches, `--state-batches carry`). A distributed run's ranks
    read the store shared (`disttrain.exchanges` refuses --rank-data own)."""
    if cfg.accumulate == "on":
        raise UserError("--accumulate on balances labels across mini-batches; a link store's batches are edges "
                        "(use auto: a step per batch, or per --batch-size edges under marius --state-batches carry; "
                        "or off: a step per batch)")
    if not len(store.link_edges("val")):
        raise UserError(f"{store.path}: no validation edges; a link run needs held-out edges to evaluate")
