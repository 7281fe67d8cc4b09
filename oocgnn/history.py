"""Historical embeddings (OUTRE §4.3): reuse h^(L−1) of hop-1 nodes, prune their sub-trees.

A fixed set of candidates (declared by the plan, `policies.HistorySpec`) owns one slot each, so
the cache never evicts for capacity; an entry is reused while it is fresh. Per batch, `plan`
decides (with `history_prune`):

- SKIP: a fresh candidate among the non-seed sources of the last layer; its h^(L−1) is
  pulled from the cache and its (L−1)-deep sub-tree is neither expanded nor gathered
  (unless another node NEEDs its lower-layer embeddings, which `history_prune` handles).
- PUSH: a candidate among the last layer's sources (seeds included) that is empty or stale;
  its exact h^(L−1) is computed anyway and stored with stamp = t. A fresh seed candidate is
  computed exactly but not re-pushed: stamps change only on empty/stale entries (OUTRE Fig. 3).

`HistoryStamps` holds only the decisions (the simulator replays them, no model needed);
`HistoryCache` adds the embeddings and is the executor's stage for such plans: `inputs` gathers
the rows a pruned batch needs, `forward` runs layers 0..L−2 on the pruned blocks, swaps the
skipped rows of h^(L−1) for their (detached) histories, pushes, and runs the last layer.
`NoHistory` is the same stage for plans without histories. Stamps are written at compute time,
so planning batches ahead is safe (a plan never skips an unwritten slot). Pushed rows are taken
in whatever mode the model is in (training: after dropout).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .blocks import Block
from .errors import UserError


def history_prune(blocks, history_mask):
    """(input, expanded, skipped) masks over the local ids of blocks[0].src, blocks[0].dst, blocks[-1].src.

    OUTRE §4.3: a history node met at hop 1 (a source of the last layer) that is not a seed
    is SKIPped: its h^(L−1) comes from the cache, so it is not expanded at hop 1. If it is
    also drawn as a neighbour deeper down (NEEDED), its lower-layer embedding is needed and it
    is expanded there. R_1 = hop-1 nodes minus skipped, then R_{h+1} = R_h ∪ sampled nbrs(R_h).
    """
    if len(blocks) < 2:
        raise UserError("history reuse needs at least 2 layers (it caches h^(L-1))")
    last = blocks[-1]
    skipped = history_mask[last.src_nodes]
    skipped[:last.num_dst] = False                 # seeds are computed exactly
    need = ~skipped
    for b in reversed(blocks[:-1]):                # hop 1, 2, ..., L-1
        expanded = need
        src, dst = b.edges()
        need = np.zeros(b.num_src, dtype=bool)
        need[:b.num_dst] = expanded                # dst nodes come first among the sources
        need[src[expanded[dst]]] = True
    return need, expanded, skipped


class FreshAt:
    """`stamps.fresh_mask(t)[ids]` for any ids, read through the slot table (`HistoryStamps.fresh_at`)."""

    def __init__(self, stamps, t):
        self.stamps, self.t = stamps, t

    def __getitem__(self, ids) -> np.ndarray:
        s = self.stamps.slot[ids]
        ok = s >= 0
        if not ok.any():
            return ok
        stamp = self.stamps.stamp[np.where(ok, s, 0)]
        return ok & (stamp >= 0) & (self.t - stamp < self.stamps.staleness)


class HistoryStamps:
    """Which candidates hold a reusable history: `slot` int32 [N] (−1: not a candidate), `stamp`
    int64 [k] (−1: empty).

    Reuse rule (OUTRE §4.3, code `|t − stamp| < STALENESS`): a candidate is fresh at
    iteration t iff stamp ≥ 0 and t − stamp < staleness, so staleness=1 never reuses across steps.
    `t` is a global iteration counter, non-decreasing across epochs: the optimizer step (`optsteps`; one per
    mini-batch unless steps accumulate), so that within one step, whose weights do not change, a history stays fresh.
    """

    def __init__(self, candidates, staleness: int, num_nodes: int):
        cand = np.unique(np.asarray(candidates, dtype=np.int64))
        if len(cand) and (cand[0] < 0 or cand[-1] >= num_nodes):
            raise UserError(f"history candidates must be store ids in [0, {num_nodes})")
        if int(staleness) < 1:
            raise UserError(f"history staleness must be >= 1, got {staleness}")
        self.candidates, self.staleness, self.num_nodes = cand, int(staleness), int(num_nodes)
        self.slot = np.full(self.num_nodes, -1, dtype=np.int32)            # [N]
        self.slot[cand] = np.arange(len(cand), dtype=np.int32)
        self.stamp = np.full(len(cand), -1, dtype=np.int64)                # [k]
        self.stats = {"batches": 0, "hits": 0, "pushes": 0}                # cumulative, per executed batch

    def __len__(self):
        return len(self.candidates)

    def copy(self) -> "HistoryStamps":
        """The decisions alone, to plan batches ahead without touching these (the slot table is shared:
        it never changes)."""
        out = HistoryStamps.__new__(HistoryStamps)
        out.candidates, out.staleness, out.num_nodes, out.slot = self.candidates, self.staleness, self.num_nodes, self.slot
        out.stamp, out.stats = self.stamp.copy(), dict(self.stats)
        return out

    def fresh_at(self, t: int) -> "FreshAt":
        """`fresh_mask(t)` as a view indexed by node ids: what `history_prune` reads of it, without N bools
        built (and freed) for every batch — 28 MB a batch on xlarge, which fragmented the heap."""
        return FreshAt(self, int(t))

    def fresh_mask(self, t: int) -> np.ndarray:
        """bool [N]: candidates whose history may be reused at iteration t."""
        ok = (self.stamp >= 0) & (int(t) - self.stamp < self.staleness)
        mask = np.zeros(self.num_nodes, dtype=bool)
        mask[self.candidates[ok]] = True
        return mask

    def plan(self, blocks, t: int, prune=True) -> "HistoryPlan":
        """SKIP/PUSH decisions of one sampled batch at iteration t (and its pruned blocks if `prune`)."""
        fresh = self.fresh_at(t)
        need, expanded, skipped = history_prune(blocks, fresh)
        pruned = None
        if prune:   # per-level expansion: history_prune on the suffix blocks[i:] yields blocks[i]'s expanded dst
            pruned = [_prune(b, history_prune(blocks[i:], fresh)[1]) for i, b in enumerate(blocks[:-1])]
            pruned.append(blocks[-1])
        hop1 = blocks[-1].src_nodes
        slots = self.slot[hop1].astype(np.int64)
        push = (slots >= 0) & ~fresh[hop1]
        return HistoryPlan(t=int(t), need=need, expanded=expanded, skipped=skipped, push=push,
                           skip_slots=slots[skipped], push_slots=slots[push],
                           input_ids=blocks[0].src_nodes[need], pruned_blocks=pruned)

    def mark(self, plan: "HistoryPlan"):
        """Stamp the plan's pushes (what computing the batch does), counting its hits."""
        self.stamp[plan.push_slots] = plan.t
        self.stats["batches"] += 1
        self.stats["hits"] += plan.hits
        self.stats["pushes"] += plan.pushes


