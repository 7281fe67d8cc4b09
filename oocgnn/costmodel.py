"""Predict a policy's epoch time before running it.

Three measured ingredients, combined as each policy pipelines:

- the plan's exact I/O, from the simulator (`simulate.simulate`: per batch, the random feature pages
  and neighbour-list pages read and their requests, and the sequential loads of residency changes);
- this machine's disk (`disk.DiskRates`, measured once per device and cached): sequential bytes/s and
  random 4 KiB reads/s at the queue depth `DirectReader` keeps in flight, and at depth 1 (page
  faults). A read of `pages` in `requests` costs `requests·latency + pages·4096/bandwidth`, where
  the latency is what the random rate leaves after the bytes (a linear latency-bandwidth model);
- the processor's per-batch costs (`StepCosts`), from a short calibration run: seconds of sampling
  per expanded node, of gathering and of the model's step per input row.

Overlap (HierBatching §3.5 generalised, BatchGNN App. A): a plan's batches fall in phases — a group
of ranges loaded together (HierBatching's mega-batch, MariusGNN's buffer state) or a chunk sampled
ahead (Ginex's superbatch, BatchGNN's macrobatch) — and a phase's background work (the next group's
load; the next chunk's sampling and, for a macrobatch, its union read) runs beside its foreground
work, so an epoch takes `bg[0] + Σ max(fg[i], bg[i+1])`; a plan that does not pipeline adds them.
On a CPU the background's processor time also delays the model's step, by its share of the step's cores.
`mmap`'s reads are the page faults an LRU over 4 KiB pages of the budget's size would miss
(`cache.PageLRUCache`), one at a time: the kernel's cache is not exactly LRU, so it is an estimate.
On a link store the batches are of training edges (their seeds the endpoints and negatives) and the calibration
runs train the link model (encoder, decoder, loss over the chunks' negatives): the same units, another model.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from .adam import Adam
from .buckets import buffer_csc
from .cache import PageLRUCache, replay
from .disk import CACHE_VERSION, DiskRates, cache_dir, load_cached, save_cached
from .errors import UserError
from .io import PAGE
from .policies import make_plan
from .trace import record_trace

# ---- the processor -------------------------------------------------------------------------------
@dataclass
class StepCosts:
    """CPU seconds of a batch's stages, from a calibration run (`calibrate`): each stage costs a constant
    per step (Python, kernel launches, the optimiser's step over every parameter) plus a cost per unit —
    sampling per expanded node (the dst nodes of every layer), gathering per input row, and the model's
    forward, backward and step per `compute_unit`: expanded nodes (a layer that transforms its dst nodes
    and aggregates their edges: SAGE, GIN) or input rows (one that transforms every src node: GAT),
    whichever fits the calibration runs better."""
    sample_s: float
    gather_s: float
    compute_s: float
    sample_step_s: float = 0.0
    gather_step_s: float = 0.0
    compute_step_s: float = 0.0
    load_row_s: float = 0.0       # a residency change: copying a loaded row into place, beyond its read
    subgraph_s: float = 0.0       # inducing a group's subgraph, per node it holds (HierBatching)
    steps: int = 0
    key: str = ""
    compute_unit: str = "rows"
    bucket_edge_s: float = 0.0    # a buffer state's subgraph from its edge buckets, per edge (MariusGNN)
    slot_row_s: float = 0.0       # a partition read whole into a buffer slot, per row beyond its read (MariusGNN)
    optimizer_step_s: float = 0.0 # the optimiser's step over every parameter, part of compute_step_s in the
    #                               calibration runs (a step per batch); charged per optimizer step (`optsteps`)

    def load_seconds(self, df, plan=None) -> np.ndarray:
        """Per-batch CPU seconds of the residency changes made before it (their reads apart), and of the
        subgraph a `plan` that samples inside each group builds for it: induced on the group's nodes
        (per node), or from a partition buffer's edge buckets (per edge of the state, `_state_edges`).
        A partition buffer's rows are charged at `slot_row_s` (a whole partition copied into one slot),
        not HierBatching's `load_row_s`: on `large` the loader's thread time per row was 11x lower."""
        rows = df["load_feature_rows"].to_numpy(float)
        if getattr(plan, "partition_buffer", False):
            return self.slot_row_s * rows + self.bucket_edge_s * _state_edges(plan, df)
        load = self.load_row_s * rows
        if getattr(plan, "induces", False):
            return load + self.subgraph_s * _induced_nodes(df)
        return load

    def batch_seconds(self, df) -> dict:
        """Per-batch CPU seconds of a `simulate` frame, by stage; the optimiser's step is charged to the
        batches that close an optimizer step (every batch, unless steps accumulate: `optsteps`)."""
        expanded, rows = _expanded(df), df["input_nodes"].to_numpy(float)
        opt = min(self.optimizer_step_s, self.compute_step_s)
        return {"sample": self.sample_step_s + self.sample_s * expanded,
                "gather": self.gather_step_s + self.gather_s * rows,
                "compute": self.compute_step_s - opt + opt * closes_step(df)
                + self.compute_s * (expanded if self.compute_unit == "expanded" else rows)}


def closes_step(df) -> np.ndarray:
    """1.0 where a `simulate` frame's batch ends its optimizer step (the next batch's `update` differs, or it
    is the last), else 0.0; a frame without `update` steps per batch."""
    if "update" not in df:
        return np.ones(len(df))
    u = df["update"].to_numpy()
    return np.append(u[1:] != u[:-1], True).astype(float)


def _group_starts(df) -> np.ndarray:
    """Per batch, whether it is its group's first (where a group's subgraph is built)."""
    group, epoch = df["group"].to_numpy(), df["epoch"].to_numpy()
    return np.r_[True, (group[1:] != group[:-1]) | (epoch[1:] != epoch[:-1])]


def _induced_nodes(df) -> np.ndarray:
    """Per batch, the nodes of a subgraph induced before it: a group's visible nodes where a group loads."""
    return np.where(_group_starts(df), df["visible_nodes"].to_numpy(float), 0.0)


