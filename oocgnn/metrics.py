"""Node-classification metrics beyond accuracy: macro-F1 and, for binary labels, ROC-AUC.

Accuracy hides a minority class: on a binary graph with 22 % positives, predicting the majority class
scores 78 %. An evaluation keeps, per split, a `Tally`: its confusion counts (they add over batches and
over ranks, so a distributed run sums them) and, for binary labels, each node's positive score with its
label (AUC ranks them all: a distributed run gathers them; the evaluated sets are bounded by
--max-eval-nodes). `metrics` turns them into numbers, NaN where one is undefined (no nodes; AUC of one
class, or of more than two). The definitions are scikit-learn's (`f1_score(average="macro")`,
`roc_auc_score`), the tests' oracle.
"""
from __future__ import annotations

import numpy as np

from .errors import UserError

METRICS = ("acc", "f1", "auc")       # --target-metric; log.csv's val_<m> and test_<m> columns
LINK_METRICS = ("mrr", "hits@1", "hits@3", "hits@10")   # a link store's (`linktask`, OGB's ogbl-citation2 list)
SHARED_HITS = ("hits@20", "hits@50", "hits@100")   # beside them where OGB gives shared negative pairs: its 'hits@K'
#                                                    evaluator (ogbl-ddi's K, -collab's, -ppa's; `linkmetrics.SharedHits`)
NAMES = {"acc": "accuracy", "f1": "macro-F1", "auc": "ROC-AUC", "mrr": "MRR",
         **{m: m.replace("hits", "Hits") for m in LINK_METRICS[1:] + SHARED_HITS}}


def confusion(pred, labels, num_classes: int) -> np.ndarray:
    """[C, C] int64 counts: row = label, column = prediction."""
    pred, labels = np.asarray(pred, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    return np.bincount(labels * num_classes + pred, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def positive_score(logits) -> np.ndarray:
    """Binary logits [n, 2] -> class 1's logit minus class 0's (float64): the order of its softmax
    probability, without the ties a saturated float32 probability makes."""
    logits = logits.float()
    return (logits[:, 1] - logits[:, 0]).double().numpy()


def accuracy(conf: np.ndarray) -> float:
    n = conf.sum()
    return float(np.trace(conf) / n) if n else float("nan")


def macro_f1(conf: np.ndarray) -> float:
    """Mean over the classes in the labels or the predictions of 2TP / (2TP + FP + FN): sklearn's
    macro-F1 (its zero_division never applies to such a class, whose denominator is > 0)."""
    tp = np.diag(conf).astype(np.float64)
    denom = conf.sum(0) + conf.sum(1)              # 2TP + FP + FN
    present = denom > 0
    return float(np.mean(2 * tp[present] / denom[present])) if present.any() else float("nan")


def roc_auc(scores, labels) -> float:
    """Area under the ROC curve of binary `labels` (0/1) ranked by `scores`: the Mann-Whitney statistic,
    tied scores at their average rank, which is sklearn's trapezoid over tied thresholds; NaN unless both
    classes occur."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) == 1
    pos = int(labels.sum())
    neg = len(labels) - pos
    if not pos or not neg:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2, counts)      # 1-based average rank of each sorted score
    return float((ranks[labels[order]].sum() - pos * (pos + 1) / 2) / (pos * neg))


def metrics(conf: np.ndarray, scores=None, labels=None) -> dict:
    """{acc, f1, auc} of a split from its confusion counts and, for binary labels, its positive scores
    and labels (else AUC is NaN)."""
    auc = roc_auc(scores, labels) if conf.shape == (2, 2) and scores is not None else float("nan")
    return {"acc": accuracy(conf), "f1": macro_f1(conf), "auc": auc}


class Tally:
    """What an evaluation of one split saw, batch by batch (`add`): confusion counts and, for binary
    labels, the positive scores and labels."""

    def __init__(self, num_classes: int):
        self.num_classes = int(num_classes)
        self.confusion = np.zeros((self.num_classes, self.num_classes), dtype=np.int64)
        self._scores, self._labels = [], []

    @property
    def binary(self) -> bool:
        return self.num_classes == 2

    def add(self, logits, labels):
        """A batch's logits [n, C] and labels [n] (CPU tensors)."""
        self.confusion += confusion(logits.argmax(1).numpy(), labels.numpy(), self.num_classes)
        if self.binary:
            self._scores.append(positive_score(logits))
            self._labels.append(labels.numpy().astype(np.int64))

    def scored(self) -> tuple:
        """(scores, labels) of every node added: float64 and int64 arrays (empty unless binary)."""
        return (np.concatenate(self._scores) if self._scores else np.empty(0),
                np.concatenate(self._labels) if self._labels else np.empty(0, np.int64))


def summary_keys(metric: str) -> tuple:
    """summary.json's keys of `metric`: (its best validation value, the test value at the best validation)."""
    return ("best_val_acc", "test_at_best_val") if metric == "acc" else \
        (f"best_val_{metric}", f"test_{metric}_at_best_val")


def still_rising(curve, points: float = 0.5):
    """(rise in points, evaluations) when the best of a validation curve's last quarter of evaluations beats
    its best before them by more than `points` (a run that stopped while it was still learning), else None.
    Bests, not last values: a noisy curve (a partition buffer's, whose last states bias the model) does not
    read as rising. `curve`: the values in evaluation order, the one before training first; NaNs skipped."""
    v = np.asarray(curve, dtype=np.float64)
    v = v[~np.isnan(v)]
    k = (len(v) - 1) // 4
    if k < 1:
        return None                                # fewer than 5 evaluations: no trend to read
    rise = 100 * (v[-k:].max() - v[:-k].max())
    return (float(rise), k) if rise > points else None


def shared_negatives(store) -> bool:
    """Whether a store's held-out edges are ranked against OGB's shared negative pairs (ogbl-collab, -ppa, -ddi)."""
    return getattr(store, "task", "node") == "link" and store.meta["link"]["negatives"] == "pairs"


def check_target(metric: str, num_classes: int, task: str = "node", shared: bool = False):
    """Refuse --target-metric auc on labels that are not binary, a node metric on a link store, a link metric on a
    node store, and OGB's shared-negative Hits@K on a link store without OGB's shared negative pairs (`shared`)."""
    link = ("mrr", *SHARED_HITS) if shared else ("mrr",)
    if metric not in (link if task == "link" else METRICS):
        raise UserError(f"--target-metric {metric} does not apply to a {task} store (node stores: "
                        f"{', '.join(METRICS)}; link stores: mrr; with OGB's shared negative pairs also "
                        f"{', '.join(SHARED_HITS)})")
    if metric == "auc" and num_classes != 2:
        raise UserError(f"--target-metric auc needs binary labels; this store has {num_classes} classes "
                        "(use acc or f1)")
