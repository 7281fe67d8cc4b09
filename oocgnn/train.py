"""The executor: run a policy's plan for real, train the model, log accuracy against time.

The plan (`oocgnn.policies`) is what the simulator replays; the runtime (`oocgnn.runtime`)
interprets it: setup rows before the run, each step's residency change before its batch is
sampled (the shared walk `sampler.sampled_steps`), the batch's input rows gathered through the
resident rows and the readers, the model run through the plan's history stage (OUTRE §4.3) — the
loop every run shares (`oocgnn.loop`). Simulated and executed I/O of the same run agree (a test).

Every run writes `config.json`, `log.csv` (one row per evaluation: training wall time
without evaluation, accuracy, macro-F1 and ROC-AUC (`oocgnn.metrics`), bytes and requests read),
`steps.csv` (one row per step: its seconds and the reads made while it ran, background loads included)
and `summary.json` (stage timers, I/O, memory accounting, time to a target accuracy) to its run directory.
"""
from __future__ import annotations

import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import torch

from .config import TrainConfig, task_defaults
from .device import cuda_host_memory, resolve_device
from .disttrain import exchanges, joined, rank_config
from .errors import UserError
from .loop import Ranks, run_loop, seed_everything
from .metrics import check_target, shared_negatives
from .mixing import mixing
from .policies import make_plan
from .rundir import RunDir, check_same_store, default_run_dir, read_json, resumed_config
from .rankplans import ExchangeEvaluation, ExchangeRuntime
from .runtime import Runtime
from .shards import RankData
from .store import open_store
from .units import format_size, reset_peak_rss

RUN_FACTS = ("store_meta", "policy_memory", "schedule", "host", "run_id", "memory_budget_bytes",
             "topology_used")  # config.json, not settings


def train(cfg: TrainConfig) -> dict:
    """Run one training job; returns the summary (also written to the run directory).

    With `cfg.checkpoint_every` it saves the model, the optimiser, the random state and the policy's
    state every so many steps; `cfg.resume` (a run directory) continues such a run from its last
    checkpoint, with the configuration it was started with, and ends with the same losses as an
    uninterrupted run. With `cfg.distributed` this process is one rank of a torchrun job
    (`oocgnn.disttrain`): the same loop over its share of the training nodes."""
    t_enter = time.perf_counter()
    reset_peak_rss()                               # this run's peak, not an earlier run's in this process
    run = None
    if cfg.resume:                                 # (every rank reads the checkpoint; rank 0 writes on)
        run = RunDir.create(cfg.resume, resume=True)
        cfg = resumed_config(cfg, run)
    if not cfg.distributed:
        return _train(cfg, run, Ranks(), t_enter)
    with joined(cfg) as ranks:
        return _train(cfg, run, ranks, t_enter)


def _train(cfg, run, ranks, t_enter) -> dict:
    world = ranks.world
    own_rows = ranks.distributed and exchanges(cfg)   # ranks holding only their own rows (BatchGNN's exchanges)
    store = None if own_rows else open_store(cfg.store)   # a bad store is refused before --out is made
    if store is not None and store.task == "link":
        from .linktask import check_settings
        cfg = task_defaults(cfg, store.task)         # a link store's defaults (MRR, ...) where not given
        check_target(cfg.target_metric, store.num_classes, store.task, shared_negatives(store))
        check_settings(cfg, store)
    elif store is not None:
        check_target(cfg.target_metric, store.num_classes)
        for split in ("train", "val"):
            if not len(getattr(store, f"{split}_idx")):
                raise UserError(f"{store.path}: the {split} split is empty; a run needs training and validation "
                                "nodes")
    if run is None and ranks.rank == 0:
        default = Path(f"{default_run_dir(cfg)}-r{world}") if ranks.distributed else default_run_dir(cfg)
        run = RunDir.create(Path(cfg.out) if cfg.out else default, force=cfg.force)
    if ranks.distributed:
        shared = ranks.share((str(run.path), run.run_id) if ranks.rank == 0 else None)
        run = run or RunDir(Path(shared[0]), shared[1])
        device = ranks.device
    else:
        device = resolve_device(cfg.device)        # before any work: a missing GPU is one line
        cuda_host_memory(device)                   # measured before anything else uses the GPU
    saved_world = read_json(run.path / "config.json").get("world") if ranks.distributed and cfg.resume else world
    if saved_world != world:
        raise UserError(f"{run.path} is a run of {saved_world} ranks; resume it with as many, not {world}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if own_rows:
        return _train_own_rows(cfg, run, ranks, t_enter)
    if cfg.resume:
        check_same_store(run, store.meta)
    facts = {}
    if ranks.distributed:
        store = ranks.view(store)                  # the policy over this rank's training nodes
        facts = {"world": world, "owner_bounds": ranks.bounds.tolist(), "rank_data": "shared",
                 "rank_batch_size": rank_config(cfg, world).batch_size}
    seed_everything(cfg.seed)
    with ranks.one_at_a_time():                    # what a plan derives once (edge buckets): rank 0 writes it
        plan = make_plan(store, rank_config(cfg, world))
        plan.check_machine()                       # what cannot be resident here is refused before any read
        mix = mixing(plan) if plan.task == "node" else None   # from labels and the plan's groups: no I/O
        if mix and mix["warning"] and ranks.rank == 0:
            print(f"oocgnn: warning: {plan.name}: {mix['warning']}", file=sys.stderr)
        if not plan.budgeted and plan.resident_bytes() > plan.budget and ranks.rank == 0:
            print(f"oocgnn: note: {plan.name} keeps {format_size(plan.resident_bytes())} resident, more than the "
                  f"{format_size(plan.budget)} budget (it is a baseline: the budget does not bound it)",
                  file=sys.stderr)
        runtime = Runtime(store, plan, device)
    try:
        return run_loop(cfg, run, store, plan, runtime, t_enter, device, mix, ranks, facts)
    finally:
        runtime.close()


def _train_own_rows(cfg, run, ranks, t_enter) -> dict:
    """A rank that holds only its own rows and lists, from the store or its shard (`shards.RankData`)."""
    data = RankData.open(cfg.store, ranks.world, ranks.rank)
    check_target(cfg.target_metric, data.num_classes)
    if cfg.resume:
        check_same_store(run, data.meta)
    ranks.bounds = data.bounds
    seed_everything(cfg.seed)                      # the same initial weights on every rank
    runtime = ExchangeRuntime(cfg, data, ranks.device)
    facts = {"world": ranks.world, "owner_bounds": data.bounds.tolist(), "rank_data": "own", "sharded": data.sharded}
    try:
        return run_loop(cfg, run, data, runtime.plan, runtime, t_enter, ranks.device, None, ranks, facts,
                        evaluation=ExchangeEvaluation)
    finally:
        runtime.close()


def train_fresh(cfg: TrainConfig) -> dict:
    """`train(cfg)` in a fresh interpreter: its peak RSS (and an mmap run's cgroup) then belong to this
    run alone, not to what the calling process did before (notebooks, sweeps)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(train, cfg).result()
        except BrokenProcessPool:                  # a Pool would wait for ever on the lost task
            raise UserError(f"the process training {cfg.policy} died (killed: by its memory cgroup's OOM killer "
                            f"if the run was capped, see `dmesg`)") from None
