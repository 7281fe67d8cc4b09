"""The executor: run a policy's plan for real, train the model, log accuracy against time.

The plan (`oocgnn.policies`) is what the simulator replays; the runtime (`oocgnn.runtime`)
interprets it: setup rows before the run, each step's residency change before its batch is
sampled (the shared walk `sampler.sampled_steps`), the batch's input rows gathered through the
resident rows and the readers, the model run through the plan's history stage (OUTRE §4.3).
This loop trains and evaluates. Simulated and executed I/O of the same run agree (a test).

Every run writes `config.json`, `log.csv` (one row per evaluation: training wall time
without evaluation, accuracy, bytes and requests read), `steps.csv` (one row per step: its
seconds and the reads made while it ran, background loads included) and `summary.json` (stage
timers, I/O, memory accounting, time to a target accuracy) to its run directory.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .config import TrainConfig
from .device import LossMeter, autocast, resolve_device
from .disttrain import train_distributed
from .errors import UserError
from .evaluation import LayerwiseEval
from .io import IOStats
from .mixing import mixing
from .models import build_model
from .policies import make_plan
from .rundir import LOG_COLUMNS, STEP_COLUMNS, RunDir, default_run_dir, resumed_config
from .runtime import Runtime
from .sampler import Sampler
from .store import open_store
from .units import format_size, peak_rss, reset_peak_rss

WARMUP_STEPS = 2


class _Timers:
    """Seconds per stage (sample, gather, compute, eval), accumulated."""

    def __init__(self):
        self.s = {}

    @contextlib.contextmanager
    def __call__(self, stage):
        t = time.perf_counter()
        yield
        self.s[stage] = self.s.get(stage, 0.0) + time.perf_counter() - t

    def timed(self, stage, fn):
        """`fn` with every call counted in `stage`."""
        def run(*args, **kw):
            with self(stage):
                return fn(*args, **kw)
        return run


def _seed_everything(seed: int):
    np.random.seed(seed)
    torch.manual_seed(seed)


def evaluate(model, sampler, gather, labels, nodes, batch_size, device="cpu", precision="fp32") -> float:
    """Accuracy of sampled mini-batch inference on `nodes` (features through `gather`, the model on
    `device`); batch i is sampled with the sampler's key (seed, 0, i), the same at every evaluation."""
    model.eval()
    correct = 0
    device = torch.device(device)
    with torch.no_grad():
        for i, lo in enumerate(range(0, len(nodes), batch_size)):
            input_nodes, output_nodes, blocks = sampler.sample(nodes[lo:lo + batch_size], 0, i)
            with autocast(device, precision):
                pred = model(blocks, gather(input_nodes).to(device)).argmax(1).cpu()
            correct += int((pred == labels[torch.from_numpy(output_nodes)]).sum())
    model.train()
    return correct / max(1, len(nodes))


def eval_budget(plan) -> int:
    """Bytes layer-wise evaluation may hold in RAM (the rest spills to a temporary file): what the plan
    leaves of the budget, since evaluation runs while the plan's residents are held; a baseline the
    budget does not bound (inmemory, mmap) evaluates within the budget itself."""
    if not plan.budgeted:
        return plan.budget
    return max(0, plan.budget - plan.resident_bytes())


def _next_loads(steps) -> list:
    """For each step index, the next later step that loads ranges (what a prefetcher loads)."""
    out, nxt = [None] * len(steps), None
    for i in range(len(steps) - 1, -1, -1):
        out[i] = nxt
        if steps[i][2].enter_ranges:
            nxt = steps[i][2]
    return out


def _position(runtime, steps, start):
    """Bring the runtime's residency to what it is before step `start`: load that step's group (in the
    foreground: the next group then loads as an uninterrupted run's would, its reads counted alike)."""
    j = next((k for k in range(start - 1, -1, -1) if steps[k][2].enter_ranges), None)
    if j is not None and not steps[start][2].enter_ranges:
        runtime.before(steps[j][2], None)


