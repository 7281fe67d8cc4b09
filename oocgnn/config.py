"""Run configuration: one dataclass whose field names the CLI, notebooks, papermill and sweeps share.

Settings every run has are fields of `TrainConfig`; each policy's own options are a small nested
dataclass named after the policy (`cfg.hierbatching.passes`), declared beside its plan in
`oocgnn.policies` (the registry). Every setting has one name, unique across the registry, which
is also its CLI flag (`--parts-per-megabatch`): `TrainConfig.create(**settings)` and
`cfg.replace(**settings)` take any of them, and `SETTINGS` lists them with their help.
`asdict(cfg)` (nested) is saved with every run; `TrainConfig.create(**json)` reads it back.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from .errors import UserError
from .metrics import METRICS, SHARED_HITS
from .policies import POLICIES, setting
from .units import parse_size


EVAL_MODES = ("layerwise", "batch")   # --eval-mode (oocgnn.evaluation)
ACCUMULATE = ("auto", "on", "off")   # --accumulate (oocgnn.optsteps)
DECODERS = ("dot", "mlp")        # --decoder (oocgnn.linktask)
PRECISIONS = ("fp32", "bf16")     # --precision: float32, or bfloat16 autocast (oocgnn.device)
MAX_HIDDEN = 1 << 16              # --hidden: wider layers are refused before torch tries to allocate them


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


def _with_policy_options(cls):
    """Each registered policy's options as a field named after it (`cfg.hierbatching.passes`), from the
    registry: a new policy's options need no line here."""
    for name, plan in POLICIES.items():
        if plan.Options is not None:
            cls.__annotations__[name] = plan.Options
            setattr(cls, name, field(default_factory=plan.Options))
    cls.__annotations__["memory_budget_bytes"] = cls.__annotations__.pop("memory_budget_bytes")   # derived: last
    return cls


