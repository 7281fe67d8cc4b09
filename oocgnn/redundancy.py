"""The Redundancy Ratio (OUTRE Eq. 2) and what historical-embedding reuse saves (OUTRE §3.3, §4.3).

    RR = Σ_b |Ñ_b| / Σ_b |N_b|

over the batches b of an epoch: N_b the batch's seeds, Ñ_b the unique nodes of its sampled
L-hop neighbourhood (deduplicated within a batch, counted again across batches). RR measures
demand, not misses: caches do not change it (OUTRE §9 item 2).

With history reuse, a chosen node set supplies its layer-(L−1) embedding when met at hop 1,
which prunes its (L−1)-hop sub-tree (`simulate.history_prune`: the SKIP/NEEDED logic of
OUTRE §4.3, staleness out of scope). `history_nodes` chooses the set by degree (OUTRE
Table 4) or by OUTRE's profiled saved_I/O_hist (`importance`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import UserError
from .sampler import Sampler, sampled_steps
from .schedules import make_schedule
from .simulate import simulate, summarize

_TOTALS = ("seeds", "input_nodes", "feature_rows_read", "feature_pages_read", "neighbour_lists_read",
           "neighbour_pages_read", "load_pages")


def redundancy_ratio(store, schedule, fanouts, epochs=1, seed=0, history=None, progress=False,
                     **schedule_params) -> dict:
    """RR (Eq. 2) of `epochs` epochs of `schedule` (a Schedule or a name + params), and the I/O behind it.

    Keys: schedule, epochs, batches, seeds, input_nodes, rr, rows/pages/lists read; with
    `history` (ids or a mask) also history_nodes, history_hits and every count again with the
    suffix `_hist`, plus rr_reduction = 1 − rr_hist / rr.
    """
    df = simulate(store, schedule, fanouts, epochs=epochs, seed=seed, history=history,
                  progress=progress, **schedule_params)
    s = summarize(df)
    out = {"schedule": df.attrs["schedule"], "fanouts": ",".join(map(str, df.attrs["fanouts"])),
           "epochs": epochs, "batches": int(s["batches"].sum())}
    out.update({k: int(s[k].sum()) for k in _TOTALS})
    out["rr"] = out["input_nodes"] / out["seeds"]
    if history is not None:
        mask = np.asarray(history)
        out["history_nodes"] = int(mask.sum()) if mask.dtype == bool else len(np.unique(mask))
        out["history_hits"] = int(s["history_hits"].sum())
        for k in ("input_nodes", "feature_rows_read", "feature_pages_read", "neighbour_lists_read",
                  "neighbour_pages_read"):
            out[f"{k}_hist"] = int(s[f"{k}_hist"].sum())
        out["rr_hist"] = out["input_nodes_hist"] / out["seeds"]
        out["rr_reduction"] = 1.0 - out["rr_hist"] / out["rr"]
    return out


def redundancy_table(store, schedules: dict, fanouts, epochs=1, seed=0, history=None) -> pd.DataFrame:
    """One `redundancy_ratio` row per labelled schedule: {label: Schedule | (name, params)}."""
    rows = []
    for label, sch in schedules.items():
        name, params = (sch, {}) if not isinstance(sch, tuple) else sch
        rows.append({"label": label, **redundancy_ratio(store, name, fanouts, epochs, seed, history,
                                                        **params)})
    return pd.DataFrame(rows)


def _first_discoverer(block):
    """(new src local ids, parent dst local id): each node new at this hop, charged to its first edge."""
    src, dst = block.edges()
    new = src >= block.num_dst
    ids, first = np.unique(src[new], return_index=True)
    return ids, dst[new][first]


def importance(store, fanouts, schedule="random", epochs=1, seed=0, progress=False, topology=None,
               **schedule_params) -> pd.DataFrame:
    """OUTRE's saved_I/O_hist profile (§2.6 of the digest), one row per store id.

    For every batch and every hop-1 node u that is not a seed (the nodes a history could skip):
    - saved_gather: nodes of the batch's Ñ_b that u brings in first (a first-discoverer
      forest over the sampled MFG, propagated from the outermost hop inwards), i.e. the feature
      reads its reuse saves;
    - saved_sample: the size of u's sampled (L−1)-hop sub-tree, i.e. the neighbour entries its
      reuse leaves unsampled (OUTRE's reverse propagation of ones, +1 for self per hop).
    Summed over the batches of `epochs` epochs of `schedule` (profiling epochs; seeds as `simulate`).
    `topology`: the lists to sample from (default the store's, all in RAM; a run passes its own).
    """
    from tqdm.auto import tqdm
    fanouts = [int(f) for f in fanouts]
    if len(fanouts) < 2:
        raise UserError("importance needs at least 2 layers (history caches h^(L-1))")
    schedule = make_schedule(schedule, store, **({"seed": seed} | schedule_params)) \
        if isinstance(schedule, str) else schedule
    gather = np.zeros(store.num_nodes, dtype=np.float64)
    sample = np.zeros(store.num_nodes, dtype=np.float64)
    walk = sampled_steps(schedule, Sampler(topology or store.neighbour_lists(), fanouts, seed), epochs)
    for _, _, _, _, smp in tqdm(walk, desc="importance", disable=not progress, leave=False):
        blocks = smp.blocks
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
        gather[hop1[k:]] += c[k:] - 1
        sample[hop1[k:]] += t[k:] - 1
    return pd.DataFrame({"degree": store.degrees(), "saved_gather": gather.astype(np.int64),
                         "saved_sample": sample.astype(np.int64)})


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
    k = int(fraction * store.num_nodes)
    return np.sort(np.argsort(-score, kind="stable")[:k]).astype(np.int64)
