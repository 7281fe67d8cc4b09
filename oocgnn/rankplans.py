"""What a rank that holds only its own rows trains on (`--rank-data own`): a rank plan
(`make_rank_plan`), and the runtime and evaluation that run it in the training loop (`loop.run_loop`).

A rank plan cuts each epoch into chunks (`chunks(epoch)`), and turns a chunk into its samples and a
`gather(input_nodes)` of their rows (`prepare`); `ExchangeRuntime` prepares each chunk as its first
batch comes. The loop pads a rank's epoch with empty steps to the ranks' most, so ranks step in lockstep.

- `inmemory`, `macrobatch` (`MacrobatchPlan`, BatchGNN §2.6): a chunk is k = --macrobatch mini-batches
  of the rank's training nodes, sampled over the whole graph (remote lists fetched per layer), their
  remote rows fetched in one exchange (`distributed.fetch_macrobatch`). Every rank has as many chunks
  of as many batches (an empty share of a batch still takes part in the exchanges).
- `hierbatching` (`MegabatchPlan`, HierBatching Alg. 1 on the rank's shard): mega-batches of N_d of
  the rank's own partitions plus a static cache of its top-degree rows, p passes, sampling inside the
  mega-batch ∪ static nodes: every row and list a batch touches is the rank's own, so nothing but
  gradients crosses ranks. A chunk is one batch of ceil(B / R) seeds; a mega-batch's rows are read (one
  sequential read per part) when its first batch comes, in the foreground. N_d by HierBatching's own
  rule (`policies.fitting_parts`, `evened`): the mega-batch and the static rows fit --memory-budget
  (per rank).
"""
from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from . import optsteps
from .device import HostToDevice
from .distributed import (TRAFFIC, Exchange, RankFeatures, batch_key, fetch_macrobatch, rank_batches,
                          sample_macrobatch, steps_per_epoch)
from .errors import UserError
from .io import IOStats, range_chunks
from .metrics import Tally
from .policies import evened, fitting_parts, lowered_until, passes_for, resolve_static_ratio
from .policies.sampleahead import MacrobatchPlan as BatchGNNPlan
from .sampler import Sampler

RANK_POLICIES = ("inmemory", "macrobatch", "hierbatching")


def exchange_k(cfg) -> int:
    """k of the macrobatched all_to_all: --macrobatch, or for 0 (its default) BatchGNN's 4 (a rank's
    exchange buffers are not fitted to its budget)."""
    return int(cfg.get("macrobatch")) or BatchGNNPlan.default_size


def make_rank_plan(cfg, data, features, lists, sampler, exchange):
    """The rank plan of `cfg.policy` on this rank's `data` (`shards.RankData`)."""
    if cfg.policy not in RANK_POLICIES:
        raise UserError(f"--distributed runs the policies {', '.join(RANK_POLICIES)} per rank; got {cfg.policy!r}")
    if cfg.policy == "hierbatching":
        return MegabatchPlan(cfg, data, lists, sampler)
    return MacrobatchPlan(cfg, data, features, lists, sampler, exchange)


def _add(stages, name, seconds):
    stages[name] = stages.get(name, 0.0) + seconds



