"""Every benchmark keeps running: each module imports, answers --help, and runs end to end at toy
sizes (the numbers of such runs mean nothing; that they finish is the point), saving its table as
CSV; a configuration that does not fit is a row saying why, and the others still run and print."""
import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


def _module(path):
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_imports_and_has_help(path, capsys):
    mod = _module(path)
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "usage:" in out
    entry = " ".join(out.rsplit("--csv PATH", 1)[-1].split())[:200]            # its line under options:
    assert "--csv PATH" in out and re.search(r"\(default [^)]*csv", entry), "--csv states its default"


def _rows(csv_path):
    with open(csv_path, newline="") as f:
        return {r["config"]: r for r in csv.DictReader(f)}


def _run(path, *args, timeout=900):
    r = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return r.stdout


SMOKE = {   # toy settings of each benchmark; tmp is a fresh directory
    "cache_split": lambda tmp: ["--preset", "tiny", "--parts", 16, "--budgets", "1MB", "--epochs", 1,
                                "--batch-size", 64, "--parts-per-macro", 4, "--data", tmp],
    "cache": lambda tmp: ["--nodes", 20_000, "--iterations", 40, "--size", 800, "--sizes", "2,4",
                          "--prefix", 10, "--horizon", 10, "--reps", 1, "--cache-dir", tmp],
    "io": lambda tmp: ["--size", "32MiB", "--dir", tmp, "--rows", 2048, "--ios", 2048, "--range-mib", 4,
                       "--reps", 3],
    "mixing": lambda tmp: ["--preset", "tiny", "--splits", "given,random", "--configs", "16:2,16:0", "--policies", "outre,marius",
                           "--policy-parts", 16, "--seeds", 0, "--random-seeds", 1, "--threads", 1,
                           "--hb-variants", "static_ratio=0.05;passes=1,pipeline=false",
                           "--epochs", 1, "--batch-size", 256, "--eval-nodes", 100, "--data", tmp],
    "models": lambda tmp: ["--preset", "tiny", "--batches", 2, "--batch-size", 128, "--data", tmp],
    "sparse_input": lambda tmp: ["--preset", "tiny", "--batches", 2, "--batch-size", 128, "--width", 500,
                                 "--hidden", 32, "--data", tmp],
    "sampler": lambda tmp: ["--preset", "tiny", "--batches", 3, "--batch-size", 256, "--data", tmp],
    "dense": lambda tmp: ["--preset", "tiny", "--batches", 3, "--batch-size", 128, "--data", tmp],
    "external_sort": lambda tmp: ["--preset", "tiny", "--memory", "1MiB", "--data", tmp],
    "prepare": lambda tmp: ["--preset", "tiny", "--memories", "0,1MiB", "--parts", 16, "--data", tmp],
    "partition": lambda tmp: ["--preset", "tiny", "--parts", 16, "--fennel-passes", 1, "--no-small",
                              "--data", tmp],
    "costmodel": lambda tmp: ["--preset", "tiny", "--parts", 16, "--budget", "10MB", "--steps", 4,
                              "--policies", "inmemory,mmap,hierbatching,outre,ginex,macrobatch,marius",
                              "--physical-parts", 8, "--superbatch", 2, "--macrobatch", 2, "--eval-nodes", 100,
                              "--cache-dir", tmp, "--data", tmp, "--out", tmp / "cm"],
    "distributed": lambda tmp: ["--preset", "tiny", "--parts", 16, "--epochs", 1, "--batch-size", 256,
                                "--fanouts", "5,5", "--eval-nodes", 200, "--project-ranks", "2,4", "--ks", "1,4",
                                "--data", tmp],
    "comet_gap": lambda tmp: ["--preset", "tiny", "--parts", 8, "--buffer", 4, "--seeds", 0, "--epochs", 1,
                              "--data", tmp, "--out", tmp / "runs"],
    "eval": lambda tmp: ["--preset", "tiny", "--eval-nodes", 300, "--reps", 1, "--budget", "64KB", "--data", tmp],
    "train": lambda tmp: ["--preset", "tiny", "--parts", 16, "--budget", "10MB", "--steps", 4,
                          "--policies", "inmemory,macrobatch,marius,marius-beta",     # the other four: below
                          "--physical-parts", 8, "--macrobatch", 2, "--eval-nodes", 100, "--reps", 2, "--data", tmp],
}


