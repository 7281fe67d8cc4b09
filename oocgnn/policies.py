"""Executed policies: one object per run says what is resident, which batches, and how rows are read.

A policy is a schedule (`oocgnn.schedules`: the same object the simulator replays) plus a
feature residency: rows kept in RAM, addressed by a slot table, and a reader for the rest.

- `inmemory`: every row resident (the NS baseline), random batches.
- `mmap`: no row resident, an np.memmap reader (the OS page cache is the cache), random batches.
- `hierbatching` (HierBatching Alg. 1): mega-batches of N_d parts loaded as sequential range
  reads into the second of two buffers while training runs on the first (§3.3), a static cache
  of the top r_s·N nodes by degree, p passes, sampling inside mega-batch ∪ static nodes.
- `outre` (OUTRE §4.2–4.3): partition micro-batches sampled on the full topology, a static
  feature cache (degree or profiled frequency) with direct reads for misses, and historical
  embeddings (`oocgnn.history`).

Every resident array is counted in `memory` and checked against the budget.
"""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .errors import UserError
from .io import IOStats, drop_file_cache
from .memcap import MemoryCap
from .sampler import Sampler, induced_csc, sampled_steps
from .schedules import make_schedule
from .units import format_size


class ResidentRows:
    """Feature rows in RAM: `slot[id]` (int32, −1 = absent) indexes `rows` [capacity, D]."""

    def __init__(self, num_nodes, dim, capacity):
        self.rows = torch.empty((int(capacity), dim), dtype=torch.float32)
        self.slot = np.full(num_nodes, -1, dtype=np.int32)

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * 4 + self.slot.nbytes

    def place(self, ids, base, data):
        """Put rows `data` (for `ids`) at slots base.. and point the table at them."""
        self.rows[base:base + len(data)] = torch.from_numpy(data)
        self.slot[ids] = np.arange(base, base + len(data), dtype=np.int32)

    def drop(self, ids):
        self.slot[ids] = -1


class Policy:
    """Base policy: random batches, nothing resident, `reader_kind` rows read on demand."""
    name = "base"
    reader_kind = "direct"
    eval_reader = None       # evaluation's own reader; None: it reads through `reader` (subtracted)

    def __init__(self, store, cfg):
        self.store, self.cfg = store, cfg
        self.schedule = make_schedule("random", store, batch_size=cfg.batch_size, seed=cfg.seed)
        self.static_ids = np.empty(0, dtype=np.int64)      # rows resident for the whole run
        self.resident = ResidentRows(store.num_nodes, store.feat_dim, 0)
        self.reader = store.reader(self.reader_kind)
        self.io_before_switch = IOStats()              # stats of readers replaced mid-run
        self.timers = {}
        self.history = None
        self.sampler = Sampler(store.graph(), cfg.fanout_list, cfg.seed)

    # -- memory ------------------------------------------------------------------------------
    def memory(self) -> dict:
        """Bytes this policy keeps resident, by kind. The topology is resident for every policy, as
        the sampler's DGL graph: an int64 CSC, twice an int32 store's indices.bin."""
        topo = self.store.indptr.nbytes + self.store.num_edges * 8
        out = {"feature_rows": self.resident.rows.numel() * 4, "slot_table": self.resident.slot.nbytes,
               "topology": topo}
        if self.history is not None:
            out["history"] = self.history.nbytes
        return out

    def resident_bytes(self) -> int:
        """What the budget bounds: every resident graph array except the in-RAM topology."""
        return sum(v for k, v in self.memory().items() if k != "topology")

    def check_budget(self):
        need, budget = self.resident_bytes(), self.cfg.memory_budget_bytes
        if need > budget:
            raise UserError(f"policy {self.name} needs {format_size(need)} resident "
                            f"({', '.join(f'{k} {format_size(v)}' for k, v in self.memory().items())}) "
                            f"but --memory-budget is {format_size(budget)}")

    # -- the run -------------------------------------------------------------------------------
    def memory_cap(self):
        return contextlib.nullcontext(None)

    def end_warmup(self):
        pass

    def cap_record(self) -> dict:
        return {"enforced": False, "reason": f"{self.name} bounds its own resident arrays (no cgroup)"}

    def io(self) -> IOStats:
        """Everything this policy's readers read so far (a reader replaced mid-run included)."""
        return self.io_before_switch + self.reader.stats

    def _time(self, stage, seconds):
        self.timers[stage] = self.timers.get(stage, 0.0) + seconds

    def steps(self, epochs):
        """(epoch, batch index, Step) of the whole run, in order."""
        for e in range(epochs):
            for b, step in enumerate(self.schedule.epoch(e)):
                yield e, b, step

    def before(self, step, next_load):
        """Apply the step's residency change (features) before its batch is sampled.

        `next_load` is the next later step that loads ranges (None at the end): a pipelined
        policy starts loading it in the background now."""


    def gather(self, ids: np.ndarray) -> torch.Tensor:
        """Feature rows of `ids`: resident ones from RAM, the rest through the reader."""
        slots = self.resident.slot[ids]
        hit = slots >= 0
        if hit.all():
            return self.resident.rows[torch.from_numpy(slots.astype(np.int64))]
        out = torch.empty((len(ids), self.store.feat_dim), dtype=torch.float32)
        if hit.any():
            out[torch.from_numpy(hit)] = self.resident.rows[torch.from_numpy(slots[hit].astype(np.int64))]
        out[torch.from_numpy(~hit)] = torch.from_numpy(self.reader.read_rows(ids[~hit]))
        return out

    def eval_gather(self, ids: np.ndarray) -> torch.Tensor:
        """Features for evaluation (not part of the measured run): the policy's own path by default."""
        return self.gather(ids)

    def close(self):
        self.reader.close()