class RankPlan:
    """What the training loop (`loop.run_loop`) asks of a plan, for a rank plan: its steps (every batch
    of `chunks`), its memory and its knobs."""
    budgeted = True
    topology = "memory"                            # its own lists (remote ones fetched per macrobatch and layer)
    passes = 1.0                                   # visits of each training node an epoch (MegabatchPlan's p)

    @property
    def name(self) -> str:
        return self.cfg.policy

    @property
    def budget(self) -> int:
        return self.cfg.memory_budget_bytes

    @property
    def schedule(self) -> str:
        return f"{type(self).__name__} of rank {self.data.rank} of {self.data.world}"

    def steps(self, epochs):
        """(epoch, batch, step) of every batch of every chunk, in order: a step that loads nothing the loop
        must know of, with its seeds and its optimizer step (`optsteps`)."""
        target = optsteps.step_target(self.cfg.batch_size, len(self.data.train_idx), self.passes)
        counter = optsteps.StepCounter(target, self.accumulates(target))
        for epoch in range(epochs):
            for chunk in self.chunks(epoch):
                for b, item in chunk:
                    seeds = self.seeds_of(item)
                    yield epoch, b, SimpleNamespace(enter_ranges=[], seeds=seeds, examples=len(seeds),
                                                    update=counter(epoch, len(seeds)))

    def accumulates(self, target) -> bool:
        """Whether its optimizer steps accumulate mini-batches towards `target` labelled nodes (`--accumulate`;
        auto looks at its groups and their labels: `optsteps.accumulates`)."""
        if self.cfg.accumulate != "auto":
            return self.cfg.accumulate == "on"
        sizes = self.group_sizes()
        own = np.asarray(self.data.train_idx, dtype=np.int64)
        own = own[(own >= self.data.lo) & (own < self.data.hi)] - self.data.lo
        hist = np.bincount(self.data.labels()[own], minlength=self.data.num_classes) if len(sizes) > 1 else None
        return optsteps.accumulates("auto", sizes, target, hist)

    def seeds_of(self, item) -> np.ndarray:
        """The training nodes of a chunk's batch item."""
        return item

    def group_sizes(self) -> list:
        """Training nodes of each group of the first epoch (none: batches drawn from all of them)."""
        return []

    def memory(self) -> dict:
        return {"feature_rows": self.resident_bytes()}

    def close(self):
        pass


class MacrobatchPlan(RankPlan):
    """Chunks of k mini-batches of the rank's training nodes (`distributed.rank_batches`)."""
    exchanges = True

    def __init__(self, cfg, data, features, lists, sampler, exchange):
        self.cfg, self.data, self.features, self.lists = cfg, data, features, lists
        self.sampler, self.exchange, self.k = sampler, exchange, exchange_k(cfg)

    def resident_bytes(self) -> int:
        return self.features.peak_rows * self.data.row_bytes

    def chunks(self, epoch) -> list:
        batches = rank_batches(self.data.train_idx, self.data.bounds, self.data.rank, self.cfg.batch_size,
                               self.cfg.seed, epoch)
        return [list(enumerate(batches[c:c + self.k], start=c)) for c in range(0, len(batches), self.k)]

    def prepare(self, epoch, chunk, stages, counted=True) -> tuple:
        """(samples, gather) of a chunk: sampled a layer at a time, remote rows in one exchange; the
        seconds of each go to `stages`; `counted`: its traffic counted (a chunk a resumed run prepares
        again was counted before its checkpoint)."""
        t = time.perf_counter()
        keys = [batch_key(b, self.data.rank, self.data.world) for b, _ in chunk]
        samples = sample_macrobatch(self.sampler, self.lists, self.exchange, [s for _, s in chunk], epoch, keys,
                                    counted)
        t1 = time.perf_counter()
        gather = fetch_macrobatch(samples, self.features, self.exchange, counted).gather
        _add(stages, "sample", t1 - t)
        _add(stages, "exchange", time.perf_counter() - t1)
        return samples, gather

    def io(self) -> IOStats:
        return IOStats()                           # its rows are read through the rank's features

    def describe(self) -> dict:
        return {"macrobatch": self.k}