def test_every_benchmark_has_a_smoke_run():
    assert {p.stem for p in BENCHMARKS} == set(SMOKE)


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.stem)
def test_benchmark_runs_at_toy_size(path, tmp_path):
    out = _run(path, *SMOKE[path.stem](tmp_path), "--csv", tmp_path / "table.csv")
    assert "load" in out, "every benchmark reports the machine load beside its numbers"
    rows = _rows(tmp_path / "table.csv")
    assert rows, "the table is saved as CSV"
    assert all(r["status"] == "ok" or r["status"].startswith("does not fit: ") for r in rows.values()), \
        [r["status"] for r in rows.values()]        # at toy sizes only a refusal of the budget, never a crash
    assert not list(tmp_path.glob(".table.csv.tmp-*")), "the atomic rewrite leaves no temporary file"


def test_prepare_benchmark_checks_the_bounded_store_against_the_in_memory_one(tmp_path):
    path = next(p for p in BENCHMARKS if p.stem == "prepare")
    out = _run(path, "--preset", "tiny", "--memories", "1MiB", "--partitioner", "none", "--data", tmp_path)
    rows = _rows(tmp_path / "bench" / "prepare.csv")
    assert list(rows) == ["0", "1MiB"]                    # the baseline runs first, even when not listed
    assert rows["1MiB"]["same_store"] == "True" and rows["1MiB"]["within_goal"] == "True"
    assert "throughput" in out and "Traceback" not in out


def test_external_sort_benchmark_checks_duckdb_against_our_sort(tmp_path):
    """Both methods give the same CSR (digests of indptr and the neighbour file); the raw edges are removed."""
    path = next(p for p in BENCHMARKS if p.stem == "external_sort")
    out = _run(path, "--preset", "tiny", "--memory", "64KiB", "--data", tmp_path)
    rows = _rows(tmp_path / "bench" / "external_sort.csv")
    assert list(rows) == ["numpy", "duckdb"] and all(r["same_csr"] == "True" for r in rows.values())
    assert "duckdb: throughput" in out and not (tmp_path / "bench" / "edges-tiny.npy").exists()


def test_prepare_benchmark_converts_a_papers100m_fixture(tmp_path):
    """--ogb-scale: OGB's binary layout at a small fraction of ogbn-papers100M, the bounded path's store equal
    to the in-memory one, the prediction for the full dataset printed, the fixture removed."""
    path = next(p for p in BENCHMARKS if p.stem == "prepare")
    out = _run(path, "--ogb-scale", "0.0001", "--memories", "4MiB", "--parts", 16, "--data", tmp_path)
    rows = _rows(tmp_path / "bench" / "prepare.csv")
    assert rows["4MiB"]["same_store"] == "True" and float(rows["4MiB"]["peak_disk"]) > 0
    assert "ogbn-papers100M (111M nodes" in out and re.search(r"\n  --prepare-memory 4MiB +\d+ min, peak RSS", out)
    assert not (tmp_path / "bench" / "ogb-fixture-0.0001").exists()


def test_train_goes_on_after_a_configuration_that_does_not_fit(tmp_path):
    """marius needs 1.5 MiB for its smallest buffer on the tiny store, over the 1MB budget: its worker
    refuses, the row says so, and inmemory and hierbatching still run, print and are saved."""
    path = next(p for p in BENCHMARKS if p.stem == "train")
    out = _run(path, "--preset", "tiny", "--parts", 16, "--budget", "1MB", "--steps", 4,
               "--policies", "inmemory,marius,hierbatching", "--physical-parts", 8, "--eval-nodes", 100,
               "--data", tmp_path, "--csv", tmp_path / "train.csv")
    rows = _rows(tmp_path / "train.csv")
    assert list(rows) == ["inmemory", "marius", "hierbatching"]
    assert rows["inmemory"]["status"] == rows["hierbatching"]["status"] == "ok"
    assert float(rows["hierbatching"]["epoch_s"]) > 0
    assert rows["marius"]["status"].startswith("does not fit: policy marius needs"), rows["marius"]["status"]
    assert "--memory-budget" in rows["marius"]["status"]
    table = out[out.index("\nconfig "):]
    assert "\ninmemory " in table and "\nhierbatching " in table and re.search(r"\nmarius +does not fit", table)
    assert "hierbatching / inmemory" in out                                  # the ratios that can be are
    assert "marius / inmemory" in out and "n/a (marius: does not fit" in out
    assert "Traceback" not in out


