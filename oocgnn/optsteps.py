"""Label-balanced optimizer steps: an optimizer step that sees the training set's label mix although each
mini-batch comes from one group.

A group policy (HierBatching's mega-batches, OUTRE's partition batches, MariusGNN's buffer states, the
composed policy's) draws every mini-batch of a group from that group's training nodes. On a small
labelled set (a given split of 20 labels per class) a group holds a few labelled nodes of one or two
classes, and a step per mini-batch is a step towards those classes: the loss climbs and a seed may never
recover (`mixing` measures how far a group is from the training set). The optimizer step need not be the
mini-batch: gradients accumulate over consecutive mini-batches until the step has seen `step_target`
labelled nodes — min(batch size, training nodes), what one in-memory step sees (with p passes over each
group, p times the training nodes) — or its epoch ends. Each mini-batch's loss is weighted by its share of
the step's labelled nodes, so the step's gradient is the mean over all of them, as an in-memory batch's is.
Sampling and residency are untouched: each mini-batch is still sampled inside its own group, while it is
resident.

`--accumulate on | off | auto`: off is a step per mini-batch (the papers'); auto is on where the plan's
groups hold fewer labelled nodes, on average, than a step's target and so few that a random draw of as many
is far from the training set's label mix (`accumulates`); elsewhere accumulating would change nothing (groups
of a batch or more) or only cut the number of updates (groups of hundreds of labelled nodes).
Historical embeddings (OUTRE) count their staleness in optimizer steps: within one step the weights do not
change, so a history pushed by its first mini-batch is as fresh for its last.
"""
from __future__ import annotations

from math import ceil, floor, lgamma, sqrt

import numpy as np


def step_target(batch_size, num_train, passes=1.0) -> int:
    """Labelled nodes an optimizer step sees: a batch's, or, when that is smaller, the training set as many
    times as the epoch visits it (HierBatching's p passes over each mega-batch): an epoch's seeds come group
    by group, each group's p passes together, so a target of |train| would close a step after the first
    1/p of the groups, p steps of a few classes each; round(p·|train|) makes the epoch one step of every
    group."""
    return max(1, min(int(batch_size), round(float(passes) * int(num_train))))


AUTO_SKEW = 0.10    # auto: on where a random draw of a group's labelled nodes is this far (TV) from the training set


def accumulates(mode, group_sizes, target, train_labels=None) -> bool:
    """Whether optimizer steps accumulate mini-batches: `mode` on or off, or auto: on where there are groups,
    they hold fewer labelled nodes than `target` on average, and so few that even a random draw of as many
    training labels (`train_labels`: their histogram) is more than AUTO_SKEW from the training set's mix
    (`mixing.random_draw_tv`): a step on such a group follows a few labels. Groups that hold hundreds of
    labelled nodes keep a step each (merging them would only cut the number of updates)."""
    if mode != "auto":
        return mode == "on"
    if len(group_sizes) < 2 or float(np.mean(group_sizes)) >= target:
        return False
    if train_labels is None:
        return True
    return random_draw_tv(int(np.mean(group_sizes)), train_labels) > AUTO_SKEW


class StepCounter:
    """The optimizer step of each mini-batch, called in order with (epoch, labelled nodes): a step closes
    once it has seen `target` labelled nodes or when its epoch ends, and a mini-batch of `target` or more
    is a step of its own (so groups that hold a batch train as without accumulation); off (`on` False): one
    per mini-batch."""

    def __init__(self, target: int, on: bool):
        self.target, self.on = int(target), bool(on)
        self.index, self.seen, self.epoch = -1, 0, None

    def __call__(self, epoch: int, labelled: int) -> int:
        if not self.on or epoch != self.epoch or self.seen >= self.target or labelled >= self.target:
            self.index, self.seen = self.index + 1, 0
        self.epoch = epoch
        self.seen += int(labelled)
        return self.index


def closes_and_weights(updates, sizes, ranks_max) -> tuple[list, list]:
    """For a run's slots (each a mini-batch's optimizer step in `updates` and its labelled nodes in `sizes`,
    or None for a padding step): whether the optimizer steps after each slot, and the weight of each
    mini-batch's loss (its share of the labelled nodes this rank trains on in that optimizer step).
    `ranks_max`: the ranks' element-wise maximum (one process: identity); a step closes where any rank's
    does, so that every rank steps together; the last slot always closes."""
    n = len(updates)
    own, later = [False] * n, None                     # this rank's last mini-batch of each of its steps
    for g in range(n - 1, -1, -1):
        if updates[g] is not None:
            own[g], later = later != updates[g], updates[g]
    close = [bool(c) for c in ranks_max([float(c) for c in own])] if n else []
    if n:
        close[-1] = True
    weights, start = [1.0] * n, 0
    for g in range(n):
        if close[g]:
            total = sum(sizes[k] for k in range(start, g + 1) if updates[k] is not None)
            for k in range(start, g + 1):
                if updates[k] is not None and total:
                    weights[k] = sizes[k] / total
            start = g + 1
    return close, weights


def random_draw_tv(size, reference) -> float:
    """The expected TV distance from `reference` (a label histogram) of the labels of `size` nodes drawn
    at random from it: the distance a perfectly mixed group of that size still has (binomial counts per
    class, summed over the counts within 12 standard deviations + 40 of the mean: Bernstein's inequality
    puts the rest below 1e-25). Groups of few training nodes are far from the training set by this much alone."""
    q = np.asarray(reference, float) / np.sum(reference)
    size = int(size)
    if size < 1:
        return 0.0
    total = 0.0
    for qc in q[(q > 0) & (q < 1)]:             # a class of share 0 or 1 is always drawn exactly
        mean, sd = size * qc, sqrt(size * qc * (1 - qc))
        k = np.arange(max(0, floor(mean - 12 * sd - 40)), min(size, ceil(mean + 12 * sd + 40)) + 1)
        log_choose = lgamma(size + 1) - np.array([lgamma(i + 1) + lgamma(size - i + 1) for i in k])
        pmf = np.exp(log_choose + k * np.log(qc) + (size - k) * np.log1p(-qc))
        total += pmf @ np.abs(k / size - qc)
    return 0.5 * float(total)
