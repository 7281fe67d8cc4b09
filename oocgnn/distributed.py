"""Scale-out on torch.distributed: ranks own shards of the store, remote rows come by macrobatched
all_to_all (BatchGNN §2.1, §2.6); the training loop averages gradients (`loop.run_loop`).

Ownership: rank r of R owns a contiguous range of the store's partitions, i.e. the rows
[bounds[r], bounds[r+1]) in store order (`owner_bounds`: cuts at partition offsets, balanced by
rows). Its training nodes are the training nodes it owns; every rank runs the same number of steps
per epoch (ceil(train / batch_size), each rank's share split evenly), so the global batch and the
step count do not depend on R and the ranks stay in lockstep.

Exchange (BatchGNN's macrobatching): a rank samples k mini-batches ahead (our sampler, keyed by
(seed, epoch, b·R + r)), takes the union of their input rows, and fetches the rows other ranks own
in one exchange: request counts, the sorted ids and the rows, three `all_to_all_single` calls (gloo
supports them on the CPU, nccl on GPUs).

Topology: a rank holds only the neighbour lists of the rows it owns (`RankLists`). It samples a
macrobatch a layer at a time (`Sampler.sample_many`); before each layer, the lists of that layer's
frontier that it neither owns nor fetched earlier in the macrobatch come from their owners in one
exchange (ids, lengths, entries: `Exchange.fetch_lists`), and are dropped when the next macrobatch
starts. The samples are those of a sampler over the whole graph (its draws are keyed by node, not by
where a list came from). The rows and lists each rank sends and receives are a function of the
samples alone, so `simulate_exchange` predicts them without communication (simulated = executed, a
test).

Per-rank policies (`RankFeatures`): `inmemory` keeps the rank's own rows resident; `macrobatch`
keeps none and reads, per macrobatch, the union of the rows its own batches and the other ranks
need in one coalesced direct read, within the per-rank memory budget.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from .errors import StoreError, UserError
from .io import range_chunks
from .sampler import Sampler

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


def edge_owner(bounds, edges) -> np.ndarray:
    """The rank training (or evaluating) each link edge (u, v): the owner of u where u + v is even, else of v,
    so that the edges between two ranks' rows split about evenly between them."""
    edges = np.asarray(edges, dtype=np.int64)
    return owner(bounds, np.where((edges[:, 0] + edges[:, 1]) % 2 == 0, edges[:, 0], edges[:, 1]))


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


TRAFFIC = ("exchanges", "rows_sent", "rows_recv", "bytes_sent", "bytes_recv",
           "list_exchanges", "lists_sent", "lists_recv", "list_entries_sent", "list_entries_recv")


def _traffic(world, row_bytes):
    return {key: np.zeros(world, np.int64) for key in TRAFFIC}


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


def _tally_lists(t, rank, world, sent_ids, recv_ids, got_entries, served_entries, entry_bytes):
    """Count one list exchange of rank `rank`: it asked peer p for `sent_ids[p]` lists (`got_entries[p]`
    entries came back) and served `recv_ids[p]` lists (`served_entries[p]` entries); each list travels
    as its id, its length and its entries."""
    peers = np.arange(world) != rank
    out_ids, in_ids = int(sent_ids[peers].sum()), int(recv_ids[peers].sum())
    got, served = int(got_entries[peers].sum()), int(served_entries[peers].sum())
    head = COUNT_BYTES * (world - 1)
    t["list_exchanges"][rank] += 1
    t["lists_recv"][rank] += out_ids
    t["lists_sent"][rank] += in_ids
    t["list_entries_recv"][rank] += got
    t["list_entries_sent"][rank] += served
    t["bytes_sent"][rank] += head + (out_ids + in_ids) * ID_BYTES + served * entry_bytes
    t["bytes_recv"][rank] += head + (in_ids + out_ids) * ID_BYTES + got * entry_bytes


