"""Mixing: how far each group of a schedule is from the whole training set, from the plan alone.

A schedule that trains on groups of parts (HierBatching's mega-batches, OUTRE's macro batches,
MariusGNN's buffer states, the composed policy's mega-batches) takes every step of a group from
that group's training nodes. Parts of a locality partition (METIS, FENNEL) hold few classes, so a
group of few parts pulls the model towards them for all its steps: HierBatching (App. C.3,
Table 5) runs mega-batches of N_d = 256-1024 parts for this reason. Per group this module counts
the parts its training nodes come from and the total-variation distance
TV = ½ Σ_c |p_group(c) − p_train(c)| between its training-label histogram and the whole training
set's; over an epoch, the mean (weighted by training nodes, i.e. by steps) and the worst. Nothing
but labels and the step stream's groups is read (no features, no lists).

`check(stats)` is the warning a run prints before it starts when groups are farther from the training
set than random draws of their size, over enough consecutive optimizer steps, that the model drifts
(`drift`, `MAX_DRIFT`, calibrated on ../shared/datasets).
"""
from __future__ import annotations

import math

import numpy as np

from .config import SETTINGS
from .io import feature_row_stride
from .optsteps import random_draw_tv
from .policies import POLICIES, Plan
from .units import parse_size

# Calibration (issue 37's protocol: METIS at prepare's default K, a third of the feature file, 100 epochs, fanouts
# 25,10, hidden 512, lr 0.01; test at best val minus inmemory's, 7 seeds on given splits, 3 on random ones).
# Neither the parts per group nor the raw TV predicts a loss: on a given split of 20 labels per class a group of
# 15-20 labelled nodes is about as far from the training set as any random draw that small (cora: TV 0.28 against
# tv_random 0.23), and the policies' defaults were within 1 pt at TV 0.2-0.5 (citeseer's HierBatching, -3.9, lost
# at no excess at all: not a mixing effect). What loses is a bias repeated over a group's steps: amazon_photo in
# 16 parts trained in pairs a step per mini-batch, given split, -3.5 pt over 7 seeds with weight decay (-6.5
# without); random split: drift 0.76-0.90, -1.7 pt, and 4 steps a group (batch 64) -15 pt. One epoch's groups
# moved that drift between seeds (0.32-0.47: a seed of 0.32 lost 8.6 pt), so the warning reads WARN_EPOCHS
# epochs' groups: 0.37-0.44 over the 7 seeds. Cora in the same pairs lost only 0.6 pt (7 seeds) at 0.35-0.40:
# the two overlap, and MAX_DRIFT 0.38 warns on 6 of amazon_photo's 7 seeds and 2 of cora's. With label-balanced
# steps (the default) every default's drift is at most 0.10; a step per mini-batch, at most 0.42 (amazon_photo's
# composed).
# Where an epoch takes many optimizer steps, even a larger drift cost nothing: on `small` (make run's store, 20,000
# labelled nodes, METIS 256 parts, lr 0.005, 8 epochs, 3 seeds) OUTRE's defaults at drift 0.92 (87 steps an epoch)
# and at batch 64 at 3.57 (24 steps a group, 317 an epoch), composed's defaults at 0.61 (172) and composed in
# mega-batches of one part at 0.83 (512) were within 0.5 pt of inmemory at the same batch size (+0.3 at batch 64);
# every configuration measured to lose took 8-32 steps an epoch, and notebook 04's HierBatching (16 groups of 4
# steps, 64 an epoch, drift 0.60) was 1.2 +- 0.5 pt below inmemory. The warning reads epochs of at most 64 steps.
MAX_DRIFT = 0.38       # `check`: warn above this `drift` (weighted mean over the first WARN_EPOCHS epochs' groups)
MAX_EPOCH_STEPS = 64   # `check`: ... in epochs of at most this many optimizer steps (mean over those epochs)
WARN_EPOCHS = 5        # `mixing`'s default: the epochs whose groups the warning reads
MIN_PARTS = 16         # the advice: a K whose mega-batches hold at least this many parts
SPREAD = 0.7           # parts per group at least this share of its training nodes: more parts cannot mix it more
TARGET_PARTS = 128     # `default_parts`: parts a HierBatching mega-batch holds at the default budget
MIN_PART_NODES = 20    # `default_parts`: no smaller parts (HierBatching's digest: ~100-2000 nodes)
MAX_PART_NODES = 2000


def part_of(schedule, ids) -> np.ndarray:
    """The schedule's part of each store id: its store part, or its part of a regroup assignment."""
    ids = np.asarray(ids, dtype=np.int64)
    if getattr(schedule, "scattered", False):
        part = np.empty(schedule.store.num_nodes, np.int64)
        part[schedule._order] = np.repeat(np.arange(schedule.num_parts), np.diff(schedule.offsets))
        return part[ids]
    offsets = np.asarray(schedule.store.part_offsets, dtype=np.int64)
    return np.searchsorted(offsets, ids, side="right") - 1


