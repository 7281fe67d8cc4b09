"""The executor: train a model over a store under a policy, logging accuracy against time.

A policy decides what graph data stays resident and how feature rows are read; this
issue's policies are the baselines every out-of-core technique is compared with:
`inmemory` (all features in RAM + DGL neighbour sampling, the "NS" baseline of
HierBatching/Ginex) and `mmap` (the same through an np.memmap of the store, capped by a
memory cgroup when the process may create one).

Every run writes `config.json`, `log.csv` (one row per evaluation) and `summary.json` to
its run directory.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import time
from pathlib import Path

import dgl
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .config import TrainConfig
from .memcap import MemoryCap, drop_file_cache
from .models import build_model
from .store import Store, open_store

LOG_COLUMNS = ["wall_s", "epoch", "step", "train_loss", "val_acc", "test_acc",
               "bytes_read", "requests", "peak_rss"]


def peak_rss() -> int:
    """Peak resident set size of this process in bytes (VmHWM)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class InMemoryPolicy:
    """All features resident in RAM (the NS baseline); no budget applies."""
    name = "inmemory"

    def __init__(self, store: Store, cfg: TrainConfig):
        self.reader = store.reader("memory")
        self.resident_bytes = store.num_nodes * store.row_bytes

    def memory_cap(self):
        return contextlib.nullcontext(None)

    def end_warmup(self):
        pass

    def cap_record(self) -> dict:
        return {"enforced": False, "reason": "inmemory keeps every feature resident by design"}


class MmapPolicy:
    """Features through np.memmap (MADV_RANDOM): the OS page cache is the only cache.

    Honest only under an enforced limit. A memory cgroup counts the process's new
    allocations as well as the page cache, so the run is capped at
    `memory_budget + W`, where W is the working memory of sampling, training and
    evaluation, measured exactly in the same cgroup during the warm-up steps while
    features are read with O_DIRECT (no page cache). What is left for caching feature
    pages during a step is then about the budget.
    """
    name = "mmap"
    unlimited = 1 << 50

    def __init__(self, store: Store, cfg: TrainConfig):
        self.store, self.budget = store, cfg.memory_budget_bytes
        self.reader = store.reader("direct")      # warm-up: measure W without page cache
        self.resident_bytes = 0                    # resident features are the kernel's business
        self.cap, self.working_set = None, None

    def memory_cap(self):
        drop_file_cache(self.store.features_path)
        self.cap = MemoryCap(self.unlimited)
        return self.cap

    def end_warmup(self):
        """Cap at budget + measured working set, then switch to the mmap reader."""
        self.working_set = self.cap.peak() if self.cap.enforced else None
        if self.working_set is not None:
            self.cap.set_limit(self.budget + int(1.25 * self.working_set) + (16 << 20))
            self.cap.reset_peak()
        self.reader.close()
        self.reader = self.store.reader("mmap")

    def cap_record(self) -> dict:
        return {**self.cap.record(), "budget": self.budget, "working_set": self.working_set}


POLICY_CLASSES = {"inmemory": InMemoryPolicy, "mmap": MmapPolicy}


def default_run_dir(cfg: TrainConfig) -> Path:
    return Path("runs") / f"{Path(cfg.store).name}-{cfg.policy}-{cfg.model}-s{cfg.seed}"


class _Timers:
    """Seconds per stage (sample, gather, compute, eval), accumulated."""

    def __init__(self):
        self.s = {}

    @contextlib.contextmanager
    def __call__(self, stage):
        t = time.perf_counter()
        yield
        self.s[stage] = self.s.get(stage, 0.0) + time.perf_counter() - t


def _seed_everything(seed: int):
    np.random.seed(seed)
    torch.manual_seed(seed)
    dgl.seed(seed)