def simulate_exchange(store, world, k, batch_size, fanouts, seed=0, epochs=1, dense=False,
                      topology=None) -> pd.DataFrame:
    """Rows, neighbour lists and bytes each rank sends and receives per epoch with `world` ranks and
    macrobatches of `k` mini-batches, from the samples alone (no communication): one row per (epoch,
    rank). Per macrobatch a rank asks, layer by layer, for the remote lists it has not fetched in that
    macrobatch (`RankLists`), then for the remote input rows."""
    bounds = owner_bounds(store.part_offsets, world)
    sampler = Sampler(topology or store.neighbour_lists(), fanouts, seed, dense=dense)
    train, row_bytes = store.train_idx, store.feat_dim * 4
    degree, entry_bytes = store.degrees(), np.dtype(store.meta["index_dtype"]).itemsize
    depth = len(sampler.fanouts)
    out = []
    for epoch in range(epochs):
        t = _traffic(world, row_bytes)
        batches = [rank_batches(train, bounds, r, batch_size, seed, epoch) for r in range(world)]
        for c in range(0, len(batches[0]), k):
            asked = np.zeros((world, world), np.int64)     # asked[r, p]: ids rank r asks of p
            lists = np.zeros((depth, 2, world, world), np.int64)   # per layer: lists, entries r asks of p
            for r in range(world):
                held, layer = np.empty(0, np.int64), [0]

                def fetch(nodes, r=r):
                    nonlocal held
                    remote = nodes[(owner(bounds, nodes) != r) & ~np.isin(nodes, held)]
                    who = owner(bounds, remote)
                    lists[layer[0], 0, r] = np.bincount(who, minlength=world)
                    lists[layer[0], 1, r] = np.bincount(who, weights=degree[remote], minlength=world)
                    held, layer[0] = np.union1d(held, remote), layer[0] + 1
                keys = [batch_key(b, r, world) for b in range(c, min(c + k, len(batches[r])))]
                samples = sampler.sample_many(batches[r][c:c + k], epoch, keys, before_layer=fetch)
                _, remote = chunk_request([s.input_nodes for s in samples], bounds, r)
                asked[r] = np.bincount(owner(bounds, remote), minlength=world)
            for r in range(world):
                for d in range(depth):
                    _tally_lists(t, r, world, lists[d, 0, r], lists[d, 0, :, r], lists[d, 1, r], lists[d, 1, :, r],
                                 entry_bytes)
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
            rows.append({"ranks": world, "k": k, "rows": int(df.rows_recv.sum()), "lists": int(df.lists_recv.sum()),
                         "bytes": int(df.bytes_recv.sum()), "max_rank_bytes": int(df.bytes_recv.max()),
                         "exchanges": int(df.exchanges.max() + df.list_exchanges.max())})
    return pd.DataFrame(rows)


class Exchange:
    """One rank's end of the macrobatched feature exchange over the default process group; counts
    what it sends and receives exactly, as `simulate_exchange` does."""

    def __init__(self, bounds, rank, world, feat_dim):
        self.bounds, self.rank, self.world, self.dim = bounds, rank, world, int(feat_dim)
        self.traffic = _traffic(world, 4 * self.dim)

    def _ask(self, remote) -> tuple:
        """Send the sorted remote ids to their owners: (ids asked of each peer, ids each peer asked of this
        rank, those ids), two `all_to_all_single` calls (counts, then ids)."""
        import torch.distributed as dist
        send = torch.from_numpy(np.bincount(owner(self.bounds, remote), minlength=self.world).astype(np.int64))
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        asked = torch.empty(int(recv.sum()), dtype=torch.int64)
        dist.all_to_all_single(asked, torch.from_numpy(np.ascontiguousarray(remote, dtype=np.int64)),
                               recv.tolist(), send.tolist())
        return send, recv, asked.numpy()

    def fetch(self, remote, serve, counted=True) -> torch.Tensor:
        """Rows of the sorted remote ids `remote` ([len, dim] float32) from their owners; `serve(ids)`
        returns this rank's rows of the ids the peers ask for (it is called between the two halves)."""
        import torch.distributed as dist
        send, recv, asked = self._ask(remote)
        sl, rl = send.tolist(), recv.tolist()
        rows = serve(asked)
        got = torch.empty(len(remote), self.dim, dtype=torch.float32)
        dist.all_to_all_single(got, rows.contiguous(), sl, rl)
        if counted:
            _tally(self.traffic, self.rank, self.world, send.numpy(), recv.numpy(), 4 * self.dim)
        return got

    def fetch_lists(self, remote, serve, entry_dtype, counted=True) -> tuple:
        """(lengths, entries) of the neighbour lists of the sorted remote ids `remote`, from their owners:
        counts, ids, lengths and entries, four `all_to_all_single` calls; `serve(ids)` returns this rank's
        (lengths, concatenated entries) of the ids the peers ask for."""
        import torch.distributed as dist
        send, recv, asked = self._ask(remote)
        sl, rl = send.tolist(), recv.tolist()
        lens, entries = serve(asked)
        got_lens = torch.empty(len(remote), dtype=torch.int64)
        dist.all_to_all_single(got_lens, torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int64)), sl, rl)
        got_lens = got_lens.numpy()
        served, got = _per_peer(lens, rl), _per_peer(got_lens, sl)      # entries to and from each peer
        entries = torch.from_numpy(np.ascontiguousarray(entries, dtype=entry_dtype))   # as stored: int32 or int64
        out = torch.empty(int(got.sum()), dtype=entries.dtype)
        dist.all_to_all_single(out, entries, got.tolist(), served.tolist())
        if counted:
            _tally_lists(self.traffic, self.rank, self.world, send.numpy(), recv.numpy(), got, served,
                         np.dtype(entry_dtype).itemsize)
        return got_lens, out.numpy()

    def record(self) -> dict:
        return {key: int(v[self.rank]) for key, v in self.traffic.items()}


