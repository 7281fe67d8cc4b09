"""Exact I/O simulation of a schedule: sample every batch, read nothing, count everything.

`simulate` replays a schedule (`oocgnn.schedules`) with the same seeded sampler the
executor uses (`oocgnn.sampler`) and counts, per batch, what the store layout implies:
feature rows and 4 KiB pages read from features.bin (rows sharing a page within a batch are
read once, as DirectReader coalesces them), neighbour lists and pages read from indices.bin,
and the sequential loads of residency changes. Resident data is never read again:
a megabatch's group and static cache (features + adjacency), a partition macro batch's
adjacency (OUTRE's dynamic neighbour cache), plus optional external caches.

With `history` (ids supplying their layer-(L−1) embedding, OUTRE §4.3), a second set of
columns counts the pruned computation graph (`history_prune`).
"""
from __future__ import annotations

import time
from itertools import islice

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .ahead import chunks
from .errors import UserError
from .history import HistoryStamps, history_prune
from .io import PAGE, page_span, range_chunks, range_requests, request_breaks, span_runs
from .mixing import mixing
from .policies import as_plan
from .sampler import Sampler, sampled_steps
from .schedules import _ids_of_ranges

DATA = ("features", "adjacency")


def page_union(first, last) -> tuple[int, int]:
    """(pages, runs) covered by page spans [first[i], last[i]] given in ascending order of first."""
    if len(first) == 0:
        return 0, 0
    reach = np.maximum.accumulate(last)
    prev = np.concatenate(([-2], reach[:-1]))
    pages = int(np.maximum(last - np.maximum(first, prev + 1) + 1, 0).sum())
    return pages, int(np.count_nonzero(first > prev + 1))


def _as_mask(ids, n):
    mask = np.zeros(n, dtype=bool)
    if ids is not None:
        ids = np.asarray(ids)
        if ids.dtype == bool:
            if ids.shape != (n,):
                raise UserError(f"a boolean node mask must have shape ({n},), got {ids.shape}")
            return ids.copy()
        mask[ids.astype(np.int64)] = True
    return mask


class Layout:
    """Page arithmetic of a store: feature rows in features.bin, neighbour lists in indices.bin."""

    def __init__(self, store):
        self.stride, self.row_bytes = store.row_stride, store.row_bytes
        self.indptr = np.asarray(store.indptr, dtype=np.int64)
        self.isz = np.dtype(store.meta["index_dtype"]).itemsize

    def feature_pages(self, rows):
        """(pages, runs) of reading sorted unique `rows` in one batch."""
        return page_union(*page_span(rows * self.stride, self.row_bytes))

    def feature_requests(self, rows) -> int:
        """Requests DirectReader.read_rows issues for sorted unique `rows` (same coalescing rule)."""
        return _requests(rows, self.stride, self.row_bytes)

    def list_reads(self, nodes) -> tuple[int, int]:
        """(pages, requests) of reading the lists of `nodes` (unique, none empty) in one call, as
        `topology.NeighbourLists` does (`DirectReader.read_spans`: the `io.span_runs` rule)."""
        nodes = np.sort(nodes)
        start, end = self.indptr[nodes] * self.isz, self.indptr[nodes + 1] * self.isz
        _, pages, requests = span_runs(*page_span(start, end - start))
        return int(pages.sum()), int(requests.sum())

    def range_list_reads(self, lo, hi) -> tuple[int, int]:
        """(pages, requests) of loading the lists of nodes [lo, hi) sequentially (`io.range_chunks`)."""
        pages = []
        for a, b in range_chunks(self.indptr[lo], self.indptr[hi], self.isz):
            first, last = page_span(a * self.isz, (b - a) * self.isz)
            pages.append(int(last - first + 1))
        return sum(pages), sum(range_requests(p) for p in pages)

    def adjacency_pages(self, nodes):
        """(pages, runs) of reading the neighbour lists of sorted unique `nodes` (empty ones read nothing)."""
        start, end = self.indptr[nodes] * self.isz, self.indptr[nodes + 1] * self.isz
        keep = end > start
        return page_union(*page_span(start[keep], end[keep] - start[keep]))

    def range_feature_reads(self, lo, hi) -> tuple[int, int]:
        """(pages, requests) of loading feature rows [lo, hi) as the runtime does (`io.range_chunks`); rows of
        features.bin, or of a file of rows at the same stride (a packed batch's, past N too)."""
        pages = []
        for a, b in range_chunks(lo, hi, self.stride):
            first, last = page_span(a * self.stride, (b - 1 - a) * self.stride + self.row_bytes)
            pages.append(int(last - first + 1))
        return sum(pages), sum(range_requests(p) for p in pages)

    def range_pages(self, lo, hi) -> tuple[int, int]:
        """(feature pages, adjacency pages) of sequential reads of rows [lo, hi)."""
        if hi <= lo:
            return 0, 0
        first, last = page_span(lo * self.stride, (hi - 1 - lo) * self.stride + self.row_bytes)
        a, b = self.indptr[lo] * self.isz, self.indptr[hi] * self.isz
        if b <= a:
            return int(last - first + 1), 0
        afirst, alast = page_span(a, b - a)
        return int(last - first + 1), int(alast - afirst + 1)


