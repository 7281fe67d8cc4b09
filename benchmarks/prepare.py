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
        [--parts 4096] [--ogb-scale S] [--data data/] [--keep]

With --ogb-scale S the source is a generated fixture in ogbn-papers100M's raw layout (OGB's binary one:
raw/data.npz, raw/node-label.npz, split/time) at S of its size, and the bounded rows are extrapolated to
the full dataset: the README's guidance for preparing it.
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


# ogbn-papers100M (OGB's binary raw layout): nodes, undirected raw edges, feature width, classes, labelled nodes
PAPERS100M = {"nodes": 111_059_956, "edges": 1_615_685_872, "dim": 128, "classes": 172, "labelled": 1_546_782}


def write_npz_member(zf, key, shape, dtype, chunks):
    """One .npy member of a zip (.npz), written from `chunks` without holding the array (zip64)."""
    import numpy as np
    with zf.open(key + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": tuple(shape)})
        for c in chunks:
            f.write(np.ascontiguousarray(c, dtype=dtype).tobytes())


def ogb_fixture(root: Path, scale: float, seed=0) -> Path:
    """<root>/ogbn_papers100M: ogbn-papers100M's raw layout and formats at `scale` of its size (raw/data.npz,
    stored uncompressed as OGB ships it: edge_index [2, E] int64, node_feat [N, 128] float32, node_year,
    num_nodes_list, num_edges_list; raw/node-label.npz: node_label [N, 1] float32, NaN where unlabelled
    (98.6 %); split/time/{train,valid,test}.csv.gz). Edges are the synthetic generator's draws at the same
    mean degree; made once, written in chunks."""
    import gzip
    import zipfile
    import numpy as np
    from itertools import chain
    from oocgnn.synthetic import SyntheticConfig, edge_draws, edge_stream
    d = root / "ogbn_papers100M"
    if (d / "split" / "time" / "test.csv.gz").is_file():
        return d
    n = max(1000, int(PAPERS100M["nodes"] * scale))
    dup = 0.14
    cfg = SyntheticConfig(num_nodes=n, avg_degree=2 * PAPERS100M["edges"] / PAPERS100M["nodes"] / (1 + dup),
                          duplicate_allowance=dup, num_communities=max(16, n // 2000), num_classes=16, seed=seed)
    m = edge_draws(cfg)
    (d / "raw").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = 1 << 18
    with zipfile.ZipFile(d / "raw" / "data.npz", "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        write_npz_member(zf, "edge_index", (2, m), np.int64,     # every source, then every destination
                         chain((e[0] for e in edge_stream(cfg)), (e[1] for e in edge_stream(cfg))))
        write_npz_member(zf, "node_feat", (n, PAPERS100M["dim"]), np.float32,
                         (rng.standard_normal((min(rows, n - lo), PAPERS100M["dim"]), dtype=np.float32)
                          for lo in range(0, n, rows)))
        write_npz_member(zf, "node_year", (n, 1), np.int64, [rng.integers(1950, 2021, (n, 1))])
        write_npz_member(zf, "num_nodes_list", (1,), np.int64, [[n]])
        write_npz_member(zf, "num_edges_list", (1,), np.int64, [[m]])
    labelled = rng.choice(n, max(30, int(n * PAPERS100M["labelled"] / PAPERS100M["nodes"])), replace=False)
    label = np.full((n, 1), np.nan, np.float32)
    label[labelled, 0] = rng.integers(0, PAPERS100M["classes"], len(labelled))
    np.savez_compressed(d / "raw" / "node-label.npz", node_label=label)
    cut = np.cumsum([int(len(labelled) * 0.78), int(len(labelled) * 0.08)])     # papers100M's 78/8/14 %
    split = d / "split" / "time"
    split.mkdir(parents=True, exist_ok=True)
    for name, ids in zip(("train", "valid", "test"), np.split(np.sort(labelled), cut)):
        with gzip.open(split / f"{name}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in ids))
    return d


def tree_bytes(path: Path) -> int:
    """Bytes allocated on disk under `path` (files being written included)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:                       # removed meanwhile
                pass
    return total


def run_prepare(args, source, memory, out):
    """Prepare `out` from `source` (prepare's arguments before --out) at --prepare-memory `memory`;
    (wall s, peak RSS bytes, edges, peak bytes on disk in out's directory) or ProcessFailed."""
    import threading
    cmd = [sys.executable, "-m", "oocgnn", "prepare", *source, "--out", str(out),
           "--prepare-memory", memory, "--quiet", "--force"]
    if args.partitioner != "none":
        cmd += ["--partitioner", args.partitioner, "--parts", str(args.parts)]
    timed = os.path.exists("/usr/bin/time")
    env = {**os.environ, "OOCGNN_PARTITION_CACHE": str(out.parent / f"partitions-{out.name}")}  # no reuse
    disk, done = [0], threading.Event()

    def watch():                                  # the store, the sorted runs and temporary files, every second
        while not done.wait(1.0):
            disk[0] = max(disk[0], tree_bytes(out.parent))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t = time.perf_counter()
    try:
        r = subprocess.run((["/usr/bin/time", "-v"] if timed else []) + cmd, capture_output=True, text=True,
                           cwd=REPO, env=env)
    finally:
        done.set()
        watcher.join()
    wall = time.perf_counter() - t
    disk[0] = max(disk[0], tree_bytes(out.parent))
    if r.returncode:                              # prepare's own last line, not time's report
        raise ProcessFailed(r.returncode, r.stderr.split("\tCommand being timed")[0])
    text = r.stdout + r.stderr
    m = re.search(r"wrote Store\(.*E=([\d,]+).*\) in ([\d.]+) s \(source ([\d.]+) s, peak RSS ([\d.]+) GiB\)", text)
    if not m:
        raise RuntimeError(f"no 'wrote Store' line in prepare's output: {text[-500:]}")
    rss = float(m.group(4)) * GIB
    t_rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if t_rss:
        rss = max(rss, int(t_rss.group(1)) * 1024)
    return wall, rss, int(m.group(1).replace(",", "")), disk[0]


def store_digest(path: Path) -> dict:
    """SHA-256 of every data file of the store at `path`."""
    from oocgnn.storemeta import DATA_FILES
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
    ap.add_argument("--ogb-scale", type=float, default=0.0,
                    help="prepare a generated ogbn-papers100M fixture instead of the preset: OGB's binary raw layout "
                         "at this fraction of its size (e.g. 0.1: 11M nodes, 162M raw edges, 5.7 GB of features; "
                         "made once in <data>/bench/ogb-fixture-S), with the bounded rows extrapolated to the full "
                         "dataset (default 0: the synthetic preset)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    ap.add_argument("--keep", action="store_true", help="keep the stores in <data>/bench/prepare/ and the OGB fixture "
                                                        "(default: delete them)")
    add_csv_argument(ap, "bench/prepare.csv under --data")
    args = ap.parse_args(argv)
    from oocgnn.prepare import prepare_memory
    memories = [m.strip() for m in args.memories.split(",") if m.strip()]
    if not memories:
        ap.error("--memories: give at least one value")
    memories = ["0"] + [m for m in memories if m != "0"]
    work = Path(args.data) / "bench" / "prepare"
    work.mkdir(parents=True, exist_ok=True)
    table = BenchTable(args.csv or Path(args.data) / "bench" / "prepare.csv",
                       ["memory", "budget", "seconds", "edges_per_s", "peak_rss", "peak_disk", "within_goal",
                        "same_store", "load"])
    if args.ogb_scale > 0:
        fixture_dir = Path(args.data) / "bench" / f"ogb-fixture-{args.ogb_scale:g}"
        t = time.perf_counter()
        source = [str(ogb_fixture(fixture_dir, args.ogb_scale))]
        name = f"ogb-{args.ogb_scale:g}"
        print(f"OGB fixture {source[0]} ({tree_bytes(fixture_dir) / GIB:.1f} GiB; ready in "
              f"{time.perf_counter() - t:.0f} s)", flush=True)
    else:
        source, name = ["synthetic", "--preset", args.preset], args.preset
    print(f"prepare {' '.join(source)} --partitioner {args.partitioner}"
          + (f" --parts {args.parts}" if args.partitioner != "none" else "") + f"; load {loadavg()}", flush=True)
    digests = {}                                  # memory -> the store's file digests
    for memory in memories:
        out = work / f"{name}-{memory}"

        def one():
            budget = prepare_memory(memory)
            load = loadavg()
            try:
                wall, rss, edges, disk = run_prepare(args, source, memory, out)
                digests[memory] = store_digest(out)
            finally:
                if not args.keep:
                    shutil.rmtree(out, ignore_errors=True)
            row = {"memory": memory, "budget": budget or 0, "seconds": wall, "edges_per_s": edges / wall,
                   "peak_rss": rss, "peak_disk": disk, "within_goal": None if budget is None else rss <= budget + GIB,
                   "same_store": True if memory == "0" else
                   (digests[memory] == digests["0"] if "0" in digests else None), "load": load}
            print(f"  --prepare-memory {memory:<6} {wall:7.1f} s, {edges / wall / 1e6:6.2f} M edges/s, peak RSS "
                  f"{rss / GIB:5.2f} GiB, peak disk {disk / GIB:5.1f} GiB" + ("" if budget is None else
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
    if args.ogb_scale > 0:
        extrapolate(table, memories, args.ogb_scale)
    print(f"load at end {loadavg()}; table {table.path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        if args.ogb_scale > 0:
            shutil.rmtree(fixture_dir, ignore_errors=True)


def base_rss() -> int:
    """Peak RSS of a process that imports what prepare imports and does nothing: the part that does not scale
    (the second of two, so that numba's cache is written and not compiled again)."""
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", "import oocgnn.cli, oocgnn.prepare, oocgnn.partition, oocgnn.store, oocgnn.storewrite, oocgnn.csrbuild; "
                            "from oocgnn.units import peak_rss; print(peak_rss())"],
                           capture_output=True, text=True, cwd=REPO, check=True)
    return int(r.stdout.split()[-1])


def extrapolate(table, memories, scale):
    """ogbn-papers100M predicted from the fixture at `scale`: time and disk linear in the size; the bounded
    rows at the smallest --prepare-memory its nodes allow (`csrbuild.sort_memory`: their per-node arrays
    + a 256 MiB sort), peak RSS = the imports' + that budget times the share of its budget this run's peak
    took beyond the imports."""
    from oocgnn.csrbuild import NODE_BYTES
    n = max(1000, int(PAPERS100M["nodes"] * scale))
    base = base_rss()
    least = NODE_BYTES * PAPERS100M["nodes"] + (256 << 20)
    print(f"\nogbn-papers100M ({PAPERS100M['nodes'] / 1e6:.0f}M nodes, {PAPERS100M['edges'] / 1e9:.2f}B raw edges, "
          f"{PAPERS100M['nodes'] * PAPERS100M['dim'] * 4 / 1e9:.0f} GB of features) predicted from the fixture "
          f"({n / 1e6:.2f}M nodes) at {scale:g} of its size, on this machine; its smallest --prepare-memory is "
          f"{least / GIB:.1f} GiB ({NODE_BYTES} B a node + a 256 MiB sort):")
    for memory in memories:
        row = table.ok(memory)
        if not row:
            continue
        if row["budget"]:
            share = max(0, row["peak_rss"] - base) / row["budget"]
            rss, how = base + share * least, f"imports {base / GIB:.2f} GiB + {share:.2f} x {least / GIB:.1f} GiB"
        else:
            rss, how = base + (row["peak_rss"] - base) / scale, f"imports {base / GIB:.2f} GiB + the rest x {1 / scale:g}"
        print(f"  --prepare-memory {memory:<6} {row['seconds'] / scale / 60:6.0f} min, peak RSS {rss / GIB:5.1f} GiB "
              f"({how}), disk {row['peak_disk'] / scale / 1e9:5.0f} GB beside the raw files")


if __name__ == "__main__":
    sys.exit(main())