def groups(schedule, epoch=0) -> list:
    """The training ids of each group of the epoch, in order; a schedule without groups (random batches)
    draws every batch from the whole training set: one group."""
    if not hasattr(schedule, "groups"):
        return [np.asarray(schedule.store.train_idx, dtype=np.int64)]
    return [np.asarray(train, dtype=np.int64) for _, train in schedule.groups(epoch)]


def _epochs_steps(plan_or_schedule, epochs):
    """Per epoch of the first `epochs`, one pass over the step stream: ({group: optimizer steps taken in it},
    {optimizer step: its mini-batches' seeds}). A plan's step is `Step.update` (consecutive mini-batches of a
    group share one where steps accumulate, `optsteps`), a bare schedule's one per mini-batch."""
    is_plan = hasattr(plan_or_schedule, "step_target")
    steps, seeds = [{} for _ in range(epochs)], [{} for _ in range(epochs)]
    for e, b, step in plan_or_schedule.steps(epochs):
        update = step.update if is_plan else b
        steps[e].setdefault(step.group, set()).add(update)
        seeds[e].setdefault(update, []).append(np.asarray(step.seeds, dtype=np.int64))
    return ([{g: len(v) for g, v in by.items()} for by in steps],
            [[np.concatenate(v) for v in by.values()] for by in seeds])


def tv_distance(labels, reference) -> float:
    """½ Σ |p − q| of two label histograms (counts, any scale)."""
    p, q = np.asarray(labels, float), np.asarray(reference, float)
    return 0.5 * float(np.abs(p / p.sum() - q / q.sum()).sum())


def group_stats(plan_or_schedule, epochs=1):
    """A DataFrame, one row per group of the first `epochs` epochs: epoch, group, training nodes, parts
    (that its training nodes come from), tv (distance of its label histogram from the training set's) and
    tv_random (`random_draw_tv` of its size: what a random group of as many training nodes would have).
    A plan whose optimizer steps accumulate mini-batches (`optsteps`) has a row per optimizer step instead:
    what each step's gradient follows."""
    import pandas as pd
    schedule = getattr(plan_or_schedule, "schedule", plan_or_schedule)
    per_update = bool(getattr(plan_or_schedule, "accumulate", False))
    store = schedule.store
    labels = store.compact_labels()       # not store.labels: that int64 copy would stay cached for the run
    c = int(store.num_classes)
    whole = np.bincount(labels[np.asarray(store.train_idx, dtype=np.int64)], minlength=c)
    rows = []
    group_steps, updates = _epochs_steps(plan_or_schedule, int(epochs))
    for e in range(int(epochs)):
        steps = {} if per_update else group_steps[e]
        for g, train in enumerate(updates[e] if per_update else groups(schedule, e)):
            hist = np.bincount(labels[train], minlength=c)
            rows.append({"epoch": e, "group": g, "train_nodes": len(train),
                         "parts": int(len(np.unique(part_of(schedule, train)))),
                         "tv": tv_distance(hist, whole), "steps": 1 if per_update else steps.get(g, 0)})
    df = pd.DataFrame(rows, columns=["epoch", "group", "train_nodes", "parts", "tv", "steps"])
    sizes = {n: random_draw_tv(n, whole) for n in df["train_nodes"].unique()}      # groups share a few sizes
    return df.assign(tv_random=df["train_nodes"].map(sizes).astype(float))


def drift(tv, tv_random, steps):
    """How far a group's consecutive optimizer steps pull the model from the training set's label mix:
    its bias repeats at every step (adds as tv × steps), while a random draw's deviation is new at each
    step (adds as tv_random × √steps); with one step, the excess over a random draw."""
    steps = np.asarray(steps, float)
    return np.asarray(tv, float) * steps - np.asarray(tv_random, float) * np.sqrt(steps)


def mixing(plan_or_schedule, epochs=WARN_EPOCHS) -> dict:
    """The summary of `group_stats` over the first `epochs` epochs (WARN_EPOCHS: one epoch's groups are one
    draw of the seed): groups per epoch, training nodes per group (mean), parts per group
    (mean weighted by training nodes, and the fewest), TV (mean weighted by training nodes, i.e. by the
    steps taken in each group, and the worst), the same mean for random groups of the same sizes
    (`tv_random`), and `warning`: `check`'s line or ""."""
    df = group_stats(plan_or_schedule, epochs)
    w = df["train_nodes"].to_numpy(float)
    out = {"groups": round(len(df) / max(1, int(epochs)), 2),
           "train_mean": round(float(w.mean()), 2),
           "parts_mean": round(float(np.average(df["parts"], weights=w)), 2),
           "parts_min": int(df["parts"].min()),
           "tv_mean": round(float(np.average(df["tv"], weights=w)), 4),
           "tv_max": round(float(df["tv"].max()), 4),
           "tv_random": round(float(np.average(df["tv_random"], weights=w)), 4),
           "steps_per_group": round(float(np.average(df["steps"], weights=w)), 2),
           "steps_per_epoch": round(float(df["steps"].sum()) / max(1, int(epochs)), 2),
           "drift": round(float(np.average(drift(df["tv"], df["tv_random"], df["steps"]), weights=w)), 4),
           "unit": "optimizer step" if getattr(plan_or_schedule, "accumulate", False) else "group"}
    out["warning"] = check(out, plan_or_schedule)
    return out