def _state_edges(plan, df) -> np.ndarray:
    """Per batch, the edges of the buffer state whose subgraph is built before it (MariusGNN: every edge
    bucket among the state's partitions, `buckets.buffer_csc`), at its group's first batch; else 0."""
    b = plan.schedule.buckets
    sizes = np.diff(b.offsets).reshape(b.p, b.p)
    starts, out = _group_starts(df), np.zeros(len(df))
    epochs = int(df["epoch"].max()) + 1 if len(df) else 0
    for i, (_, _, step) in enumerate(islice(plan.schedule.steps(epochs), len(df))):
        if starts[i]:
            state = np.asarray(sorted(step.buffer), dtype=np.int64)
            out[i] = sizes[np.ix_(state, state)].sum()
    return out


def _expanded(df) -> np.ndarray:
    """Per batch, the nodes the sampler expanded: the unique dst nodes of every layer but the input one."""
    depth = max(int(c[len("unique_l"):]) for c in df.columns if c.startswith("unique_l"))
    return sum(df[f"unique_l{k}"].to_numpy(float) for k in range(depth))


def _calibration_key(store, cfg) -> str:
    import torch  # torch: imported when used, not with this module
    parts = [CACHE_VERSION, store.meta.get("checksum", str(store.path)), cfg.model, cfg.hidden, cfg.fanouts,
             cfg.batch_size, cfg.sampler, cfg.device, cfg.precision, cfg.threads or torch.get_num_threads(),
             cfg.dropout]
    return "|".join(map(str, parts))


def _fit(units, seconds, runs):
    """(per step, per unit) seconds from per-step points of runs at different batch sizes: the line through
    each run's median units and median seconds (medians: a step the machine's load slowed does not move
    them); neither cost negative."""
    m = _run_medians(units, seconds, runs)
    if len(m) < 2 or np.ptp(m["x"]) == 0:
        return 0.0, float(m["y"].sum() / max(m["x"].sum(), 1e-12))
    slope, intercept = np.polyfit(m["x"], m["y"], 1)
    if intercept < 0:
        return 0.0, float(m["y"].sum() / m["x"].sum())
    if slope < 0:
        return float(m["y"].median()), 0.0
    return float(intercept), float(slope)


