"""The training loop every run shares: one process (`train.train`), or each rank of a torchrun job.

It walks the plan's steps through the runtime (`runtime.Runtime.walk`: each step's residency change,
then its batch sampled), gathers the batch's rows, runs the model through the plan's history stage,
takes the task's loss (`nodetask.NodeTask`: cross-entropy on the seeds' labels; `linktask.LinkTask`: edges against
their negatives), and does what every run does around that: evaluation, `log.csv`/`steps.csv`/`summary.json`,
checkpoints and their resume, stage timers. What differs between one process and a rank is its
`Ranks`: the collectives (gradients averaged after backward, evaluation's confusion counts and log totals
summed, its binary scores and every rank's record gathered) and what it owns (its evaluation nodes); one
process's are identities.

Ranks step in lockstep: each epoch of a rank is padded with empty steps (zero gradients, averaged with
the others') to the most steps any rank has in that epoch (BatchGNN §3 runs ranks alike).
"""
from __future__ import annotations

import contextlib
import os
import platform
import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import optsteps
from .adam import Adam
from .device import LossMeter, autocast, cuda_host_memory
from .errors import UserError
from .io import IOStats
from .metrics import summary_keys
from .nodetask import NodeTask, SampledEvaluation
from .rundir import EVAL_LOG_COLUMNS, STEP_COLUMNS
from .units import peak_rss, trim_heap

WARMUP_STEPS = 2
RANK_STATE = ("history", "torch_rng", "numpy_rng", "cuda_rng", "step_rows", "counters", "timers", "bg_timers",
              "io", "topology_io", "grads")      # what a checkpoint keeps of each rank (the rest is the same on every rank)


class Ranks:
    """The ranks a loop runs among; this one is a single process, whose collectives are identities
    (`disttrain.TorchRanks`: the ranks of a torchrun job)."""
    rank, world = 0, 1
    distributed = False

    def owns(self, ids: np.ndarray) -> np.ndarray:
        """The nodes of `ids` this rank evaluates."""
        return ids

    def owns_edges(self, edges: np.ndarray) -> np.ndarray:
        """bool [M]: which of the link edges `edges` [M, 2] this rank evaluates."""
        return np.ones(len(edges), dtype=bool)

    def average_gradients(self, model):
        """After backward: every parameter's gradient averaged over the ranks."""

    def sum(self, values: list) -> list:
        return list(values)

    def max(self, values: list) -> list:
        return list(values)

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order."""
        return [obj]

    @contextlib.contextmanager
    def one_at_a_time(self):
        """Rank 0 runs the block first, the others after it (what it writes, they find written)."""
        yield


class Timers:
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


def seed_everything(seed: int):
    np.random.seed(seed)
    torch.manual_seed(seed)


def _next_loads(steps) -> list:
    """For each step index, the next later step that loads ranges (what a prefetcher loads)."""
    out, nxt = [None] * len(steps), None
    for i in range(len(steps) - 1, -1, -1):
        out[i] = nxt
        if steps[i][2].enter_ranges:
            nxt = steps[i][2]
    return out


def _position(runtime, steps, start):
    """Bring the runtime's residency to what it is before step `start`: load the group of step start − 1 (in
    the foreground, excluded from the run's reads), also when step `start` opens a group: a partition buffer's
    next state enters only the partitions it lacks, so the uninterrupted run's reads are counted alike."""
    j = next((k for k in range(start - 1, -1, -1) if steps[k][2].enter_ranges), None)
    if j is not None:
        runtime.before(steps[j][2], None)


def _slots(steps, epochs, ranks) -> list:
    """The run's steps in order: each of this rank's step indices, and None for the empty steps that pad
    an epoch to the most steps a rank has in it (one process: none)."""
    mine = np.bincount([e for e, _, _ in steps], minlength=epochs).tolist()
    most = ranks.max(mine)
    out, j = [], 0
    for e in range(epochs):
        out += [(e, i) for i in range(j, j + mine[e])] + [(e, None)] * (int(most[e]) - mine[e])
        j += mine[e]
    return out