def _requests(rows, stride, row_bytes) -> int:
    """Requests DirectReader.read_rows issues for sorted unique `rows` of a layout."""
    row_pages = stride // PAGE if stride % PAGE == 0 else 1
    return int(request_breaks(*page_span(rows * stride, row_bytes), row_pages).sum())


LOADS = ("load_feature_rows", "load_feature_pages", "load_feature_requests", "load_edges",
         "load_adjacency_pages", "load_adjacency_requests")


class Residency:
    """What is in RAM: boolean masks over store ids per (data, setup|ranges|ids|fetched); `apply` counts the
    loads. Setup residents (`apply(step, setup=True)`) stay all run: steps never move them; `fetched` is what a
    plan sampling ahead fetched for its chunk (`fetch`, `change`), apart from the rows its steps bring."""

    def __init__(self, store, feature_cache=None, neighbour_cache=None, buckets=None):
        n = store.num_nodes
        self.buckets, self.parts = buckets, set()     # a partition buffer's bucket file and held partitions
        self.layout, self.deg = Layout(store), store.degrees()
        self.masks = {(d, k): np.zeros(n, dtype=bool) for d in DATA for k in ("setup", "ranges", "ids", "fetched")}
        self.extra = {"features": _as_mask(feature_cache, n), "adjacency": _as_mask(neighbour_cache, n)}
        self._update()

    def _update(self):
        held = {d: self.masks[d, "setup"] | self.masks[d, "ranges"] | self.masks[d, "ids"] | self.masks[d, "fetched"]
                for d in DATA}
        self.resident = {d: held[d] | self.extra[d] for d in DATA}
        self.counts = {d: int(np.count_nonzero(held[d])) for d in DATA}

    def apply(self, step, setup=False) -> dict:
        """Apply the step's residency change (leave, then enter) and return its load counts."""
        load = dict.fromkeys(LOADS, 0)
        if not (step.leave_ranges or step.enter_ranges or len(step.leave_ids) or len(step.enter_ids)):
            return load
        for d in DATA:
            for lo, hi in step.leave_ranges:
                self.masks[d, "ranges"][lo:hi] = False
            self.masks[d, "ids"][step.leave_ids] = False
        lay = self.layout
        ids = np.unique(np.asarray(step.enter_ids, dtype=np.int64))
        for d in step.data:
            if d not in DATA + ("buckets",):
                raise UserError(f"unknown resident data {d!r}; expected one of {DATA + ('buckets',)}")
            d = "adjacency" if d == "buckets" else d     # the buffer's subgraph: what sampling needs of it
            for lo, hi in step.enter_ranges:
                self.masks[d, "setup" if setup else "ranges"][lo:hi] = True
            self.masks[d, "setup" if setup else "ids"][ids] = True
        if "features" in step.data:
            load["load_feature_rows"] = sum(hi - lo for lo, hi in step.enter_ranges) + len(ids)
            if step.scattered:          # HB−: the group's rows are one coalesced gather
                rows = _ids_of_ranges(step.enter_ranges)
                load["load_feature_pages"] = lay.feature_pages(rows)[0] + lay.feature_pages(ids)[0]
                load["load_feature_requests"] = lay.feature_requests(rows) + lay.feature_requests(ids)
            else:
                reads = [lay.range_feature_reads(lo, hi) for lo, hi in step.enter_ranges]
                load["load_feature_pages"] = sum(p for p, _ in reads) + lay.feature_pages(ids)[0]
                load["load_feature_requests"] = sum(r for _, r in reads) + lay.feature_requests(ids)
        if "buckets" in step.data:      # the edge buckets the buffer lacks (MariusGNN §3)
            edges, pages, requests = self.buckets.reads(self.buckets.pairs(step.buffer, self.parts))
            self.parts = set(step.buffer)
            load.update(load_edges=edges, load_adjacency_pages=pages, load_adjacency_requests=requests)
        if "adjacency" in step.data:
            listed = ids[self.deg[ids] > 0]
            reads = [lay.range_list_reads(lo, hi) for lo, hi in step.enter_ranges] + \
                ([lay.list_reads(listed)] if len(listed) else [])
            load["load_edges"] = (sum(int(lay.indptr[hi] - lay.indptr[lo]) for lo, hi in step.enter_ranges)
                                  + int(self.deg[ids].sum()))
            load["load_adjacency_pages"] = sum(p for p, _ in reads)
            load["load_adjacency_requests"] = sum(r for _, r in reads)
        self._update()
        return load


    def fetch(self, fetch) -> dict:
        """A chunk's fetch (`oocgnn.ahead`): its resident rows replace the previous chunk's fetched rows;
        the rows read then (those not held, or all of them if it rereads) are its load."""
        load, ids = dict.fromkeys(LOADS, 0), fetch.resident
        held = self.masks["features", "fetched"]
        read = ids if fetch.reread else ids[~held[ids]]
        load["load_feature_rows"] = len(read)
        if fetch.span is not None:      # one range of a packed file at the store's stride (DiskGNN)
            load["load_feature_pages"], load["load_feature_requests"] = self.layout.range_feature_reads(*fetch.span)
        else:
            load["load_feature_pages"] = self.layout.feature_pages(read)[0]
            load["load_feature_requests"] = self.layout.feature_requests(read)
        held[:] = False
        held[ids] = True
        self._update()
        return load

    def change(self, admit, evict):
        """A batch's changeset (Ginex §3.4): `evict` leaves the scattered rows, `admit` (rows the batch
        read) enters them; no I/O."""
        m = self.masks
        m["features", "fetched"][evict] = False
        m["features", "fetched"][admit] = True
        for ids in (evict, admit):
            self.resident["features"][ids] = (m["features", "setup"][ids] | m["features", "ranges"][ids]
                                              | m["features", "ids"][ids] | m["features", "fetched"][ids]
                                              | self.extra["features"][ids])
        self.counts["features"] += len(admit) - len(evict)


