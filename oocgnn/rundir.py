"""A run directory: the files of one run, written so that two runs never mix, and checkpoints.

`RunDir.create(path, force, resume)` takes a directory for a run: a fresh or empty one; with
`force`, one that holds an earlier run (its run files are removed; anything else in it is left
and refused); with `resume`, the killed run to continue. Every file is written atomically (a
temporary file renamed into place), and config.json, log.csv, summary.json and the checkpoint carry
one `run_id`, so `load_run` (what `oocgnn report` reads) refuses a directory whose files come from
different runs, or a run that did not finish.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pandas as pd

from .config import POLICY_OPTIONS, SETTINGS, TrainConfig
from .errors import UserError, first_line
from .metrics import LINK_METRICS, SHARED_HITS

RUN_FILES = ("config.json", "log.csv", "steps.csv", "summary.json", "checkpoint.pt")
LOG_COLUMNS = ["wall_s", "epoch", "step", "train_loss", "val_acc", "test_acc",
               "bytes_read", "requests", "peak_rss"]
METRIC_LOG_COLUMNS = ["val_f1", "test_f1", "val_auc", "test_auc"]   # macro-F1, ROC-AUC (NaN unless binary labels);
#                                                       not required of a log (runs before them load)
EVAL_LOG_COLUMNS = ["eval_bytes_read", "eval_requests"]   # evaluation's reads so far (features and lists), beside
#                                                       the run's; not required of a log (runs before them load)
LINK_LOG_COLUMNS = ["wall_s", "epoch", "step", "train_loss",
                    *(f"{split}_{m}" for split in ("val", "test") for m in LINK_METRICS),
                    "bytes_read", "requests", "peak_rss"]       # a link store's run (`linktask`): its metrics'
SHARED_LOG_COLUMNS = [f"{split}_{m}" for split in ("val", "test") for m in SHARED_HITS]   # a store with OGB's
#                                                       shared negative pairs: its Hits@K beside the link columns
STEP_COLUMNS = ["epoch", "batch", "seconds", "bytes_read", "pages", "requests", "io_seconds",
                "sample_s", "gather_s", "compute_s"]      # the step's foreground stages (compute: with h2d)


def _atomic(path: Path, write):
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _leftover(name: str) -> bool:
    """A temporary file `_atomic` left behind when its process was killed mid-write."""
    return name.startswith(".") and ".tmp-" in name and name[1:].split(".tmp-")[0] in RUN_FILES


class RunDir:
    """The directory of one run (see the module docstring)."""

    def __init__(self, path: Path, run_id: str):
        self.path, self.run_id = Path(path), run_id

    @classmethod
    def create(cls, path, force=False, resume=False) -> "RunDir":
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"{path} is a file, not a run directory")
        present = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        if resume:
            if "config.json" not in present or "checkpoint.pt" not in present:
                raise UserError(f"{path} holds no run to resume (config.json and checkpoint.pt are needed; "
                                "a run writes checkpoints with --checkpoint-every N)")
            if "summary.json" in present:
                raise UserError(f"{path} holds a run that finished: there is nothing to resume")
            return cls(path, read_json(path / "config.json")["run_id"])
        if present:
            others = [p for p in present if p not in RUN_FILES and not p.startswith(".")]
            if others:
                raise UserError(f"{path} is not a run directory (it holds {', '.join(others[:3])}); "
                                "choose another --out")
            if not force:
                raise UserError(f"{path} already holds a run; use --force to replace it, --resume to continue "
                                "it, or another --out")
            for name in present:
                if name in RUN_FILES or _leftover(name):
                    (path / name).unlink()
        path.mkdir(parents=True, exist_ok=True)
        return cls(path, uuid.uuid4().hex)

    def write_json(self, name, obj):
        _atomic(self.path / name, lambda p: p.write_text(json.dumps({**obj, "run_id": self.run_id}, indent=2,
                                                                     default=float) + "\n"))

    def write_csv(self, name, df: pd.DataFrame):
        _atomic(self.path / name, lambda p: df.assign(run_id=self.run_id).to_csv(p, index=False))

    def save_checkpoint(self, state: dict):
        import torch  # torch: imported when used, not with this module
        try:
            _atomic(self.path / "checkpoint.pt", lambda p: torch.save({**state, "run_id": self.run_id}, p))
        except RuntimeError as e:                  # torch's writer reports a full disk as a RuntimeError
            raise UserError(f"cannot write {self.path / 'checkpoint.pt'} ({first_line(e)[:200]}): is the disk full? "
                            "The last checkpoint written is kept") from None

    def load_checkpoint(self) -> dict:
        import torch
        try:
            state = torch.load(self.path / "checkpoint.pt", weights_only=False, map_location="cpu")
        except Exception as e:  # a truncated or foreign file
            raise UserError(f"{self.path / 'checkpoint.pt'} is not a readable checkpoint ({e})") from None
        if state.get("run_id") != self.run_id:
            raise UserError(f"{self.path}: checkpoint.pt belongs to another run than config.json")
        return state


def read_json(path: Path) -> dict:
    try:
        obj = json.loads(Path(path).read_text())
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} does not hold a JSON object")
    return obj


def load_run(path) -> tuple[dict, pd.DataFrame, dict]:
    """(config, log, summary) of a finished run, checked: every file present and readable, from one run; the
    log's metric columns are NaN where it has none (a run from before them); a link run's log has its own
    (`LINK_LOG_COLUMNS`: MRR, Hits@K)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a run directory")
    missing = [n for n in ("config.json", "log.csv", "summary.json") if not (path / n).is_file()]
    if missing:
        why = "the run did not finish (resume it with --resume)" if missing == ["summary.json"] else \
            "not a run directory"
        raise UserError(f"{path}: missing {', '.join(missing)}: {why}")
    cfg, summary = read_json(path / "config.json"), read_json(path / "summary.json")
    try:
        log = pd.read_csv(path / "log.csv")
    except (ValueError, OSError) as e:
        raise UserError(f"{path / 'log.csv'} is not a readable CSV ({e})") from None
    columns = LINK_LOG_COLUMNS if "val_mrr" in log.columns else LOG_COLUMNS     # a link store's run: MRR, Hits@K
    if not set(columns) <= set(log.columns) or not len(log):
        raise UserError(f"{path / 'log.csv'} lacks the log columns {', '.join(columns)} or any row")
    ids = {cfg.get("run_id"), summary.get("run_id"), *log.get("run_id", pd.Series([None])).unique()}
    if len(ids) != 1 or None in ids:
        raise UserError(f"{path}: its files come from different runs (run ids {sorted(map(str, ids))}); "
                        "run again into an empty directory")
    for key in ("policy", "model", "seed"):
        if key not in cfg:
            raise UserError(f"{path / 'config.json'} has no {key!r}")
    if columns is LINK_LOG_COLUMNS:
        return cfg, log.reindex(columns=LINK_LOG_COLUMNS + [c for c in SHARED_LOG_COLUMNS if c in log]), summary
    return cfg, log.reindex(columns=LOG_COLUMNS + METRIC_LOG_COLUMNS), summary   # an older log's metrics: NaN