def run_loop(cfg, run, store, plan, runtime, t_enter, device, mix, ranks=None, facts=None,
             evaluation=SampledEvaluation) -> dict:
    """Train `plan` through `runtime`; returns the summary (rank 0 writes the run directory). `facts`:
    more of config.json (a distributed run's world and owners); `evaluation`: how the rank evaluates its
    nodes (made after the setup: `SampledEvaluation`'s arguments). The store's task (`NodeTask`, or
    `linktask.LinkTask` on a link store, whose evaluation is its own) gives the model, loss and metrics."""
    ranks = ranks or Ranks()
    writes = ranks.rank == 0
    sampler = runtime.sampler
    if not cfg.resume and writes:
        run.write_json("config.json", {
            **cfg.to_dict(), "store_meta": {k: store.meta.get(k) for k in
                                            ("name", "num_nodes", "num_edges", "feat_dim", "num_parts", "checksum")},
            "policy_memory": plan.memory(), "schedule": repr(plan.schedule), "topology_used": plan.topology,
            "host": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                     "device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                     "loadavg": open("/proc/loadavg").read().split()[:3]}, **(facts or {})})

    cuda_memory = cuda_host_memory(device)         # CUDA's own host memory (measured at the process's start)
    if getattr(store, "task", "node") == "link":
        from .linktask import LinkTask
        task = LinkTask(cfg, store, runtime, ranks)
    else:
        task = NodeTask(cfg, store, runtime, ranks)
    model = task.build_model()
    model.to(device)                               # initialised on the CPU: the same weights on any device
    opt = Adam.of_config(model.parameters(), cfg)
    losses = LossMeter(device)                     # on a GPU, read one step late (no sync per step)
    log_columns = task.columns + EVAL_LOG_COLUMNS + list(runtime.log_fields())

    steps = list(plan.steps(cfg.epochs))          # deterministic; listed once for lookahead
    slots = _slots(steps, cfg.epochs, ranks)      # one process: (epoch, i) of every step
    epoch_steps = sum(1 for e, _ in slots if e == 0)
    truncated = 0 < cfg.max_steps < len(slots)
    if truncated:
        slots = slots[:cfg.max_steps]
        steps = steps[:sum(1 for _, i in slots if i is not None)]
    next_load = _next_loads(steps)
    plan_accumulates, plan_target = getattr(plan, "accumulate", False), getattr(plan, "step_target", 1)
    closes, weights = optsteps.closes_and_weights(        # optimizer steps: after which slots, and each batch's share
        [None if i is None else steps[i][2].update for _, i in slots],
        [0 if i is None else steps[i][2].examples for _, i in slots], ranks.max)
    timers, rows, step_rows = Timers(), [], []
    st = {"train_s": 0.0, "loss_sum": 0.0, "loss_n": 0}
    excluded = IOStats()                           # reads of the setup, of evaluation, of a resume's reload
    carried, carried_topology = IOStats(), IOStats()   # what a resumed run read before its checkpoint

    def add_losses(known):
        for j, ep, value in known:
            if not np.isfinite(value):
                raise UserError(f"training diverged at step {j} (epoch {ep}): the loss is {value}; "
                                f"lower --lr (now {cfg.lr}) or check the features")
            st["loss_sum"], st["loss_n"] = st["loss_sum"] + value, st["loss_n"] + 1

    def eval_io():
        """Evaluation's reads so far, features and lists (its own readers', or what it read through the run's)."""
        rows_io, lists_io = runtime.eval_io()
        return (rows_io if not evaluator.reads_in_run else excluded - setup_io) + lists_io

    def settle():
        """Wait for the load running ahead (a mega-batch's or a state's), so that a row counts every load issued
        so far whatever the disk's speed; the wait is training's, as the next load would have waited. With none
        running there is nothing to time (the row at step 0 of a policy without loads stays at 0 s)."""
        if runtime.loader.pending is None:
            return
        t = time.perf_counter()
        with timers("load"):
            runtime.loader.pending_io()
        st["train_s"] += time.perf_counter() - t

    def log_eval(epoch, step):
        add_losses(losses.flush())
        settle()
        before = runtime.io()
        with timers("eval"):
            got = task.evaluate(evaluator, model)
            trim_heap()                            # its blocks' pieces: not left in the RSS under the steps
        if evaluator.reads_in_run:                 # else a background load may be what was read
            excluded.__iadd__(runtime.io() - before)
        io = runtime.io() - excluded + carried
        ev = eval_io()
        more = runtime.log_fields()                # e.g. the rows a rank received
        loss_sum, loss_n, bytes_read, requests, eval_bytes, eval_requests, *more_sums = ranks.sum(
            [st["loss_sum"], st["loss_n"], io.bytes_read, io.requests, ev.bytes_read, ev.requests, *more.values()])
        wall_s, rss = ranks.max([st["train_s"], peak_rss()])
        rows.append({"wall_s": round(wall_s, 4), "epoch": epoch, "step": step,
                     "train_loss": loss_sum / loss_n if loss_n else float("nan"),
                     **{f"{split}_{m}": got[split][m] for split in ("val", "test") for m in task.metrics},
                     "bytes_read": int(bytes_read), "requests": int(requests), "peak_rss": int(rss),
                     "eval_bytes_read": int(eval_bytes), "eval_requests": int(eval_requests),
                     **{k: int(v) for k, v in zip(more, more_sums)}})
        st["loss_sum"], st["loss_n"] = 0.0, 0
        if writes:
            run.write_csv("log.csv", pd.DataFrame(rows, columns=log_columns))
        return got

    def checkpoint(step):
        add_losses(losses.flush())
        ahead, ahead_lists = runtime.loader.pending_io()   # a resumed run reads that group again
        mine = {"history": runtime.state(), "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                "step_rows": step_rows, "counters": dict(st), "timers": dict(timers.s),
                "bg_timers": dict(runtime.timers), "io": (runtime.io() - excluded + carried - ahead).as_dict(),
                "topology_io": (runtime.topology_io() - setup_topology_io + carried_topology - ahead_lists).as_dict(),
                "grads": [None if p.grad is None else p.grad.cpu() for p in model.parameters()]}   # a step under way
        every = ranks.gather(mine)
        if writes:
            run.save_checkpoint({"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "rows": rows,
                                 **(mine if not ranks.distributed else {"ranks": every})})

    def update():
        """The optimizer step after the last mini-batch it accumulates (`optsteps`): the gradients averaged
        over the ranks (a rank without a batch in it gives zeros), applied, cleared."""
        ranks.average_gradients(model)
        opt.step()
        opt.zero_grad()

    start = real_start = 0
    bar = tqdm(total=len(slots), desc=cfg.policy, unit="step", disable=not cfg.progress, leave=False)
    with runtime.memory_cap():
        runtime.setup()                            # run-long residents: outside the timed epochs
        evaluator = task.evaluator(evaluation, plan, runtime, device)
        trim_heap()                                # the setup's transients (profiles, chunks read)
        if cfg.resume:
            state = run.load_checkpoint()
            start = state["step"]
            real_start = sum(1 for _, i in slots[:start] if i is not None)
            mine = state if not ranks.distributed else state["ranks"][ranks.rank]
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            for p, grad in zip(model.parameters(), mine.get("grads") or []):
                p.grad = None if grad is None else grad.to(device)
            runtime.load_state(mine["history"])
            rows[:], step_rows[:] = state["rows"], mine["step_rows"]
            st.update(mine["counters"])
            timers.s.update(mine["timers"])
            runtime.timers.update(mine["bg_timers"])
            carried, carried_topology = IOStats(**mine["io"]), IOStats(**mine["topology_io"])
            if real_start < len(steps):
                _position(runtime, steps, real_start)
            torch.set_rng_state(mine["torch_rng"])
            if device.type == "cuda" and mine.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(mine["cuda_rng"], device)
            np.random.set_state(mine["numpy_rng"])
            bar.update(start)
        setup_io, setup_topology_io = runtime.io(), runtime.topology_io()
        excluded += setup_io
        if not cfg.resume:
            log_eval(0, 0)                         # accuracy at time 0; also part of the warm-up
        elif real_start >= WARMUP_STEPS:
            runtime.end_warmup()
        setup_s = time.perf_counter() - t_enter
        walk = iter(runtime.walk(steps, timers.timed("sample", sampler.sample),
                                 before=timers.timed("load", lambda i, step: runtime.before(step, next_load[i])),
                                 start=real_start))
        io0, t0, stage0 = runtime.io(), time.perf_counter(), dict(timers.s)
        for g in range(start, len(slots)):
            epoch, i = slots[g]
            if i is not None:
                i, epoch, b, step, sample = next(walk)   # loads the step's ranges, then samples its batch
            if i is None or not len(sample.output_nodes):   # padding, or a rank's empty share of a batch
                if closes[g]:
                    with timers("compute"):
                        update()
            else:
                with timers("gather"):
                    x, ctx = runtime.inputs(sample, step.update)
                with timers("h2d"):                # a no-op on the CPU; on a GPU, queued on a side stream
                    x, *y = runtime.to_device([x, *task.targets(step, sample)], ctx)
                with timers("compute"):
                    with autocast(device, cfg.precision):
                        out = runtime.forward(model, ctx, x, step.update)   # histories age per update
                    loss = task.loss(model, out, *y)
                    (loss if weights[g] == 1.0 else loss * weights[g]).backward()   # the step's mean loss
                    if closes[g]:
                        update()
                    add_losses(losses.push(i, epoch, loss))   # a GPU waits here for the previous step
                    runtime.h2d.step_done()
                del x, y, ctx, sample, out
            step_s = time.perf_counter() - t0
            st["train_s"] += step_s
            if i is not None:
                sio = runtime.io() - io0
                spent = {k: timers.s.get(k, 0.0) - stage0.get(k, 0.0) for k in ("sample", "gather", "h2d", "compute")}
                step_rows.append((epoch, b, step_s, sio.bytes_read, sio.pages, sio.requests, sio.seconds,
                                  spent["sample"], spent["gather"], spent["h2d"] + spent["compute"]))
            bar.update()
            if i is not None and i + 1 == WARMUP_STEPS:
                runtime.end_warmup()               # e.g. mmap: cap at budget + measured working set
            last_of_epoch = g + 1 == len(slots) or slots[g + 1][0] != epoch
            if (cfg.eval_every and (g + 1) % cfg.eval_every == 0) or (not cfg.eval_every and last_of_epoch) \
                    or g + 1 == len(slots):
                got = log_eval(epoch, g + 1)
                bar.set_postfix(val=f"{got['val'][cfg.target_metric]:.3f}", loss=f"{rows[-1]['train_loss']:.3f}")
            if cfg.checkpoint_every and (g + 1) % cfg.checkpoint_every == 0 and g + 1 < len(slots):
                checkpoint(g + 1)
            if i is not None:
                steps[i] = next_load[i] = None     # a finished group's visible set can go
            io0, t0, stage0 = runtime.io(), time.perf_counter(), dict(timers.s)
        for _ in walk:                             # (none left: the walk ends with its last step)
            raise AssertionError("the runtime walked more steps than the run has")
        if len(steps) < WARMUP_STEPS:
            runtime.end_warmup()
        add_losses(losses.flush())
    bar.close()
    cap_record = runtime.cap_record()
    eval_rows, eval_lists = runtime.eval_io()
    io = runtime.io() - excluded + carried
    topology_io = runtime.topology_io() - setup_topology_io + carried_topology
    reader = type(runtime.cached.reader).__name__

    log = pd.DataFrame(rows, columns=log_columns)
    if writes:
        run.write_csv("steps.csv", pd.DataFrame(step_rows, columns=STEP_COLUMNS))
    # a run cut by max_steps is extrapolated to a whole epoch at its mean step rate
    train_s = st["train_s"]
    epochs_run = len(slots) / max(1, epoch_steps) if truncated else cfg.epochs
    target = log[f"val_{cfg.target_metric}"]     # a validation split of one class has no AUC: then accuracy's
    best = int((target if target.notna().any() else log[f"val_{task.primary}"]).idxmax())
    reached = log[target >= cfg.target_acc] if cfg.target_acc else log.iloc[:0]
    stage = {k: round(v, 3) for k, v in {**timers.s, **{f"bg_{k}": v for k, v in runtime.timers.items()}}.items()}
    summary = {
        "policy": cfg.policy, "model": cfg.model, "store": str(store.path), "seed": cfg.seed,
        "epochs": cfg.epochs, "steps": len(slots), "epoch_steps": epoch_steps, "resumed_at": start,
        "train_s": round(train_s, 3), "epoch_s": round(train_s / epochs_run, 3),
        "setup_s": round(setup_s, 3), "stage_s": stage,
        # each metric's best validation value, and its test value where the target metric's validation peaked
        **{k: v for m in task.metrics for k, v in zip(summary_keys(m), (_metric(log[f"val_{m}"].max()),
                                                                         _metric(log[f"test_{m}"][best])))},
        f"final_val_{task.primary}": float(log[f"val_{task.primary}"].iloc[-1]),
        f"final_test_{task.primary}": _metric(log[f"test_{task.primary}"].iloc[-1]),
        "target_metric": cfg.target_metric, "target_acc": cfg.target_acc,
        "time_to_target_s": float(reached["wall_s"].iloc[0]) if len(reached) else None,
        "io": {**io.as_dict(), "reader": reader},
        # pages moved per useful byte: a scattered row costs its 4 KiB page (issue 38); 1.0 for whole pages
        "read_amplification": round(io.bytes_read / io.bytes_requested, 3) if io.bytes_requested else None,
        "feature_dtype": getattr(store, "feature_dtype", "float32"),
        "io_setup": setup_io.as_dict(),
        "topology": plan.topology, "topology_io": topology_io.as_dict(),
        "topology_io_setup": setup_topology_io.as_dict(),
        "io_excluded": (excluded - setup_io).as_dict(),
        "io_eval": (eval_rows if not evaluator.reads_in_run else excluded - setup_io).as_dict(),
        "topology_io_eval": eval_lists.as_dict(),     # evaluation's reads, beside the run's (not in them)
        "optimizer_steps": {"accumulate": bool(plan_accumulates), "target": int(plan_target),
                            "per_epoch": sum(1 for g, (e, _) in enumerate(slots) if e == 0 and closes[g]),
                            "total": sum(closes)},
        "memory": plan.memory(), "resident_bytes": plan.resident_bytes(),
        "memory_budget": cfg.memory_budget_bytes, "memory_cap": cap_record, "peak_rss": peak_rss(),
        "cuda_host_memory": cuda_memory,
        "history_hits": runtime.history_hits, "mixing": mix,
        **evaluator.describe(),
        "device": str(device), "precision": cfg.precision,
        "h2d": {"bytes": runtime.h2d.bytes, "pinned_bytes": runtime.h2d.pinned_bytes, **runtime.h2d.timing()},
    }
    summary.update(plan.describe())              # the policy's own knobs (HierBatching's rule, a buffer, a split, ...)
    if ranks.distributed:
        summary.update(_ranks_summary(summary, ranks, runtime, steps, epochs_run))
    if writes:
        run.write_json("summary.json", summary)
    return {**summary, "run_dir": str(run.path) if writes else "", "log": log}


def _metric(value):
    """A metric for summary.json: None where it has no value (an empty split), not NaN."""
    return None if np.isnan(value) else float(value)


def _ranks_summary(summary, ranks, runtime, steps, epochs_run) -> dict:
    """A distributed run's summary: every rank's steps, I/O, time and peak (and what its runtime adds);
    I/O totals over the ranks."""
    keys = ("io", "io_setup", "topology_io", "topology_io_setup", "io_excluded", "train_s", "peak_rss",
            "memory", "resident_bytes", "history_hits", "stage_s", "memory_cap")
    every = ranks.gather({"rank": ranks.rank, "own_steps": len(steps), **{k: summary[k] for k in keys},
                          **runtime.record()})
    total = {k: {f: sum(r[k][f] for r in every) for f in every[0][k] if f != "reader"}
             for k in ("io", "topology_io", "io_setup", "topology_io_setup", "io_excluded")}
    total["io"]["reader"] = summary["io"]["reader"]
    train_s = max(r["train_s"] for r in every)
    device = ranks.device
    return {**total, "distributed": True, "world": ranks.world, "ranks": every, "train_s": train_s,
            "epoch_s": round(train_s / epochs_run, 3), "peak_rss": max(r["peak_rss"] for r in every),
            "backend": "gloo" if ranks.grads is None else "gloo (exchanges), nccl (gradients)",
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            **runtime.summarize(every)}