def train(cfg: TrainConfig) -> dict:
    """Run one training job; returns the summary (also written to the run directory).

    With `cfg.checkpoint_every` it saves the model, the optimiser, the random state and the policy's
    state every so many steps; `cfg.resume` (a run directory) continues such a run from its last
    checkpoint, with the configuration it was started with, and ends with the same losses as an
    uninterrupted run."""
    if cfg.distributed:                            # one rank of a torchrun job (`oocgnn.disttrain`)
        return train_distributed(cfg)
    t_enter = time.perf_counter()
    reset_peak_rss()                               # this run's peak, not an earlier run's in this process
    if cfg.resume:
        run = RunDir.create(cfg.resume, resume=True)
        cfg = resumed_config(cfg, run)
    else:
        run = RunDir.create(Path(cfg.out) if cfg.out else default_run_dir(cfg), force=cfg.force)
    device = resolve_device(cfg.device)            # before any work: a missing GPU is one line
    store = open_store(cfg.store)
    for split in ("train", "val"):
        if not len(getattr(store, f"{split}_idx")):
            raise UserError(f"{store.path}: the {split} split is empty; a run needs training and validation nodes")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    _seed_everything(cfg.seed)
    plan = make_plan(store, cfg)
    plan.check_machine()                           # what cannot be resident here is refused before any read
    mix = mixing(plan)                             # from labels and the plan's groups: no I/O
    if mix["warning"]:
        print(f"oocgnn: warning: {plan.name}: {mix['warning']}", file=sys.stderr)
    if not plan.budgeted and plan.resident_bytes() > plan.budget:
        print(f"oocgnn: note: {plan.name} keeps {format_size(plan.resident_bytes())} resident, more than the "
              f"{format_size(plan.budget)} budget (it is a baseline: the budget does not bound it)", file=sys.stderr)
    runtime = Runtime(store, plan, device)
    try:
        return _train(cfg, run, store, plan, runtime, t_enter, device, mix)
    finally:
        runtime.close()


RUN_FACTS = ("store_meta", "policy_memory", "schedule", "host", "run_id", "memory_budget_bytes")  # config.json, not settings


