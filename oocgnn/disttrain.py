"""`oocgnn train --distributed`: one rank of a torchrun job (BatchGNN's training loop, §3).

Each rank trains on the training nodes it owns, chunk by chunk as its per-rank policy cuts them
(`rankplans`): for `inmemory`/`macrobatch`, k = --macrobatch mini-batches sampled a layer at a time
(the remote neighbour lists of each layer fetched in one exchange, `distributed.sample_macrobatch`:
a rank holds only its own lists) and their remote input rows fetched in one exchange
(`distributed.fetch_macrobatch`); for `hierbatching`, batches inside mega-batches of its own
partitions. DistributedDataParallel averages the gradients. Evaluation is distributed alike: each rank evaluates the nodes it owns, the correct
counts are summed. Rank 0 writes the run directory (config.json, log.csv, summary.json with every
rank's traffic). The process group has a timeout (--dist-timeout): a rank that dies makes the
others fail with a clear error instead of hanging.

Devices: the exchanges always go over gloo (host tensors: rows read from disk, lists the CPU sampler
walks). With --device cuda (or auto where torch sees GPUs) a rank trains on GPU LOCAL_RANK mod the
node's GPUs, and DDP's gradient all-reduce goes over a nccl group when every rank has a GPU of its
own (the ranks compare their GPUs' UUIDs); ranks that share a GPU (nccl refuses two ranks on one)
all-reduce over gloo. Batches reach the GPU through `device.HostToDevice` as in one process.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from .distributed import (Exchange, RankFeatures, batch_key, fetch_macrobatch, owner_bounds, sample_macrobatch,
                          steps_per_epoch)
from .loop import Ranks
from .rankplans import RANK_POLICIES, make_rank_plan
from .device import HostToDevice, resolve_device
from .errors import UserError
from .models import build_model
from .rundir import RunDir, default_run_dir, read_json
from .sampler import Sampler
from .shards import RankData
from .units import peak_rss

LOG_COLUMNS = ["wall_s", "epoch", "step", "train_loss", "val_acc", "test_acc", "rows_recv", "lists_recv",
               "bytes_recv", "peak_rss"]


def exchanges(cfg) -> bool:
    """Whether this run's ranks each hold only their own rows and exchange the rest (BatchGNN's way:
    `--rank-data own`; a shards directory, or auto for the policies with a rank plan) rather than each
    reading the shared store through the policy (`--rank-data shared`: every registered policy)."""
    sharded = (Path(cfg.store) / "shards.json").is_file()
    if cfg.rank_data == "shared" and sharded:
        raise UserError(f"{cfg.store} holds per-rank shards: a rank reads only its own rows there, so "
                        "--rank-data shared cannot run on it (give the store itself)")
    if cfg.rank_data == "own" or sharded:
        if cfg.policy not in RANK_POLICIES:
            raise UserError(f"--rank-data own (ranks holding only their own rows) runs {', '.join(RANK_POLICIES)}; "
                            f"{cfg.policy} runs with --rank-data shared on a store every rank reads")
        return True
    return cfg.rank_data == "auto" and cfg.policy in RANK_POLICIES


@contextlib.contextmanager
def joined(cfg):
    """This process's rank of a torchrun job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), as
    `TorchRanks`; a failed collective (a dead rank, a timeout) ends it with a clear error."""
    import torch.distributed as dist
    if not all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        raise UserError("--distributed runs under torchrun, e.g. torchrun --nproc-per-node 2 -m oocgnn train "
                        "STORE --distributed (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are not set)")
    device = rank_device(cfg.device)
    timeout = timedelta(seconds=cfg.dist_timeout)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        yield TorchRanks(rank, world, device, gradient_group(device, world, timeout))
    except UserError:
        raise
    except (RuntimeError, dist.DistError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"rank {rank} of {world}: a collective failed: another rank died or did not answer "
                        f"within --dist-timeout {cfg.dist_timeout:g} s ({first[:300]})") from None
    dist.destroy_process_group()


class TorchRanks(Ranks):
    """The ranks of a torchrun job, for `loop.run_loop`: gradients all-reduced (nccl when every rank has
    a GPU of its own, else gloo), the rest over gloo; each rank owns a contiguous range of the store's
    partitions (`distributed.owner_bounds`, set by `view`)."""

    def __init__(self, rank, world, device, grads=None):
        self.rank, self.world, self.device, self.grads = rank, world, device, grads
        self.bounds = None

    def view(self, store) -> "RankView":
        self.bounds = owner_bounds(store.part_offsets, self.world)
        return RankView(store, self.bounds, self.rank)

    def owns(self, ids):
        return _owned(ids, self.bounds, self.rank)

    def average_gradients(self, model):
        import torch.distributed as dist
        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.grads)
        flat /= self.world
        at = 0
        for p in params:
            p.grad = flat[at:at + p.numel()].view_as(p)
            at += p.numel()

    def _reduce(self, values, op):
        import torch.distributed as dist
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, values):
        import torch.distributed as dist
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values):
        import torch.distributed as dist
        return self._reduce(values, dist.ReduceOp.MAX)

    def gather(self, obj):
        import torch.distributed as dist
        every = [None] * self.world
        dist.all_gather_object(every, obj)
        return every

    @contextlib.contextmanager
    def one_at_a_time(self):
        import torch.distributed as dist
        if self.rank:
            dist.barrier()
        yield
        if not self.rank:
            dist.barrier()

    def share(self, obj):
        """Rank 0's `obj` on every rank."""
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def rank_config(cfg, world):
    """The configuration a rank's plan runs with: the global batch split over the ranks (ceil(B / R)
    seeds a rank's batch), so that an epoch takes about as many steps as in one process."""
    return cfg.replace(batch_size=-(-cfg.batch_size // world))


class RankView:
    """A rank's view of the shared store: the store, but its training nodes are the rank's own (those
    in [bounds[rank], bounds[rank + 1])): a policy's plan over it is that policy run on this rank's share,
    and `simulate(view, plan)` is this rank's I/O."""

    def __init__(self, store, bounds, rank):
        self.store, self.bounds, self.rank = store, bounds, rank
        self.train_idx = _owned(np.asarray(store.train_idx), bounds, rank)

    def __getattr__(self, name):
        return getattr(self.store, name)


def train_exchanging(cfg, ranks, run) -> dict:
    """This rank of a run whose ranks hold only their own rows (`exchanges`)."""
    return _run(cfg, ranks.rank, ranks.world, run, ranks.device, ranks.grads)


def rank_device(name) -> torch.device:
    """This rank's torch.device for a --device value: a GPU without an index is GPU LOCAL_RANK mod the
    node's GPUs."""
    device = resolve_device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    return device


def gradient_group(device, world, timeout):
    """The process group DDP all-reduces over: None (the default gloo group) on the CPU or when two
    ranks share a GPU, else a new nccl group. Every rank calls it (it gathers every rank's GPU)."""
    import torch.distributed as dist
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    mine = str(getattr(props, "uuid", "")) or f"{socket.gethostname()}:{device.index}"
    every = [None] * world
    dist.all_gather_object(every, mine)
    return dist.new_group(backend="nccl", timeout=timeout) if len(set(every)) == world else None


def _owned(ids, bounds, rank):
    return ids[(ids >= bounds[rank]) & (ids < bounds[rank + 1])]


def _run(cfg, rank, world, run, device=torch.device("cpu"), grads=None) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    t_enter = time.perf_counter()
    store = RankData.open(cfg.store, world, rank)     # the shared store's range, or this rank's shard
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    bounds = store.bounds
    k = int(cfg.get("macrobatch"))
    if run is not None:
        saved = read_json(run.path / "config.json").get("world")
        if saved != world:
            raise UserError(f"{run.path} is a run of {saved} ranks; resume it with as many, not {world}")
    elif rank == 0:
        run = RunDir.create(Path(cfg.out) if cfg.out else Path(f"{default_run_dir(cfg)}-r{world}"), force=cfg.force)
        run.write_json("config.json", {**cfg.to_dict(), "world": world, "owner_bounds": bounds.tolist(),
                                       "store_meta": {m: store.meta[m] for m in
                                                      ("name", "num_nodes", "num_edges", "feat_dim", "num_parts")},
                                       "sharded": store.sharded})
    # the rows a rank serves (and evaluates from): resident for inmemory, else read per macrobatch
    features = RankFeatures(store, "inmemory" if cfg.policy == "inmemory" else "macrobatch", cfg.memory_budget_bytes)
    topology = store.lists()                      # its own lists; remote ones come per macrobatch
    sampler = Sampler(topology, cfg.fanout_list, cfg.seed, dense=cfg.sampler == "dense")
    eval_sampler = Sampler(topology, [int(f) for f in cfg.eval_fanouts.split(",")], cfg.seed + 7)
    exchange = Exchange(bounds, rank, world, store.feat_dim)
    labels = torch.from_numpy(store.labels()).long()   # of its own rows: every output node is its own
    plan = make_rank_plan(cfg, store, features, topology, sampler, exchange)

    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)                   # the same initial weights on every rank (DDP checks)
    model = build_model(cfg.model, store.feat_dim, cfg.hidden, store.num_classes, cfg.layers, cfg.dropout)
    model.to(device)                              # initialised on the CPU: the same weights on any device
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                  process_group=grads)
    h2d = HostToDevice(device)
    opt = torch.optim.Adam(ddp.parameters(), lr=cfg.lr)

    eval_sets = {}
    for split, ids in (("val", store.val_idx), ("test", store.test_idx)):
        if cfg.max_eval_nodes and len(ids) > cfg.max_eval_nodes:
            ids = np.sort(np.random.default_rng(cfg.seed + 1).choice(ids, cfg.max_eval_nodes, replace=False))
        eval_sets[split] = (_owned(ids, bounds, rank), len(ids),
                            max(steps_per_epoch(len(_owned(ids, bounds, r)), cfg.eval_batch_size)
                                for r in range(world)))

    def evaluate():
        model.eval()
        out = {}
        with torch.no_grad():
            for split, (ids, total, nb) in eval_sets.items():
                correct = 0
                batches = [ids[i * cfg.eval_batch_size:(i + 1) * cfg.eval_batch_size] for i in range(nb)]
                for c in range(0, nb, k):
                    keys = [batch_key(b, rank, world) for b in range(c, c + len(batches[c:c + k]))]
                    samples = sample_macrobatch(eval_sampler, topology, exchange, batches[c:c + k], 0, keys,
                                                counted=False)
                    mb = fetch_macrobatch(samples, features, exchange, counted=False)
                    for s in samples:
                        if len(s.output_nodes):
                            x, y = h2d([mb.gather(s.input_nodes), labels[torch.from_numpy(s.output_nodes - store.lo)]],
                                       s.blocks)
                            correct += int((model(s.blocks, x).argmax(1) == y).sum())
                n = torch.tensor([correct], dtype=torch.int64)
                dist.all_reduce(n)
                out[split] = int(n) / max(1, total)
        model.train()
        return out

    rows, train_s, step = [], 0.0, 0
    setup_s = time.perf_counter() - t_enter
    stages = {"sample": 0.0, "exchange": 0.0, "load": 0.0, "compute": 0.0}

    def log(epoch, loss_sum, loss_n):
        accs = evaluate()
        t = exchange.record()
        total = torch.tensor([loss_sum, loss_n], dtype=torch.float64)
        dist.all_reduce(total)                    # the epoch's mean loss over every rank's batches
        rows.append({"wall_s": round(train_s, 4), "epoch": epoch, "step": step,
                     "train_loss": float(total[0] / total[1]) if total[1] else float("nan"), "val_acc": accs["val"],
                     "test_acc": accs["test"], "rows_recv": t["rows_recv"], "lists_recv": t["lists_recv"],
                     "bytes_recv": t["bytes_recv"],
                     "peak_rss": peak_rss()})
        if rank == 0:
            run.write_csv("log.csv", pd.DataFrame(rows, columns=LOG_COLUMNS))

    def checkpoint(epoch, chunk, loss_sum, loss_n):
        mine = {"rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state(device) if h2d.on_gpu else None,
                "traffic": exchange.record(), "train_s": train_s, "stages": stages,
                "peak_rows": features.peak_rows, "loss": (loss_sum, loss_n)}        # each rank's own
        every = [None] * world
        dist.all_gather_object(every, mine)
        if rank == 0:
            run.save_checkpoint({"epoch": epoch, "chunk": chunk, "step": step, "model": model.state_dict(),
                                 "opt": opt.state_dict(), "rows": rows,
                                 "epoch_s": epoch_s, "ranks": every})

    epoch_s, start = [], (0, 0, 0.0, 0)
    if cfg.resume:
        state = run.load_checkpoint()
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        mine = state["ranks"][rank]
        torch.set_rng_state(mine["rng"])
        if h2d.on_gpu and mine.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(mine["cuda_rng"], device)
        for key, v in mine["traffic"].items():
            exchange.traffic[key][rank] = v
        train_s, step, features.peak_rows = mine["train_s"], state["step"], max(features.peak_rows, mine["peak_rows"])
        stages.update(mine["stages"])
        rows[:], epoch_s[:] = state["rows"], state["epoch_s"]
        start = (state["epoch"], state["chunk"], *mine["loss"])
    else:
        log(0, 0.0, 0)
    for epoch in range(start[0], cfg.epochs):
        chunks = plan.chunks(epoch)               # as many on every rank, of as many batches
        first, loss_sum, loss_n = start[1:] if epoch == start[0] else (0, 0.0, 0)
        t_epoch = time.perf_counter()
        for c in range(first, len(chunks)):
            if cfg.max_steps and step >= cfg.max_steps:
                break
            t = time.perf_counter()
            samples, gather = plan.prepare(epoch, chunks[c], stages)
            t2 = time.perf_counter()
            for s in samples:
                x, y = h2d([gather(s.input_nodes), labels[torch.from_numpy(s.output_nodes - store.lo)]], s.blocks)
                logits = ddp(s.blocks, x)
                loss = F.cross_entropy(logits, y) if len(y) else logits.sum() * 0   # DDP needs every rank's backward
                opt.zero_grad()
                loss.backward()
                opt.step()
                if len(y):
                    value = float(loss.detach())
                    if not np.isfinite(value):
                        raise UserError(f"training diverged at step {step}: the loss is {value}; lower --lr")
                    loss_sum, loss_n = loss_sum + value, loss_n + 1
                step += 1
            t3 = time.perf_counter()
            stages["compute"] += t3 - t2
            train_s += t3 - t
            n = cfg.eval_every                     # every n steps (a chunk's last step crossing a multiple)
            if n and step // n > (step - len(samples)) // n:
                log(epoch, loss_sum, loss_n)
            every = cfg.checkpoint_every
            if every and step // every > (step - len(samples)) // every and \
                    (epoch, c) != (cfg.epochs - 1, len(chunks) - 1):
                checkpoint(epoch, c + 1, loss_sum, loss_n)
        epoch_s.append(time.perf_counter() - t_epoch)
        done = epoch == cfg.epochs - 1 or (cfg.max_steps and step >= cfg.max_steps)
        if not cfg.eval_every or (done and rows[-1]["step"] != step):      # and the run's end, once
            log(epoch, loss_sum, loss_n)
        if done:
            break

    me = {"rank": rank, "rows": [int(bounds[rank]), int(bounds[rank + 1])],
          "train_nodes": int(len(_owned(store.train_idx, bounds, rank))), **exchange.record(),
          "bytes_read": features.reader.stats.bytes_read, "peak_buffer_rows": features.peak_rows,
          "peak_eval_rows": features.peak_eval_rows,
          "topology_bytes": topology.nbytes, "peak_list_entries": topology.peak_entries,
          "peak_rss": peak_rss(), "train_s": round(train_s, 3), "stage_s": {n: round(v, 3) for n, v in stages.items()},
          "plan": plan.describe()}
    ranks = [None] * world
    dist.all_gather_object(ranks, me)
    features.close()
    logdf = pd.DataFrame(rows, columns=LOG_COLUMNS)
    best = int(logdf["val_acc"].idxmax())
    summary = {
        "distributed": True, "world": world, "device": str(device),
        "backend": "gloo" if grads is None else "gloo (exchanges), nccl (gradients)",
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "policy": cfg.policy, "model": cfg.model, "store": str(store.path),
        "seed": cfg.seed, "epochs": cfg.epochs, "steps": step, "epoch_steps": sum(map(len, plan.chunks(0))),
        "macrobatch": k,
        "train_s": round(max(r["train_s"] for r in ranks), 3),
        "epoch_s": round(float(np.mean(epoch_s)), 3) if epoch_s else 0.0, "setup_s": round(setup_s, 3),
        "best_val_acc": float(logdf["val_acc"][best]), "test_at_best_val": float(logdf["test_acc"][best]),
        "final_val_acc": float(logdf["val_acc"].iloc[-1]), "final_test_acc": float(logdf["test_acc"].iloc[-1]),
        "exchange": {key: sum(r[key] for r in ranks) for key in ("rows_recv", "lists_recv", "list_entries_recv",
                                                                 "bytes_recv", "exchanges", "list_exchanges")},
        "ranks": ranks, "memory_budget": cfg.memory_budget_bytes,
        "topology": "sharded (each rank its own lists; remote lists fetched per macrobatch and layer)",
    }
    if rank == 0:                                 # every rank holds `run` when resuming; rank 0 writes
        run.write_json("summary.json", summary)
    return {**summary, "run_dir": str(run.path) if run is not None else "", "log": logdf}