def default_run_dir(cfg: TrainConfig) -> Path:
    return Path("runs") / f"{Path(cfg.store).name}-{cfg.policy}-{cfg.model}-s{cfg.seed}"


def resumed_config(cfg: TrainConfig, run: RunDir) -> TrainConfig:
    """The configuration of the run being resumed (its config.json), on the store given again."""
    saved = read_json(run.path / "config.json")
    settings = {k: v for k, v in saved.items() if k in SETTINGS or k in POLICY_OPTIONS}
    settings.setdefault("weight_decay", 0.0)     # runs saved before the setting trained without it
    if Path(settings.get("store", "")).resolve() != Path(cfg.store).resolve():
        raise UserError(f"{run.path} is a run on {settings.get('store')}, not on {cfg.store}")
    resumed = TrainConfig.create(**{**settings, "resume": cfg.resume, "progress": cfg.progress,
                                    "threads": cfg.threads, "out": str(run.path)})
    if cfg.out and Path(cfg.out).resolve() != run.path.resolve():
        raise UserError(f"--resume continues {run.path} in place; --out {cfg.out} names another directory")
    given = getattr(cfg, "given", None)          # the settings named (`TrainConfig.create`), else those not at default
    defaults = TrainConfig(store=cfg.store)
    changed = [name for name in SETTINGS if name not in _RESUME_MAY_CHANGE
               and (name in given if given is not None else cfg.get(name) != defaults.get(name))
               and cfg.get(name) != resumed.get(name)]
    if changed:
        raise UserError(f"--resume continues {run.path} with the settings it was started with; "
                        + ", ".join(f"{n} {cfg.get(n)!r} differs from its {resumed.get(n)!r}" for n in changed))
    return resumed


def check_same_store(run: RunDir, meta: dict):
    """Refuse to resume `run` on a store other than the one it started on: the same path rewritten with
    another graph (`prepare --force`) has another meta checksum."""
    saved = read_json(run.path / "config.json").get("store_meta", {})
    if saved.get("checksum") is not None and saved["checksum"] != meta.get("checksum"):
        raise UserError(f"{run.path} started on another store than the one now at {saved.get('name', 'its path')} "
                        f"(meta checksum {saved['checksum']}, now {meta.get('checksum')}: it was prepared again "
                        "since); its checkpoint does not fit this store")


_RESUME_MAY_CHANGE = {"store", "resume", "progress", "threads", "out", "force", "device"}
