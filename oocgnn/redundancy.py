"""The Redundancy Ratio (OUTRE Eq. 2) and what historical-embedding reuse saves (OUTRE §3.3, §4.3).

    RR = Σ_b |Ñ_b| / Σ_b |N_b|

over the batches b of an epoch: N_b the batch's seeds, Ñ_b the unique nodes of its sampled
L-hop neighbourhood (deduplicated within a batch, counted again across batches). RR measures
demand, not misses: caches do not change it (OUTRE §9 item 2).

With history reuse, a chosen node set supplies its layer-(L−1) embedding when met at hop 1,
which prunes its (L−1)-hop sub-tree (`simulate.history_prune`: the SKIP/NEEDED logic of
OUTRE §4.3, staleness out of scope). The set is chosen by `importance.history_nodes` (by degree,
OUTRE Table 4, or by OUTRE's profiled saved_I/O_hist).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

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


def parts_per_macro(store, batch_size, micro_batches) -> int:
    """Parts per macro batch (OUTRE §4.2) that hold about `micro_batches` micro batches of `batch_size`
    training nodes."""
    return max(1, round(micro_batches * batch_size * store.num_parts / len(store.train_idx)))


def batch_seen(store, batch_size, n_per_macro, seed=0) -> float:
    """Size of the batch an average training node is in, Σ|N_b|² / Σ|N_b|, over one epoch of partition
    batches (no sampling): the small micro batches a macro batch of few training nodes is cut into."""
    sizes = np.array([len(st.seeds) for st in make_schedule("partition", store, batch_size=batch_size,
                                                            n_per_macro=n_per_macro, seed=seed).epoch(0)])
    return (sizes ** 2).sum() / sizes.sum()


def random_vs_partition(store, fanouts, batch_size, n_per_macro, seed=0) -> dict:
    """RR of one epoch of random batches and of partition batches (OUTRE Tables 2–3), as one row: both RRs
    and the change, the batches, the partition batch a node is in (`batch_seen`), the random batch's
    neighbourhood as a share of the graph, and the lists each reads."""
    r = redundancy_ratio(store, "random", fanouts, seed=seed, batch_size=batch_size)
    p = redundancy_ratio(store, "partition", fanouts, seed=seed, batch_size=batch_size, n_per_macro=n_per_macro)
    return {"n_per_macro": n_per_macro, "rr_random": r["rr"], "rr_partition": p["rr"],
            "change_%": 100 * (p["rr"] / r["rr"] - 1), "batches_random": r["batches"],
            "batches_partition": p["batches"], "batch_seen_partition": batch_seen(store, batch_size, n_per_macro, seed),
            "nbhd_%_of_graph": 100 * r["input_nodes"] / r["batches"] / store.num_nodes,
            "lists_read_random": r["neighbour_lists_read"], "lists_read_partition": p["neighbour_lists_read"]}
