"""Scale-out on torch.distributed: ranks own shards of the store, remote rows come by macrobatched
all_to_all (BatchGNN §2.1, §2.6), DistributedDataParallel averages gradients.

Ownership: rank r of R owns a contiguous range of the store's partitions, i.e. the rows
[bounds[r], bounds[r+1]) in store order (`owner_bounds`: cuts at partition offsets, balanced by
rows). Its training nodes are the training nodes it owns; every rank runs the same number of steps
per epoch (ceil(train / batch_size), each rank's share split evenly), so the global batch and the
step count do not depend on R and DDP stays in lockstep.

Exchange (BatchGNN's macrobatching): a rank samples k mini-batches ahead (our sampler, keyed by
(seed, epoch, b·R + r)), takes the union of their input rows, and fetches the rows other ranks own
in one exchange: request counts, the sorted ids and the rows, three `all_to_all_single` calls (gloo
supports them on the CPU, nccl on GPUs). The rows each rank sends and receives are a function of the
samples alone, so `simulate_exchange` predicts them without communication (simulated = executed, a
test). Only features are exchanged: every rank keeps the whole topology (indptr and lists, read from
the shared store), so remote neighbour lists never travel.

Per-rank policies (`RankFeatures`): `inmemory` keeps the rank's own rows resident; `macrobatch`
keeps none and reads, per macrobatch, the union of the rows its own batches and the other ranks
need in one coalesced direct read, within the per-rank memory budget.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from .errors import UserError
from .io import range_chunks

POLICIES = ("inmemory", "macrobatch")
ID_BYTES = 8                 # request ids travel as int64
COUNT_BYTES = 8              # one int64 count per peer per exchange


def owner_bounds(part_offsets, world) -> np.ndarray:
    """Row bounds [R+1] of R contiguous ranges of partitions, each cut at the partition offset
    nearest to an even share of the rows; every rank gets at least one partition."""
    off = np.asarray(part_offsets, dtype=np.int64)
    parts, n = len(off) - 1, int(off[-1])
    if world < 1 or world > parts:
        raise UserError(f"{world} ranks need a store with at least {world} partitions; it has {parts} "
                        "(prepare it with --partitioner metis|fennel --parts K)")
    cuts = [0]
    for r in range(1, world):
        k = int(np.argmin(np.abs(off - r * n / world)))
        cuts.append(min(max(k, cuts[-1] + 1), parts - (world - r)))
    cuts.append(parts)
    return off[cuts]


def owner(bounds, ids) -> np.ndarray:
    """The rank owning each store id."""
    return np.searchsorted(bounds, ids, side="right") - 1


def steps_per_epoch(num_train, batch_size) -> int:
    return max(1, math.ceil(num_train / batch_size))


def rank_batches(train_idx, bounds, rank, batch_size, seed, epoch) -> list:
    """Rank `rank`'s mini-batches of `epoch`: its own training nodes, shuffled, split evenly into as
    many batches as a single process would run (the same for every rank)."""
    lo, hi = bounds[rank], bounds[rank + 1]
    mine = train_idx[(train_idx >= lo) & (train_idx < hi)]
    perm = np.random.default_rng([seed, epoch, rank]).permutation(mine)
    return np.array_split(perm, steps_per_epoch(len(train_idx), batch_size))


def batch_key(b, rank, world) -> int:
    """The sampler's batch counter of rank `rank`'s batch b (distinct across ranks)."""
    return b * world + rank


def chunk_request(inputs, bounds, rank) -> tuple[np.ndarray, np.ndarray]:
    """(local, remote) sorted unique input rows of a macrobatch's samples' `inputs`."""
    union = np.unique(np.concatenate(inputs)) if len(inputs) else np.empty(0, np.int64)
    mine = owner(bounds, union) == rank
    return union[mine], union[~mine]


def _traffic(world, row_bytes):
    return {key: np.zeros(world, np.int64) for key in ("exchanges", "rows_sent", "rows_recv", "bytes_sent", "bytes_recv")}


def _tally(t, rank, world, sent_ids, recv_ids, row_bytes):
    """Count one exchange of rank `rank`: it sent `sent_ids[p]` ids to peer p and got rows back, and
    received `recv_ids[p]` ids from p and sent rows back (self slots are not traffic)."""
    peers = np.arange(world) != rank
    out_ids, in_ids = int(sent_ids[peers].sum()), int(recv_ids[peers].sum())
    head = COUNT_BYTES * (world - 1)
    t["exchanges"][rank] += 1
    t["rows_sent"][rank] += in_ids                   # rows served to the peers that asked
    t["rows_recv"][rank] += out_ids                  # rows fetched from their owners
    t["bytes_sent"][rank] += head + out_ids * ID_BYTES + in_ids * row_bytes
    t["bytes_recv"][rank] += head + in_ids * ID_BYTES + out_ids * row_bytes


def simulate_exchange(store, world, k, batch_size, fanouts, seed=0, epochs=1, dense=False,
                      topology=None) -> pd.DataFrame:
    """Rows and bytes each rank sends and receives per epoch with `world` ranks and macrobatches of
    `k` mini-batches, from the samples alone (no communication): one row per (epoch, rank)."""
    from .sampler import Sampler
    bounds = owner_bounds(store.part_offsets, world)
    sampler = Sampler(topology or store.neighbour_lists(), fanouts, seed, dense=dense)
    train, row_bytes = store.train_idx, store.feat_dim * 4
    out = []
    for epoch in range(epochs):
        t = _traffic(world, row_bytes)
        batches = [rank_batches(train, bounds, r, batch_size, seed, epoch) for r in range(world)]
        for c in range(0, len(batches[0]), k):
            asked = np.zeros((world, world), np.int64)     # asked[r, p]: ids rank r asks of p
            for r in range(world):
                inputs = [sampler.sample(s, epoch, batch_key(b, r, world)).input_nodes
                          for b, s in enumerate(batches[r][c:c + k], start=c)]
                _, remote = chunk_request(inputs, bounds, r)
                asked[r] = np.bincount(owner(bounds, remote), minlength=world)
            for r in range(world):
                _tally(t, r, world, asked[r], asked[:, r], row_bytes)
        out += [{"epoch": epoch, "rank": r, "world": world, "k": k, **{key: int(v[r]) for key, v in t.items()}}
                for r in range(world)]
    return pd.DataFrame(out)


def projection(store, worlds, ks, batch_size, fanouts, seed=0) -> pd.DataFrame:
    """Exchanged rows and bytes per epoch, summed over ranks, for each R in `worlds` and k in `ks`."""
    rows = []
    for world in worlds:
        for k in ks:
            df = simulate_exchange(store, world, k, batch_size, fanouts, seed)
            rows.append({"ranks": world, "k": k, "rows": int(df.rows_recv.sum()), "bytes": int(df.bytes_recv.sum()),
                         "max_rank_bytes": int(df.bytes_recv.max()), "exchanges": int(df.exchanges.max())})
    return pd.DataFrame(rows)


class Exchange:
    """One rank's end of the macrobatched feature exchange over the default process group; counts
    what it sends and receives exactly, as `simulate_exchange` does."""

    def __init__(self, bounds, rank, world, feat_dim):
        self.bounds, self.rank, self.world, self.dim = bounds, rank, world, int(feat_dim)
        self.traffic = _traffic(world, 4 * self.dim)

    def fetch(self, remote, serve, counted=True) -> torch.Tensor:
        """Rows of the sorted remote ids `remote` ([len, dim] float32) from their owners; `serve(ids)`
        returns this rank's rows of the ids the peers ask for (it is called between the two halves)."""
        import torch.distributed as dist
        send = torch.from_numpy(np.bincount(owner(self.bounds, remote), minlength=self.world).astype(np.int64))
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        sl, rl = send.tolist(), recv.tolist()
        asked = torch.empty(sum(rl), dtype=torch.int64)
        dist.all_to_all_single(asked, torch.from_numpy(np.ascontiguousarray(remote, dtype=np.int64)), rl, sl)
        rows = serve(asked.numpy())
        got = torch.empty(len(remote), self.dim, dtype=torch.float32)
        dist.all_to_all_single(got, rows.contiguous(), sl, rl)
        if counted:
            _tally(self.traffic, self.rank, self.world, send.numpy(), recv.numpy(), 4 * self.dim)
        return got

    def record(self) -> dict:
        return {key: int(v[self.rank]) for key, v in self.traffic.items()}