class InMemoryPolicy(Policy):
    """Every feature row resident (the NS baseline of HierBatching and Ginex); no budget applies."""
    name = "inmemory"
    reader_kind = "memory"

    def __init__(self, store, cfg):
        super().__init__(store, cfg)                  # self.reader: a MemoryReader, the whole matrix

    def gather(self, ids):
        return torch.from_numpy(self.reader.read_rows(ids))

    def memory(self):
        return {**super().memory(), "feature_rows": self.store.num_nodes * self.store.row_bytes}

    def check_budget(self):
        pass


class MmapPolicy(Policy):
    """Features through np.memmap (MADV_RANDOM): the OS page cache is the only cache.

    Honest only under an enforced limit. A memory cgroup counts the process's new
    allocations as well as the page cache, so the run is capped at `memory_budget + W`,
    where W is the working memory of sampling, training and evaluation, measured exactly in
    the same cgroup during the warm-up steps while features are read with O_DIRECT (no page
    cache). What is left for caching feature pages during a step is then about the budget.
    """
    name = "mmap"
    reader_kind = "direct"                           # warm-up only: see end_warmup
    unlimited = 1 << 50

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.cap, self.working_set = None, None

    def check_budget(self):
        pass                                          # bounded by the cgroup, not by own arrays

    def memory_cap(self):
        drop_file_cache(self.store.features_path)
        self.cap = MemoryCap(self.unlimited)
        return self.cap

    def end_warmup(self):
        """Cap at budget + measured working set, then switch to the mmap reader."""
        budget = self.cfg.memory_budget_bytes
        self.working_set = self.cap.peak() if self.cap and self.cap.enforced else None
        if self.working_set is not None:
            self.cap.set_limit(budget + int(1.25 * self.working_set) + (16 << 20))
            self.cap.reset_peak()
        self.io_before_switch += self.reader.stats
        self.reader.close()
        self.reader = self.store.reader("mmap")

    def cap_record(self) -> dict:
        if self.cap is None:
            return {"enforced": False, "reason": "the run ended before its warm-up"}
        return {**self.cap.record(), "budget": self.cfg.memory_budget_bytes, "working_set": self.working_set}


