"""A plain-PyTorch full-graph link-prediction reference (a test helper): the oracle of in-memory link training.

Written from scratch with torch and numpy only (none of oocgnn's sampler, blocks, models, runtime or loop): the
store's files read directly, GraphSAGE with mean aggregation as a row-normalised sparse adjacency
(fc_self(h) + fc_neigh(A_mean h), ReLU between layers; Hamilton et al. 2017), a dot-product decoder, and
MariusGNN's softmax loss (−pos + logsumexp([pos, negs]), averaged) with one shared set of negatives per step,
full batch: every training edge in every step, embeddings of the whole graph. What it shares with oocgnn is what
the comparison must hold fixed: the training edges' directions (`linksplit.train_directions`), the negatives
(`negatives.batch_negatives` keyed by (seed, epoch, 0)), the evaluation's negatives (`negatives.eval_targets_at`)
and OGB's metrics (`linkmetrics.RankMetrics`), and, passed in, the initial weights.
"""
import json

import numpy as np
import torch
import torch.nn.functional as F

from oocgnn.linkmetrics import RankMetrics
from oocgnn.linksplit import train_directions
from oocgnn.negatives import batch_negatives, eval_targets_at


def read_store(path):
    """(features [N, D] float32, indptr, indices, {split: held-out edges [M, 2]}) from a float32 store's files."""
    meta = json.loads((path / "meta.json").read_text())
    n, d, stride = meta["num_nodes"], meta["feat_dim"], meta["row_stride"]
    raw = np.fromfile(path / "features.bin", dtype=np.float32).reshape(n, stride // 4)[:, :d]
    indptr = np.load(path / "indptr.npy")
    indices = np.fromfile(path / "indices.bin", dtype=meta["index_dtype"]).astype(np.int64)
    held = {s: np.load(path / f"link_{s}.npy") for s in ("val", "test")}
    return torch.from_numpy(np.ascontiguousarray(raw)), indptr, indices, held


def mean_adjacency(indptr, indices):
    """Sparse [N, N]: row v averages v's neighbours (an isolated node's row is empty: its mean is 0)."""
    n = len(indptr) - 1
    deg = np.diff(indptr)
    rows = np.repeat(np.arange(n), deg)
    values = 1.0 / deg[rows]
    return torch.sparse_coo_tensor(np.stack([rows, indices]), torch.tensor(values, dtype=torch.float32),
                                   (n, n), check_invariants=True).coalesce()


def sage(params, x, adj):
    """Full-graph GraphSAGE-mean: params is [(W_self, b_self, W_neigh)] per layer."""
    h = x
    for i, (w_self, b_self, w_neigh) in enumerate(params):
        h = h @ w_self.T + b_self + torch.sparse.mm(adj, h) @ w_neigh.T
        if i < len(params) - 1:
            h = F.relu(h)
    return h


def evaluate(h, held, num_nodes, k, seed) -> dict:
    """{split: MRR and Hits@K} of the dot products, each held-out edge against its k fixed negatives."""
    out = {}
    for split, edges in held.items():
        negs = eval_targets_at(np.arange(len(edges)), num_nodes, k, seed)
        src = h[torch.from_numpy(edges[:, 0])]
        pos = (src * h[torch.from_numpy(edges[:, 1])]).sum(1)
        neg = (src[:, None, :] * h[torch.from_numpy(negs)]).sum(2)
        metrics = RankMetrics(ks=(1, 3, 10))
        metrics.add(pos, neg)
        out[split] = metrics.result()
    return out


def train_reference(path, init, epochs, lr, num_negatives, seed=0, eval_negatives=100, eval_seed=0) -> list:
    """Per evaluation (before training, then after each epoch) {split: metrics}. `init`: the initial weights as
    [(W_self, b_self, W_neigh)] per layer (copied)."""
    x, indptr, indices, held = read_store(path)
    n = len(indptr) - 1
    adj = mean_adjacency(indptr, indices)
    src = np.repeat(np.arange(n), np.diff(indptr))
    keep = indices > src
    edges = train_directions(src[keep], indices[keep], np.load(path / "orig_ids.npy"))   # each once, as trained
    params = [tuple(t.detach().clone().requires_grad_() for t in layer) for layer in init]
    opt = torch.optim.Adam([t for layer in params for t in layer], lr=lr)
    e_src, e_dst = torch.from_numpy(edges[:, 0]), torch.from_numpy(edges[:, 1])
    log = []
    with torch.no_grad():
        log.append(evaluate(sage(params, x, adj), held, n, eval_negatives, eval_seed))
    for epoch in range(epochs):
        negs, _ = batch_negatives(edges, n, num_negatives, 1, 0.0, seed, epoch, 0)
        h = sage(params, x, adj)
        s = h[e_src]
        pos = (s * h[e_dst]).sum(1)
        neg = s @ h[torch.from_numpy(negs[0])].T
        logits = torch.cat([pos[:, None], neg], 1)
        loss = F.cross_entropy(logits, torch.zeros(len(pos), dtype=torch.long))
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            log.append(evaluate(sage(params, x, adj), held, n, eval_negatives, eval_seed))
    return log
