"""The out-of-core sort of `prepare`: our NumPy external merge sort (csrbuild.CSRBuilder) against DuckDB's
larger-than-memory sort, under the same memory bound, in one run.

Both turn the same raw undirected edge list (the synthetic preset's draws, written once to
<data>/bench/edges-<preset>.npy as [2, M] int64 and read in 8M-edge chunks) into the canonical CSR:
symmetrised, self-loops dropped, sorted and deduplicated, the neighbour ids written to a file and the
row pointers counted. Each method runs in a fresh process, which reports its wall seconds and peak RSS
(VmHWM); the outputs must be identical (SHA-256 of indptr and of the neighbour file).

  numpy   CSRBuilder: sorted runs of memory/36 keys (src*N + dst) on disk, merged by source-id range
  duckdb  the keys (computed by DuckDB from the chunks, both directions) inserted into a table, then
          SELECT DISTINCT k ORDER BY k streamed out in chunks of vectors; memory_limit = the bound,
          temp_directory beside the output, threads = the cores, preserve_insertion_order off

    .venv/bin/python benchmarks/external_sort.py [--preset large] [--memory 1GB]
        [--methods numpy,duckdb] [--data data/] [--keep]
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, ProcessFailed, add_csv_argument  # noqa: E402

CHUNK = 1 << 23
METHODS = ("numpy", "duckdb")


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def edge_file(preset, data_dir: Path) -> Path:
    """<data>/bench/edges-<preset>.npy: the preset's raw undirected edges, [2, M] int64 (made once)."""
    import numpy as np
    from oocgnn.synthetic import edge_draws, edge_stream, preset as get_preset
    path = data_dir / "bench" / f"edges-{preset}.npy"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    m = edge_draws(get_preset(preset))
    tmp = path.with_suffix(".partial.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(2, m))
    at = 0
    for src, dst in edge_stream(preset):
        out[0, at:at + len(src)], out[1, at:at + len(src)] = src, dst
        at += len(src)
    assert at == m, (at, m)
    out.flush()
    del out
    os.replace(tmp, path)
    print(f"wrote {path}: {m:,} undirected edges of {get_preset(preset).num_nodes:,} nodes", flush=True)
    return path


def sort_numpy(edges, n, memory, workdir: Path):
    """(indptr, path of the neighbour ids) by csrbuild.CSRBuilder."""
    from oocgnn.csrbuild import CSRBuilder
    builder = CSRBuilder(n, workdir, memory)
    for lo in range(0, edges.shape[1], CHUNK):
        builder.add(edges[0, lo:lo + CHUNK], edges[1, lo:lo + CHUNK])
    out = workdir / "indices.bin"
    indptr, _ = builder.finish(out)
    return indptr, out


def sort_duckdb(edges, n, memory, workdir: Path):
    """(indptr, path of the neighbour ids) by DuckDB's out-of-core DISTINCT + ORDER BY."""
    import duckdb
    import numpy as np
    import pandas as pd
    from oocgnn.datasets import index_dtype
    con = duckdb.connect(str(workdir / "sort.duckdb"))
    con.execute(f"SET memory_limit = '{max(memory // 2**20, 64)}MB'")
    con.execute(f"SET temp_directory = '{workdir / 'spill'}'")
    con.execute(f"SET threads = {os.cpu_count()}")
    con.execute("SET preserve_insertion_order = false")
    con.execute("CREATE TABLE e (k BIGINT)")
    for lo in range(0, edges.shape[1], CHUNK):
        chunk = pd.DataFrame({"s": edges[0, lo:lo + CHUNK], "d": edges[1, lo:lo + CHUNK]})  # noqa: F841
        con.execute(f"INSERT INTO e SELECT s * {n} + d FROM chunk WHERE s <> d "
                    f"UNION ALL SELECT d * {n} + s FROM chunk WHERE s <> d")
    count = np.zeros(n, dtype=np.int64)
    out = workdir / "indices.bin"
    dtype = index_dtype(n)
    con.execute("SELECT DISTINCT k FROM e ORDER BY k")
    with open(out, "wb") as fh:
        while True:
            df = con.fetch_df_chunk(64)               # 64 vectors of 2048 rows
            if not len(df):
                break
            keys = df["k"].to_numpy(np.int64)
            rows = keys // n
            count += np.bincount(rows, minlength=n)
            fh.write((keys - rows * n).astype(dtype).tobytes())
    con.close()
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(count, out=indptr[1:])
    return indptr, out


def worker(args):
    """One method in this fresh process; prints `RESULT <json>`."""
    import numpy as np
    from oocgnn.units import parse_size, peak_rss
    edges = np.load(args.edges, mmap_mode="r")
    n = args.nodes
    memory = parse_size(args.memory)
    work = Path(tempfile.mkdtemp(prefix=f"sort-{args.worker}-", dir=Path(args.edges).parent))
    try:
        t = time.perf_counter()
        indptr, path = {"numpy": sort_numpy, "duckdb": sort_duckdb}[args.worker](edges, n, memory, work)
        wall = time.perf_counter() - t
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        digest = hashlib.sha256(indptr.tobytes() + digest.encode()).hexdigest()
        rss = peak_rss()                          # VmHWM: ru_maxrss after exec can be the parent's RSS at fork
        print("RESULT " + json.dumps({"seconds": wall, "peak_rss": rss, "entries": int(indptr[-1]),
                                      "digest": digest}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--preset", default="large", help="synthetic preset whose edges are sorted (default large)")
    ap.add_argument("--memory", default="1GB", help="the memory bound of both methods (default 1GB)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated (default {','.join(METHODS)})")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    ap.add_argument("--keep", action="store_true", help="keep the raw edge file <data>/bench/edges-<preset>.npy "
                                                        "for the next run (default: delete it)")
    add_csv_argument(ap, "bench/external_sort.csv under --data")
    ap.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--edges", help=argparse.SUPPRESS)
    ap.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}")
    from oocgnn.synthetic import preset
    from oocgnn.units import parse_size
    n = preset(args.preset).num_nodes
    data_dir = Path(args.data)
    edges = edge_file(args.preset, data_dir)
    table = BenchTable(args.csv or data_dir / "bench" / "external_sort.csv",
                       ["seconds", "edges_per_s", "peak_rss", "within_bound", "same_csr", "load"])
    budget = parse_size(args.memory)
    import numpy as np
    m = np.load(edges, mmap_mode="r").shape[1]
    print(f"sorting the edges of {args.preset} ({m:,} undirected) under {args.memory}; "
          f"load {loadavg()}", flush=True)
    digests = {}
    for method in methods:
        def one():
            load = loadavg()
            cmd = [sys.executable, __file__, "--worker", method, "--edges", str(edges), "--nodes", str(n),
                   "--memory", args.memory]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if r.returncode:
                raise ProcessFailed(r.returncode, r.stderr)
            res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
            digests[method] = res["digest"]
            row = {"seconds": res["seconds"], "edges_per_s": res["entries"] / res["seconds"],
                   "peak_rss": res["peak_rss"], "within_bound": res["peak_rss"] <= budget + (1 << 30),
                   "same_csr": len(set(digests.values())) == 1, "load": load}
            print(f"  {method:<7} {res['seconds']:7.1f} s, {row['edges_per_s'] / 1e6:6.2f} M CSR entries/s, "
                  f"peak RSS {res['peak_rss'] / 2**30:5.2f} GiB, same CSR as the others: {row['same_csr']}", flush=True)
            return row
        table.run(method, one)
    if "numpy" in methods:
        print("\nratios against numpy (same run):")
        for method in methods:
            if method != "numpy":
                _, text = table.ratio(method, "numpy", "edges_per_s")
                _, text_rss = table.ratio(method, "numpy", "peak_rss")
                print(f"  {method}: throughput {text}, peak RSS {text_rss}")
    print(f"load at end {loadavg()}; table {table.path}")
    if not args.keep:
        edges.unlink()


if __name__ == "__main__":
    sys.exit(main())