class _GroupLoader:
    """Loads a residency group's ranges into one of two buffers, in a background thread if pipelined."""

    def __init__(self, policy, capacity, pipeline):
        self.policy, self.capacity = policy, capacity
        self.pipeline = pipeline
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="oocgnn-load") if pipeline else None
        self.pending = None                           # (step id, future)
        self.buffer = 0                               # which half holds the current group

    def _read(self, step, half):
        """Read `step`'s rows into buffer `half`, then build the subgraph its rows induce (the loader
        prepares both, HierBatching §3.3); returns (seconds reading, the subgraph's CSC)."""
        t = time.perf_counter()
        base = self.policy.group_base + half * self.capacity
        reader, res = self.policy.reader, self.policy.resident
        if step.scattered:                            # HB−: one coalesced gather of scattered rows
            ids = np.concatenate([np.arange(lo, hi) for lo, hi in step.enter_ranges])
            res.rows[base:base + len(ids)] = torch.from_numpy(reader.read_rows(ids))
        else:                                         # one sequential read per part range
            pos = base
            for lo, hi in step.enter_ranges:
                res.rows[pos:pos + hi - lo] = torch.from_numpy(reader.read_range(lo, hi))
                pos += hi - lo
        seconds, t = time.perf_counter() - t, time.perf_counter()
        induced = induced_csc(self.policy.store.graph(), step.visible) if step.visible is not None else None
        self.policy._time("subgraph", time.perf_counter() - t)
        return seconds, induced

    def load(self, step, next_step):
        """Make `step`'s ranges resident; start loading `next_step`'s into the other half."""
        half = 1 - self.buffer if self.pipeline else 0
        if self.pending is not None and self.pending[0] is step:
            t = time.perf_counter()
            seconds, induced = self.pending[1].result()
            self.policy._time("wait", time.perf_counter() - t)
        else:
            seconds, induced = self._read(step, half)
        self.policy._time("load", seconds)
        if induced is not None:
            self.policy.sampler.prepare(step.visible, induced)
        self.pending = None
        self.buffer = half
        if self.pipeline and next_step is not None:
            self.pending = (next_step, self.pool.submit(self._read, next_step, 1 - half))
        return self.policy.group_base + half * self.capacity

    def close(self):
        if self.pool:
            self.pool.shutdown(wait=True)


class HierBatchingPolicy(Policy):
    """HierBatching (Alg. 1): mega-batches of N_d parts + static cache, p passes, pipelined loads."""
    name = "hierbatching"

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        assignment = regroup_assignment(store, cfg)
        parts = store.num_parts if assignment is None else int(assignment.max()) + 1
        if parts < cfg.parts_per_megabatch:
            raise UserError(f"hierbatching needs a partitioned store with at least --parts-per-megabatch "
                            f"({cfg.parts_per_megabatch}) parts; {store.path} has {parts} "
                            "(prepare it with --partitioner metis|fennel --parts K, or --regroup metis:K)")
        self.schedule = make_schedule("megabatch", store, batch_size=cfg.batch_size, seed=cfg.seed,
                                      parts_per_megabatch=cfg.parts_per_megabatch,
                                      static_ratio=cfg.static_ratio, passes=cfg.passes,
                                      static_scope=cfg.static_scope, assignment=assignment)
        self.static_ids = self.schedule.static_ids
        sizes = np.diff(self.schedule.offsets)
        # the largest group: N_d largest parts (a safe bound for any permutation)
        group_rows = int(np.sort(sizes)[::-1][:cfg.parts_per_megabatch].sum())
        halves = 2 if cfg.pipeline else 1
        self.group_base = len(self.static_ids)
        self.resident = ResidentRows(store.num_nodes, store.feat_dim, self.group_base + halves * group_rows)
        self.loader = _GroupLoader(self, group_rows, cfg.pipeline)
        self.eval_reader = store.reader("direct")   # evaluation: outside the measured run, no page cache

    def rule(self) -> dict:
        """HierBatching App. B: 2(r_s + r_d)(A + B) <= C, with A, B the feature and topology bytes."""
        a = self.store.num_nodes * self.store.row_stride
        b = self.store.topology_nbytes
        r_d = self.cfg.parts_per_megabatch / self.schedule.num_parts
        need = (2 if self.cfg.pipeline else 1) * (self.cfg.static_ratio + r_d) * (a + b)
        return {"r_s": self.cfg.static_ratio, "r_d": r_d, "A": a, "B": b, "need": int(need),
                "budget": self.cfg.memory_budget_bytes, "holds": need <= self.cfg.memory_budget_bytes}

    def before(self, step, next_load):
        res = self.resident
        if len(step.enter_ids):                       # the static cache: once, at the run's start
            t = time.perf_counter()
            res.place(step.enter_ids, 0, self.reader.read_rows(step.enter_ids))
            self._time("load", time.perf_counter() - t)
        if step.enter_ranges:
            for lo, hi in step.leave_ranges:
                res.drop(np.arange(lo, hi))
            base = self.loader.load(step, next_load)
            ids = np.concatenate([np.arange(lo, hi) for lo, hi in step.enter_ranges])
            res.slot[ids] = np.arange(base, base + len(ids), dtype=np.int32)
            res.slot[self.static_ids] = np.arange(len(self.static_ids), dtype=np.int32)

    def eval_gather(self, ids):
        return torch.from_numpy(self.eval_reader.read_rows(ids))

    def close(self):
        self.loader.close()
        self.eval_reader.close()
        super().close()