class RankFeatures:
    """The rank's own feature rows under a per-rank policy: `inmemory` (its range resident, read at
    setup) or `macrobatch` (nothing resident; per macrobatch one coalesced read of the own rows the
    rank and its peers need, held until the next)."""

    def __init__(self, store, policy, bounds, rank, budget):
        if policy not in POLICIES:
            raise UserError(f"--distributed runs the policies {', '.join(POLICIES)} per rank; got {policy!r}")
        self.store, self.policy, self.budget = store, policy, int(budget)
        self.lo, self.hi = int(bounds[rank]), int(bounds[rank + 1])
        self.reader = store.reader("direct")
        self.resident = None
        self.peak_rows = 0
        if policy == "inmemory":
            self.resident = torch.empty(self.hi - self.lo, store.feat_dim)
            for a, b in range_chunks(self.lo, self.hi, store.row_stride):
                self.resident[a - self.lo:b - self.lo] = torch.from_numpy(self.reader.read_range(a, b))
            self.peak_rows = self.hi - self.lo
        self.ids, self.rows = np.empty(0, np.int64), torch.empty(0, store.feat_dim)

    def load(self, local, asked):
        """Make rows `local` (this rank's batches) and `asked` (its peers') available; `rows_of` reads them."""
        if self.resident is not None:
            return
        ids = np.union1d(local, asked)
        need = (len(ids) + len(asked)) * self.store.row_bytes      # the union, and the copy sent out
        if need > self.budget:
            raise UserError(f"a macrobatch needs {need} bytes of rows on this rank, more than --memory-budget "
                            f"{self.budget}: lower --macrobatch or --batch-size, or raise the budget")
        self.ids, self.rows = ids, torch.from_numpy(self.reader.read_rows(ids)) if len(ids) else self.rows[:0]
        self.peak_rows = max(self.peak_rows, len(ids) + len(asked))

    def rows_of(self, ids) -> torch.Tensor:
        if self.resident is not None:
            return self.resident[torch.from_numpy(ids - self.lo)]
        return self.rows[torch.from_numpy(np.searchsorted(self.ids, ids))]

    def close(self):
        self.reader.close()


class MacrobatchInputs:
    """The input rows of one macrobatch on one rank: its own and the fetched remote rows, by id."""

    def __init__(self, local_ids, features, remote_ids, remote_rows):
        self.ids = np.concatenate([local_ids, remote_ids])
        order = np.argsort(self.ids, kind="stable")
        self.ids = self.ids[order]
        rows = torch.cat([features.rows_of(local_ids), remote_rows]) if len(self.ids) else remote_rows
        self.rows = rows[torch.from_numpy(order)]

    def gather(self, ids) -> torch.Tensor:
        return self.rows[torch.from_numpy(np.searchsorted(self.ids, ids))]


def fetch_macrobatch(samples, features, exchange, counted=True) -> MacrobatchInputs:
    """BatchGNN's one exchange per macrobatch: the union of the samples' input rows, the remote ones
    fetched from their owners, the local ones (and those the peers ask for) read by the rank's policy."""
    local, remote = chunk_request([s.input_nodes for s in samples], exchange.bounds, exchange.rank)

    def serve(asked):
        features.load(local, asked)
        return features.rows_of(asked) if len(asked) else torch.empty(0, exchange.dim)
    got = exchange.fetch(remote, serve, counted)
    return MacrobatchInputs(local, features, remote, got)
