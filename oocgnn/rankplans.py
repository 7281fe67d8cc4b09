"""What one rank of a distributed run trains on, chunk by chunk: a per-rank policy (`make_rank_plan`).

A rank plan cuts each epoch into chunks (`chunks(epoch)`), and turns a chunk into its samples and a
`gather(input_nodes)` of their rows (`prepare`). Every rank of a run has as many chunks per epoch and
as many batches per chunk, so DistributedDataParallel's collectives stay in lockstep.

- `inmemory`, `macrobatch` (`MacrobatchPlan`, BatchGNN §2.6): a chunk is k = --macrobatch mini-batches
  of the rank's training nodes, sampled over the whole graph (remote lists fetched per layer), their
  remote rows fetched in one exchange (`distributed.fetch_macrobatch`).
- `hierbatching` (`MegabatchPlan`, HierBatching Alg. 1 on the rank's shard): mega-batches of N_d of
  the rank's own partitions plus a static cache of its top-degree rows, p passes, sampling inside the
  mega-batch ∪ static nodes: every row and list a batch touches is the rank's own, so nothing but
  gradients crosses ranks. A chunk is one batch of ceil(B / R) seeds; a mega-batch's rows are read (one
  sequential read per part) when its first batch comes, in the foreground. The mega-batch and the
  static rows fit --memory-budget (per rank). Ranks whose epoch has fewer batches end it with empty
  ones (a zero loss: DDP's backward runs on every rank).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .distributed import batch_key, fetch_macrobatch, rank_batches, sample_macrobatch
from .errors import UserError
from .io import range_chunks
from .policies import resolve_static_ratio

RANK_POLICIES = ("inmemory", "macrobatch", "hierbatching")


def make_rank_plan(cfg, data, features, lists, sampler, exchange):
    """The rank plan of `cfg.policy` on this rank's `data` (`shards.RankData`)."""
    if cfg.policy not in RANK_POLICIES:
        raise UserError(f"--distributed runs the policies {', '.join(RANK_POLICIES)} per rank; got {cfg.policy!r}")
    if cfg.policy == "hierbatching":
        return MegabatchPlan(cfg, data, lists, sampler)
    return MacrobatchPlan(cfg, data, features, lists, sampler, exchange)


class MacrobatchPlan:
    """Chunks of k mini-batches of the rank's training nodes (`distributed.rank_batches`)."""
    exchanges = True

    def __init__(self, cfg, data, features, lists, sampler, exchange):
        self.cfg, self.data, self.features, self.lists = cfg, data, features, lists
        self.sampler, self.exchange, self.k = sampler, exchange, int(cfg.get("macrobatch"))

    def chunks(self, epoch) -> list:
        batches = rank_batches(self.data.train_idx, self.data.bounds, self.data.rank, self.cfg.batch_size,
                               self.cfg.seed, epoch)
        return [list(enumerate(batches[c:c + self.k], start=c)) for c in range(0, len(batches), self.k)]

    def prepare(self, epoch, chunk, stages) -> tuple:
        """(samples, gather) of a chunk: sampled a layer at a time, remote rows in one exchange; the
        seconds of each go to `stages`."""
        t = time.perf_counter()
        keys = [batch_key(b, self.data.rank, self.data.world) for b, _ in chunk]
        samples = sample_macrobatch(self.sampler, self.lists, self.exchange, [s for _, s in chunk], epoch, keys)
        t1 = time.perf_counter()
        gather = fetch_macrobatch(samples, self.features, self.exchange).gather
        stages["sample"] += t1 - t
        stages["exchange"] += time.perf_counter() - t1
        return samples, gather

    def describe(self) -> dict:
        return {"macrobatch": self.k}