@dataclass
@_with_policy_options
class TrainConfig:
    """Settings of one training run; `asdict(cfg)` is saved as the run's config.json."""
    store: str = field(metadata={"help": "the store directory (written by `oocgnn prepare`)"})
    policy: str = setting("inmemory", "what stays in memory and how batches are formed: "
                                      + " | ".join(POLICIES))
    model: str = setting("sage", "sage | gat | gin | mlp")
    epochs: int = setting(5, "epochs to train")
    max_steps: int = setting(0, "stop after this many steps (0: all epochs); epoch_s is then extrapolated")
    fanouts: str = setting("10,10", "sampled neighbours per layer, input layer first (-1: all)")
    layers: int = setting(0, "number of layers (0: as many as fanouts; else must match them)")
    sampler: str = setting("per-hop", "per-hop (every layer draws its nodes' neighbours, DGL's) | dense (MariusGNN's "
                                      "DENSE: a node's draw is reused by the inner layers; only new nodes are drawn)")
    batch_size: int = setting(1024, "training nodes per mini-batch")
    accumulate: str = setting("auto", "label-balanced optimizer steps: on (a step accumulates the gradients of "
                                      "consecutive mini-batches until it has seen min(batch size, training nodes "
                                      "× passes) labelled nodes, or its epoch ends) | off (a step per mini-batch, "
                                      "as the papers) | auto (on where the plan's groups hold fewer labelled nodes "
                                      "than that, and too few to carry the training set's label mix)")
    hidden: int = setting(128, "hidden width")
    lr: float = setting(3e-3, "Adam learning rate")
    dropout: float = setting(0.5, "dropout between layers")
    weight_decay: float = setting(5e-4, "Adam weight decay (L2 on every parameter; 5e-4 as GCN on Planetoid: "
                                        "without it small labelled sets overfit in a few steps; on a link store "
                                        "0 unless given, as MariusGNN's and OGB's link predictors)")
    adam_beta1: float = setting(0.9, "Adam's first beta: how much of the last steps' gradients a step keeps "
                                     "(its momentum; torch's 0.9; 0: none, each step its own batch's gradient)")
    memory_budget: str = setting("256MB", "bytes the policy may keep resident, e.g. 256MB, 1GiB")
    topology: str = setting("auto", "where the neighbour lists live: memory | disk (read when sampled, "
                                    "through what the policy keeps resident) | auto (memory if it fits the budget)")
    neighbour_cache_ratio: float = setting(-1.0, "share of the budget for a static cache of neighbour lists on a disk "
                                                 "topology (-1: the policy's default, outre 0.1 by cross-partition "
                                                 "degree, ginex 0.5 by out/in-degree)")
    eval_every: int = setting(0, "evaluate every N steps (0: at the end of each epoch)")
    eval_fanouts: str = setting("", "fanouts of evaluation (default: the training fanouts)")
    eval_batch_size: int = setting(1024, "evaluation batch size")
    eval_mode: str = setting("layerwise", "layerwise (each layer once for the evaluated ids' neighbourhood, input rows "
                                          "read once in store order: oocgnn.evaluation; faster in memory too) | batch "
                                          "(sampled mini-batches of --eval-batch-size, rows gathered per batch)")
    max_eval_nodes: int = setting(20_000, "evaluate on a fixed seeded subset this large per split (0: all); on a link "
                                          "store, of the held-out edges")
    target_acc: float = setting(0.0, "report the time to reach this validation accuracy (of --target-metric)")
    target_metric: str = setting("acc", "the validation metric that picks the best evaluation (test at best val), "
                                        "--target-acc and the tuner's choice aim at: acc | f1 (macro-F1) | auc "
                                        "(ROC-AUC, binary labels only); a link store's: mrr (its default), or "
                                        "with OGB's shared negative pairs hits@20 | hits@50 | hits@100")
    decoder: str = setting("dot", "link stores: the edge score of two endpoint embeddings: dot (their dot product) | "
                                  "mlp (OGB's LinkPredictor: an MLP on their elementwise product)")
    negatives: int = setting(100, "link stores: negatives shared by each chunk of a training batch (MariusGNN)")
    negative_chunks: int = setting(10, "link stores: chunks a training batch is cut into, each sharing one set of "
                                       "negatives (MariusGNN's num_chunks)")
    negative_degree_fraction: float = setting(0.0, "link stores: share of the negatives drawn from the batch's "
                                                   "destinations, i.e. by degree (MariusGNN's degree_fraction; the "
                                                   "rest uniform)")
    eval_negatives: int = setting(100, "link stores: negatives each held-out edge is ranked against (fixed per edge, "
                                       "negatives.eval_targets; OGB's own where the store has them)")
    out: str = setting("", "run directory (default runs/<store>-<policy>-<model>-s<seed>)")
    seed: int = setting(0, "seed of batches, sampling and model initialisation")
    seeds: str = setting("", "train once per seed (e.g. 0,1,2) into <out>/seed<S> and write their mean ± std "
                             "(aggregate.json, aggregate_log.csv); empty: one run with --seed")
    threads: int = setting(0, "torch intra-op threads (0: the library default)")
    device: str = setting("auto", "where the model runs: auto (cuda when a GPU is visible) | cpu | cuda | cuda:N")
    precision: str = setting("fp32", "fp32 | bf16 (autocast: bfloat16 matmuls, float32 sums; on the CPU too)")
    progress: bool = setting(True, "show a progress bar")
    force: bool = setting(False, "replace the run directory if it holds an earlier run (never anything else)")
    checkpoint_every: int = setting(0, "save a checkpoint every N steps, to resume a killed run from (0: none)")
    resume: str = setting("", "continue the killed run in this directory from its last checkpoint, with the "
                              "settings it was started with")
    distributed: bool = setting(False, "run as one rank of a torchrun job: ranks own contiguous ranges of the "
                                       "store's partitions and train on their own training nodes (a link "
                                       "store: edges), gradients averaged; --memory-budget per rank (see "
                                       "--rank-data)")
    rank_data: str = setting("auto", "what a distributed rank reads: own (only its own rows and lists, remote "
                                     "ones by macrobatched all_to_all, k = --macrobatch; inmemory | macrobatch | "
                                     "hierbatching; STORE may be a `prepare --shards R` directory) | shared (the "
                                     "whole store, which every rank reads, through its policy: every policy) | "
                                     "auto (own for the policies it runs, else shared; a link store: shared)")
    dist_timeout: float = setting(120.0, "seconds a distributed collective waits for the other ranks before the "
                                         "run fails (a dead rank ends the others, never a hang)")
    memory_budget_bytes: int = field(init=False, default=0)     # memory_budget, parsed once
    # + one field per registered policy with options, named after it, before memory_budget_bytes
    #   (`_with_policy_options`)

    def __post_init__(self):
        for name in POLICY_OPTIONS:                   # nested dicts (config.json) -> options
            if isinstance(getattr(self, name), dict):
                setattr(self, name, POLICIES[name].Options(**getattr(self, name)))
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
        from .models import MODELS  # torch: imported when used, not with this module
        if self.model not in MODELS:
            raise UserError(f"unknown model {self.model!r}; choose from {', '.join(MODELS)}")
        for name in ("epochs", "batch_size", "hidden", "eval_batch_size"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden > MAX_HIDDEN:
            raise UserError(f"hidden must be at most {MAX_HIDDEN:,} (a layer of {self.hidden:,} units would not "
                            f"fit in memory), got {self.hidden:,}")
        if not 0 <= self.dropout < 1 or self.lr <= 0 or self.weight_decay < 0 or not 0 <= self.target_acc <= 1:
            raise UserError("need 0 <= dropout < 1, lr > 0, weight_decay >= 0 and 0 <= target_acc <= 1")
        if not 0 <= self.adam_beta1 < 1:
            raise UserError(f"adam_beta1 must be in [0, 1), got {self.adam_beta1}")
        if min(self.eval_every, self.max_eval_nodes, self.threads, self.max_steps, self.checkpoint_every, self.seed) < 0:
            raise UserError("eval_every, max_eval_nodes, max_steps, threads, checkpoint_every and seed must be >= 0")
        for name, most in (("seed", 2**32 - 8), ("threads", 4096)):   # numpy's seeds; torch's thread count
            if getattr(self, name) > most:
                raise UserError(f"{name} must be at most {most:,}, got {getattr(self, name):,}")
        self.memory_budget_bytes = parse_size(self.memory_budget)
        if self.precision not in PRECISIONS:
            raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.seeds:
            self.seeds = ",".join(map(str, parse_seeds(self.seeds)))
        if self.target_metric not in METRICS + ("mrr", *SHARED_HITS):   # link stores' (`metrics.check_target`)
            raise UserError(f"target_metric must be one of {', '.join(METRICS + ('mrr', *SHARED_HITS))}, "
                            f"got {self.target_metric!r}")
        if self.decoder not in DECODERS:
            raise UserError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if min(self.negatives, self.negative_chunks, self.eval_negatives) < 1 or \
                not 0 <= self.negative_degree_fraction <= 1:
            raise UserError("negatives, negative_chunks and eval_negatives must be >= 1 and negative_degree_fraction "
                            "in [0, 1]")
        if self.eval_mode not in EVAL_MODES:
            raise UserError(f"eval_mode must be one of {', '.join(EVAL_MODES)}, got {self.eval_mode!r}")
        if self.accumulate not in ACCUMULATE:
            raise UserError(f"accumulate must be one of {', '.join(ACCUMULATE)}, got {self.accumulate!r}")
        if self.sampler not in ("per-hop", "dense"):
            raise UserError(f"sampler must be per-hop or dense, got {self.sampler!r}")
        if self.topology not in ("auto", "memory", "disk"):
            raise UserError(f"topology must be auto, memory or disk, got {self.topology!r}")
        if not (0 <= self.neighbour_cache_ratio <= 1 or self.neighbour_cache_ratio == -1):
            raise UserError(f"neighbour_cache_ratio is a fraction in [0, 1] (or -1: the policy's default), "
                            f"got {self.neighbour_cache_ratio}")
        if self.rank_data not in ("auto", "own", "shared"):
            raise UserError(f"rank_data must be auto, own or shared, got {self.rank_data!r}")
        if self.dist_timeout <= 0:
            raise UserError(f"dist_timeout must be > 0 seconds, got {self.dist_timeout}")
        history = self.get("history_ratio")       # auto gives the MLP no histories
        if self.policy in ("outre", "composed") and history != "auto" and float(history) > 0 and self.model == "mlp":
            raise UserError("historical embeddings need a GNN (the MLP has no layer L-1 inputs)")

    @property
    def fanout_list(self) -> list:
        return list(parse_fanouts(self.fanouts))

    def neighbour_cache_ratio_of(self, policy) -> float:
        """--neighbour-cache-ratio, or `policy`'s default for it when left at -1."""
        r = self.neighbour_cache_ratio
        return POLICIES[policy].neighbour_cache_default if r < 0 else r

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def create(cls, **settings) -> "TrainConfig":
        """A config from settings by name, top-level or a policy's (`parts_per_megabatch=16`); `given` names
        them (a resumed run compares those with its own, whatever their values)."""
        cfg = cls(**settings)                     # __init__ routes them (`_settings_by_name`)
        cfg.given = frozenset(settings)           # an attribute, not a field: not a setting, not saved
        return cfg

    def replace(self, **settings) -> "TrainConfig":
        """A copy with settings changed by name, top-level or a policy's; a config made by `create` keeps
        `given`, plus the names changed (a setting chosen by a caller, `--seeds` or a sweep, is not a default)."""
        top, nested = _route(settings)
        out = replace(self, **top, **{p: replace(getattr(self, p), **kw) for p, kw in nested.items()})
        if hasattr(self, "given"):
            out.given = self.given | frozenset(settings)
        return out

    def get(self, name):
        """A setting's value by its name (top-level or a policy's: the run's policy's when it shares it)."""
        owners = OWNERS.get(name, [])
        owner = self.policy if self.policy in owners else owners[0] if owners else None
        return getattr(getattr(self, owner) if owner else self, name)


POLICY_OPTIONS = [p for p, plan in POLICIES.items() if plan.Options is not None]


LINK_DEFAULTS = {"target_metric": "mrr", "weight_decay": 0.0}   # a link store's, where not given (`task_defaults`)


def task_defaults(cfg: TrainConfig, task: str) -> TrainConfig:
    """`cfg` with a link store's defaults (`LINK_DEFAULTS`) for the settings not given and left at a node store's:
    MRR as the target metric (acc is a node store's), and no weight decay. 5e-4 is GCN's for ~20 labels a class;
    MariusGNN's, OGB's and DGL's link predictors train without it, and on amazon_photo (edges held out 85/5/10,
    30 epochs) it held in-memory training's test MRR to 0.42 against 0.57 without."""
    if task != "link":
        return cfg
    given = getattr(cfg, "given", ())
    node = TrainConfig.__dataclass_fields__
    unset = {k: v for k, v in LINK_DEFAULTS.items() if k not in given and getattr(cfg, k) == node[k].default}
    if not unset:
        return cfg
    out = cfg.replace(**unset)
    if hasattr(cfg, "given"):
        out.given = cfg.given                     # a task's default stays a default
    return out


def _settings() -> tuple[dict, dict]:
    """(name -> (policy owning it first or None, dataclass field), every setting once; name -> the
    policies owning it). Policies may share a setting (`policies.shared`) only with the same default
    and help: one flag, one meaning, set in each of them."""
    out = {f.name: (None, f) for f in fields(TrainConfig) if f.init and f.name not in POLICY_OPTIONS}
    owners = {}
    for policy in POLICY_OPTIONS:
        for f in fields(POLICIES[policy].Options):
            if f.name in out:
                first, g = out[f.name]
                if first is None or (g.default, g.metadata["help"]) != (f.default, f.metadata["help"]):
                    raise TypeError(f"setting {f.name!r} of {policy} is already a setting of "
                                    f"{first or 'every run'}: names must be unique (or shared, meaning the same)")
            else:
                out[f.name] = (policy, f)
            owners.setdefault(f.name, []).append(policy)
    return out, owners


SETTINGS, OWNERS = _settings()


def _typed(name, value):
    """`value` as setting `name`'s declared type takes it, or a one-line UserError naming the setting: an
    int is whole (an integral float is taken, a bool is not), a float is a finite number, a bool is a bool;
    str settings are parsed where they are used. A wrong type from --config JSON or a call never reaches
    numpy or torch."""
    kinds = [k.strip() for k in str(SETTINGS[name][1].type).split("|")]
    number = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if "int" in kinds and number and float(value).is_integer() and math.isfinite(value):
        return int(value)
    if "float" in kinds and number and math.isfinite(value):
        return float(value)
    if "bool" in kinds and isinstance(value, bool):
        return value
    if kinds == ["str"] or ("str" in kinds and isinstance(value, str)) or not {"int", "float", "bool"} & set(kinds):
        return value
    want = " or ".join({"int": "a whole number", "float": "a finite number", "bool": "true or false",
                        "str": "a word (such as auto)"}[k] for k in kinds)
    raise UserError(f"setting {name} must be {want}, got {value!r}")


def _route(settings: dict) -> tuple[dict, dict]:
    """Split settings by name into top-level ones and {policy: its options}, each of its type (`_typed`);
    nested dicts pass, their settings typed too."""
    top, nested = {}, {}
    for name, value in settings.items():
        if name in POLICY_OPTIONS and isinstance(value, dict):
            known = {f.name for f in fields(POLICIES[name].Options)}
            unknown = sorted(map(repr, set(value) - known))
            if unknown:
                raise UserError(f"unknown setting(s) {', '.join(unknown)} of policy {name}; its settings are: "
                                f"{', '.join(sorted(known))}")
            nested.setdefault(name, {}).update({k: _typed(k, v) for k, v in value.items()})
            continue
        if name in POLICY_OPTIONS and isinstance(value, POLICIES[name].Options):
            top[name] = value
            continue
        if name in SETTINGS:
            value = _typed(name, value)
        if name in OWNERS:                      # a policy's, set in every policy sharing it
            for owner in OWNERS[name]:
                nested.setdefault(owner, {})[name] = value
        elif name in SETTINGS:
            top[name] = value
        elif name != "memory_budget_bytes":       # derived: config.json has it, it is recomputed
            raise UserError(f"unknown setting {name!r}; settings are: {', '.join(SETTINGS)}")
    return top, nested


def _settings_by_name(init):
    """`TrainConfig(...)` takes a policy's settings by name too (`parts_per_megabatch=4`), as `create` does:
    the dataclass's own __init__ would stop at them with a bare TypeError."""
    def __init__(self, *args, **settings):
        top, nested = _route(settings)
        for policy, kw in nested.items():
            top[policy] = replace(top[policy], **kw) if policy in top else POLICIES[policy].Options(**kw)
        init(self, *args, **top)
    __init__.__doc__ = init.__doc__
    return __init__


TrainConfig.__init__ = _settings_by_name(TrainConfig.__init__)


def parse_seeds(text) -> list:
    """'0,1,2' -> [0, 1, 2] (distinct non-negative integers)."""
    try:
        seeds = [int(s) for s in str(text).replace(" ", "").split(",") if s]
    except ValueError:
        raise UserError(f"bad --seeds {text!r}: use comma-separated integers, e.g. 0,1,2") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise UserError(f"bad --seeds {text!r}: give distinct non-negative integers, e.g. 0,1,2")
    return seeds
