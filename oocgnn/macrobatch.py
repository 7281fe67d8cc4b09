"""BatchGNN macrobatching: k consecutive mini-batches share one deduplicated feature fetch.

The sampled subgraphs do not change (tests/test_macrobatch.py), only the fetch set: the union
of k iterations' ids is read once, optionally through a cache policy of `oocgnn.cache`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .cache import CachePolicy, replay
from .io import PAGE
from .trace import Trace


def macrobatch_fetch(trace: Trace, ks, cache: CachePolicy | None = None) -> pd.DataFrame:
    """BatchGNN macrobatching: every k consecutive iterations fetch the union of their ids once.

    One row per k: macrobatches, accesses (Σ per-iteration unique, the k = 1 fetch), fetched rows,
    pages and bytes, the largest union (rows buffered at once) and rows vs k = 1. With `cache`, the
    union is first looked up in the cache (replayed over the macrobatches, each one iteration);
    fetched then counts the misses, and init the cache's prefetch.
    """
    rows = []
    for k in np.atleast_1d(ks):
        k = len(trace) if k is None or k <= 0 else int(k)
        mb = trace.coarsen(k)
        if cache is None:
            fetched, pages, init_rows, init_pages = mb.accesses, int(mb.pages().sum()), 0, 0
        else:
            r = replay(mb, cache)
            fetched, pages, init_rows, init_pages = r.misses, r.pages_read, r.init_rows, r.init_pages
        rows.append({"k": k, "macrobatches": len(mb), "accesses": trace.accesses, "union_rows": mb.accesses,
                     "fetched_rows": fetched, "fetched_pages": pages,
                     "bytes_requested": fetched * trace.row_bytes, "bytes_read": pages * PAGE,
                     "init_rows": init_rows, "init_pages": init_pages,
                     "max_union_rows": int(mb.sizes().max()) if len(mb) else 0,
                     "cache": "none" if cache is None else cache.name,
                     "capacity": 0 if cache is None else cache.capacity})
    df = pd.DataFrame(rows)
    df["rows_vs_k1"] = df["fetched_rows"] / max(1, trace.accesses)
    return df
