"""Policies as plans: what a policy does, declared before anything runs.

A plan is built from the store's metadata and its options with no I/O. It declares every
in-memory decision as part of its step stream: which batches and what enters and leaves memory
before each (its schedule's `Step`s), what is resident all run (`setup()`: static caches, or every
row), which rows keep a historical embedding and when it is refreshed (`history`), and how rows
that are not resident are read (`reader`). `memory()` follows from the plan alone, so a tuner can
ask it without opening a reader. Both back ends read the same plan: `simulate(store, plan)` counts
its I/O exactly, and the executor's runtime (`oocgnn.runtime`) does the same steps for real.

| policy | schedule | resident | reads |
|---|---|---|---|
| `inmemory` | random batches | every row (setup) | none |
| `mmap` | random batches | the OS page cache, under a cgroup cap | page faults |
| `hierbatching` | mega-batches of N_d parts, p passes, sampling inside them | static top-r_s·N rows (setup) + two mega-batch buffers | one sequential read per part, in the background |
| `outre` | macro batches of parts, micro-batches of B | static degree/frequency cache (setup) + historical embeddings | direct reads of the misses, coalesced |
| `ginex` | random batches, sampled S at a time (superbatches) | neighbour cache (setup) + a Belady feature cache following each superbatch's changesets | direct reads of the misses, coalesced |
| `macrobatch` | random batches, sampled k at a time (macrobatches) | two union buffers (+ an optional static degree cache) | one coalesced read of each macrobatch's union, in the background |
| `marius` | buffer states of c of p partitions (COMET, BETA, sequential), each training node in one; sampling inside the buffer | the buffer's partitions and the edge buckets among them | sequential reads of entering partitions and buckets, in the background |
| `composed` | hierbatching's mega-batches sampled S at a time, sampling over the graph | static rows (setup) + two mega-batch buffers + histories + a Belady cache of what chunks read outside them | mega-batches as hierbatching; the rest through the Belady cache, misses read directly |
| `packed` | random batches sampled offline for E epochs (DiskGNN) | the most accessed rows (setup) + two batch buffers | one sequential range of the packed file per batch, in the background |

Each policy's options are a small dataclass beside its plan (`HierBatchingPlan.Options`); the
registry `POLICIES` feeds the run configuration, the CLI, the widgets and the benchmarks. The contract
and what plans share live in `base`, each policy family in its own module.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import UserError
from ..schedules import make_schedule
from .base import REGISTRY, HistorySpec, Plan, SchedulePlan, fraction_or_auto, register, setting, shared
from .baselines import InMemoryPlan, MmapPlan
from .composed import ComposedPlan
from .hierbatching import (PAPER_PASSES, STATIC_RATIO, STATIC_SHARE, HierBatchingPlan, evened, fitting_parts,
                           lowered_until, passes_for, resolve_static_ratio, static_ratio_for)
from .marius import MariusPlan
from .outre import OutrePlan
from .packed import PackedPlan
from .sampleahead import GinexPlan, MacrobatchPlan, SampleAheadPlan

__all__ = ["POLICIES", "REGISTRY", "register", "make_plan", "as_plan", "Plan", "SchedulePlan", "HistorySpec",
           "setting", "shared", "fraction_or_auto", "InMemoryPlan", "MmapPlan", "HierBatchingPlan", "OutrePlan", "SampleAheadPlan",
           "GinexPlan", "MacrobatchPlan", "MariusPlan", "ComposedPlan", "PackedPlan", "STATIC_RATIO", "STATIC_SHARE",
           "static_ratio_for", "resolve_static_ratio", "lowered_until", "fitting_parts", "evened", "PAPER_PASSES",
           "passes_for"]


def _import_every_module():
    """Import each module of this package: a policy is a module with a `@register`ed plan, listed by
    dropping it here (no other file names it)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_every_module()
POLICIES = {name: REGISTRY[name] for name in sorted(REGISTRY, key=lambda n: (REGISTRY[n].listed, n))}


def make_plan(store, cfg) -> Plan:
    """The plan of `cfg.policy` over `store`, checked against the memory budget."""
    if cfg.policy not in POLICIES:
        raise UserError(f"unknown policy {cfg.policy!r}; choose from {', '.join(POLICIES)}")
    task = getattr(store, "task", "node")
    if task not in POLICIES[cfg.policy].tasks:
        able = ", ".join(name for name, p in POLICIES.items() if task in p.tasks)
        raise UserError(f"policy {cfg.policy} does not train on {task} stores yet; policies that do: {able}")
    plan = POLICIES[cfg.policy](store, cfg)
    plan.check_budget()
    return plan


def as_plan(store, plan, fanouts=None, seed=0, **schedule_params) -> Plan:
    """A plan as is, or a schedule (object or name + parameters) walked with `fanouts` and `seed`."""
    if isinstance(plan, Plan):
        if fanouts is not None or schedule_params:
            raise UserError("a plan carries its own fanouts and schedule; pass neither with it")
        return plan
    if fanouts is None:
        raise UserError("simulating a schedule needs its fanouts")
    if isinstance(plan, str):
        plan = make_schedule(plan, store, **({"seed": seed} | schedule_params))
    elif schedule_params:
        raise UserError("schedule parameters go with a schedule name, not a Schedule object")
    return SchedulePlan(store, plan, fanouts, seed)