class OutrePolicy(Policy):
    """OUTRE (§4.2–4.3): partition micro-batches, static feature cache + direct reads, histories."""
    name = "outre"

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        if store.num_parts < 2:
            raise UserError(f"outre needs a partitioned store; {store.path} has 1 part "
                            "(prepare it with --partitioner metis|fennel --parts K)")
        self.schedule = make_schedule("partition", store, batch_size=cfg.batch_size, seed=cfg.seed,
                                      n_per_macro=cfg.parts_per_macro)
        if cfg.history_ratio > 0:
            from .history import HistoryCache
            from .redundancy import history_nodes
            # importance is profiled on an epoch of this schedule with another sampling seed
            cand = history_nodes(store, cfg.history_ratio, by=cfg.history_by, fanouts=cfg.fanout_list,
                                 schedule=self.schedule, seed=cfg.seed + 1, g=store.graph())
            self.history = HistoryCache(cand, self._history_dim(), cfg.staleness, store.num_nodes)
        # the feature cache gets what the budget leaves after histories and its slot table
        left = cfg.memory_budget_bytes - (self.history.nbytes if self.history else 0) - 4 * store.num_nodes
        capacity = int(min(store.num_nodes, max(0, left) // (store.feat_dim * 4)))
        self.static_ids = self._cache_ids(capacity)
        self.resident = ResidentRows(store.num_nodes, store.feat_dim, len(self.static_ids))
        t = time.perf_counter()
        if len(self.static_ids):
            self.resident.place(self.static_ids, 0, self.reader.read_rows(self.static_ids))
        self._time("load", time.perf_counter() - t)
        self.eval_reader = store.reader("direct")     # evaluation: outside the measured run, no page cache

    def _history_dim(self):
        """Width of h^(L-1): hidden, or the concatenated heads of GAT."""
        return (self.cfg.hidden // 4) * 4 if self.cfg.model == "gat" else self.cfg.hidden

    def eval_gather(self, ids):
        return torch.from_numpy(self.eval_reader.read_rows(ids))

    def close(self):
        self.eval_reader.close()
        super().close()

    def _cache_ids(self, capacity):
        """Top `capacity` nodes by degree, or by accesses in a profiling epoch (OUTRE's frequency)."""
        if capacity <= 0:
            return np.empty(0, dtype=np.int64)
        if self.cfg.feature_cache == "degree":
            score = self.store.degrees()
        else:
            score = profile_accesses(self.store, self.schedule, self.cfg.fanout_list, seed=self.cfg.seed + 1)
        return np.sort(np.argsort(-score, kind="stable")[:capacity]).astype(np.int64)


def regroup_assignment(store, cfg):
    """Parts from `--regroup method:K` computed on the store (cached), or None for the store's own.

    On an unpartitioned store this is HierBatching's HB−: partition mega-batches whose rows are
    scattered over the file, so each load is a random gather instead of sequential reads."""
    if not cfg.regroup:
        return None
    from .partition import partition
    method, _, parts = cfg.regroup.partition(":")
    try:
        parts = int(parts)
    except ValueError:
        raise UserError(f"--regroup takes METHOD:PARTS, e.g. metis:256; got {cfg.regroup!r}") from None
    return partition(store, method, parts, seed=cfg.seed)[0]


def profile_accesses(store, schedule, fanouts, seed=1, epochs=1) -> np.ndarray:
    """How often each node's features are requested in `epochs` sampled epochs (OUTRE §4.4 profiling)."""
    counts = np.zeros(store.num_nodes, dtype=np.int64)
    for _, _, _, _, sample in sampled_steps(schedule, Sampler(store.graph(), fanouts, seed), epochs):
        counts[sample.input_nodes] += 1
    return counts


POLICIES = {"inmemory": InMemoryPolicy, "mmap": MmapPolicy, "hierbatching": HierBatchingPolicy,
            "outre": OutrePolicy}


def make_policy(store, cfg) -> Policy:
    if cfg.policy not in POLICIES:
        raise UserError(f"unknown policy {cfg.policy!r}; choose from {', '.join(POLICIES)}")
    policy = POLICIES[cfg.policy](store, cfg)
    policy.check_budget()
    return policy