def _reads(lay, resident, ids, data):
    """(count, pages, runs) read from disk for the ids not resident: feature rows or neighbour lists."""
    ids = np.sort(ids)
    miss = ids[~resident[data][ids]]
    if data == "features":
        return len(miss), *lay.feature_pages(miss)
    miss = miss[lay.indptr[miss + 1] > lay.indptr[miss]]     # an empty list costs no read
    return len(miss), *lay.adjacency_pages(miss)


def count_batch(lay, resident, blocks, history=None, used=None) -> dict:
    """Per-batch demand and disk reads of one sampled batch, given what is resident.

    `used`: a `HistoryPlan` (OUTRE §4.3) of this batch; only the input rows its pruned computation
    uses are read (the lists were read to sample it). `history`: an ideal always-fresh history mask,
    counted apart in the `*_hist` columns (those count the lists a pruned sampling would read)."""
    row = {"unique_l0": blocks[-1].num_dst}
    for h, blk in enumerate(reversed(blocks), 1):
        row[f"unique_l{h}"] = blk.num_src
    inp, exp = blocks[0].src_nodes, blocks[0].dst_nodes
    row["input_nodes"] = row["feature_rows_needed"] = len(inp)
    read = inp if used is None else inp[used.need]
    row["feature_rows_read"], row["feature_pages_read"], row["feature_runs"] = \
        _reads(lay, resident, read, "features")
    miss = np.sort(read)
    row["feature_requests"] = lay.feature_requests(miss[~resident["features"][miss]])
    row["neighbour_lists_needed"] = len(exp)
    row["neighbour_lists_read"] = row["neighbour_pages_read"] = row["neighbour_requests"] = 0
    for i in range(len(blocks) - 1, -1, -1):      # the sampler's reads, layer by layer from the seeds:
        known = blocks[i + 1].num_dst if i + 1 < len(blocks) else 0   # lists it has not brought yet
        new = blocks[i].dst_nodes[known:]
        miss = new[~resident["adjacency"][new] & (lay.indptr[new + 1] > lay.indptr[new])]
        if len(miss):
            pages, requests = lay.list_reads(miss)
            row["neighbour_lists_read"] += len(miss)
            row["neighbour_pages_read"] += pages
            row["neighbour_requests"] += requests
    if used is not None:
        row["history_hits"] = used.hits
    if history is not None:
        need, expanded, skipped = history_prune(blocks, history)
        row["history_hits"] = int(np.count_nonzero(skipped))
        row["input_nodes_hist"] = int(np.count_nonzero(need))
        row["feature_rows_read_hist"], row["feature_pages_read_hist"], _ = \
            _reads(lay, resident, inp[need], "features")
        row["neighbour_lists_read_hist"], row["neighbour_pages_read_hist"], _ = \
            _reads(lay, resident, exp[expanded], "adjacency")
    return row


