"""Faults and bad input around a run: each case ends in a clear error (one line, exit 2 through the
CLI, nothing lost) or a correct result. The store's and the caches' faults are in test_faults_store.py."""
import errno
import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.store import open_store
from oocgnn.storewrite import write_store
from oocgnn.train import train


def oocgnn(*args, cwd=None):
    r = subprocess.run([sys.executable, "-m", "oocgnn", *map(str, args)], capture_output=True, text=True,
                       timeout=600, cwd=cwd)
    return r


def assert_one_line_error(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def _run(store, tmp, name="run", **kw):
    kw = {"epochs": 2, "batch_size": 128, "max_eval_nodes": 100, "progress": False, "out": str(tmp / name), **kw}
    return train(TrainConfig.create(store=str(store.path), **kw))


# ---- bad numbers: refused at prepare, or a run stopped with a clear message -------------------
def _npz(path, n=60, feat=None, train=range(0, 20), val=range(20, 30), test=range(30, 40)):
    rng = np.random.default_rng(0)
    feat = rng.standard_normal((n, 6)).astype(np.float32) if feat is None else feat
    np.savez(path, src=rng.integers(0, n, 200), dst=rng.integers(0, n, 200), feat=feat,
             label=rng.integers(0, 3, n), train_idx=np.array(list(train), dtype=np.int64),
             val_idx=np.array(list(val), dtype=np.int64), test_idx=np.array(list(test), dtype=np.int64))
    return path


@pytest.mark.parametrize("case, words", [
    ("nan", ["NaN or infinite", "rows 3, 17"]), ("inf", ["NaN or infinite", "rows 3, 17"]),
    ("empty-train", ["train split is empty"]), ("empty-val", ["val split is empty"])])
def test_bad_numbers_are_refused_at_prepare(tmp_path, case, words):
    feat = np.random.default_rng(1).standard_normal((60, 6)).astype(np.float32)
    if case in ("nan", "inf"):
        feat[[3, 17], 2] = np.nan if case == "nan" else np.inf
    kw = {"train": []} if case == "empty-train" else {"val": []} if case == "empty-val" else {}
    src = _npz(tmp_path / "g.npz", feat=feat, **kw)
    r = oocgnn("prepare", src, "--out", tmp_path / "store")
    assert_one_line_error(r, *words)
    assert not (tmp_path / "store").exists(), "nothing half-written is left"


@pytest.mark.parametrize("labels, words", [(10**12, "the largest is 1,000,000,000,000 with 60 nodes"),
                                           (70_000, "the largest is 70,000"), (-3, "found -3")])
def test_labels_that_are_not_class_indices_are_refused_at_prepare(tmp_path, labels, words):
    """A label far beyond the classes would become the class count (a model with that many outputs)."""
    src = _npz(tmp_path / "g.npz")
    arr = dict(np.load(src))
    arr["label"][5] = labels
    np.savez(src, **arr)
    assert_one_line_error(oocgnn("prepare", src, "--out", tmp_path / "store"), words)
    assert not (tmp_path / "store").exists()
    arr["label"][5] = 59                          # as many classes as nodes at most: accepted
    np.savez(src, **arr)
    assert oocgnn("prepare", src, "--out", tmp_path / "ok").returncode == 0


def test_prepare_refuses_options_it_would_ignore(tmp_path):
    r = oocgnn("prepare", "synthetic", "--preset", "tiny", "--row-normalize", "--out", tmp_path / "s")
    assert_one_line_error(r, "--row-normalize applies to .npz sources only")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("split", ["train_idx", "val_idx"])
def test_a_store_without_training_or_validation_nodes_is_refused(tiny_data, tmp_path, split):
    import dataclasses
    data = dataclasses.replace(tiny_data, **{split: np.empty(0, np.int64)})
    store = write_store(data, tmp_path / "s", progress=False)
    with pytest.raises(UserError, match=f"the {split.split('_')[0]} split is empty"):
        _run(store, tmp_path)


@pytest.mark.parametrize("eval_mode", ["layerwise", "batch"])
def test_a_split_without_test_nodes_has_no_test_accuracy(tiny_data, tmp_path, capsys, eval_mode):
    """No test nodes: the log's test accuracy is empty and the summary's None, never a made-up 0.0; the
    command line says so."""
    import dataclasses
    from oocgnn.cli import main
    store = write_store(dataclasses.replace(tiny_data, test_idx=np.empty(0, np.int64)), tmp_path / "s",
                        progress=False)
    s = _run(store, tmp_path, eval_mode=eval_mode)
    assert s["test_at_best_val"] is None and s["final_test_acc"] is None and s["best_val_acc"] > 0
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    assert log["test_acc"].isna().all() and log["val_acc"].notna().all()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["test_at_best_val"] is None
    capsys.readouterr()
    assert main(["train", str(store.path), "--epochs", "1", "--batch-size", "128", "--no-progress",
                 "--eval-mode", eval_mode, "--out", str(tmp_path / "cli")]) == 0
    assert "test at best val - (no test nodes)" in capsys.readouterr().out


def test_a_diverging_run_stops_with_a_clear_message(tiny_data, tmp_path):
    import dataclasses
    huge = np.full((tiny_data.num_nodes, 4), 3e38, np.float32)     # finite, but inf once multiplied
    store = write_store(dataclasses.replace(tiny_data, features=huge), tmp_path / "s", progress=False)
    with pytest.raises(UserError, match="training diverged at step 0 .* the loss is nan"):
        _run(store, tmp_path)
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    assert list(log["step"]) == [0] and not (tmp_path / "run" / "summary.json").exists()


# ---- run directories: never two runs mixed, nothing but a run replaced ------------------------
def test_a_run_directory_is_not_reused_without_force(tiny_store, tmp_path):
    _run(tiny_store, tmp_path, epochs=1)
    first = json.loads((tmp_path / "run" / "config.json").read_text())["run_id"]
    with pytest.raises(UserError, match="already holds a run; use --force"):
        _run(tiny_store, tmp_path, epochs=1)
    (tmp_path / "run" / ".log.csv.tmp-99999").write_text("left by a killed writer")
    second = _run(tiny_store, tmp_path, epochs=1, force=True)
    ids = {json.loads((tmp_path / "run" / n).read_text())["run_id"] for n in ("config.json", "summary.json")}
    ids |= set(pd.read_csv(tmp_path / "run" / "log.csv")["run_id"])
    assert len(ids) == 1 and first not in ids and second["steps"] > 0
    assert not (tmp_path / "run" / ".log.csv.tmp-99999").exists()


@pytest.mark.parametrize("what", ["foreign-file", "a-file"])
def test_force_replaces_only_a_run(tiny_store, tmp_path, what):
    out = tmp_path / "out"
    if what == "foreign-file":
        out.mkdir()
        (out / "notes.txt").write_text("precious")
    else:
        out.write_text("precious")
    with pytest.raises(UserError, match="not a run directory|is a file"):
        _run(tiny_store, tmp_path, name="out", force=True)
    assert (out / "notes.txt" if what == "foreign-file" else out).read_text() == "precious"


def test_train_into_the_current_directory_is_refused(tiny_store, tmp_path):
    (tmp_path / "notes.txt").write_text("precious")
    r = oocgnn("train", tiny_store.path, "--out", ".", "--epochs", "1", "--no-progress", cwd=tmp_path)
    assert_one_line_error(r, "not a run directory")
    assert (tmp_path / "notes.txt").read_text() == "precious"


def _finished(store, tmp_path, name):
    _run(store, tmp_path, name=name, epochs=1)
    return tmp_path / name


@pytest.mark.parametrize("damage, words", [
    ("no-summary", ["did not finish"]), ("mixed", ["come from different runs"]),
    ("bad-log", ["log.csv"]), ("bad-config", ["config.json is not valid JSON"]),
    ("missing", ["is not a run directory"]), ("empty-log", ["log.csv"])])
def test_report_refuses_a_corrupt_or_incomplete_run(tiny_store, tmp_path, damage, words):
    run, other = _finished(tiny_store, tmp_path, "a"), _finished(tiny_store, tmp_path, "b")
    if damage == "no-summary":
        (run / "summary.json").unlink()
    elif damage == "mixed":
        shutil.copy(other / "summary.json", run / "summary.json")
    elif damage == "bad-log":
        (run / "log.csv").write_text("garbage,\x00\n1")
    elif damage == "bad-config":
        (run / "config.json").write_text("{not json")
    elif damage == "missing":
        run = tmp_path / "nope"
    else:
        (run / "log.csv").write_text("")
    r = oocgnn("report", run, "--out", tmp_path / "fig" / "tta")
    assert_one_line_error(r, *words)


# ---- checkpoints: a killed run resumes to the same losses -------------------------------------
RESUMED = {"inmemory": {}, "hierbatching": {"parts_per_megabatch": 4, "static_ratio": 0.02, "passes": 1.5},
           "outre": {"parts_per_macro": 4, "memory_budget": "1MB", "history_ratio": 0.2, "staleness": 5,
                     "topology": "disk"},
           "marius": {"memory_budget": "2MB", "batch_size": 16}}


@pytest.mark.parametrize("policy", list(RESUMED))
def test_a_killed_run_resumes_to_the_same_losses(fennel16, tmp_path, kill_at, policy):
    """Killed after step 5 with a checkpoint every 3 steps, resumed from step 3: the same log (losses,
    accuracies, bytes read) as the run that was never interrupted."""
    kw = {"policy": policy, "checkpoint_every": 3, "dropout": 0.5, **RESUMED[policy]}
    whole = _run(fennel16, tmp_path, name="whole", **kw)
    kill_at(5)
    with pytest.raises(KeyboardInterrupt):
        _run(fennel16, tmp_path, name="killed", **kw)
    kill_at(None)
    assert not (tmp_path / "killed" / "summary.json").exists()
    resumed = train(TrainConfig.create(store=str(fennel16.path), resume=str(tmp_path / "killed"), progress=False))
    assert resumed["resumed_at"] == 3 and resumed["steps"] == whole["steps"]
    cols = ["epoch", "step", "train_loss", "val_acc", "test_acc", "bytes_read", "requests"]
    pd.testing.assert_frame_equal(resumed["log"][cols], whole["log"][cols])
    assert resumed["io"]["pages"] == whole["io"]["pages"] and resumed["history_hits"] == whole["history_hits"]


@pytest.mark.parametrize("placement", ["neighbours", "ordering"])
def test_a_buffer_run_resumed_where_a_state_begins_reads_what_the_whole_run_reads(fennel16, tmp_path, kill_at,
                                                                                  placement):
    """A partition buffer's state enters only the partitions the previous one lacked: a run resumed at a state's
    first step holds the previous state first (excluded), so it reads what the uninterrupted run read."""
    from oocgnn.policies import make_plan
    kw = {"policy": "marius", "dropout": 0.5, "placement": placement, **RESUMED["marius"]}
    cfg = TrainConfig.create(store=str(fennel16.path), epochs=2, progress=False, **kw)
    first = next(i for i, (_, _, step) in enumerate(make_plan(fennel16, cfg).steps(2)) if i >= 2 and step.enter_ranges)
    kw["checkpoint_every"] = first
    whole = _run(fennel16, tmp_path, name="whole", **kw)
    kill_at(first + 1)
    with pytest.raises(KeyboardInterrupt):
        _run(fennel16, tmp_path, name="killed", **kw)
    kill_at(None)
    resumed = train(TrainConfig.create(store=str(fennel16.path), resume=str(tmp_path / "killed"), progress=False))
    assert resumed["resumed_at"] == first
    for io in ("io", "topology_io"):
        for k in ("bytes_read", "requests", "pages"):
            assert resumed[io][k] == whole[io][k], (io, k)


def test_resume_needs_a_checkpoint_of_the_same_store(tiny_store, fennel16, tmp_path):
    _run(tiny_store, tmp_path, name="plain", epochs=1)
    with pytest.raises(UserError, match="no run to resume"):
        train(TrainConfig.create(store=str(tiny_store.path), resume=str(tmp_path / "plain")))
    _run(tiny_store, tmp_path, name="ck", epochs=2, checkpoint_every=1)
    (tmp_path / "ck" / "summary.json").unlink()                 # as if killed after its last checkpoint
    with pytest.raises(UserError, match="is a run on"):
        train(TrainConfig.create(store=str(fennel16.path), resume=str(tmp_path / "ck")))
    (tmp_path / "ck" / "checkpoint.pt").write_bytes(b"\x00" * 10)
    with pytest.raises(UserError, match="not a readable checkpoint"):
        train(TrainConfig.create(store=str(tiny_store.path), resume=str(tmp_path / "ck")))


@pytest.mark.parametrize("given, words", [({"epochs": 9}, "epochs 9 differs from its 2"),
                                          ({"epochs": 5}, "epochs 5 differs from its 2"),      # 5: the default
                                          ({"batch_size": 1024}, "batch_size 1024 differs from its 128"),
                                          ({"max_eval_nodes": 20_000}, "max_eval_nodes 20000 differs"),
                                          ({"passes": 3.0}, "passes 3.0 differs"),
                                          ({"out": "elsewhere"}, "names another directory")])
def test_resume_refuses_settings_that_differ_from_the_run(tiny_store, tmp_path, given, words):
    """--resume continues a run with its own settings: a different value given beside it is refused, not
    silently ignored, even when it is the setting's default (the same value, or the progress bar and
    threads, may be given)."""
    _run(tiny_store, tmp_path, name="r", checkpoint_every=2, max_steps=3)
    with pytest.raises(UserError, match="finished: there is nothing to resume"):
        train(TrainConfig.create(store=str(tiny_store.path), resume=str(tmp_path / "r"), progress=False))
    (tmp_path / "r" / "summary.json").unlink()                  # as if killed after its last checkpoint
    ok = train(TrainConfig.create(store=str(tiny_store.path), resume=str(tmp_path / "r"), progress=False,
                                  epochs=2, threads=1, max_eval_nodes=100))
    assert ok["resumed_at"] == 2
    (tmp_path / "r" / "summary.json").unlink()
    given = {k: str(tmp_path / v) if k == "out" else v for k, v in given.items()}
    with pytest.raises(UserError, match=words):
        train(TrainConfig.create(store=str(tiny_store.path), resume=str(tmp_path / "r"), progress=False, **given))


def test_resume_refuses_a_store_prepared_again_at_the_same_path(tmp_path):
    """A run killed, its store's path prepared again with another graph (`prepare --force`): resuming it
    there is refused (the store's meta checksum differs), not continued on the new data."""
    from oocgnn.cli import main
    store = tmp_path / "st"
    assert main(["prepare", "synthetic", "--preset", "tiny", "--out", str(store), "--quiet"]) == 0
    run = tmp_path / "r"
    _run(open_store(store), tmp_path, name="r", checkpoint_every=2, max_steps=3)
    (run / "summary.json").unlink()                              # as if killed after its last checkpoint
    assert main(["prepare", "synthetic", "--preset", "tiny", "--seed", "1", "--out", str(store), "--force",
                 "--quiet"]) == 0
    with pytest.raises(UserError, match="another store than the one now at"):
        train(TrainConfig.create(store=str(store), resume=str(run), progress=False))
    assert not (run / "summary.json").exists(), "nothing continued"


def test_resume_takes_the_store_from_the_run(tiny_store, tmp_path, capsys):
    """`train --resume RUN` needs no STORE: the run's config.json names it."""
    from oocgnn.cli import main
    _run(tiny_store, tmp_path, name="r", checkpoint_every=2, max_steps=3)
    (tmp_path / "r" / "summary.json").unlink()
    assert main(["train", "--resume", str(tmp_path / "r"), "--no-progress"]) == 0
    assert (tmp_path / "r" / "summary.json").exists()
    assert main(["train", "--resume", str(tmp_path / "nothing"), "--no-progress"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err


# ---- the budget of the baselines -------------------------------------------------------------
def test_inmemory_over_its_budget_says_so(tiny_store, tmp_path, capsys):
    s = _run(tiny_store, tmp_path, epochs=1, memory_budget="1MB")
    assert "more than the 976.6 KiB budget" in capsys.readouterr().err and s["resident_bytes"] > 1e6


def test_a_refusal_lists_what_it_adds_up(fennel16, tmp_path):
    from oocgnn.policies import make_plan
    from oocgnn.units import format_size
    cfg = TrainConfig.create(store=str(fennel16.path), policy="hierbatching", parts_per_megabatch=8,
                             memory_budget="100KB")
    with pytest.raises(UserError) as e:
        make_plan(fennel16, cfg)
    plan = type(make_plan(fennel16, cfg.replace(memory_budget="1GB")))(fennel16, cfg)
    parts = plan.memory()
    assert f"needs {format_size(sum(parts.values()))}" in str(e.value)
    assert all(f"{k} {format_size(v)}" in str(e.value) for k, v in parts.items())


# ---- the environment: EIO (in the background loader too), a full or read-only disk, a path in the way
def _cli(capsys, *args):
    from oocgnn.cli import main
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err.strip()


def _eio_in(monkeypatch, thread_prefix):
    """Make every direct read in threads named `thread_prefix*` fail as a dying disk does."""
    import threading
    from oocgnn.direct import DirectReader
    issue, hit = DirectReader._issue, []

    def failing(self, *a, **kw):
        if threading.current_thread().name.startswith(thread_prefix):
            hit.append(threading.current_thread().name)
            raise OSError(errno.EIO, "Input/output error", str(self.path))
        return issue(self, *a, **kw)
    monkeypatch.setattr(DirectReader, "_issue", failing)
    return hit


HB = ("--policy", "hierbatching", "--parts-per-megabatch", 4)
OUTRE = ("--policy", "outre", "--parts-per-macro", 4, "--memory-budget", "1MB", "--topology", "disk")


@pytest.mark.parametrize("args, where", [(("--policy", "inmemory"), "MainThread"),
                                         ((*HB, "--no-pipeline"), "MainThread"), (HB, "oocgnn-load"),
                                         (OUTRE, "MainThread")], ids=["inmemory", "hb", "hb-loader", "outre"])
def test_a_read_error_ends_the_run_in_one_line(fennel16, tmp_path, monkeypatch, capsys, args, where):
    """EIO where the policy reads (for hierbatching's pipeline, in its loader thread): exit 2, one line
    naming the file, and no run left looking finished."""
    import threading
    hit = _eio_in(monkeypatch, where)
    before = threading.active_count()
    code, err = _cli(capsys, "train", fennel16.path, *args, "--epochs", "1", "--no-progress",
                     "--out", tmp_path / "run")
    assert hit and code == 2, (hit, code, err)
    lines = [line for line in err.splitlines() if not line.startswith(("oocgnn: note:", "oocgnn: warning:"))]
    assert len(lines) == 1 and "Input/output error" in lines[0] and ".bin" in lines[0], err
    assert not (tmp_path / "run" / "summary.json").exists()
    assert threading.active_count() <= before + 1     # the loader's and readers' pools are shut down


@pytest.mark.parametrize("fault, code_name", [("ENOSPC", "No space left on device"),
                                              ("EROFS", "Read-only file system")])
def test_a_full_or_read_only_disk_ends_in_one_line(tiny_store, tmp_path, monkeypatch, capsys, fault, code_name):
    """Writing the run's files fails: one line, exit 2, and no half-written file in the run directory."""
    def failing(self, path, *a, **kw):
        raise OSError(getattr(errno, fault), code_name, str(path))
    monkeypatch.setattr(pd.DataFrame, "to_csv", failing)
    code, err = _cli(capsys, "train", tiny_store.path, "--epochs", "1", "--no-progress",
                     "--max-eval-nodes", "100", "--out", tmp_path / "run")
    assert code == 2 and err.count("\n") == 0 and code_name in err, (code, err)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.json"]


@pytest.mark.parametrize("error", [RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos "
                                                  "1216 vs 1100"), OSError(errno.ENOSPC, "No space left on device")])
def test_a_checkpoint_that_cannot_be_written_ends_in_one_line(tiny_store, tmp_path, monkeypatch, capsys, kill_at,
                                                               error):
    """torch.save on a full disk raises a RuntimeError, not an OSError: one line all the same, the
    checkpoint written before kept whole, no temporary file left."""
    import torch
    kill_at(3)                                    # killed at step 3, its checkpoint of step 2 on disk
    with pytest.raises(KeyboardInterrupt):
        _run(tiny_store, tmp_path, name="run", checkpoint_every=2)
    kill_at(None)
    kept = (tmp_path / "run" / "checkpoint.pt").read_bytes()
    def failing(obj, path, *a, **kw):
        with open(path, "wb") as f:                  # a partial write, then the failure
            f.write(b"partial")
        raise error
    monkeypatch.setattr(torch, "save", failing)
    code, err = _cli(capsys, "train", "--resume", tmp_path / "run", "--no-progress")   # its next checkpoint: step 4
    assert code == 2 and err.count("\n") == 0 and "Traceback" not in err, err
    assert ("is the disk full" in err) if isinstance(error, RuntimeError) else ("No space left" in err)
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")], "no temporary file left"
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == kept


def test_a_store_on_a_read_only_file_system_opens_and_trains(tiny_store, tmp_path, monkeypatch, capsys):
    """No stamp can be written there (nor its temporary file removed): the store opens, `info --verify`
    checks it, and it trains; nothing is written into it."""
    import pathlib
    store = tmp_path / "ro"
    shutil.copytree(tiny_store.path, store, ignore=shutil.ignore_patterns(".*"))
    before = sorted(p.name for p in store.iterdir())
    real_write, real_unlink = pathlib.Path.write_text, pathlib.Path.unlink

    def read_only(real):
        def refuse(self, *a, **kw):
            if store in self.parents:
                raise OSError(errno.EROFS, "Read-only file system", str(self))
            return real(self, *a, **kw)
        return refuse
    monkeypatch.setattr(pathlib.Path, "write_text", read_only(real_write))
    monkeypatch.setattr(pathlib.Path, "unlink", read_only(real_unlink))
    code, err = _cli(capsys, "info", store, "--verify")
    assert code == 0 and not err, err
    code, err = _cli(capsys, "train", store, "--epochs", "1", "--batch-size", "512", "--no-progress",
                     "--max-eval-nodes", "100", "--out", tmp_path / "run")
    assert code == 0, err
    assert sorted(p.name for p in store.iterdir()) == before


def test_a_read_only_parent_ends_in_one_line(tiny_store, tmp_path, monkeypatch, capsys):
    import pathlib
    def failing(self, *a, **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(self))
    monkeypatch.setattr(pathlib.Path, "mkdir", failing)
    code, err = _cli(capsys, "train", tiny_store.path, "--epochs", "1", "--no-progress", "--out", tmp_path / "ro")
    assert code == 2 and err == f"oocgnn: error: Read-only file system: {tmp_path / 'ro'}", err


@pytest.mark.parametrize("where", ["out-under-a-file", "store-is-a-file"])
def test_a_file_where_a_directory_is_expected(tiny_store, tmp_path, where):
    (tmp_path / "f").write_text("precious")
    if where == "out-under-a-file":
        r = oocgnn("train", tiny_store.path, "--epochs", "1", "--no-progress", "--out", tmp_path / "f" / "run")
    else:
        r = oocgnn("train", tmp_path / "f", "--epochs", "1", "--no-progress", "--out", tmp_path / "run")
    assert_one_line_error(r, str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "precious"


@pytest.mark.parametrize("read", ["spans", "ranges"])
def test_a_list_damaged_after_open_is_refused_when_read(fennel16, tmp_path, read):
    """indices.bin damaged once the store is open (no checksum sees it then): the disk topology refuses
    an out-of-range id as it reads it, instead of sampling out of bounds."""
    from oocgnn.errors import StoreError
    from oocgnn.topology import NeighbourLists
    shutil.copytree(fennel16.path, tmp_path / "s")
    store = open_store(tmp_path / "s")
    lists = NeighbourLists(store)
    v = int(np.argmax(store.degrees()))
    with open(tmp_path / "s" / "indices.bin", "r+b") as f:
        f.seek(int(store.indptr[v]) * lists.dtype.itemsize)
        f.write(np.array([store.num_nodes + 7], dtype=lists.dtype).tobytes())
    with pytest.raises(StoreError, match="outside 0..4999"):
        lists._read(np.array([v])) if read == "spans" else lists.read_ranges([(v, v + 1)], 0)
    lists.close()
