"""Run configuration: one dataclass whose field names the CLI, notebooks and papermill share."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UserError
from .units import parse_size

POLICIES = ("inmemory", "mmap", "hierbatching", "outre")
MODELS = ("sage", "gat", "gin", "mlp")


def parse_fanouts(text) -> tuple:
    """'10,10' -> (10, 10); -1 means all neighbours."""
    if isinstance(text, (list, tuple)):
        parts = list(text)
    else:
        parts = [p for p in str(text).replace(" ", "").split(",") if p]
    try:
        fanouts = tuple(int(p) for p in parts)
    except ValueError:
        raise UserError(f"bad fanouts {text!r}: use comma-separated integers, e.g. 10,10") from None
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise UserError(f"bad fanouts {text!r}: each must be a positive integer or -1 (all)")
    return fanouts


@dataclass
class TrainConfig:
    """Settings of one training run; `asdict(cfg)` is saved as the run's config.json."""
    store: str
    policy: str = "inmemory"
    model: str = "sage"
    epochs: int = 5
    max_steps: int = 0                # stop after this many steps (0: all epochs); for quick looks
    fanouts: str = "10,10"
    layers: int = 0                   # 0: as many as fanouts; else must equal len(fanouts)
    batch_size: int = 1024
    hidden: int = 128
    lr: float = 3e-3
    dropout: float = 0.5
    memory_budget: str = "256MB"
    eval_every: int = 0               # evaluate every N steps; 0: at the end of each epoch
    eval_fanouts: str = ""            # default: the training fanouts
    eval_batch_size: int = 1024
    max_eval_nodes: int = 20_000      # evaluate on a fixed seeded subset this large (0: all)
    target_acc: float = 0.0           # summary reports the time to reach this val accuracy
    out: str = ""                     # run directory; default runs/<store>-<policy>-<model>-s<seed>
    seed: int = 0
    # hierbatching (HierBatching Alg. 1)
    parts_per_megabatch: int = 8      # N_d: parts per mega-batch (r_d = N_d / parts)
    static_ratio: float = 0.01        # r_s: top-degree nodes resident for the whole run
    passes: float = 2.0               # p: passes over a mega-batch's training nodes (float allowed)
    static_scope: str = "adjacent"    # static nodes visible to a mega-batch: adjacent to it, or all
    pipeline: bool = True             # load the next mega-batch while training on this one
    regroup: str = ""                 # "metis:256": group by this partition instead of the store's
                                      # parts; on an unpartitioned store, HB− (scattered loads)
    # outre (OUTRE §4.2-4.3)
    parts_per_macro: int = 20         # parts per macro batch
    feature_cache: str = "degree"     # static feature cache: degree | frequency (profiled epoch)
    history_ratio: float = 0.1        # fraction of nodes with a historical layer-(L-1) embedding
    history_by: str = "importance"    # importance (OUTRE's pruned-subtree size) | degree
    staleness: int = 100              # reuse a history while younger than this many iterations
    threads: int = 0                  # torch intra-op threads; 0: library default (DGL sampling is
                                      # reproducible only with OMP_NUM_THREADS=1)
    progress: bool = True

    def __post_init__(self):
        self.fanouts = ",".join(map(str, parse_fanouts(self.fanouts)))
        self.eval_fanouts = ",".join(map(str, parse_fanouts(self.eval_fanouts or self.fanouts)))
        n = len(self.fanout_list)
        if self.layers and self.layers != n:
            raise UserError(f"--layers {self.layers} does not match {n} fanouts ({self.fanouts})")
        if len(parse_fanouts(self.eval_fanouts)) != n:
            raise UserError(f"eval fanouts {self.eval_fanouts} do not match {n} layers")
        self.layers = n
        if self.policy not in POLICIES:
            raise UserError(f"unknown policy {self.policy!r}; choose from {', '.join(POLICIES)}")
        if self.model not in MODELS:
            raise UserError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        for name in ("epochs", "batch_size", "hidden", "eval_batch_size"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1 or self.lr <= 0 or not 0 <= self.target_acc <= 1:
            raise UserError("need 0 <= dropout < 1, lr > 0 and 0 <= target_acc <= 1")
        if self.eval_every < 0 or self.max_eval_nodes < 0 or self.threads < 0 or self.max_steps < 0:
            raise UserError("eval_every, max_eval_nodes, max_steps and threads must be >= 0")
        self.memory_budget_bytes   # validates the size string
        if self.parts_per_megabatch < 1 or self.parts_per_macro < 1:
            raise UserError("parts_per_megabatch and parts_per_macro must be >= 1")
        if not 0 <= self.static_ratio <= 1 or not 0 <= self.history_ratio <= 1:
            raise UserError("static_ratio and history_ratio are fractions in [0, 1]")
        if self.passes < 1:
            raise UserError(f"passes must be >= 1 (every training node at least once), got {self.passes}")
        if self.static_scope not in ("adjacent", "all"):
            raise UserError(f"static_scope must be adjacent or all, got {self.static_scope!r}")
        if self.feature_cache not in ("degree", "frequency"):
            raise UserError(f"feature_cache must be degree or frequency, got {self.feature_cache!r}")
        if self.history_by not in ("importance", "degree"):
            raise UserError(f"history_by must be importance or degree, got {self.history_by!r}")
        if self.staleness < 1:
            raise UserError(f"staleness must be >= 1 iteration (1 disables reuse), got {self.staleness}")
        if self.history_ratio > 0 and self.model == "mlp" and self.policy == "outre":
            raise UserError("historical embeddings need a GNN (the MLP has no layer L-1 inputs)")

    @property
    def fanout_list(self) -> list:
        return list(parse_fanouts(self.fanouts))

    @property
    def memory_budget_bytes(self) -> int:
        return parse_size(self.memory_budget)

    def to_dict(self) -> dict:
        return {**asdict(self), "memory_budget_bytes": self.memory_budget_bytes}