def test_in_process_benchmark_goes_on_after_a_budget_that_does_not_fit(tmp_path):
    """cache_split at 1MB runs; at 1KB outre's plan refuses the budget: a row saying so, the 1MB
    table still printed, and the CSV (default: bench/cache_split.csv under --data) holds both."""
    path = next(p for p in BENCHMARKS if p.stem == "cache_split")
    out = _run(path, "--preset", "tiny", "--parts", 16, "--budgets", "1KB,1MB", "--epochs", 1,
               "--batch-size", 64, "--parts-per-macro", 4, "--data", tmp_path)
    rows = _rows(tmp_path / "bench" / "cache_split.csv")
    assert list(rows) == ["1KB", "1MB"]
    assert rows["1KB"]["status"].startswith("does not fit: policy outre needs"), rows["1KB"]["status"]
    assert rows["1MB"]["status"] == "ok" and 0 <= float(rows["1MB"]["auto_alpha"]) <= 1
    assert "budget 1MB: split budget" in out and "brute-force best alpha" in out
    assert "budget 1KB: does not fit: policy outre needs" in out


def test_mixing_reuses_a_finished_run_only_with_the_same_settings(tmp_path):
    """A table re-run (after a stop, or with rows added) takes each seed's finished run from its run
    directory instead of training it again; a changed setting, or a store written since, trains again."""
    path = next(p for p in BENCHMARKS if p.stem == "mixing")
    args = ["--preset", "tiny", "--splits", "given", "--configs", "16:0", "--seeds", 0, "--epochs", 1,
            "--batch-size", 256, "--eval-nodes", 100, "--data", tmp_path]
    _run(path, *args)
    summaries = sorted((tmp_path / "runs").glob("*/summary.json"))
    assert len(summaries) == 2                                    # inmemory and hierbatching, seed 0
    before = {p: p.stat().st_mtime_ns for p in summaries}
    first = _run(path, *args)
    assert {p: p.stat().st_mtime_ns for p in summaries} == before
    _run(path, *args[:-2], "--lr", 0.02, "--data", tmp_path)
    assert all(p.stat().st_mtime_ns != t for p, t in before.items())
    (tmp_path / "synthetic-given-k16" / "meta.json").touch()
    before = {p: p.stat().st_mtime_ns for p in summaries}
    _run(path, *args[:-2], "--lr", 0.02, "--data", tmp_path)
    assert all(p.stat().st_mtime_ns != t for p, t in before.items())
    assert "inmemory" in first


def test_train_checks_executed_reads_against_the_simulation(tmp_path):
    """--check-simulated: each run's reads equal its plan's simulation for the steps it ran ('='), mmap's
    at most ('<=', or '=' when its page cache saved nothing); on the int8 store of the same graph too."""
    path = next(p for p in BENCHMARKS if p.stem == "train")
    out = _run(path, "--preset", "tiny", "--parts", 16, "--budget", "10MB", "--steps", 5, "--limit", "all",
               "--policies", "mmap,hierbatching,ginex,outre", "--superbatch", 2, "--eval-nodes", 100,
               "--check-simulated", "--data", tmp_path, "--csv", tmp_path / "train.csv", "--feature-dtypes", "float32,int8")
    rows = _rows(tmp_path / "train.csv")
    exact = ("hierbatching", "ginex", "outre", "hierbatching@int8", "ginex@int8", "outre@int8")
    assert [rows[p]["sim_exec"] for p in exact] == ["="] * 6, out[-3000:]
    assert rows["mmap"]["sim_exec"] in ("=", "<=") and rows["mmap@int8"]["sim_exec"] in ("=", "<=")
    assert "ginex@int8 / ginex" in out and "tiny-fennel-16-int8: int8 rows of 128 B at stride 128" in out
    assert "executed" not in out.split("sim: the run's reads")[1].split("\n\n")[0]    # no counter differs


