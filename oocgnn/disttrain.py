"""`oocgnn train --distributed`: this process as one rank of a torchrun job.

Rank r of R owns a contiguous range of the store's partitions (`distributed.owner_bounds`) and trains
on the training nodes it owns, in the training loop one process runs (`loop.run_loop`), with
`TorchRanks` for its collectives: gradients averaged after every step, evaluation counts and log
totals summed, epochs padded to the ranks' most steps. What a rank reads (`--rank-data`, `exchanges`):

- shared: the whole store, through the policy's own plan over the rank's training nodes (`RankView`):
  every registered policy; its reads are what `simulate(RankView(...), plan)` predicts.
- own (BatchGNN §3): only its own rows and lists (from the store's range or its shard, `shards.RankData`);
  remote lists and rows come by macrobatched exchanges (`rankplans.ExchangeRuntime`).

Rank 0 writes the run directory. The process group has a timeout (--dist-timeout): a rank that dies
makes the others fail with a clear error instead of hanging.

Devices: the exchanges always go over gloo (host tensors: rows read from disk, lists the CPU sampler
walks). With --device cuda (or auto where torch sees GPUs) a rank trains on GPU LOCAL_RANK mod the
node's GPUs, and the gradient all-reduce goes over a nccl group when every rank has a GPU of its
own (the ranks compare their GPUs' UUIDs); ranks that share a GPU (nccl refuses two ranks on one)
all-reduce over gloo. Batches reach the GPU through `device.HostToDevice` as in one process.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from datetime import timedelta
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .device import cuda_host_memory, resolve_device
from .distributed import edge_owner, owner_bounds
from .errors import UserError, first_line
from .loop import Ranks
from .rankplans import RANK_POLICIES


def exchanges(cfg) -> bool:
    """Whether this run's ranks each hold only their own rows and exchange the rest (BatchGNN's way:
    `--rank-data own`; a shards directory, or auto for the policies with a rank plan) rather than each
    reading the shared store through the policy (`--rank-data shared`: every registered policy)."""
    sharded = (Path(cfg.store) / "shards.json").is_file()
    if _meta(cfg.store).get("task") == "link":
        if cfg.rank_data == "own":
            raise UserError(f"{cfg.store} is a link store: its ranks read it shared, each its own training edges "
                            "through the policy (--rank-data shared or auto); --rank-data own exchanges node "
                            "batches' rows only")
        return False
    if cfg.rank_data == "shared" and sharded:
        raise UserError(f"{cfg.store} holds per-rank shards: a rank reads only its own rows there, so "
                        "--rank-data shared cannot run on it (give the store itself)")
    if cfg.rank_data == "own" or sharded:
        if cfg.policy not in RANK_POLICIES:
            raise UserError(f"--rank-data own (ranks holding only their own rows) runs {', '.join(RANK_POLICIES)}; "
                            f"{cfg.policy} runs with --rank-data shared on a store every rank reads")
        return True
    return cfg.rank_data == "auto" and cfg.policy in RANK_POLICIES and _float32_rows(cfg.store)


def _float32_rows(store) -> bool:
    """Whether the store's rows are float32 (the exchange of `--rank-data own` moves float32 rows; a compressed
    store's ranks read it shared, each through the policy, its rows decoded after the gather)."""
    return _meta(store).get("dtype", "float32") == "float32"


def _meta(store) -> dict:
    """The store's meta.json, or {} where there is none to read (opening the store says why)."""
    try:
        return json.loads((Path(store) / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def joined(cfg):
    """This process's rank of a torchrun job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), as
    `TorchRanks`; a failed collective (a dead rank, a timeout) ends it with a clear error."""
    if not all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        raise UserError("--distributed runs under torchrun, e.g. torchrun --nproc-per-node 2 -m oocgnn train "
                        "STORE --distributed (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are not set)")
    rank, world = _environment()
    device = rank_device(cfg.device)
    cuda_host_memory(device)                       # measured before anything else uses the GPU
    timeout = timedelta(seconds=cfg.dist_timeout)
    if rank:                                       # torch's client would print its retries as C++ errors
        _wait_for_master(rank, world, cfg.dist_timeout)
    try:
        dist.init_process_group("gloo", timeout=timeout, rank=rank, world_size=world)
    except (RuntimeError, ValueError, dist.DistError) as e:
        raise UserError(f"rank {rank} of {world}: the ranks did not meet at {os.environ['MASTER_ADDR']}:"
                        f"{os.environ['MASTER_PORT']} within --dist-timeout {cfg.dist_timeout:g} s (are the other "
                        f"ranks started, with the same MASTER_ADDR and MASTER_PORT?) ({first_line(e)[:200]})") from None
    try:
        yield TorchRanks(rank, world, device, gradient_group(device, world, timeout))
    except BaseException as e:                     # failed or interrupted: leave now, not in the interpreter's teardown
        _leave()
        if isinstance(e, (RuntimeError, dist.DistError)):
            raise UserError(f"rank {rank} of {world}: a collective failed: another rank died or did not answer "
                            f"within --dist-timeout {cfg.dist_timeout:g} s ({first_line(e)[:300]})") from None
        raise
    dist.barrier()                                 # no rank tears its connections down while another still uses them
    dist.destroy_process_group()


def _leave():
    """Destroy this rank's process group without a barrier (a rank that failed or was interrupted): left to the
    interpreter's exit, gloo's threads were sometimes torn down unjoined ('terminate called without an active
    exception', SIGABRT instead of the run's exit code)."""
    try:
        dist.destroy_process_group()
    except Exception:                              # noqa: BLE001  (already gone: nothing left to release)
        pass


def _environment() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) from torchrun's environment, checked: whole numbers, 0 <= RANK < WORLD_SIZE, and a
    port that is one."""
    values = {}
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        try:
            values[name] = int(os.environ[name])
        except ValueError:
            raise UserError(f"--distributed: {name}={os.environ[name]!r} is not a whole number "
                            "(torchrun sets it; so must whoever starts the ranks by hand)") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    if world < 1 or not 0 <= rank < world:
        raise UserError(f"--distributed: RANK={rank} with WORLD_SIZE={world}; a rank is 0..WORLD_SIZE-1")
    if not 0 < values["MASTER_PORT"] < 65536:
        raise UserError(f"--distributed: MASTER_PORT={values['MASTER_PORT']} is not a port (1..65535)")
    return rank, world


def _wait_for_master(rank, world, seconds):
    """Wait until rank 0's rendezvous (MASTER_ADDR:MASTER_PORT) accepts connections, at most `seconds`."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise UserError(f"rank {rank} of {world}: the ranks did not meet at {addr}:{port} within "
                                f"--dist-timeout {seconds:g} s (is rank 0 started, with the same MASTER_ADDR and "
                                "MASTER_PORT?)") from None
            time.sleep(0.2)