def _run_medians(units, seconds, runs) -> pd.DataFrame:
    """Each run's median units (x) and seconds (y) per step."""
    p = pd.DataFrame({"x": np.asarray(units, float), "y": np.asarray(seconds, float), "run": np.asarray(runs)})
    return p.groupby("run")[["x", "y"]].median()


def _points(run, df, measured) -> pd.DataFrame:
    """A calibration run's steps past the warm-up: simulated units beside measured stage seconds."""
    from .loop import WARMUP_STEPS  # torch: imported when used, not with this module
    return pd.DataFrame({"run": run, "expanded": _expanded(df), "rows": df["input_nodes"].to_numpy(float),
                         **{k: measured[f"{k}_s"].to_numpy() for k in ("sample", "gather", "compute")}}
                        ).iloc[WARMUP_STEPS:]


def _fit_unit(units: dict, seconds, runs):
    """`_fit` against whichever unit explains the runs' medians best: (per step, per unit, the unit's name)."""
    best = None
    for name, x in units.items():
        c0, c1 = _fit(x, seconds, runs)
        m = _run_medians(x, seconds, runs)
        err = float(((c0 + c1 * m["x"] - m["y"]) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, c0, c1, name)
    return best[1:]


def calibrate(store, cfg, steps=24, cache=None, refresh=False) -> StepCosts:
    """Per-batch CPU costs of `cfg`'s model and sampler on this machine: after a warm-up, two short runs with
    every row in memory (`inmemory`, `steps` steps each, no evaluation but at the start), at the batch size
    and at a quarter of it, whose per-step stage seconds (steps.csv), against what the simulator counts for
    the same batches, give each stage's cost per step and per unit (`_fit`: through the runs' medians). The
    model's unit (`_fit_unit`) is chosen with a third run, HierBatching's (`_calibrate_loads`), whose batches,
    sampled inside a community, hold far fewer input rows per expanded node. Cached per store, model and
    settings."""
    from .simulate import simulate  # torch: imported when used, not with this module
    from .loop import WARMUP_STEPS  # torch: imported when used, not with this module
    from .train import train  # (as above)
    key, file = _calibration_key(store, cfg), cache_dir(cache) / "calibration.json"
    saved = load_cached(file)
    if key in saved and not refresh:
        return StepCosts(**saved[key])
    points = []
    with tempfile.TemporaryDirectory(prefix="oocgnn-calibrate-") as tmp:
        def run(b, k):
            return cfg.replace(store=str(store.path), policy="inmemory", epochs=k, max_steps=k, eval_every=0,
                               max_eval_nodes=64, out=str(Path(tmp) / f"run{b}"), progress=False, force=True,
                               checkpoint_every=0, resume="", target_acc=0.0, batch_size=b)
        train(run(cfg.batch_size, 3))          # warm-up: compiled kernels, thread pools, the page cache
        for b in sorted({cfg.batch_size, max(1, cfg.batch_size // 4)}):
            run_cfg = run(b, steps + WARMUP_STEPS)
            summary = train(run_cfg)
            df = simulate(store, make_plan(store, run_cfg), epochs=run_cfg.epochs, progress=False,
                          steps=summary["steps"])
            measured = pd.read_csv(Path(summary["run_dir"]) / "steps.csv")
            points.append(_points(b, df, measured))
        load_row_s, subgraph_s, grouped = _calibrate_loads(store, run(cfg.batch_size, steps + WARMUP_STEPS), cache)
    p = pd.concat(points, ignore_index=True)
    (s0, s1), (g0, g1) = _fit(p["expanded"], p["sample"], p["run"]), _fit(p["rows"], p["gather"], p["run"])
    q = pd.concat([p, grouped], ignore_index=True)
    c0, c1, unit = _fit_unit({"rows": q["rows"], "expanded": q["expanded"]}, q["compute"], q["run"])
    costs = StepCosts(s1, g1, c1, s0, g0, c0, load_row_s, subgraph_s, len(p), key, unit, _calibrate_buckets(store),
                      _calibrate_slot_rows(store), _calibrate_optimizer_step(store, cfg))
    saved[key] = asdict(costs)
    save_cached(file, saved)
    return costs


def _calibrate_loads(store, run_cfg, cache) -> tuple:
    """(processor seconds per loaded row, per node of an induced subgraph, the run's steps as calibration
    points) of residency changes: a short
    HierBatching run without pipelining, the loader thread's CPU time (`time.thread_time`: copying rows
    into place and the reads' system time, not the wait for the disk, which the rates cover) of its loads
    and of its subgraphs, over what the simulator counts it loaded and induced. (0, 0) on a store with
    too few parts to group."""
    from .simulate import simulate  # torch: imported when used, not with this module
    from .train import train  # torch: imported when used, not with this module
    if store.num_parts < 4:
        return 0.0, 0.0, pd.DataFrame()
    cfg = run_cfg.replace(policy="hierbatching", parts_per_megabatch=max(2, store.num_parts // 8), passes=1.0,
                          pipeline=False, memory_budget="1TB",
                          topology="memory" if store.task == "link" else "disk")   # a link store's: in memory
    summary = train(cfg)
    df = simulate(store, make_plan(store, cfg), epochs=cfg.epochs, progress=False, steps=summary["steps"])
    st = summary["stage_s"]
    rows, nodes = df["load_feature_rows"].sum(), _induced_nodes(df).sum()   # hierbatching induces
    measured = pd.read_csv(Path(summary["run_dir"]) / "steps.csv")
    return (st.get("bg_load_cpu", 0.0) / max(rows, 1), st.get("bg_subgraph_cpu", 0.0) / max(nodes, 1),
            _points("grouped", df, measured))


def _calibrate_optimizer_step(store, cfg, repeats=20) -> float:
    """Seconds of one Adam step over `cfg`'s model (every parameter with a gradient): the median of
    `repeats`, after two (its state allocated)."""
    import torch  # torch: imported when used, not with this module
    from .models import build_model  # torch: imported when used, not with this module
    if store.task == "link":            # the encoder and its decoder (`linktask`)
        from .linktask import build_link_model
        model = build_link_model(cfg, store.feat_dim)
    else:
        model = build_model(cfg.model, store.feat_dim, cfg.hidden, store.num_classes, cfg.layers, cfg.dropout)
    opt = Adam.of_config(model.parameters(), cfg)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    times = []
    for i in range(repeats + 2):
        t = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t)
    return float(np.median(times[2:]))


def _calibrate_buckets(store, repeats=3) -> float:
    """Processor seconds per edge of `buckets.buffer_csc` (MariusGNN's buffer subgraph, built from the held
    edge buckets rather than induced from adjacency lists): the median of `repeats` timed builds
    (`time.thread_time`, after one that compiles) over 4 partitions of random edges at the store's density
    on a quarter of its nodes (at most 2^20), each bucket's edges in source order as the bucket file holds them, no disk."""
    rng, p = np.random.default_rng(0), 4
    n = int(min(max(store.num_nodes // 4, p), 1 << 20))        # a buffer state: a quarter of the graph
    e = max(p * p, int(store.num_edges * n / max(store.num_nodes, 1)))
    bounds = np.linspace(0, n, p + 1).astype(np.int64)
    dtype = np.dtype(store.meta.get("index_dtype", "int32"))
    pairs = rng.integers(0, n, (e, 2))
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]       # a bucket's edges come in list (src) order
    part = np.searchsorted(bounds, pairs, side="right") - 1
    key = part[:, 0] * p + part[:, 1]
    held = {(i, j): pairs[key == i * p + j].astype(dtype) for i in range(p) for j in range(p)}
    fake = SimpleNamespace(bounds=bounds, dtype=dtype)
    buffer_csc(fake, range(p), held)
    seconds = []
    for _ in range(repeats):
        c = time.thread_time()
        buffer_csc(fake, range(p), held)
        seconds.append(time.thread_time() - c)
    return float(np.median(seconds)) / e


def _calibrate_slot_rows(store, nbytes=64 << 20, repeats=3) -> float:
    """Processor seconds per row of a MariusGNN buffer load (`buffer.PartitionBuffer._read`): a contiguous
    range of up to `nbytes` of feature rows read into one slot of a resident table (`buffer.read_into_slot`),
    timed with `time.thread_time` (the reads' system time and the copy, not the disk's wait); the median of
    `repeats` after one untimed round."""
    import torch  # torch: imported when used, not with this module
    from .buffer import read_into_slot  # torch: imported when used, not with this module
    n = int(max(1, min(store.num_nodes, nbytes // store.row_stride)))
    reader = store.reader("direct")
    rows = torch.empty((n, store.feat_dim), dtype=store.codec.torch_dtype)
    seconds = []
    try:
        for _ in range(repeats + 1):
            c = time.thread_time()
            read_into_slot(reader, rows, 0, 0, n, store.row_stride)
            seconds.append(time.thread_time() - c)
    finally:
        reader.close()
    return float(np.median(seconds[1:])) / n


# ---- the policies ----------------------------------------------------------------------------------
def phases(plan, df) -> np.ndarray:
    """Phase of each simulated batch: the chunk it was sampled ahead in, or the group of ranges loaded
    with it (a new phase where a batch's step loaded something), or one phase per batch."""
    if plan.lookahead:
        return (df["epoch"].to_numpy() * (1 << 32) + df["batch"].to_numpy() // plan.lookahead)
    loads = (df["load_pages"].to_numpy() > 0)
    return np.cumsum(loads | (np.arange(len(df)) == 0)) - 1


def _model_on_gpu(cfg) -> bool:
    import torch  # torch: imported when used, not with this module
    return cfg.device != "cpu" and torch.cuda.is_available()


def _model_cores(cfg) -> int:
    """Cores a CPU model's step keeps busy: its threads, at most the machine's. A background thread's
    `b` processor seconds take `b` core-seconds from that step, so delay it by `b / cores` (measured on
    2 cores: HierBatching's and MariusGNN's steps slowed by half their loader's CPU, not all of it)."""
    import torch  # torch: imported when used, not with this module
    return max(1, min(int(cfg.threads or torch.get_num_threads()), os.cpu_count() or 1))


def mmap_faults(store, plan, steps=None) -> np.ndarray:
    """Per batch, the 4 KiB feature pages an LRU page cache of the budget's size misses (mmap's faults)."""
    trace = record_trace(store, plan.schedule, plan.fanouts, epochs=1, seed=plan.seed, cache_dir=False)
    res = replay(trace, PageLRUCache.from_budget(plan.budget, store.row_bytes, store.num_nodes), per_iteration=True)
    pages = res.per_iteration["pages_read"].to_numpy()
    return pages[:steps] if steps is not None else pages


def predict(store, plan, rates: DiskRates, costs: StepCosts, steps=None, df=None) -> dict:
    """Predicted seconds of the first `steps` batches (default an epoch) of `plan`, and the parts.

    Returns `seconds` (the prediction, from a standing start), `epoch_s` (an epoch in the steady state,
    `_steady_epoch_s`: extrapolated from a window of `steps`), the totals of each stage (`sample`, `gather`, `compute`, `read`:
    random reads, `load`: residency changes and fetches), `fg`/`bg` totals and the I/O they come from."""
    from .simulate import simulate  # torch: imported when used, not with this module
    if df is None:
        df = simulate(store, plan, epochs=1, progress=False, steps=steps)
    cpu = costs.batch_seconds(df)
    if plan.reader == "mmap":
        faults = mmap_faults(store, plan, len(df))
        read = rates.seconds(faults, faults, depth="qd1")
    else:
        read = rates.seconds(df["feature_pages_read"], df["feature_requests"]) + \
            rates.seconds(df["neighbour_pages_read"], df["neighbour_requests"])
    load = rates.seconds(df["load_pages"], df["load_feature_requests"] + df["load_adjacency_requests"])
    read, load = np.asarray(read, float), np.asarray(load, float)
    load_cpu = costs.load_seconds(df, plan)
    sample, gather, compute = (np.asarray(cpu[k], float) for k in ("sample", "gather", "compute"))
    if plan.lookahead:         # sampled ahead in a thread; a macrobatch's union is read (and placed) there too
        ahead = plan.fetch_reads_ahead
        bg_io, bg_cpu = (load if ahead else 0.0), sample + (load_cpu if ahead else 0.0)
        fg = gather + compute + read + (0.0 if ahead else load + load_cpu)
    elif plan.pipeline:        # the next group loads (and its subgraph is induced) while this one trains
        bg_io, bg_cpu = load, load_cpu
        fg = sample + gather + compute + read
    else:
        bg_io, bg_cpu = 0.0, 0.0
        fg = sample + gather + compute + read + load + load_cpu
    bg = np.zeros(len(df)) + bg_io + bg_cpu
    if not _model_on_gpu(plan.cfg):     # the model's step keeps its cores busy: background work takes from them
        fg = fg + bg_cpu / _model_cores(plan.cfg)
    ph = phases(plan, df)
    frame = pd.DataFrame({"phase": ph, "fg": fg, "bg": bg})
    per = frame.groupby("phase", sort=False)[["fg", "bg"]].sum()
    f, b = per["fg"].to_numpy(), per["bg"].to_numpy()
    seconds = float(b[0] + np.maximum(f, np.append(b[1:], 0.0)).sum()) if len(per) else 0.0
    epoch_steps = sum(1 for e, _, _ in plan.schedule.steps(1))
    return {"policy": plan.name, "steps": len(df), "epoch_steps": epoch_steps, "seconds": seconds,
            "epoch_s": _steady_epoch_s(f, b, per.index, ph, epoch_steps, len(df)),
            "sample": float(sample.sum()), "gather": float(gather.sum()), "compute": float(compute.sum()),
            "read": float(read.sum()), "load": float(load.sum()), "load_cpu": float(load_cpu.sum()), "fg": float(f.sum()), "bg": float(b.sum()),
            "phases": len(per), "first_phase_steps": int((ph == per.index[0]).sum()) if len(per) else 0,
            "disk_bytes": int(df["feature_pages_read"].sum() + df["neighbour_pages_read"].sum()
                                                   + df["load_pages"].sum()) * PAGE,
            "exact_io": bool(plan.exact_io)}


def _steady_epoch_s(f, b, order, ph, epoch_steps, steps) -> float:
    """An epoch's seconds once a run is under way (what a second epoch takes): the pipeline carries over
    between epochs, so the first phase's background work hides behind the previous epoch's last phase
    (cyclic) instead of standing alone. For a window of an epoch (`steps` < `epoch_steps`), the phases it
    saw after its first, extrapolated at their rate: a window's start is not an epoch's steady state."""
    if not len(f):
        return 0.0
    if steps >= epoch_steps:
        return float(np.maximum(f, np.roll(b, -1)).sum())
    if len(f) == 1:
        return float(f[0]) * epoch_steps / max(1, steps)
    first = int((ph == order[0]).sum())                  # the window's first phase, and its batches
    rest = float(np.maximum(f[1:], np.append(b[2:], 0.0)).sum())
    return rest * epoch_steps / max(1, steps - first)


def check_prediction(predicted: dict, measured_epoch_s: float, tolerance=0.2) -> dict:
    """Predicted vs measured epoch seconds: their ratio and whether it is within ±tolerance."""
    if measured_epoch_s <= 0:
        raise UserError("a measured epoch time must be positive")
    ratio = predicted["epoch_s"] / measured_epoch_s
    return {"predicted_s": predicted["epoch_s"], "measured_s": measured_epoch_s, "ratio": ratio,
            "within": abs(ratio - 1) <= tolerance}