def evaluate(model, g, reader, labels, nodes, sampler, batch_size) -> float:
    """Accuracy of sampled mini-batch inference on `nodes`."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for lo in range(0, len(nodes), batch_size):
            seeds = torch.from_numpy(nodes[lo:lo + batch_size])
            input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
            x = torch.from_numpy(reader.read_rows(input_nodes.numpy()))
            pred = model(blocks, x).argmax(1)
            correct += int((pred == labels[output_nodes]).sum())
    model.train()
    return correct / max(1, len(nodes))


def train(cfg: TrainConfig) -> dict:
    """Run one training job; returns the summary (also written to the run directory)."""
    store = open_store(cfg.store)
    run_dir = Path(cfg.out) if cfg.out else default_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({
        **cfg.to_dict(), "store_meta": {k: store.meta[k] for k in
                                        ("name", "num_nodes", "num_edges", "feat_dim", "num_parts")},
        "host": {"python": platform.python_version(), "torch": torch.__version__,
                 "dgl": dgl.__version__, "cpus": os.cpu_count(),
                 "loadavg": open("/proc/loadavg").read().split()[:3]}}, indent=2) + "\n")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    _seed_everything(cfg.seed)
    rng = np.random.default_rng(cfg.seed)

    g = store.graph()
    labels = torch.from_numpy(store.labels)
    policy = POLICY_CLASSES[cfg.policy](store, cfg)
    sampler = dgl.dataloading.NeighborSampler(cfg.fanout_list)
    eval_sampler = dgl.dataloading.NeighborSampler(
        [int(f) for f in cfg.eval_fanouts.split(",")])
    model = build_model(cfg.model, store.feat_dim, cfg.hidden, store.num_classes,
                        cfg.layers, cfg.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    eval_sets = {}
    for split, ids in (("val", store.val_idx), ("test", store.test_idx)):
        if cfg.max_eval_nodes and len(ids) > cfg.max_eval_nodes:
            ids = np.sort(np.random.default_rng(cfg.seed + 1).choice(ids, cfg.max_eval_nodes, replace=False))
        eval_sets[split] = ids

    train_ids = store.train_idx
    steps_per_epoch = -(-len(train_ids) // cfg.batch_size)
    eval_every = cfg.eval_every or steps_per_epoch
    warmup_steps = 2
    timers, rows = _Timers(), []
    train_s, step, loss_sum, loss_n = 0.0, 0, 0.0, 0
    io_train = {"bytes_read": 0, "requests": 0, "rows": 0, "seconds": 0.0}

    def log_eval(epoch):
        nonlocal loss_sum, loss_n
        with timers("eval"):
            accs = {s: evaluate(model, g, policy.reader, labels, ids, eval_sampler,
                                cfg.eval_batch_size) for s, ids in eval_sets.items()}
        rows.append({"wall_s": round(train_s, 4), "epoch": epoch, "step": step,
                     "train_loss": loss_sum / loss_n if loss_n else float("nan"),
                     "val_acc": accs["val"], "test_acc": accs["test"],
                     "bytes_read": io_train["bytes_read"],
                     "requests": io_train["requests"], "peak_rss": peak_rss()})
        loss_sum, loss_n = 0.0, 0
        pd.DataFrame(rows, columns=LOG_COLUMNS).to_csv(run_dir / "log.csv", index=False)
        return accs

    def io_step(stats_before):
        after = policy.reader.stats.as_dict()
        for k in io_train:
            io_train[k] += after[k] - stats_before[k]

    with policy.memory_cap():
        log_eval(0)                  # accuracy at time 0; also part of the warm-up
        for epoch in range(cfg.epochs):
            perm = rng.permutation(train_ids)
            bar = tqdm(range(steps_per_epoch), desc=f"{cfg.policy} epoch {epoch}",
                       disable=not cfg.progress, leave=False)
            for b in bar:
                t0 = time.perf_counter()
                seeds = torch.from_numpy(perm[b * cfg.batch_size:(b + 1) * cfg.batch_size])
                with timers("sample"):
                    input_nodes, output_nodes, blocks = sampler.sample(g, seeds)
                before = policy.reader.stats.as_dict()
                with timers("gather"):
                    x = torch.from_numpy(policy.reader.read_rows(input_nodes.numpy()))
                io_step(before)
                with timers("compute"):
                    loss = F.cross_entropy(model(blocks, x), labels[output_nodes])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                del x, blocks
                step += 1
                loss_sum, loss_n = loss_sum + loss.item(), loss_n + 1
                train_s += time.perf_counter() - t0
                if step == warmup_steps:
                    policy.end_warmup()      # the working set is known: cap the rest of the run
                if step % eval_every == 0 or (epoch == cfg.epochs - 1 and b == steps_per_epoch - 1):
                    accs = log_eval(epoch)
                    bar.set_postfix(val=f"{accs['val']:.3f}", loss=f"{rows[-1]['train_loss']:.3f}")
            bar.close()
        if step < warmup_steps:
            policy.end_warmup()
    cap_record = policy.cap_record()

    log = pd.DataFrame(rows, columns=LOG_COLUMNS)
    best = int(log["val_acc"].idxmax())
    reached = log[log["val_acc"] >= cfg.target_acc] if cfg.target_acc else log.iloc[:0]
    summary = {
        "policy": cfg.policy, "model": cfg.model, "store": str(store.path), "seed": cfg.seed,
        "epochs": cfg.epochs, "steps": step, "train_s": round(train_s, 3),
        "epoch_s": round(train_s / cfg.epochs, 3),
        "stage_s": {k: round(v, 3) for k, v in timers.s.items()},
        "best_val_acc": float(log["val_acc"][best]), "test_at_best_val": float(log["test_acc"][best]),
        "final_val_acc": float(log["val_acc"].iloc[-1]), "final_test_acc": float(log["test_acc"].iloc[-1]),
        "target_acc": cfg.target_acc,
        "time_to_target_s": float(reached["wall_s"].iloc[0]) if len(reached) else None,
        "io": {**io_train, "reader": type(policy.reader).__name__},
        "resident_bytes": policy.resident_bytes, "memory_budget": cfg.memory_budget_bytes,
        "memory_cap": cap_record, "peak_rss": peak_rss(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    policy.reader.close()
    return {**summary, "run_dir": str(run_dir), "log": log}
