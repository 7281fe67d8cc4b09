"""Static-cache candidates and the mega-batch degree analysis of HierBatching §3.2 (Eq. 1–5).

A mega-batch holds the nodes C_D of N_d random parts; the static cache C_S (r_s·N nodes, in RAM
for the whole run) adds the edges from C_D into C_S. Over one epoch whose mega-batches cover
every node, the summed gain is separable (App. A, Eq. 5):

    Σ_i Δ(C_D^(i), C_S) = Σ_{v ∈ C_S} (deg(v) − deg_sub(v)),

deg_sub(v) being v's degree inside its own mega-batch. So the top-k by deg − deg_sub (Eq. 3)
is optimal for a realised schedule, and the paper's top-k by degree is its proxy.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .csrsource import CSRSource
from .partition import megabatch_of_part
from .ranking import top_ordered

BUCKETS = (0, 5, 10, 20, 50)     # Fig. 2 groups by in-mega-batch degree: [0,5) [5,10) [10,20) [20,50) [50,∞)
BUCKET_LABELS = ("0-5", "5-10", "10-20", "20-50", ">50")


def _top_k(score, k) -> np.ndarray:
    """Ids of the k highest scores; ties go to the smaller id."""
    return top_ordered(np.asarray(score, dtype=np.int64), k)


def static_cache_candidates(degrees, r_s) -> np.ndarray:
    """The ⌊r_s·N⌋ highest-degree node ids, highest first (HierBatching Alg. 1 line 9)."""
    return _top_k(degrees, int(r_s * len(degrees)))


def megabatch_degree_analysis(indptr, indices, assignment, n_d, r_s, seed=0, epochs=1, parts=None):
    """(buckets, policies) DataFrames for a mega-batch schedule of `epochs` epochs.

    Each epoch shuffles the K parts and cuts them into mega-batches of n_d (the last takes the
    leftover parts, so every node is in exactly one mega-batch: Eq. 5's precondition).
    Static sets of ⌊r_s·N⌋ nodes: `degree` (top-k degree), `eq3_optimum` (top-k of the
    summed external degree Σ_epochs deg − deg_sub for this schedule, the exact optimum of the
    summed gain), `random` (seeded).

    policies: one row per static set (and `none`), summed over epochs: `edges` (Σ deg),
    `without` (edges kept inside the mega-batch, no static cache), `gain` (edges from dynamic
    nodes into static nodes outside their mega-batch, counted directly), `gain_eq5`
    (Σ_{v∈C_S} deg − deg_sub), `retained` (edges whose far end is in C_D ∪ C_S, counted
    directly; = without + gain_eq5 exactly), their fractions of `edges`, and `vs_optimum`.

    buckets: per policy and Fig. 2 group of in-mega-batch degree, per epoch on average:
    nodes, degree before the static cache, increase from it, remaining loss vs full degree
    (sums and per-node means).
    """
    csr = CSRSource("graph", indptr, np.empty(0, np.int64), indices=np.asarray(indices))
    a = np.asarray(assignment)
    n, parts = csr.num_nodes, int(a.max()) + 1 if parts is None else int(parts)
    deg = np.diff(csr.indptr)
    rng = np.random.default_rng(seed)
    mbs = [megabatch_of_part(parts, n_d, rng)[a] for _ in range(epochs)]     # node -> mega-batch
    deg_sub = [np.zeros(n, np.int64) for _ in range(epochs)]
    for lo, hi, idx in csr.chunks():
        src = np.repeat(np.arange(lo, hi, dtype=np.int64), deg[lo:hi])
        for mb, ds in zip(mbs, deg_sub):
            ds[lo:hi] = np.bincount(src[mb[src] == mb[idx]] - lo, minlength=hi - lo)
    k = int(r_s * n)
    external = sum(deg - ds for ds in deg_sub)
    sets = {"none": np.empty(0, np.int64), "degree": _top_k(deg, k), "eq3_optimum": _top_k(external, k),
            "random": np.sort(rng.choice(n, size=k, replace=False))}
    static = {name: np.zeros(n, np.bool_) for name in sets}
    for name, ids in sets.items():
        static[name][ids] = True
    gain = {name: [np.zeros(n, np.int64) for _ in range(epochs)] for name in sets}
    retained = dict.fromkeys(sets, 0)
    for lo, hi, idx in csr.chunks():
        src = np.repeat(np.arange(lo, hi, dtype=np.int64), deg[lo:hi])
        for e, mb in enumerate(mbs):
            same = mb[src] == mb[idx]
            for name, st in static.items():
                far = st[idx]
                gain[name][e][lo:hi] = np.bincount(src[far & ~same] - lo, minlength=hi - lo)
                retained[name] += int(np.count_nonzero(same | far))

    edges, without = epochs * csr.num_edges, int(sum(ds.sum() for ds in deg_sub))
    rows, brows = [], []
    for name, ids in sets.items():
        g = int(sum(x.sum() for x in gain[name]))
        g5 = int(sum((deg[ids] - ds[ids]).sum() for ds in deg_sub))
        rows.append({"policy": name, "r_s": r_s if name != "none" else 0.0, "static_nodes": len(ids),
                     "n_d": n_d, "epochs": epochs, "edges": edges, "without": without, "gain": g,
                     "gain_eq5": g5, "retained": retained[name]})
        bucket = [np.digitize(ds, BUCKETS) - 1 for ds in deg_sub]
        for b, label in enumerate(BUCKET_LABELS):
            sel = [bk == b for bk in bucket]
            cnt = sum(int(s.sum()) for s in sel) / epochs
            before = sum(int(ds[s].sum()) for ds, s in zip(deg_sub, sel)) / epochs
            inc = sum(int(gn[s].sum()) for gn, s in zip(gain[name], sel)) / epochs
            loss = sum(int(deg[s].sum()) for s in sel) / epochs - before - inc
            per = max(cnt, 1)
            brows.append({"policy": name, "bucket": label, "nodes": cnt, "deg_before": before,
                          "gain": inc, "loss": loss, "deg_before_mean": before / per,
                          "gain_mean": inc / per, "loss_mean": loss / per})
    policies = pd.DataFrame(rows)
    for col in ("without", "gain", "retained"):
        policies[f"{col}_frac"] = policies[col] / max(edges, 1)
    best = policies.loc[policies.policy == "eq3_optimum", "gain"].item()
    policies["vs_optimum"] = policies["gain"] / best if best else np.nan
    return pd.DataFrame(brows), policies
