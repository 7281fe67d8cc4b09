"""OUTRE's importance profile and the historical-embedding choices made from it (OUTRE §4.3, Eq. 5).

A profiling epoch (`importance`) charges each input row to the hop-1 node that first discovers it
(OUTRE's first-discoverer forest): saved_I/O_hist of a node is what a fresh history of it spares.
`history_nodes` chooses the nodes that keep a history (by degree, OUTRE Table 4, or by the profile);
`history_reuse` replays the profiled meetings to find how often a history is fresh under a staleness
bound; `choose_history_split` splits a budget between histories and a feature cache by OUTRE Eq. 5.
What reuse saves over a whole schedule is `redundancy.redundancy_ratio(..., history=...)`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pandas as pd

from .errors import UserError
from .ranking import top_ids
from .sampler import Sampler, sampled_steps
from .schedules import make_schedule


def _first_discoverer(block):
    """(new src local ids, parent dst local id): each node new at this hop, charged to its first edge."""
    src, dst = block.edges()
    new = src >= block.num_dst
    ids, first = np.unique(src[new], return_index=True)
    return ids, dst[new][first]


@dataclass
class Meetings:
    """A profiled epoch's hop-1 meetings (the nodes a history could serve: the last layer's sources),
    in batch order: `node`, `batch` and `seed` int64/bool [M], `saved` int64 [M] (the rows a reuse at
    that meeting saves: `importance`'s saved_gather terms, 0 for seeds); and the reads behind `saved`,
    `pair_meeting` / `pair_row` int64 [Σ saved] (meeting index, row). `batches`: batches in the epoch."""
    node: np.ndarray
    batch: np.ndarray
    seed: np.ndarray
    saved: np.ndarray
    pair_meeting: np.ndarray
    pair_row: np.ndarray
    batches: int


def importance(store, fanouts, schedule="random", epochs=1, seed=0, progress=False, topology=None,
               meetings=False, rank=None, **schedule_params):
    """OUTRE's saved_I/O_hist profile (§2.6 of the digest), one row per store id.

    For every batch and every hop-1 node u that is not a seed (the nodes a history could skip):
    - saved_gather: nodes of the batch's Ñ_b that u brings in first (a first-discoverer
      forest over the sampled MFG, propagated from the outermost hop inwards), i.e. the feature
      reads its reuse saves;
    - saved_sample: the size of u's sampled (L−1)-hop sub-tree, i.e. the neighbour entries its
      reuse leaves unsampled (OUTRE's reverse propagation of ones, +1 for self per hop);
    and, for every node, accesses: the batches whose input rows hold it (saved_I/O_feat: the feature
    reads a cached row saves, `trace.Trace.counts` of the same epoch).
    Summed over the batches of `epochs` epochs of `schedule` (profiling epochs; seeds as `simulate`).
    `topology`: the lists to sample from (default the store's, all in RAM; a run passes its own).
    `meetings`: also return the `Meetings` behind saved_gather (`history_reuse`, `choose_history_split`);
    with `rank` (int64 [N], 0 = the first history: `ranks(score)`) a row is charged instead
    to the last-ranked hop-1 node that reaches it (seeds: never), so that the top k histories save
    exactly the rows charged to them (always fresh: `simulate`'s `history=` count, a test).
    """
    from tqdm.auto import tqdm
    fanouts = [int(f) for f in fanouts]
    if len(fanouts) < 2:
        raise UserError("importance needs at least 2 layers (history caches h^(L-1))")
    schedule = make_schedule(schedule, store, **({"seed": seed} | schedule_params)) \
        if isinstance(schedule, str) else schedule
    gather = np.zeros(store.num_nodes, dtype=np.int64)     # counts: summed exactly, never copied to
    sample = np.zeros(store.num_nodes, dtype=np.int64)     # another dtype (N-long arrays, setup memory)
    accesses = np.zeros(store.num_nodes, dtype=np.int64)
    met = {k: [] for k in ("node", "batch", "seed", "saved", "pair_meeting", "pair_row")}
    m0 = b = 0                                          # meetings so far, batches so far
    walk = sampled_steps(schedule, Sampler(topology or store.neighbour_lists(), fanouts, seed), epochs)
    for _, _, _, _, smp in tqdm(walk, desc="importance", disable=not progress, leave=False):
        blocks = smp.blocks
        accesses[smp.input_nodes] += 1                  # unique within a batch
        c = np.ones(blocks[0].num_src)                  # first-discoverer forest sizes
        t = np.ones(blocks[0].num_src)                  # sampled sub-tree sizes
        for blk in blocks[:-1]:                         # hop L-1 (outermost) ... hop 1
            nd = blk.num_dst
            ids, parent = _first_discoverer(blk)
            c = c[:nd] + np.bincount(parent, weights=c[ids], minlength=nd)
            src, dst = blk.edges()
            t = 1.0 + np.bincount(dst, weights=t[src], minlength=nd)
        hop1 = blocks[-1].src_nodes
        k = blocks[-1].num_dst                          # seeds first: never skipped
        gather[hop1[k:]] += (c[k:] - 1).astype(np.int64)   # hop1 is unique: += is exact
        sample[hop1[k:]] += (t[k:] - 1).astype(np.int64)
        if meetings:                                    # each row's owner (a local hop-1 id; -1: none)
            owner = _owners(blocks, k) if rank is None else _last_reacher(blocks, k, rank)
            keep = owner >= 0
            saved = np.bincount(owner[keep], minlength=len(hop1)).astype(np.int64)
            for key, v in (("node", hop1), ("batch", np.full(len(hop1), b)), ("saved", saved),
                           ("seed", np.arange(len(hop1)) < k), ("pair_meeting", m0 + owner[keep]),
                           ("pair_row", blocks[0].src_nodes[keep])):
                met[key].append(np.asarray(v))
            m0 += len(hop1)
        b += 1
    df = pd.DataFrame({"degree": store.degrees(), "saved_gather": gather, "saved_sample": sample,
                       "accesses": accesses}, copy=False)
    if not meetings:
        return df
    kind = {k: bool if k == "seed" else np.int64 for k in met}
    return df, Meetings(**{k: np.concatenate(v).astype(kind[k]) if v else np.empty(0, kind[k])
                           for k, v in met.items()}, batches=b)


def _owners(blocks, k):
    """OUTRE's first-discoverer forest walked outwards: each input row (blocks[0] source) that a
    non-seed hop-1 node brings in first, charged to that node (its local id); else -1."""
    hop1 = blocks[-1].num_src
    owner = np.concatenate((np.full(k, -1, np.int64), np.arange(k, hop1)))
    for blk in reversed(blocks[:-1]):                   # hop 1 ... hop L-1
        ids, parent = _first_discoverer(blk)
        owner = np.concatenate((owner, np.full(blk.num_src - blk.num_dst, -1, np.int64)))
        owner[ids] = owner[parent]
    owner[:hop1] = -1                                   # a hop-1 node's own row: not in saved_gather
    return owner


def _last_reacher(blocks, k, rank):
    """Each input row's last-ranked hop-1 reacher (local id), -1 if a seed reaches it: the row is
    needed unless every hop-1 node with a sampled path to it (itself included) is a fresh history
    (`history.history_prune`), so the top-k histories spare it iff that node ranks below k."""
    hop1 = blocks[-1].src_nodes
    never = len(rank)                                   # a seed: no history spares its rows
    r = np.concatenate((np.full(k, never, np.int64), rank[hop1[k:]]))
    for blk in reversed(blocks[:-1]):                   # hop 1 ... hop L-1: a dst reaches what it samples
        src, dst = blk.edges()
        out = np.full(blk.num_src, -1, np.int64)
        out[:blk.num_dst] = r
        np.maximum.at(out, src, r[dst])
        r = out
    local = np.full(never + 1, -1, np.int64)
    local[rank[hop1[k:]]] = np.arange(k, len(hop1))
    return local[r]


def history_reuse(meetings: Meetings, staleness: int, epochs: int = 1) -> np.ndarray:
    """float [M]: the share of `epochs` epochs in which each profiled meeting finds its node's history
    fresh, so that it is reused (a hit) rather than computed (OUTRE §4.3's rule, `history.HistoryStamps`):
    the run repeats the profiled epoch, iteration t = epoch·batches + batch; a meeting pushes (stamp = t)
    when the history is empty or stale (t − stamp ≥ staleness), seeds included; a fresh non-seed
    meeting hits. Each node on its own: its meetings do not depend on the others' histories."""
    order = np.lexsort((meetings.batch, meetings.node))
    hits = _reuse(meetings.node[order], meetings.batch[order], meetings.seed[order], int(staleness),
                  int(epochs), int(meetings.batches))
    out = np.empty(len(order))
    out[order] = hits / max(1, int(epochs))
    return out


@numba.njit(cache=True)
def _reuse(node, batch, seed, staleness, epochs, batches):
    """Hits of each meeting over `epochs` repeats, meetings sorted by (node, batch)."""
    hits = np.zeros(len(node))
    i = 0
    while i < len(node):
        j = i
        while j < len(node) and node[j] == node[i]:
            j += 1
        stamp = -1
        for e in range(epochs):
            for q in range(i, j):
                t = e * batches + batch[q]
                if stamp >= 0 and t - stamp < staleness:
                    if not seed[q]:
                        hits[q] += 1.0
                else:
                    stamp = t
        i = j
    return hits


def history_nodes(store, fraction, by="degree", fanouts=(10, 10), beta=0.0, profile=None,
                  **profile_kw) -> np.ndarray:
    """Sorted ids of the ⌊fraction·N⌋ history nodes, highest score first broken by smaller id.

    by="degree" (OUTRE Table 4's choice) or "importance": saved_gather + beta·saved_sample
    (OUTRE Eq. 4 with a given β; β=0 counts feature reads only) from `importance(store,
    fanouts, **profile_kw)`, or from `profile` (its DataFrame) when already computed.
    """
    if not 0 <= fraction <= 1:
        raise UserError(f"fraction must be in [0, 1], got {fraction}")
    if by == "degree":
        score = store.degrees().astype(np.float64)
    elif by == "importance":
        p = importance(store, fanouts, **profile_kw) if profile is None else profile
        score = p["saved_gather"].to_numpy() + beta * p["saved_sample"].to_numpy()
    else:
        raise UserError(f"history_nodes: by must be 'degree' or 'importance', got {by!r}")
    return top_ids(score, int(fraction * store.num_nodes))



def choose_history_split(saved_feat, saved_hist, budget, d_feat, d_embed, table_feat=0, table_hist=0,
                         feat_score=None, hist_score=None, overlap=None, step=0.01) -> tuple[float, pd.DataFrame]:
    """OUTRE Eq. 5 (§4.4): the share α of `budget` bytes for historical embeddings, 1 − α for the feature
    cache, that maximises the profiled reads the two save:

        benefit(α) = Σ top-k_f(α) saved_feat + Σ top-k_h(α) saved_hist,
        k_f = ⌊(B(1−α) − table_feat) / d_feat⌋,  k_h = ⌊(Bα − table_hist) / d_embed⌋,  clipped to [0, N],

    over α ∈ {0, step, …, 1}, from prefix sums of the per-node savings in the caches' order (highest
    `feat_score` / `hist_score` first, ties by smaller id; default the savings themselves, as OUTRE
    ranks). `overlap`: (u, v, w): reads of row v that u's history saves, w times each (`Meetings`
    pairs, weighted by `history_reuse`); those with u among the histories and v among the cached rows
    are saved once, not twice (inclusion–exclusion, subtracted as `both`; Eq. 5 counts them twice).
    Returns (α*, table): one row per α with feature_rows, history_rows, saved_feat, saved_hist, both
    and benefit; ties go to the smaller α (fewer histories, less staleness)."""
    def prefix(saved, score):
        saved = np.asarray(saved, dtype=np.float64)
        return np.concatenate(([0.0], np.cumsum(saved[_order(saved, score)])))   # [N+1]: saved by the top k
    if d_feat <= 0 or d_embed <= 0 or not 0 < step <= 1:
        raise UserError(f"need d_feat, d_embed > 0 and 0 < step <= 1, got {d_feat}, {d_embed}, {step}")
    pf, ph = prefix(saved_feat, feat_score), prefix(saved_hist, hist_score)
    alpha = np.round(np.arange(0.0, 1.0 + step / 2, step), 10)                       # [A]
    kf = np.clip(np.floor((budget * (1 - alpha) - table_feat) / d_feat), 0, len(pf) - 1).astype(np.int64)
    kh = np.clip(np.floor((budget * alpha - table_hist) / d_embed), 0, len(ph) - 1).astype(np.int64)
    both = np.zeros(len(alpha))
    if overlap is not None:
        both = _both(overlap, _ranks(saved_feat, feat_score), _ranks(saved_hist, hist_score), kf, kh)
    table = pd.DataFrame({"alpha": alpha, "feature_rows": kf, "history_rows": kh, "saved_feat": pf[kf],
                          "saved_hist": ph[kh], "both": both, "benefit": pf[kf] + ph[kh] - both})
    return float(alpha[int(np.argmax(table["benefit"].to_numpy()))]), table



def _order(saved, score=None) -> np.ndarray:
    """Ids, highest score (default: saved) first, ties by smaller id."""
    return np.argsort(-np.asarray(saved if score is None else score, np.float64), kind="stable")


def ranks(score) -> np.ndarray:
    """rank[v]: v's position in the order of `top_ids` (a cache of k entries holds the ranks below k)."""
    return _ranks(score)


def _ranks(saved, score=None) -> np.ndarray:
    order = _order(saved, score)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    return rank


def _both(overlap, feat_rank, hist_rank, kf, kh) -> np.ndarray:
    """Per α: the weight of pairs (u, v) with u among the top kh[α] histories, v among the top kf[α] rows.
    kh rises and kf falls with α, so each pair counts on one interval of the grid [first, last]."""
    u, v, w = overlap
    u, v, w = np.asarray(u, np.int64), np.asarray(v, np.int64), np.asarray(w, np.float64)
    first = np.searchsorted(kh, hist_rank[u], side="right")            # first α with rank < kh
    last = len(kf) - 1 - np.searchsorted(kf[::-1], feat_rank[v], side="right")   # last α with rank < kf
    ok = first <= last
    diff = np.bincount(first[ok], w[ok], minlength=len(kf) + 1) - np.bincount(last[ok] + 1, w[ok], len(kf) + 1)
    return np.cumsum(diff)[:len(kf)]