def simulate(store, plan, fanouts=None, epochs=1, seed=0, feature_cache=None, neighbour_cache=None,
             history=None, progress=True, steps=None, **schedule_params) -> pd.DataFrame:
    """One row per batch of `epochs` epochs of a plan (`policies.make_plan`: any policy), or of a
    schedule (a Schedule, or a name + schedule_params) walked with `fanouts` and sampling `seed`.

    Counted as the executor runs it: `plan.setup()` loads before the first step (its counts in
    `df.attrs["setup"]`), each step's residency change is applied before its batch is sampled, a plan
    that samples ahead fetches per chunk (`oocgnn.ahead`: counted as loads of the chunk's first batch), and
    with the plan's histories (OUTRE §4.3) only what a pruned batch uses is read, the histories'
    stamps refreshed as the executor's are. feature_cache / neighbour_cache: ids (or masks) always
    resident at no cost; history: ids (or a mask) of an ideal always-fresh history, counted apart in
    the `*_hist` columns. `steps`: only the first so many batches (what a run cut by `max_steps` does).
    `df.attrs` also holds the schedule, fanouts, seed and wall seconds, `mixing` (`oocgnn.mixing`: the
    groups' parts and label distance from the training set) and an OUTRE plan's `cache_split` (α,
    history and cache rows).
    """
    plan = as_plan(store, plan, fanouts, seed, **schedule_params)
    if history is not None and plan.history is not None:
        raise UserError("this plan has its own histories; an ideal `history` would be counted twice")
    res = Residency(store, feature_cache, neighbour_cache,
                    plan.schedule.buckets if "buckets" in plan.schedule.data else None)
    setup = dict.fromkeys(LOADS, 0)
    for step in plan.setup():
        setup = {k: v + res.apply(step, setup=True)[k] for k, v in setup.items()}
    hist = None if history is None else _as_mask(history, store.num_nodes)
    stamps = None if plan.history is None else \
        HistoryStamps(plan.history.candidates, plan.history.staleness, store.num_nodes)
    rows, t0 = [], time.perf_counter()
    bar = tqdm(desc=f"simulate {plan.schedule.name}", unit="batch", disable=not progress, leave=False)
    loads = {}
    sampler = Sampler(store.neighbour_lists(), plan.fanouts, plan.seed, plan.dense)
    before = lambda i, step: loads.__setitem__(i, res.apply(step))   # noqa: E731
    # a plan that samples ahead fetches per chunk of batches (`oocgnn.ahead`: each sampled, after its
    # residency change, when its chunk starts, and counted before the next chunk's change); the others per batch
    walked = islice(plan.steps(epochs), steps)          # a run cut by max_steps: its last chunk is cut too
    if plan.lookahead:
        walk = chunks(plan, ((i, e, b, s) for i, (e, b, s) in enumerate(walked)), sampler.sample, before,
                      None if stamps is None else stamps.copy())
    else:
        walk = (([item], None) for item in sampled_steps(walked, sampler, before=before))
    for items, fetch in walk:
        begin = res.fetch(fetch) if fetch is not None else None
        for k, (i, epoch, b, step, sample) in enumerate(items):
            row = {"epoch": epoch, "batch": b, "group": step.group, "update": step.update, "seeds": len(step.seeds),
                   "visible_nodes": store.num_nodes if step.visible is None else len(step.visible)}
            load = loads.pop(i)
            if k == 0 and begin is not None:
                load = {key: v + begin[key] for key, v in load.items()}
            used = None if stamps is None else stamps.plan(sample.blocks, step.update, prune=False)
            row.update(count_batch(res.layout, res.resident, sample.blocks, hist, used))
            if used is not None:
                stamps.mark(used)
            if fetch is not None and fetch.changes is not None:
                res.change(*fetch.changes[k][:2])
            row.update(load, load_pages=load["load_feature_pages"] + load["load_adjacency_pages"])
            row["load_bytes"] = row["load_pages"] * PAGE
            row["resident_feature_rows"], row["resident_adjacency_nodes"] = (res.counts[d] for d in DATA)
            rows.append(row)
            bar.update()
    bar.close()
    df = pd.DataFrame(rows)
    df.attrs.update(schedule=repr(plan.schedule), fanouts=plan.fanouts, seed=plan.seed, setup=setup,
                    seconds=time.perf_counter() - t0)
    if plan.task == "node" and (plan.cfg is not None or hasattr(plan.schedule, "groups")):   # a policy's plan, or
        df.attrs["mixing"] = mixing(plan)                  # a schedule of groups (labels: node classification)
    df.attrs["plan"] = plan.describe()            # the policy's own knobs, as a run's summary has them
    return df