def _train(cfg, run, store, plan, runtime, t_enter, device, mix) -> dict:
    sampler = runtime.sampler
    if not cfg.resume:
        run.write_json("config.json", {
            **cfg.to_dict(), "store_meta": {k: store.meta[k] for k in
                                            ("name", "num_nodes", "num_edges", "feat_dim", "num_parts")},
            "policy_memory": plan.memory(), "schedule": repr(plan.schedule), "topology": plan.topology,
            "host": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                     "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                     "loadavg": open("/proc/loadavg").read().split()[:3]}})

    labels = torch.from_numpy(store.compact_labels())
    model = build_model(cfg.model, store.feat_dim, cfg.hidden, store.num_classes, cfg.layers, cfg.dropout)
    model.to(device)                               # initialised on the CPU: the same weights on any device
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = LossMeter(device)                     # on a GPU, read one step late (no sync per step)
    eval_sets = {}
    for split, ids in (("val", store.val_idx), ("test", store.test_idx)):
        if cfg.max_eval_nodes and len(ids) > cfg.max_eval_nodes:
            ids = np.sort(np.random.default_rng(cfg.seed + 1).choice(ids, cfg.max_eval_nodes, replace=False))
        eval_sets[split] = ids

    steps = list(plan.steps(cfg.epochs))          # deterministic; listed once for lookahead
    epoch_steps = sum(1 for e, _, _ in steps if e == 0)
    truncated = 0 < cfg.max_steps < len(steps)
    if truncated:
        steps = steps[:cfg.max_steps]
    next_load = _next_loads(steps)
    timers, rows, step_rows = _Timers(), [], []
    st = {"train_s": 0.0, "loss_sum": 0.0, "loss_n": 0}
    excluded = IOStats()                           # reads of the setup, of evaluation, of a resume's reload
    carried, carried_topology = IOStats(), IOStats()   # what a resumed run read before its checkpoint

    def add_losses(known):
        for j, ep, value in known:
            if not np.isfinite(value):
                raise UserError(f"training diverged at step {j} (epoch {ep}): the loss is {value}; "
                                f"lower --lr (now {cfg.lr}) or check the features")
            st["loss_sum"], st["loss_n"] = st["loss_sum"] + value, st["loss_n"] + 1

    def log_eval(epoch, step):
        add_losses(losses.flush())
        before = runtime.io()
        with timers("eval"):
            if layerwise is not None:              # its reads: its own reader, never the run's
                accs = layerwise.accuracy(model, labels, eval_sets, device, cfg.precision)
            else:
                accs = {s: evaluate(model, eval_sampler, runtime.eval_rows, labels, ids, cfg.eval_batch_size,
                                    device, cfg.precision)
                        for s, ids in eval_sets.items()}
        if layerwise is None and runtime.eval_reader is None:   # else a background load may be what was read
            excluded.__iadd__(runtime.io() - before)
        io = runtime.io() - excluded + carried
        rows.append({"wall_s": round(st["train_s"], 4), "epoch": epoch, "step": step,
                     "train_loss": st["loss_sum"] / st["loss_n"] if st["loss_n"] else float("nan"),
                     "val_acc": accs["val"], "test_acc": accs["test"],
                     "bytes_read": io.bytes_read, "requests": io.requests, "peak_rss": peak_rss()})
        st["loss_sum"], st["loss_n"] = 0.0, 0
        run.write_csv("log.csv", pd.DataFrame(rows, columns=LOG_COLUMNS))
        return accs

    def checkpoint(step):
        add_losses(losses.flush())
        ahead, ahead_lists = runtime.loader.pending_io()   # a resumed run reads that group again
        run.save_checkpoint({
            "step": step, "model": model.state_dict(), "opt": opt.state_dict(),
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "history": runtime.state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "rows": rows, "step_rows": step_rows, "counters": dict(st), "timers": dict(timers.s),
            "bg_timers": dict(runtime.timers), "io": (runtime.io() - excluded + carried - ahead).as_dict(),
            "topology_io": (runtime.topology_io() - setup_topology_io + carried_topology - ahead_lists).as_dict()})

    start = 0
    bar = tqdm(total=len(steps), desc=cfg.policy, unit="step", disable=not cfg.progress, leave=False)
    with runtime.memory_cap():
        runtime.setup()                            # run-long residents: outside the timed epochs
        eval_fanouts = [int(f) for f in cfg.eval_fanouts.split(",")]
        eval_sampler = Sampler(runtime.eval_topology, eval_fanouts, cfg.seed + 7)
        layerwise = None if cfg.eval_mode == "batch" or cfg.model == "mlp" else LayerwiseEval(
            eval_sampler, eval_fanouts, np.concatenate(list(eval_sets.values())), store.feat_dim,
            runtime.stream_rows, eval_budget(plan))
        if cfg.resume:
            state = run.load_checkpoint()
            start = state["step"]
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            runtime.load_state(state["history"])
            rows[:], step_rows[:] = state["rows"], state["step_rows"]
            st.update(state["counters"])
            timers.s.update(state["timers"])
            runtime.timers.update(state["bg_timers"])
            carried, carried_topology = IOStats(**state["io"]), IOStats(**state["topology_io"])
            if start < len(steps):
                _position(runtime, steps, start)
            torch.set_rng_state(state["torch_rng"])
            if device.type == "cuda" and state.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(state["cuda_rng"], device)
            np.random.set_state(state["numpy_rng"])
            bar.update(start)
        setup_io, setup_topology_io = runtime.io(), runtime.topology_io()
        excluded += setup_io
        if not cfg.resume:
            log_eval(0, 0)                         # accuracy at time 0; also part of the warm-up
        elif start >= WARMUP_STEPS:
            runtime.end_warmup()
        setup_s = time.perf_counter() - t_enter
        walk = runtime.walk(steps, timers.timed("sample", sampler.sample),
                            before=timers.timed("load", lambda i, step: runtime.before(step, next_load[i])),
                            start=start)
        io0, t0, stage0 = runtime.io(), time.perf_counter(), dict(timers.s)
        for i, epoch, b, step, sample in walk:     # loads the step's ranges, then samples its batch
            with timers("gather"):
                x, ctx = runtime.inputs(sample, i)
            with timers("h2d"):                    # a no-op on the CPU; on a GPU, queued on a side stream
                x, y = runtime.to_device([x, labels[torch.from_numpy(sample.output_nodes)].long()], ctx)
            with timers("compute"):
                with autocast(device, cfg.precision):
                    logits = runtime.forward(model, ctx, x, i)
                loss = F.cross_entropy(logits.float(), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                add_losses(losses.push(i, epoch, loss))   # a GPU waits here for the previous step
            del x, y, ctx, sample
            step_s = time.perf_counter() - t0
            st["train_s"] += step_s
            sio = runtime.io() - io0
            spent = {k: timers.s.get(k, 0.0) - stage0.get(k, 0.0) for k in ("sample", "gather", "h2d", "compute")}
            step_rows.append((epoch, b, step_s, sio.bytes_read, sio.pages, sio.requests, sio.seconds,
                              spent["sample"], spent["gather"], spent["h2d"] + spent["compute"]))
            bar.update()
            if i + 1 == WARMUP_STEPS:
                runtime.end_warmup()               # e.g. mmap: cap at budget + measured working set
            last_of_epoch = i + 1 == len(steps) or steps[i + 1][0] != epoch
            if (cfg.eval_every and (i + 1) % cfg.eval_every == 0) or (not cfg.eval_every and last_of_epoch) \
                    or i + 1 == len(steps):
                accs = log_eval(epoch, i + 1)
                bar.set_postfix(val=f"{accs['val']:.3f}", loss=f"{rows[-1]['train_loss']:.3f}")
            if cfg.checkpoint_every and (i + 1) % cfg.checkpoint_every == 0 and i + 1 < len(steps):
                checkpoint(i + 1)
            steps[i] = next_load[i] = None         # a finished group's visible set can go
            io0, t0, stage0 = runtime.io(), time.perf_counter(), dict(timers.s)
        if len(steps) < WARMUP_STEPS:
            runtime.end_warmup()
        add_losses(losses.flush())
    bar.close()
    cap_record = runtime.cap_record()
    io = runtime.io() - excluded + carried
    topology_io = runtime.topology_io() - setup_topology_io + carried_topology
    reader = type(runtime.cached.reader).__name__

    log = pd.DataFrame(rows, columns=LOG_COLUMNS)
    run.write_csv("steps.csv", pd.DataFrame(step_rows, columns=STEP_COLUMNS))
    # a run cut by max_steps is extrapolated to a whole epoch at its mean step rate
    train_s = st["train_s"]
    epochs_run = len(steps) / max(1, epoch_steps) if truncated else cfg.epochs
    best = int(log["val_acc"].idxmax())
    reached = log[log["val_acc"] >= cfg.target_acc] if cfg.target_acc else log.iloc[:0]
    stage = {k: round(v, 3) for k, v in {**timers.s, **{f"bg_{k}": v for k, v in runtime.timers.items()}}.items()}
    summary = {
        "policy": cfg.policy, "model": cfg.model, "store": str(store.path), "seed": cfg.seed,
        "epochs": cfg.epochs, "steps": len(steps), "epoch_steps": epoch_steps, "resumed_at": start,
        "train_s": round(train_s, 3), "epoch_s": round(train_s / epochs_run, 3),
        "setup_s": round(setup_s, 3), "stage_s": stage,
        "best_val_acc": float(log["val_acc"][best]), "test_at_best_val": float(log["test_acc"][best]),
        "final_val_acc": float(log["val_acc"].iloc[-1]), "final_test_acc": float(log["test_acc"].iloc[-1]),
        "target_acc": cfg.target_acc,
        "time_to_target_s": float(reached["wall_s"].iloc[0]) if len(reached) else None,
        "io": {**io.as_dict(), "reader": reader},
        "io_setup": setup_io.as_dict(),
        "topology": plan.topology, "topology_io": topology_io.as_dict(),
        "topology_io_setup": setup_topology_io.as_dict(),
        "io_excluded": (excluded - setup_io).as_dict(),
        "memory": plan.memory(), "resident_bytes": plan.resident_bytes(),
        "memory_budget": cfg.memory_budget_bytes, "memory_cap": cap_record, "peak_rss": peak_rss(),
        "history_hits": runtime.history_hits, "mixing": mix,
        "eval_mode": "layerwise" if layerwise is not None else "batch",
        "eval_memory": layerwise.memory() if layerwise is not None else None,
        "eval_budget": layerwise.budget if layerwise is not None else None,
        "eval_spilled": layerwise.spilled if layerwise is not None else None,
        "device": str(device), "precision": cfg.precision,
        "h2d": {"bytes": runtime.h2d.bytes, "pinned_bytes": runtime.h2d.pinned_bytes},
    }
    summary.update(plan.describe())              # the policy's own knobs (HierBatching's rule, a buffer, a split, ...)
    run.write_json("summary.json", summary)
    return {**summary, "run_dir": str(run.path), "log": log}


def train_fresh(cfg: TrainConfig) -> dict:
    """`train(cfg)` in a fresh interpreter: its peak RSS (and an mmap run's cgroup) then belong to this
    run alone, not to what the calling process did before (notebooks, sweeps)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(train, cfg).result()
        except BrokenProcessPool:                  # a Pool would wait for ever on the lost task
            raise UserError(f"the process training {cfg.policy} died (killed: by its memory cgroup's OOM killer "
                            f"if the run was capped, see `dmesg`)") from None
