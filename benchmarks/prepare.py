"""`oocgnn prepare` with its edges sorted in memory against sorted in bounded memory, measured in one run.

For each --prepare-memory value (0 is the in-memory sort, the baseline), runs `oocgnn prepare synthetic
--preset P [--partitioner fennel --parts K]` in a fresh process under /usr/bin/time, and reports its wall
seconds, edges per second (directed CSR entries written), peak RSS (the larger of the process's own
report and time's), the peak against the budget + 1 GiB (issue 34's goal), and the throughput and peak
ratios against the baseline; the stores must be byte-identical to the baseline's (every data file's
SHA-256 is compared, so a store is deleted as soon as it is hashed: on `xlarge`, 31 GB a store, two do not
fit the disk beside the training store). The page cache is not dropped between runs: every run writes the
same files.

    .venv/bin/python benchmarks/prepare.py [--preset large] [--memories 0,1GB] [--partitioner fennel]
        [--parts 4096] [--data data/] [--keep]
"""
import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, ProcessFailed, add_csv_argument  # noqa: E402

GIB = 1 << 30


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def run_prepare(args, memory, out):
    """Prepare `out` at --prepare-memory `memory`; (wall s, peak RSS bytes, edges) or ProcessFailed."""
    cmd = [sys.executable, "-m", "oocgnn", "prepare", "synthetic", "--preset", args.preset, "--out", str(out),
           "--prepare-memory", memory, "--quiet", "--force"]
    if args.partitioner != "none":
        cmd += ["--partitioner", args.partitioner, "--parts", str(args.parts)]
    timed = os.path.exists("/usr/bin/time")
    env = {**os.environ, "OOCGNN_PARTITION_CACHE": str(out.parent / f"partitions-{out.name}")}  # no reuse
    t = time.perf_counter()
    r = subprocess.run((["/usr/bin/time", "-v"] if timed else []) + cmd, capture_output=True, text=True, cwd=REPO,
                       env=env)
    wall = time.perf_counter() - t
    if r.returncode:
        raise ProcessFailed(r.returncode, r.stderr)
    text = r.stdout + r.stderr
    m = re.search(r"wrote Store\(.*E=([\d,]+).*\) in ([\d.]+) s \(source ([\d.]+) s, peak RSS ([\d.]+) GiB\)", text)
    if not m:
        raise RuntimeError(f"no 'wrote Store' line in prepare's output: {text[-500:]}")
    rss = float(m.group(4)) * GIB
    t_rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if t_rss:
        rss = max(rss, int(t_rss.group(1)) * 1024)
    return wall, rss, int(m.group(1).replace(",", ""))


def store_digest(path: Path) -> dict:
    """SHA-256 of every data file of the store at `path`."""
    from oocgnn.store import DATA_FILES
    digests = {}
    for f in DATA_FILES:
        with open(path / f, "rb") as fh:
            digests[f] = hashlib.file_digest(fh, "sha256").hexdigest()
    return digests


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--preset", default="large", help="synthetic preset (default large)")
    ap.add_argument("--memories", default="0,1GB",
                    help="--prepare-memory values, comma-separated; 0 (the in-memory sort) is the baseline "
                         "and runs first (default 0,1GB)")
    ap.add_argument("--partitioner", default="fennel", help="none | fennel | metis | random (default fennel)")
    ap.add_argument("--parts", type=int, default=4096, help="parts of the partitioner (default 4096)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    ap.add_argument("--keep", action="store_true", help="keep the stores in <data>/bench/prepare/ (default: delete)")
    add_csv_argument(ap, "bench/prepare.csv under --data")
    args = ap.parse_args(argv)
    from oocgnn.cli import prepare_memory
    memories = [m.strip() for m in args.memories.split(",") if m.strip()]
    if not memories:
        ap.error("--memories: give at least one value")
    memories = ["0"] + [m for m in memories if m != "0"]
    work = Path(args.data) / "bench" / "prepare"
    work.mkdir(parents=True, exist_ok=True)
    table = BenchTable(args.csv or Path(args.data) / "bench" / "prepare.csv",
                       ["memory", "budget", "seconds", "edges_per_s", "peak_rss", "within_goal", "same_store", "load"])
    print(f"prepare synthetic --preset {args.preset} --partitioner {args.partitioner}"
          + (f" --parts {args.parts}" if args.partitioner != "none" else "") + f"; load {loadavg()}", flush=True)
    digests = {}                                  # memory -> the store's file digests
    for memory in memories:
        out = work / f"{args.preset}-{memory}"

        def one():
            budget = prepare_memory(memory)
            load = loadavg()
            try:
                wall, rss, edges = run_prepare(args, memory, out)
                digests[memory] = store_digest(out)
            finally:
                if not args.keep:
                    shutil.rmtree(out, ignore_errors=True)
            row = {"memory": memory, "budget": budget or 0, "seconds": wall, "edges_per_s": edges / wall,
                   "peak_rss": rss, "within_goal": None if budget is None else rss <= budget + GIB,
                   "same_store": True if memory == "0" else
                   (digests[memory] == digests["0"] if "0" in digests else None), "load": load}
            print(f"  --prepare-memory {memory:<6} {wall:7.1f} s, {edges / wall / 1e6:6.2f} M edges/s, peak RSS "
                  f"{rss / GIB:5.2f} GiB" + ("" if budget is None else
                                            f" (budget {budget / GIB:.2f} GiB + 1 GiB: "
                                            f"{'ok' if rss <= budget + GIB else 'OVER'})")
                  + ("" if memory == "0" else f", same store as the in-memory sort: {row['same_store']}"),
                  flush=True)
            return row
        table.run(memory, one)
    print("\nratios against the in-memory sort (same run):")
    for memory in memories[1:]:
        x, text = table.ratio(memory, "0", "edges_per_s")
        y, text_rss = table.ratio(memory, "0", "peak_rss")
        print(f"  --prepare-memory {memory}: throughput {text} (goal >= 0.5x), peak RSS {text_rss}")
    print(f"load at end {loadavg()}; table {table.path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