class HistoryCache(HistoryStamps):
    """The stamps plus the embeddings: `emb` float32 [k, dim]. The executor's history stage."""

    def __init__(self, candidates, dim: int, staleness: int, num_nodes: int):
        super().__init__(candidates, staleness, num_nodes)
        if int(dim) < 1:
            raise UserError(f"history cache needs dim >= 1, got {dim}")
        self.dim = int(dim)
        self.emb = torch.zeros(len(self.candidates), self.dim, dtype=torch.float32)   # [k, dim]

    @classmethod
    def of(cls, spec, num_nodes):
        """The cache a plan's `HistorySpec` declares."""
        return cls(spec.candidates, spec.dim, spec.staleness, num_nodes)

    def __repr__(self):
        return (f"HistoryCache(k={len(self)}, dim={self.dim}, staleness={self.staleness}, "
                f"nbytes={self.nbytes})")

    @property
    def nbytes(self) -> int:
        """Bytes held: embeddings (k·dim·4) + slot table (N·4) + stamps (k·8)."""
        return self.emb.numel() * self.emb.element_size() + self.slot.nbytes + self.stamp.nbytes

    def pull(self, slots) -> torch.Tensor:
        """Histories of `slots` [n, dim], detached (no gradient flows into histories)."""
        return self.emb[torch.as_tensor(slots, dtype=torch.int64)].detach()

    def push(self, slots, rows: torch.Tensor, t: int):
        """Store detached copies of `rows` [n, dim] in `slots`, stamped t."""
        self.emb[torch.as_tensor(slots, dtype=torch.int64)] = rows.detach().to("cpu", torch.float32)
        self.stamp[slots] = int(t)

    # -- the executor's stage ------------------------------------------------------------------
    def inputs(self, sample, t, gather):
        """(x, plan): features of the input rows the pruned batch needs (zeros elsewhere)."""
        plan = self.plan(sample.blocks, t)
        return plan.inputs(gather(sample.input_nodes[plan.need])), plan

    def forward(self, model, plan, x, t):
        return forward_with_history(model, plan, x, self, t)


