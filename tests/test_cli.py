"""The `oocgnn` command: the contract later issues rely on, and one-line errors with exit 2."""
import subprocess
import sys

import pytest

from oocgnn.cli import main


def oocgnn(*args):
    return subprocess.run([sys.executable, "-m", "oocgnn", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_prepare_info_train_report(tmp_path):
    store, run = tmp_path / "tiny", tmp_path / "run"
    r = oocgnn("prepare", "synthetic", "--preset", "tiny", "--out", store, "--quiet")
    assert r.returncode == 0, r.stderr
    r = oocgnn("prepare", "synthetic", "--preset", "tiny", "--out", store)
    assert r.returncode == 2 and "already exists" in r.stderr
    for flag, bar in (("--no-progress", False), ("--force", True)):   # train's word for --quiet too
        r = oocgnn("prepare", "synthetic", "--preset", "tiny", "--out", tmp_path / "again", "--force", flag)
        assert r.returncode == 0 and ("row/s" in r.stderr) == bar, r.stderr
    r = oocgnn("info", store)
    assert r.returncode == 0 and "nodes" in r.stdout and "5,000" in r.stdout
    r = oocgnn("train", store, "--policy", "inmemory", "--model", "sage", "--epochs", "1",
               "--fanouts", "5,5", "--batch-size", "512", "--out", run, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert {"config.json", "log.csv", "summary.json"} <= {p.name for p in run.iterdir()}
    out = tmp_path / "fig" / "tta"
    r = oocgnn("report", run, "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.with_suffix(".csv").is_file() and out.with_suffix(".png").stat().st_size > 1000
    import pandas as pd
    csv = pd.read_csv(out.with_suffix(".csv"))           # inmemory: one group, the training set itself
    assert (csv["mixing_tv_mean"] == 0).all() and "label TV 0.000" in r.stdout
    log = (run / "log.csv").read_bytes()
    for inside in (run / "log", run / "sub" / "x"):       # never into a run it reads (its log.csv was overwritten)
        r = oocgnn("report", run, "--out", inside)
        assert r.returncode == 2 and "inside the run directory" in r.stderr and "Traceback" not in r.stderr
    assert (run / "log.csv").read_bytes() == log and not (run / "sub").exists()


def test_a_partitioned_store_prepared_here_is_the_one_the_notebooks_reuse(tmp_path):
    """`partitioned_store` (the notebooks' call) opens the store `prepare` wrote for the same graph and
    partition instead of writing it again (make run prepares it once)."""
    from oocgnn.partition import partitioned_store
    from oocgnn.synthetic import generate
    store = tmp_path / "tiny-fennel-8"
    r = oocgnn("prepare", "synthetic", "--preset", "tiny", "--partitioner", "fennel", "--parts", 8, "--out", store,
               "--quiet")
    assert r.returncode == 0, r.stderr
    written = (store / "meta.json").stat().st_mtime_ns
    assert partitioned_store(generate("tiny"), store, "fennel", 8).path == store
    assert (store / "meta.json").stat().st_mtime_ns == written
    partitioned_store(generate("tiny"), store, "fennel", 4)          # another partition: written anew
    assert (store / "meta.json").stat().st_mtime_ns != written


def test_prepare_under_a_memory_bound_writes_the_same_store(tmp_path):
    """`--prepare-memory 1MiB` (edges through sorted runs on disk) against 0 (one in-memory sort), with a
    FENNEL partition over the result: every file byte for byte, meta.json but for its creation time; the
    runs' directory is gone afterwards."""
    import json
    stores = {}
    for mem in ("0", "1MiB"):
        stores[mem] = tmp_path / f"s-{mem}"
        r = oocgnn("prepare", "synthetic", "--preset", "tiny", "--partitioner", "fennel", "--parts", 8,
                   "--prepare-memory", mem, "--out", stores[mem], "--quiet")
        assert r.returncode == 0, r.stderr
    a, b = stores["0"], stores["1MiB"]
    for f in sorted(p.name for p in a.iterdir()):
        if f == "meta.json":
            ma, mb = (json.loads((d / f).read_text()) for d in (a, b))
            assert {k: v for k, v in ma.items() if k not in ("created", "checksum")} == \
                   {k: v for k, v in mb.items() if k not in ("created", "checksum")}
        elif not f.startswith("."):
            assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert not [p for p in tmp_path.iterdir() if ".prepare-" in p.name]


@pytest.mark.parametrize("args, msg", [
    (["prepare", "synthetic", "--preset", "tiny", "--out", "OUT", "--prepare-memory", "10KB"], "at least 1MiB"),
    (["prepare", "synthetic", "--preset", "tiny", "--out", "OUT", "--prepare-memory", "lots"], "bad size"),
    (["prepare", "synthetic", "--preset", "tiny", "--out", "OUT", "--prepare-memory", "1MiB", "--partitioner", "metis",
      "--parts", "8"], "use --partitioner fennel"),
    (["info", "/nonexistent/store"], "no store at /nonexistent/store"),
    (["train", "/nonexistent/store"], "no store at"),
    (["train", "S", "--memory-budget", "12 parsecs"], "bad size"),
    (["train", "S", "--policy", "teleport"], "unknown policy 'teleport'"),
    (["train", "S", "--fanouts", "10,10", "--layers", "3"], "does not match"),
    (["prepare", "/nonexistent/graph.npz", "--out", "OUT"], "does not exist"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2(args, msg, capsys, tmp_path):
    args = [str(tmp_path / "s") if a == "S" else str(tmp_path / "o") if a == "OUT" else a for a in args]
    with pytest.raises(SystemExit) as e:
        sys.exit(main(args))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err


def test_every_command_has_help():
    for cmd in ([], ["prepare"], ["info"], ["train"], ["report"], ["compare"], ["tune"]):
        r = oocgnn(*cmd, "--help")
        assert r.returncode == 0 and "usage: oocgnn" in r.stdout


def test_train_has_a_flag_for_every_setting():
    """Every setting, each policy's options included, has a flag of its own name with its help and
    default (notebooks and CLI share names), and the flags build the config they say."""
    import argparse
    from dataclasses import fields
    from oocgnn.cli import build_parser
    from oocgnn.config import SETTINGS, TrainConfig
    from oocgnn.policies import POLICIES
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices["train"]._actions}
    every = {f.name for f in fields(TrainConfig) if f.init and f.name not in POLICIES}
    every |= {f.name for p in POLICIES.values() if p.Options for f in fields(p.Options)}
    assert set(SETTINGS) == every <= set(actions)
    for name, (_, f) in SETTINGS.items():
        if name != "store" and f.type != "bool":
            assert actions[name].help.startswith(f.metadata["help"]) and "default" in actions[name].help
    args = build_parser().parse_args(["train", "S", "--passes", "1.5", "--no-pipeline", "--staleness", "3"])
    cfg = TrainConfig.create(**{k: v for k, v in vars(args).items() if k in SETTINGS and v is not None})
    assert (cfg.hierbatching.passes, cfg.hierbatching.pipeline, cfg.outre.staleness) == (1.5, False, 3)


@pytest.mark.parametrize("spec, fracs", [("random:0.1,0.1,0.8", (0.1, 0.1, 0.8)), ("random:0.3,0.2,0.25", (0.3, 0.2, 0.25))])
def test_prepare_split_random_equals_resplit(tmp_path, spec, fracs):
    """`prepare SRC.npz --split random:...` holds the splits `GraphData.resplit` makes with that seed
    (store ids mapped back to the source's through orig_ids); `--split given` keeps the source's."""
    import numpy as np
    from oocgnn.datasets import load_npz
    from oocgnn.store import open_store
    from tests.conftest import shared_dataset
    src = shared_dataset("cora")
    data = load_npz(src)
    want = load_npz(src).resplit(fracs[0], fracs[1], seed=3, test_frac=fracs[2])
    assert main(["prepare", str(src), "--out", str(tmp_path / "s"), "--quiet", "--split", spec, "--seed", "3",
                 "--partitioner", "random", "--parts", "4"]) == 0
    store = open_store(tmp_path / "s")
    for split in ("train", "val", "test"):
        got = np.sort(store.orig_ids[getattr(store, f"{split}_idx")])
        assert np.array_equal(got, getattr(want, f"{split}_idx")), split
    assert main(["prepare", str(src), "--out", str(tmp_path / "g"), "--quiet", "--split", "given"]) == 0
    given = open_store(tmp_path / "g")
    assert np.array_equal(np.sort(given.orig_ids[given.val_idx]), np.sort(data.val_idx))


@pytest.mark.parametrize("spec, msg", [("random:0.5,0.4,0.2", "sum to 1.1"), ("random:0.1,-0.1,0.8", "> 0"),
                                       ("random:0.1,0.1", "random:TRAIN,VAL,TEST"), ("random:a,b,c", "e.g."),
                                       ("half", "'given' or"), ("random:0.1,0.1,nan", "e.g.")])
def test_prepare_split_rejects_bad_specs(tmp_path, capsys, spec, msg):
    assert main(["prepare", "synthetic", "--preset", "tiny", "--out", str(tmp_path / "s"), "--split", spec]) == 2
    err = capsys.readouterr().err
    assert "bad --split" in err and msg in err and not (tmp_path / "s").exists()


def test_output_into_a_closed_pipe_is_not_an_error():
    """`oocgnn info --json | head`: the reader stops reading; no 'Broken pipe' error, the exit status of a
    command ended by SIGPIPE."""
    import sys
    p = subprocess.Popen([sys.executable, "-m", "oocgnn", "info", "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert p.returncode in (0, 141) and err == "", err
