"""Run configuration: one dataclass whose field names the CLI, notebooks and papermill share."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UserError
from .units import parse_size

POLICIES = ("inmemory", "mmap")
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
        if self.eval_every < 0 or self.max_eval_nodes < 0 or self.threads < 0:
            raise UserError("eval_every, max_eval_nodes and threads must be >= 0")
        self.memory_budget_bytes   # validates the size string

    @property
    def fanout_list(self) -> list:
        return list(parse_fanouts(self.fanouts))

    @property
    def memory_budget_bytes(self) -> int:
        return parse_size(self.memory_budget)

    def to_dict(self) -> dict:
        return {**asdict(self), "memory_budget_bytes": self.memory_budget_bytes}