class NoHistory:
    """The stage of plans without histories: every input row is gathered, the model runs whole."""
    nbytes = 0

    def __init__(self):
        self.stats = {"batches": 0, "hits": 0, "pushes": 0}

    def inputs(self, sample, t, gather):
        return gather(sample.input_nodes), sample.blocks

    def forward(self, model, blocks, x, t):
        return model(blocks, x)


def _prune(block, keep_dst: np.ndarray):
    """A copy of `block` keeping only the edges into dst nodes with keep_dst (same node sets)."""
    deg = np.where(keep_dst, np.diff(block.indptr), 0)
    indptr = np.zeros(block.num_dst + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    keep = np.repeat(keep_dst, np.diff(block.indptr))
    return Block(indptr, block.indices[keep], block.src_nodes, block.num_dst)


@dataclass
class HistoryPlan:
    """One batch's history decisions (OUTRE §4.3); masks are over local ids of the named block side."""
    t: int                   # iteration the plan was made for
    need: np.ndarray         # bool [blocks[0].num_src]: input rows whose features must be gathered
    expanded: np.ndarray     # bool [blocks[0].num_dst]: outermost nodes whose neighbour lists are used
    skipped: np.ndarray      # bool [blocks[-1].num_src]: h^(L−1) pulled from the cache (SKIP)
    push: np.ndarray         # bool [blocks[-1].num_src]: empty/stale candidates stored after compute (PUSH)
    skip_slots: np.ndarray   # int64 [hits]: cache slots of the skipped rows, in local-id order
    push_slots: np.ndarray   # int64 [pushes]: cache slots of the pushed rows, in local-id order
    input_ids: np.ndarray    # int64 [need.sum()]: store ids of the needed input rows
    pruned_blocks: list | None  # blocks[:-1] minus edges into non-expanded dst nodes, then blocks[-1]

    @property
    def hits(self) -> int:
        return int(np.count_nonzero(self.skipped))

    @property
    def pushes(self) -> int:
        return int(np.count_nonzero(self.push))

    @property
    def input_rows(self) -> int:
        """Feature rows to gather: simulate's `input_nodes_hist`."""
        return int(np.count_nonzero(self.need))

    def inputs(self, rows, dim=None) -> torch.Tensor:
        """x [blocks[0].num_src, dim]: `rows` (features of input_ids) in the needed rows, zeros elsewhere."""
        rows = torch.as_tensor(rows)
        x = rows.new_zeros(len(self.need), rows.shape[1] if dim is None else dim)
        x[torch.from_numpy(self.need)] = rows
        return x


def forward_with_history(model, plan: HistoryPlan, x: torch.Tensor, cache: HistoryCache, t=None):
    """Logits of the seeds: layers 0..L−2 on the pruned blocks, history swap at h^(L−1), last layer.

    x: [blocks[0].num_src, in_dim]; only rows with plan.need matter. `t` (default plan.t)
    stamps the pushed rows. OUTRE §4.3: no gradient flows into pulled rows or the cache.
    """
    blocks = plan.pruned_blocks
    if blocks is None:
        raise UserError("this history plan was made without its pruned blocks (plan(..., prune=True))")
    L = len(blocks)
    if not callable(getattr(model, "layer", None)):
        raise UserError(f"{type(model).__name__} has no layer(i, block, h): history reuse needs a "
                        "layer-wise GNN (SAGE, GAT, GIN), not the MLP")
    n_layers = len(getattr(model, "layers", blocks))
    if L < 2 or n_layers != L:
        raise UserError(f"history reuse needs >= 2 layers and one block per layer, got {n_layers} "
                        f"layers and {L} blocks")
    t = plan.t if t is None else int(t)
    h = x
    for i in range(L - 1):
        h = model.layer(i, blocks[i], h)                     # [blocks[i].num_dst, hidden]
    if h.shape[1] != cache.dim:
        raise UserError(f"h^(L-1) has {h.shape[1]} columns but the history cache has dim {cache.dim}")
    if plan.hits:
        h = h.clone()                                        # keep autograd's view of the computed rows
        h[torch.from_numpy(np.flatnonzero(plan.skipped)).to(h.device)] = \
            cache.pull(plan.skip_slots).to(h.device, h.dtype)
    if plan.pushes:
        cache.push(plan.push_slots, h[torch.from_numpy(np.flatnonzero(plan.push)).to(h.device)], t)
    cache.stats["batches"] += 1
    cache.stats["hits"] += plan.hits
    cache.stats["pushes"] += plan.pushes
    return model.layer(L - 1, blocks[-1], h)