class MegabatchPlan(RankPlan):
    """HierBatching on the rank's own partitions (see the module docstring)."""
    exchanges = False

    def __init__(self, cfg, data, lists, sampler):
        self.cfg, self.data, self.lists, self.sampler = cfg, data, lists, sampler
        offsets = np.asarray(data.part_offsets, dtype=np.int64)
        self.offsets = offsets[(offsets >= data.lo) & (offsets <= data.hi)]      # its own parts
        self.static_ratio = resolve_static_ratio(cfg.get("static_ratio"), cfg.memory_budget_bytes,
                                                 (data.hi - data.lo) * data.row_bytes)   # auto: the rank's
        if cfg.get("static_ratio") == "auto":       # lowered where no mega-batch fits beside it (`lowered_until`)
            self.static_ratio = lowered_until(lambda r_s: self._fit(r_s) > 0, self.static_ratio)
        self.batch_size = max(1, -(-cfg.batch_size // data.world))      # the global batch, split over ranks
        self.num_parts = len(self.offsets) - 1
        degree = np.diff(lists.own_indptr)
        k = int(self.static_ratio * (data.hi - data.lo))
        self.static_ids = np.sort(np.argsort(-degree, kind="stable")[:k]).astype(np.int64) + data.lo
        self.n_d = self._n_d()
        train, asked = len(data.train_idx), cfg.get("passes")    # auto: from its groups (p changes none of them)
        self.passes = float(asked) if asked != "auto" else \
            passes_for(cfg.batch_size, train, self.accumulates(optsteps.step_target(cfg.batch_size, train)))
        self.reader = data.reader("direct")
        self.static_rows = self._read(self.static_ids)
        self.current, self.rows, self.visible = None, None, None
        self.peak_rows = len(self.static_ids)
        self.read_rows = len(self.static_ids)

    def _n_d(self) -> int:
        """N_d: --parts-per-megabatch, or HierBatching's rule (`policies.fitting_parts`, `evened`)
        on its parts: the most of them (the largest) that fit the budget beside its static rows, counted
        twice (held, and copied into each mega-batch's rows; loaded in the foreground: no second buffer)."""
        offsets = self.offsets
        static = int(self.static_ratio * (offsets[-1] - offsets[0]))
        sizes = np.cumsum(np.sort(np.diff(offsets))[::-1])
        fit = self._fit(self.static_ratio)
        want = int(self.cfg.get("parts_per_megabatch"))
        if fit < 1 or (want and want > fit):
            need = (int(sizes[max(want, 1) - 1]) + 2 * static) * self.data.row_bytes
            raise UserError(f"hierbatching on rank {self.data.rank}: {max(want, 1)} of its parts and its static rows need "
                            f"{need} bytes, more than --memory-budget {self.cfg.memory_budget_bytes} (per rank): "
                            "raise it, or lower --parts-per-megabatch or --static-ratio")
        return min(want, len(sizes)) if want else evened(len(sizes), max(1, fit))

    def _fit(self, static_ratio) -> int:
        """The most of its parts (the largest first) that fit the budget beside `static_ratio` of its rows,
        counted twice (held, and copied into each mega-batch's rows)."""
        offsets = self.offsets
        static = int(static_ratio * (offsets[-1] - offsets[0]))
        sizes = np.cumsum(np.sort(np.diff(offsets))[::-1])
        return fitting_parts(len(sizes), lambda n: (int(sizes[n - 1]) + 2 * static) * self.data.row_bytes
                             <= self.cfg.memory_budget_bytes)

    def _read(self, ids):
        return torch.from_numpy(self.reader.read_rows(ids - self.data.lo)) if len(ids) else \
            torch.empty(0, self.data.feat_dim)

    def _groups(self, epoch) -> list:
        """[(parts, training ids)] of the rank's mega-batches in `epoch`: its parts shuffled, N_d at a time."""
        offsets, n_d = self.offsets, self.n_d
        perm = np.random.default_rng([self.cfg.seed, epoch, self.data.rank, 0]).permutation(len(offsets) - 1)
        train = self.data.train_idx
        train = train[(train >= offsets[0]) & (train < offsets[-1])]
        part = np.searchsorted(offsets, train, side="right") - 1
        return [(parts, train[np.isin(part, parts)]) for parts in
                (np.sort(perm[i:i + n_d]) for i in range(0, len(offsets) - 1, n_d))]

    def seeds_of(self, item) -> np.ndarray:
        return item[2]

    def group_sizes(self) -> list:
        return [len(train) for _, train in self._groups(0)]

    def _pass_lengths(self, n) -> list:
        """Seeds per pass over a mega-batch of n training nodes: floor(p) full, then round(frac(p)·n) (App. B)."""
        full, frac = divmod(self.passes, 1.0)
        return [n] * int(full) + ([int(round(frac * n))] if round(frac * n) else [])

    def chunks(self, epoch) -> list:
        """One batch per chunk: each mega-batch's passes cut into batches of ceil(B / R) seeds (as one
        process cuts them at B); the loop pads a rank's epoch with empty steps to the ranks' most."""
        rng = np.random.default_rng([self.cfg.seed, epoch, self.data.rank, 1])
        out = []
        for g, (parts, train) in enumerate(self._groups(epoch)):
            for m in self._pass_lengths(len(train)):
                seq = rng.permutation(train)[:m]
                out += [(g, parts, seq[i:i + self.batch_size]) for i in range(0, m, self.batch_size)]
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

    def prepare(self, epoch, chunk, stages, counted=True) -> tuple:
        [(b, (g, parts, seeds))] = chunk
        t = time.perf_counter()
        self._load((epoch, g), parts)
        t1 = time.perf_counter()
        key = batch_key(b, self.data.rank, self.data.world)
        sample = self.sampler.sample(seeds, epoch, key, self.visible)
        _add(stages, "load", t1 - t)
        _add(stages, "sample", time.perf_counter() - t1)
        visible, rows = self.visible, self.rows
        return [sample], lambda ids: rows[torch.from_numpy(np.searchsorted(visible, ids))]

    def io(self) -> IOStats:
        return self.reader.stats

    def resident_bytes(self) -> int:
        return self.peak_rows * self.data.row_bytes

    def close(self):
        self.reader.close()

    def describe(self) -> dict:
        return {"parts_per_megabatch": self.n_d, "rank_parts": self.num_parts, "static_rows": len(self.static_ids),
                "passes": self.passes, "peak_rows": self.peak_rows, "rows_read": self.read_rows}


class OwnLabels:
    """A rank's own labels, indexed by store id (rows [lo, hi) only)."""

    def __init__(self, data):
        self.lo, self.t = data.lo, torch.from_numpy(data.labels())

    def __getitem__(self, ids):
        return self.t[ids - self.lo]


class ExchangeRuntime:
    """The runtime of a rank that holds only its own rows and lists (`--rank-data own`, BatchGNN §3), for
    `loop.run_loop`: its rank plan's chunks prepared as its steps come (sampled a layer at a time, remote
    lists and rows exchanged), its rows read through `distributed.RankFeatures`."""
    eval_reader = None

    def eval_io(self) -> tuple:
        """(features, lists) evaluation read apart from the run: none (its rows and lists are the rank's own,
        or exchanged and counted as traffic)."""
        return IOStats(), IOStats()

    def __init__(self, cfg, data, device):
        self.cfg, self.data = cfg, data
        # the rows a rank serves (and evaluates from): resident for inmemory, else read per macrobatch
        self.features = RankFeatures(data, "inmemory" if cfg.policy == "inmemory" else "macrobatch",
                                     cfg.memory_budget_bytes)
        self.lists = data.lists()                  # its own lists; remote ones come per macrobatch
        self.sampler = Sampler(self.lists, cfg.fanout_list, cfg.seed, dense=cfg.sampler == "dense")
        self.exchange = Exchange(data.bounds, data.rank, data.world, data.feat_dim)
        self.plan = make_rank_plan(cfg, data, self.features, self.lists, self.sampler, self.exchange)
        self.h2d = HostToDevice(device)
        self.timers = {}
        self.loader = SimpleNamespace(pending=None, pending_io=lambda: (IOStats(), IOStats()))
        self.cached = SimpleNamespace(reader=self.features.reader)
        self.history_hits = 0
        self.samples = self.gather = None

    def labels(self):
        return OwnLabels(self.data)

    def setup(self):
        pass

    def memory_cap(self):
        return contextlib.nullcontext()

    def end_warmup(self):
        pass

    def cap_record(self) -> dict:
        return {"enforced": False, "reason": "a rank bounds its own rows (no cgroup)"}

    def walk(self, steps, sample, before, start=0):
        """(i, epoch, batch, step, sample) of the steps from `start` (`steps[i]`'s step: its seeds and optimizer
        step): each chunk prepared (`before`) at its first batch — again, uncounted, when a resumed run starts
        inside it."""
        i = 0
        for epoch in range(self.cfg.epochs):
            for chunk in self.plan.chunks(epoch):
                if i >= len(steps):
                    return
                if i + len(chunk) > start:
                    before(i, (epoch, chunk, i >= start))
                    for j, ((b, _), s) in enumerate(zip(chunk, self.samples)):
                        if start <= i + j < len(steps):
                            yield i + j, epoch, b, steps[i + j][2], s
                i += len(chunk)

    def before(self, step, next_load):
        epoch, chunk, counted = step
        self.samples, self.gather = self.plan.prepare(epoch, chunk, self.timers, counted)

    def inputs(self, sample, t):
        return self.gather(sample.input_nodes), sample.blocks

    def to_device(self, tensors, blocks):
        return self.h2d(tensors, blocks)

    def forward(self, model, blocks, x, t):
        return model(blocks, x)

    def io(self) -> IOStats:
        return self.features.reader.stats + self.plan.io()

    def topology_io(self) -> IOStats:
        return IOStats()                           # a rank's lists are in memory

    def log_fields(self) -> dict:
        t = self.exchange.record()
        return {k: t[k] for k in ("rows_recv", "lists_recv", "bytes_recv")}

    def state(self) -> dict:
        return {"traffic": self.exchange.record(), "peak_rows": self.features.peak_rows}

    def load_state(self, state):
        for key, v in state["traffic"].items():
            self.exchange.traffic[key][self.data.rank] = v
        self.features.peak_rows = max(self.features.peak_rows, state["peak_rows"])

    def record(self) -> dict:
        d = self.data
        return {"rows": [d.lo, d.hi], "train_nodes": int(np.sum((d.train_idx >= d.lo) & (d.train_idx < d.hi))),
                **self.exchange.record(), "bytes_read": self.io().bytes_read,
                "peak_buffer_rows": self.features.peak_rows, "peak_eval_rows": self.features.peak_eval_rows,
                "topology_bytes": self.lists.nbytes, "peak_list_entries": self.lists.peak_entries,
                "plan": self.plan.describe()}

    def summarize(self, records) -> dict:
        return {"exchange": {k: sum(r[k] for r in records) for k in TRAFFIC}, "macrobatch": exchange_k(self.cfg),
                "sharded": self.data.sharded,
                "topology": "sharded (each rank its own lists; remote lists fetched per macrobatch and layer)"}

    def close(self):
        self.plan.close()
        self.features.close()


class ExchangeEvaluation:
    """Evaluation of a rank that holds only its own rows: its own validation and test nodes, sampled
    k = --macrobatch batches at a time with their remote lists and rows exchanged (uncounted); every
    rank runs as many batches (the most any rank has), so the exchanges stay in lockstep."""
    reads_in_run = True                            # through the rank's features: taken out of the run's reads

    def __init__(self, cfg, plan, runtime, store, sets, labels, device):
        self.cfg, self.runtime, self.labels, self.sets = cfg, runtime, labels, sets
        self.num_classes = store.num_classes
        self.sampler = Sampler(runtime.lists, [int(f) for f in cfg.eval_fanouts.split(",")], cfg.seed + 7)
        most = torch.tensor([steps_per_epoch(len(ids), cfg.eval_batch_size) for ids in sets.values()])
        dist.all_reduce(most, op=dist.ReduceOp.MAX)   # every rank's count of batches: the most
        self.batches = dict(zip(sets, most.tolist()))

    def tallies(self, model) -> dict:
        rt, k, size = self.runtime, exchange_k(self.cfg), self.cfg.eval_batch_size
        model.eval()
        out = {}
        with torch.no_grad():
            for split, ids in self.sets.items():
                tally, nb = Tally(self.num_classes), self.batches[split]
                batches = [ids[i * size:(i + 1) * size] for i in range(nb)]
                for c in range(0, nb, k):
                    keys = [batch_key(b, rt.data.rank, rt.data.world) for b in range(c, c + len(batches[c:c + k]))]
                    samples = sample_macrobatch(self.sampler, rt.lists, rt.exchange, batches[c:c + k], 0, keys,
                                                counted=False)
                    mb = fetch_macrobatch(samples, rt.features, rt.exchange, counted=False)
                    for s in samples:
                        if len(s.output_nodes):
                            x, = rt.h2d([mb.gather(s.input_nodes)], s.blocks)
                            tally.add(model(s.blocks, x).cpu(), self.labels[torch.from_numpy(s.output_nodes)])
                out[split] = tally
        model.train()
        return out

    def describe(self) -> dict:
        return {"eval_mode": "batch (exchanged)", "eval_memory": None, "eval_budget": None, "eval_spilled": None}