class MegabatchPlan:
    """HierBatching on the rank's own partitions (see the module docstring)."""
    exchanges = False

    def __init__(self, cfg, data, lists, sampler):
        self.cfg, self.data, self.lists, self.sampler = cfg, data, lists, sampler
        self.passes = float(cfg.get("passes"))
        self.static_ratio = resolve_static_ratio(cfg.get("static_ratio"), cfg.memory_budget_bytes,
                                                 (data.hi - data.lo) * data.row_bytes)   # auto: the rank's
        self.batch_size = max(1, -(-cfg.batch_size // data.world))      # the global batch, split over ranks
        self.part_offsets = np.asarray(data.part_offsets, dtype=np.int64)
        self.offsets = self._offsets(data.rank)
        self.num_parts = len(self.offsets) - 1
        degree = np.diff(lists.own_indptr)
        k = int(self.static_ratio * (data.hi - data.lo))
        self.static_ids = np.sort(np.argsort(-degree, kind="stable")[:k]).astype(np.int64) + data.lo
        self.n_d = self._n_d(data.rank, check=True)
        self.reader = data.reader("direct")
        self.static_rows = self._read(self.static_ids)
        self.current, self.rows, self.visible = None, None, None
        self.peak_rows = len(self.static_ids)
        self.read_rows = len(self.static_ids)

    def _offsets(self, rank):
        lo, hi = self.data.bounds[rank], self.data.bounds[rank + 1]
        return self.part_offsets[(self.part_offsets >= lo) & (self.part_offsets <= hi)]

    def _n_d(self, rank, check=False) -> int:
        """N_d of `rank`: --parts-per-megabatch, or the most of its parts (the largest) that fit the budget
        beside its static rows, counted twice: held, and copied into each mega-batch's rows (computable for
        every rank: every rank's batch count is known to all)."""
        offsets = self._offsets(rank)
        static = int(self.static_ratio * (offsets[-1] - offsets[0]))
        sizes = np.sort(np.diff(offsets))[::-1]
        room = self.cfg.memory_budget_bytes // self.data.row_bytes - 2 * static
        fit = int(np.searchsorted(np.cumsum(sizes), room, side="right"))
        want = int(self.cfg.get("parts_per_megabatch"))
        if check and (fit < 1 or (want and want > fit)):
            need = (int(sizes[:max(want, 1)].sum()) + 2 * static) * self.data.row_bytes
            raise UserError(f"hierbatching on rank {rank}: {max(want, 1)} of its parts and its static rows need "
                            f"{need} bytes, more than --memory-budget {self.cfg.memory_budget_bytes} (per rank): "
                            "raise it, or lower --parts-per-megabatch or --static-ratio")
        return max(1, min(want or fit, len(sizes)))

    def _read(self, ids):
        return torch.from_numpy(self.reader.read_rows(ids - self.data.lo)) if len(ids) else \
            torch.empty(0, self.data.feat_dim)

    def _groups(self, epoch, rank=None) -> list:
        """[(parts, training ids)] of `rank`'s mega-batches in `epoch`: its parts shuffled, N_d at a time."""
        rank = self.data.rank if rank is None else rank
        offsets = self._offsets(rank)
        n_d = self.n_d if rank == self.data.rank else self._n_d(rank)
        perm = np.random.default_rng([self.cfg.seed, epoch, rank, 0]).permutation(len(offsets) - 1)
        train = self.data.train_idx
        train = train[(train >= offsets[0]) & (train < offsets[-1])]
        part = np.searchsorted(offsets, train, side="right") - 1
        return [(parts, train[np.isin(part, parts)]) for parts in
                (np.sort(perm[i:i + n_d]) for i in range(0, len(offsets) - 1, n_d))]

    def _pass_lengths(self, n) -> list:
        """Seeds per pass over a mega-batch of n training nodes: floor(p) full, then round(frac(p)·n) (App. B)."""
        full, frac = divmod(self.passes, 1.0)
        return [n] * int(full) + ([int(round(frac * n))] if round(frac * n) else [])

    def _count(self, epoch, rank) -> int:
        return sum(-(-m // self.batch_size) for _, t in self._groups(epoch, rank) for m in self._pass_lengths(len(t)))

    def chunks(self, epoch) -> list:
        """One batch per chunk: each mega-batch's passes cut into batches of ceil(B / R) seeds (as one
        process cuts them at B), then empty batches up to the epoch's most batches over the ranks (each
        rank computes every rank's count: no communication), so that every rank steps as often."""
        rng = np.random.default_rng([self.cfg.seed, epoch, self.data.rank, 1])
        out = []
        for g, (parts, train) in enumerate(self._groups(epoch)):
            for m in self._pass_lengths(len(train)):
                seq = rng.permutation(train)[:m]
                out += [(g, parts, seq[i:i + self.batch_size]) for i in range(0, m, self.batch_size)]
        most = max(self._count(epoch, r) for r in range(self.data.world))
        out += [(None, None, np.empty(0, np.int64))] * (most - len(out))
        return [[(b, item)] for b, item in enumerate(out)]

    def _load(self, g, parts):
        """Hold mega-batch g ((epoch, index)): its parts' rows (one read per part) and the static rows, by sorted id."""
        if self.current == g:
            return
        ranges = [(int(self.offsets[p]), int(self.offsets[p + 1])) for p in parts]
        ids = np.concatenate([np.arange(a, b) for a, b in ranges] + [self.static_ids])
        order = np.argsort(ids, kind="stable")
        self.visible, first = np.unique(ids[order], return_index=True)
        rows = [self.static_rows]
        for a, b in ranges:
            for lo, hi in range_chunks(a - self.data.lo, b - self.data.lo, self.data.row_stride):
                rows.append(torch.from_numpy(self.reader.read_range(lo, hi)))
        loaded = torch.cat(rows[1:] + rows[:1])           # the parts' rows, then the static ones (ids' order)
        self.rows = loaded[torch.from_numpy(order[first])]
        self.current = g
        self.peak_rows = max(self.peak_rows, len(self.visible) + len(self.static_ids))
        self.read_rows += len(ids) - len(self.static_ids)

    def prepare(self, epoch, chunk, stages) -> tuple:
        [(b, (g, parts, seeds))] = chunk
        t = time.perf_counter()
        if g is not None:
            self._load((epoch, g), parts)
        elif self.visible is None:                    # a rank with no training nodes: nothing to sample in
            self.visible, self.rows = np.empty(0, np.int64), torch.empty(0, self.data.feat_dim)
        t1 = time.perf_counter()
        key = batch_key(b, self.data.rank, self.data.world)
        sample = self.sampler.sample(seeds, epoch, key, self.visible if len(seeds) else None)
        stages["load"] += t1 - t
        stages["sample"] += time.perf_counter() - t1
        visible, rows = self.visible, self.rows
        return [sample], lambda ids: rows[torch.from_numpy(np.searchsorted(visible, ids))]

    def describe(self) -> dict:
        return {"parts_per_megabatch": self.n_d, "rank_parts": self.num_parts, "static_rows": len(self.static_ids),
                "passes": self.passes, "peak_rows": self.peak_rows, "rows_read": self.read_rows}