GPU_CHECK = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_gpu_check_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run(["bash", str(GPU_CHECK), str(tmp_path / "out")], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "sees no CUDA device" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_gpu_check_runs_its_steps_on_the_cpu(tmp_path):
    """DEVICE=cpu walks the same steps (the CUDA tests skip): one folder with the log, the machine,
    the tests' report, the table and the results."""
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", "PRESET": "tiny", "PARTS": "16",
           "BUDGET": "1MB", "POLICIES": "inmemory,hierbatching-p1", "DATA": str(tmp_path / "data")}
    r = subprocess.run(["bash", str(GPU_CHECK), str(tmp_path / "out")], capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["env.txt", "gpu-check.log", "pytest.xml", "train-results.json",
                                                      "train.csv"]
    assert set(_rows(out / "train.csv")) == {"inmemory", "hierbatching-p1"}
    log = (out / "gpu-check.log").read_text()
    assert "bound by" in log and "tests exit 0, benchmark exit 0" in log


def test_comet_gap_feeds_marius_batches_and_changes_one_factor_a_row(link16):
    """comet_gap's rows are decompositions of marius: with both restrictions on, its batches are
    `EdgeBufferSchedule`'s exactly (`full` with MariusGNN's short batches, `even` with marius's default); `even`
    cuts a state's edges into as many batches of equal sizes; `sizes` keeps MariusGNN's batch sizes but draws each
    epoch's edges over the whole graph, every edge once."""
    from oocgnn.edgeschedules import EdgeBufferSchedule
    mod = _module(Path(__file__).resolve().parents[1] / "benchmarks" / "comet_gap.py")
    kw = dict(physical_parts=16, buffer_parts=4, ordering="comet", seed=3, num_negatives=8, chunks=2)

    def steps(cut="full", **switches):
        s = mod.MariusBatches(link16, 40, cut=cut, **{"neg": "buffer", "restrict": True, **switches}, **kw)
        return list(s.epoch(1))

    for cut in ("full", "even"):
        marius, ours = list(EdgeBufferSchedule(link16, 40, state_batches=cut, **kw).epoch(1)), steps(cut)
        assert len(marius) == len(ours) > 16
        for a, b in zip(marius, ours):
            assert a.group == b.group
            assert np.array_equal(a.link.edges, b.link.edges) and np.array_equal(a.link.negatives, b.link.negatives)
            assert np.array_equal(a.group_visible.get(), b.group_visible.get())
    full = steps()

    def by_group(ss):
        groups = {}
        for s in ss:
            groups.setdefault(s.group, []).append(s.link.edges)
        return groups

    even, full_groups = by_group(steps("even")), by_group(full)
    assert even.keys() == full_groups.keys()
    sizes = [[len(e) for e in es] for es in full_groups.values()]
    assert any(len(set(s)) > 1 for s in sizes), "some state ends in a short batch"
    for g, es in even.items():
        assert len(es) == len(full_groups[g]) and max(map(len, es)) - min(map(len, es)) <= 1
        assert sorted(map(tuple, np.concatenate(es))) == sorted(map(tuple, np.concatenate(full_groups[g])))

    drawn = steps("sizes", neg="all", restrict=False)
    assert [len(s.link.edges) for s in drawn] == [len(s.link.edges) for s in full]
    every = np.concatenate([s.link.edges for s in drawn])
    edges = EdgeBufferSchedule(link16, 40, **kw).edge_batches.edges
    assert sorted(map(tuple, every)) == sorted(map(tuple, edges))
    assert any(not np.array_equal(a.link.edges, b.link.edges) for a, b in zip(drawn, full))