class TorchRanks(Ranks):
    """The ranks of a torchrun job, for `loop.run_loop`: gradients all-reduced (nccl when every rank has
    a GPU of its own, else gloo), the rest over gloo; each rank owns a contiguous range of the store's
    partitions (`distributed.owner_bounds`, set by `view`)."""

    distributed = True

    def __init__(self, rank, world, device, grads=None):
        self.rank, self.world, self.device, self.grads = rank, world, device, grads
        self.bounds = None

    def view(self, store) -> "RankView":
        self.bounds = owner_bounds(store.part_offsets, self.world)
        return RankView(store, self.bounds, self.rank)

    def owns(self, ids):
        return _owned(ids, self.bounds, self.rank)

    def owns_edges(self, edges):
        return _owns_edges(edges, self.bounds, self.rank)

    def average_gradients(self, model):
        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.grads)
        flat /= self.world
        at = 0
        for p in params:
            p.grad = flat[at:at + p.numel()].view_as(p)
            at += p.numel()

    def _reduce(self, values, op):
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def sum(self, values):
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values):
        return self._reduce(values, dist.ReduceOp.MAX)

    def gather(self, obj):
        every = [None] * self.world
        dist.all_gather_object(every, obj)
        return every

    @contextlib.contextmanager
    def one_at_a_time(self):
        if self.rank:
            dist.barrier()
        yield
        if not self.rank:
            dist.barrier()

    def share(self, obj):
        """Rank 0's `obj` on every rank."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def rank_config(cfg, world):
    """The configuration a rank's plan runs with: the global batch split over the ranks (ceil(B / R)
    seeds a rank's batch), so that an epoch takes about as many steps as in one process."""
    return cfg if world == 1 else cfg.replace(batch_size=-(-cfg.batch_size // world))


class RankView:
    """A rank's view of the shared store: the store, but its training nodes are the rank's own (those
    in [bounds[rank], bounds[rank + 1])), and on a link store its training edges those it owns
    (`distributed.edge_owner`): a policy's plan over it is that policy run on this rank's share,
    and `simulate(view, plan)` is this rank's I/O. `share` (rank, world) keys its batches' negatives."""

    def __init__(self, store, bounds, rank):
        self.store, self.bounds, self.rank = store, bounds, rank
        self.share = (int(rank), len(bounds) - 1)
        self.train_idx = _owned(np.asarray(store.train_idx), bounds, rank)

    @cached_property
    def train_edges(self) -> np.ndarray:
        edges = self.store.train_edges
        return edges[_owns_edges(edges, self.bounds, self.rank)]

    def __getattr__(self, name):
        return getattr(self.store, name)


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
    """The process group gradients are all-reduced over: None (the default gloo group) on the CPU or when two
    ranks share a GPU, else a new nccl group. Every rank calls it (it gathers every rank's GPU)."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    mine = str(getattr(props, "uuid", "")) or f"{socket.gethostname()}:{device.index}"
    every = [None] * world
    dist.all_gather_object(every, mine)
    return dist.new_group(backend="nccl", timeout=timeout) if len(set(every)) == world else None


def _owned(ids, bounds, rank):
    return ids[(ids >= bounds[rank]) & (ids < bounds[rank + 1])]


def _owns_edges(edges, bounds, rank):
    """bool [M]: which link edges rank `rank` trains and evaluates (`distributed.edge_owner`)."""
    return edge_owner(bounds, edges) == rank