def check(stats: dict, plan=None) -> str:
    """One line saying what to change when groups mix poorly, else "": when a group's label distance from
    the training set, repeated over its consecutive optimizer steps, outweighs what random draws of as
    many labelled nodes would carry (`tv_random`: the noise any mini-batch that small has) enough that the
    model drifts towards its classes (`drift`, weighted by training nodes, above MAX_DRIFT), in epochs of
    at most MAX_EPOCH_STEPS optimizer steps (where an epoch takes more, the same drift was measured to
    cost nothing). A plan with one group (or one step) an epoch never warns. Where a
    group's training nodes already come from nearly as many parts as it has nodes (few labels, as a given
    split's 20 per class), more parts cannot mix it further: the line says so."""
    if stats["groups"] <= 1 or stats.get("drift", 0.0) <= MAX_DRIFT or \
            stats.get("steps_per_epoch", 0) > MAX_EPOCH_STEPS:
        return ""
    unit = stats.get("unit", "group")
    line = (f"{unit}s mix poorly: label distance {stats['tv_mean']:.2f} from the training set on average against "
            f"{stats['tv_random']:.2f} for random draws of as many labelled nodes, repeated over "
            f"{stats.get('steps_per_group', 1):.1f} optimizer step(s) in each {unit} (drift {stats['drift']:.2f} in "
            f"epochs of {stats.get('steps_per_epoch', 0):g} steps; warn above {MAX_DRIFT} in epochs of at most "
            f"{MAX_EPOCH_STEPS}); "
            f"{stats['parts_mean']:.1f} parts per {unit}, worst distance "
            f"{stats['tv_max']:.2f}; accuracy may fall short of inmemory. ")
    train = stats.get("train_mean")
    if train and stats["parts_mean"] >= SPREAD * train:
        return line + (f"Each {unit} trains on only {train:.0f} labelled nodes, nearly one per part, so more parts "
                       "cannot mix it further: --accumulate on (an optimizer step over consecutive groups), a "
                       "larger --memory-budget (fewer, larger groups) or a policy of random batches (inmemory, "
                       "ginex, mmap) is the remedy")
    k = "K"
    if hasattr(plan, "n_d"):      # the budget holds n_d of num_groupable parts: K for MIN_PARTS, else twice K
        need = -(-MIN_PARTS * plan.num_groupable // plan.n_d)
        few = stats["parts_mean"] < MIN_PARTS and need > plan.num_groupable   # never a K the store has already
        k = f"{need if few else 2 * plan.num_groupable} or more"
    policy = POLICIES.get(getattr(plan, "name", ""), Plan)   # the plan's class words the advice (`Plan.mixing_fix`)
    return line + f"Try {policy.mixing_fix(plan, k)}"


def default_parts(num_nodes, num_edges, feat_dim, budget=None, static_ratio=0.01) -> int:
    """`oocgnn prepare`'s K for a partitioned store: enough parts that a HierBatching mega-batch at
    `budget` (default: the run's default `--memory-budget`) holds TARGET_PARTS of them, i.e. K = target /
    r_d with r_d from HierBatching App. B's rule 2(r_s + r_d)(A + B) <= C (A, B the feature and
    topology bytes; r_s the paper's 0.01, kept when the run's default became `policies.static_ratio_for`'s,
    so that stores prepared before keep their K); parts of at most MAX_PART_NODES and at least
    MIN_PART_NODES nodes."""
    if budget is None:
        budget = parse_size(SETTINGS["memory_budget"][1].default)
    a = int(num_nodes) * feature_row_stride(int(feat_dim) * 4)
    b = (int(num_nodes) + 1) * 8 + int(num_edges) * 4
    r_d = min(1.0, budget / (2 * (a + b)) - static_ratio)
    want = math.ceil(TARGET_PARTS / r_d) if r_d > 0 else num_nodes
    lo, hi = math.ceil(num_nodes / MAX_PART_NODES), max(1, num_nodes // MIN_PART_NODES)
    return int(max(1, min(max(want, lo), hi)))