def _per_peer(values, counts) -> np.ndarray:
    """Sums of `values` in consecutive segments of `counts` (one per peer)."""
    peers = np.repeat(np.arange(len(counts)), counts)
    return np.bincount(peers, weights=np.asarray(values, np.float64), minlength=len(counts)).astype(np.int64)


class RankLists:
    """A rank's topology source for the sampler: the neighbour lists of the rows it owns, resident (read
    once, `indptr` and entries of its range only), and the remote lists the current macrobatch needs,
    fetched from their owners a layer at a time (`fetch`, the hook of `Sampler.sample_many`) and
    dropped when the next macrobatch starts (`clear`). No rank holds the whole topology."""

    def __init__(self, num_nodes, lo, hi, indptr, indices):
        """`indptr` [hi - lo + 1] and `indices`: the lists of the rows [lo, hi) this rank owns."""
        self.num_nodes, self.lo, self.hi = int(num_nodes), int(lo), int(hi)
        self.dtype = np.dtype(indices.dtype)
        self.own_indptr = np.asarray(indptr, dtype=np.int64) - int(indptr[0])
        own = int(self.own_indptr[-1])
        self.buf = np.empty(own + max(1024, own // 4), self.dtype)
        self.buf[:own] = indices
        self.own, self.peak_entries = own, own
        self.clear()

    @classmethod
    def of_store(cls, store, bounds, rank) -> "RankLists":
        """The lists of rank `rank`'s rows, read from the store's indices.bin (its range only)."""
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        indptr = np.asarray(store.indptr[lo:hi + 1], dtype=np.int64)
        dtype = np.dtype(store.meta["index_dtype"])
        indices = np.fromfile(store.path / "indices.bin", dtype=dtype, count=int(indptr[-1] - indptr[0]),
                              offset=int(indptr[0]) * dtype.itemsize)
        if len(indices) and (indices.min() < 0 or indices.max() >= store.num_nodes):
            raise StoreError(f"store {store.path}: indices.bin holds a node id outside 0..{store.num_nodes - 1}; "
                             "the file is damaged (run `oocgnn info --verify`)")
        return cls(store.num_nodes, lo, hi, indptr, indices)

    def clear(self):
        """Forget the remote lists (a new macrobatch)."""
        self.cursor = self.own
        self.held, self.held_start, self.held_len = (np.empty(0, np.int64) for _ in range(3))

    @property
    def nbytes(self) -> int:
        return self.buf.nbytes + self.own_indptr.nbytes

    def serve(self, ids):
        """(lengths, concatenated entries) of this rank's own lists `ids` (asked by its peers)."""
        local = np.asarray(ids, dtype=np.int64) - self.lo
        if len(local) and (local.min() < 0 or local.max() >= self.hi - self.lo):
            raise UserError("a peer asked this rank for a neighbour list it does not own (ranks disagree on "
                            "ownership: were they started on the same store?)")
        starts, lens = self.own_indptr[local], self.own_indptr[local + 1] - self.own_indptr[local]
        first = np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else lens
        idx = np.repeat(starts - first, lens) + np.arange(int(lens.sum()))
        return lens, self.buf[idx]

    def fetch(self, nodes, exchange, counted=True):
        """Bring the lists of `nodes` (sorted unique) that are neither owned nor held, from their owners."""
        nodes = np.asarray(nodes, dtype=np.int64)
        remote = nodes[((nodes < self.lo) | (nodes >= self.hi)) & ~np.isin(nodes, self.held)]
        lens, entries = exchange.fetch_lists(remote, self.serve, self.dtype, counted)
        need = self.cursor + len(entries)
        if need > len(self.buf):                      # grow: a copy, rare (capacity doubles)
            grown = np.empty(max(need, 2 * len(self.buf)), self.dtype)
            grown[:self.cursor] = self.buf[:self.cursor]
            self.buf = grown
        self.buf[self.cursor:need] = entries
        starts = self.cursor + np.concatenate(([0], np.cumsum(lens)[:-1])) if len(lens) else np.empty(0, np.int64)
        self.cursor, self.peak_entries = need, max(self.peak_entries, need)
        ids = np.concatenate([self.held, remote])
        order = np.argsort(ids, kind="stable")
        self.held = ids[order]
        self.held_start = np.concatenate([self.held_start, starts])[order]
        self.held_len = np.concatenate([self.held_len, lens.astype(np.int64)])[order]

    def spans(self, nodes):
        """(starts, ends) of `nodes`' lists in `buf` (a visible set's, for `sampler.induced_csc`)."""
        return self.lists(nodes)[:2]

    def lists(self, nodes, known=0, prev=None):
        """(starts, ends, buf) of `nodes`' lists: owned ones in place, remote ones as fetched."""
        nodes = np.asarray(nodes, dtype=np.int64)
        mine = (nodes >= self.lo) & (nodes < self.hi)
        starts, ends = np.empty(len(nodes), np.int64), np.empty(len(nodes), np.int64)
        local = nodes[mine] - self.lo
        starts[mine], ends[mine] = self.own_indptr[local], self.own_indptr[local + 1]
        far = nodes[~mine]
        pos = np.minimum(np.searchsorted(self.held, far), max(len(self.held) - 1, 0))
        if len(far) and (not len(self.held) or not np.array_equal(self.held[pos], far)):
            raise ValueError("the sampler asked for a remote list that was not fetched")
        starts[~mine] = self.held_start[pos] if len(far) else 0
        ends[~mine] = starts[~mine] + (self.held_len[pos] if len(far) else 0)
        return starts, ends, self.buf


def sample_macrobatch(sampler, lists, exchange, seed_sets, epoch, keys, counted=True) -> list:
    """The samples of one macrobatch over a rank's lists: walked a layer at a time, each layer's remote
    lists fetched in one exchange before it (every rank makes the same number of exchanges)."""
    lists.clear()
    return sampler.sample_many(seed_sets, epoch, keys, before_layer=lambda nodes: lists.fetch(nodes, exchange, counted))


class RankFeatures:
    """The rank's own feature rows under a per-rank policy: `inmemory` (its range resident, read at
    setup) or `macrobatch` (nothing resident; per macrobatch one coalesced read of the own rows the
    rank and its peers need, held until the next). `data` is the rank's `shards.RankData`: its rows
    come from the shared store's range or from its shard."""

    def __init__(self, data, policy, budget):
        if policy not in POLICIES:
            raise UserError(f"--distributed runs the policies {', '.join(POLICIES)} per rank; got {policy!r}")
        self.policy, self.budget, self.row_bytes = policy, int(budget), data.row_bytes
        self.lo, self.hi, self.dim = data.lo, data.hi, data.feat_dim
        self.reader = data.reader("direct")           # local ids: row lo of the store is 0
        self.resident = None
        self.peak_rows = self.peak_eval_rows = 0
        if policy == "inmemory":
            self.resident = torch.empty(self.hi - self.lo, self.dim)
            for a, b in range_chunks(0, self.hi - self.lo, data.row_stride):
                self.resident[a:b] = torch.from_numpy(self.reader.read_range(a, b))
            self.peak_rows = self.hi - self.lo
        self.ids, self.rows = np.empty(0, np.int64), torch.empty(0, self.dim)

    def load(self, local, asked, training=True):
        """Make rows `local` (this rank's batches) and `asked` (its peers') available; `rows_of` reads them.
        Training's macrobatches must fit the budget; evaluation's are counted apart (`peak_eval_rows`), as
        one process reports its evaluation's memory beside the plan's."""
        if self.resident is not None:
            return
        ids = np.union1d(local, asked)
        need = (len(ids) + len(asked)) * self.row_bytes      # the union, and the copy sent out
        if training and need > self.budget:
            raise UserError(f"a macrobatch needs {need} bytes of rows on this rank, more than --memory-budget "
                            f"{self.budget}: lower --macrobatch or --batch-size, or raise the budget")
        self.ids = ids
        self.rows = torch.from_numpy(self.reader.read_rows(ids - self.lo)) if len(ids) else self.rows[:0]
        if training:
            self.peak_rows = max(self.peak_rows, len(ids) + len(asked))
        else:
            self.peak_eval_rows = max(self.peak_eval_rows, len(ids) + len(asked))

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
        features.load(local, asked, training=counted)
        return features.rows_of(asked) if len(asked) else torch.empty(0, exchange.dim)
    got = exchange.fetch(remote, serve, counted)
    return MacrobatchInputs(local, features, remote, got)