_LEVELS = ("visible_nodes", "resident_feature_rows", "resident_adjacency_nodes")


def executed_vs_simulated(run: dict, df: pd.DataFrame) -> dict:
    """Counter -> (executed, simulated): a run's summary (`train`) against the simulation of its plan for the
    same steps (`simulate(store, plan, epochs, steps=run["steps"])`): the pages and requests of training and
    setup reads, of features and of neighbour lists, and the history hits. Every pair is equal for a plan
    with `exact_io` (tests/test_executor.py); under mmap the page cache only saves feature reads."""
    sim, setup = summarize(df).sum(), df.attrs["setup"]
    return {
        "feature pages": (run["io"]["pages"], int(sim["feature_pages_read"] + sim["load_feature_pages"])),
        "feature requests": (run["io"]["requests"], int(sim["feature_requests"] + sim["load_feature_requests"])),
        "setup feature pages": (run["io_setup"]["pages"], int(setup["load_feature_pages"])),
        "setup feature requests": (run["io_setup"]["requests"], int(setup["load_feature_requests"])),
        "topology pages": (run["topology_io"]["pages"], int(sim["neighbour_pages_read"] + sim["load_adjacency_pages"])),
        "topology requests": (run["topology_io"]["requests"],
                              int(sim["neighbour_requests"] + sim["load_adjacency_requests"])),
        "setup topology pages": (run["topology_io_setup"]["pages"], int(setup["load_adjacency_pages"])),
        "history hits": (run["history_hits"], int(sim.get("history_hits", 0))),
    }


def read_totals(df: pd.DataFrame) -> dict:
    """What a `simulate` frame reads in all, setup excluded: the input rows its batches use, the feature rows
    and MiB read and the requests (batches and residency changes), the lists' MiB, the mean visible set."""
    pages = df["feature_pages_read"].sum() + df["load_feature_pages"].sum()
    return {"input_rows": df["input_nodes"].sum(),
            "rows_read": df["feature_rows_read"].sum() + df["load_feature_rows"].sum(),
            "feature_MiB": pages * PAGE / 2**20,
            "requests": df["feature_requests"].sum() + df["load_feature_requests"].sum(),
            "list_MiB": (df["neighbour_pages_read"].sum() + df["load_adjacency_pages"].sum()) * PAGE / 2**20,
            "visible_nodes": df["visible_nodes"].mean()}


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per-epoch totals of a `simulate` frame, plus RR (OUTRE Eq. 2) and disk bytes."""
    skip = {"epoch", "batch", "group", *_LEVELS}
    sums = df.groupby("epoch")[[c for c in df.columns if c not in skip]].sum()
    by = df.groupby("epoch")
    out = pd.DataFrame({"batches": by.size(), "groups": by["group"].nunique()}).join(sums)
    for c in _LEVELS:
        out[f"max_{c}"] = by[c].max()
    out["rr"] = out["input_nodes"] / out["seeds"]
    out["disk_pages"] = out["feature_pages_read"] + out["neighbour_pages_read"] + out["load_pages"]
    if "input_nodes_hist" in out:
        out["rr_hist"] = out["input_nodes_hist"] / out["seeds"]
        out["disk_pages_hist"] = (out["feature_pages_read_hist"] + out["neighbour_pages_read_hist"]
                                  + out["load_pages"])
    out["disk_bytes"] = out["disk_pages"] * PAGE
    return out.reset_index()
