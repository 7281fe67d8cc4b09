"""Our neighbour sampler against DGL's, in memory and with the topology on disk, measured in one run.

On the store data/<preset> (prepared when missing), for the same seed batches (--batch-size training
nodes, --fanouts) and per thread count (1 and 2: numba's, torch's and DGL's OpenMP threads alike):

  ours, in memory   oocgnn.sampler.Sampler over every list resident (topology.NeighbourLists)
  DGL, in memory    dgl.dataloading.NeighborSampler(fanouts).sample(g, seeds): sample_neighbors +
                    to_block per layer, on the store's DGL graph (reseeded per batch)
  ours, from disk   the same Sampler with no list resident: each layer's new lists read from
                    indices.bin with coalesced O_DIRECT reads (indices.bin dropped from the page cache)

and the random 4 KiB read limit of indices.bin with many requests in flight (the functions of
benchmarks/io.py). Prints medians per batch, ours/DGL speed ratios (target >= 1.5x in memory) and the
disk sampler's read rate against the limit (target >= 0.8x), with the machine load.

    .venv/bin/python benchmarks/sampler.py [--preset large] [--batches 50] [--batch-size 1024]
        [--fanouts 10,10] [--threads 1,2] [--data data/]
"""
import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402

PAGE = 4096


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def ensure_store(preset, data_dir: Path):
    """data/<preset> (source order), written by `oocgnn prepare` when missing."""
    from oocgnn.store import open_store
    path = data_dir / preset
    if not (path / "meta.json").is_file():
        print(f"preparing {path} (a few minutes on `large`) ...", flush=True)
        r = subprocess.run([sys.executable, "-m", "oocgnn", "prepare", "synthetic", "--preset", preset,
                            "--out", str(path), "--quiet", "--force"], capture_output=True, text=True, cwd=REPO)
        if r.returncode:
            raise SystemExit(f"prepare failed: {(r.stdout + r.stderr)[-2000:]}")
    return open_store(path, verify=False)


def random_read_limit(path, ios=32768, reps=3, threads=64, seed=0):
    """Median IOPS of raw random 4 KiB O_DIRECT reads of `path` with `threads` in flight."""
    import numpy as np
    spec = importlib.util.spec_from_file_location("oocgnn_bench_io", REPO / "benchmarks" / "io.py")
    bio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bio)
    bio.drop_cache(path)
    pages = os.path.getsize(path) // PAGE
    rng, fd = np.random.default_rng(seed), os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        ios = min(ios, pages // 2)
        return statistics.median(ios / bio.raw_threads(fd, (rng.choice(pages, ios, replace=False) * PAGE).tolist(),
                                                       PAGE, threads) for _ in range(reps))
    finally:
        os.close(fd)


def timed(fn, batches):
    """Median seconds of fn(i, seeds) over the batches (after one untimed call: compilation, caches)."""
    fn(0, batches[0])
    ts = []
    for i, seeds in enumerate(batches):
        t = time.perf_counter()
        fn(i, seeds)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--preset", default="large", help="synthetic preset of data/<preset> (default large)")
    ap.add_argument("--batches", type=int, default=50, help="batches timed per configuration (default 50)")
    ap.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    ap.add_argument("--fanouts", default="10,10", help="per-layer fanouts (default 10,10)")
    ap.add_argument("--threads", default="1,2", help="thread counts to measure (default 1,2)")
    ap.add_argument("--data", default=str(REPO / "data"), help="data directory (default data/)")
    add_csv_argument(ap, "bench/sampler.csv under --data")
    args = ap.parse_args(argv)

    import dgl
    import numba
    import numpy as np
    import torch
    from oocgnn.io import drop_file_cache
    from oocgnn.sampler import Sampler
    from oocgnn.topology import NeighbourLists

    fanouts = [int(f) for f in args.fanouts.split(",")]
    print(f"loadavg at start: {loadavg()}  (cpus {os.cpu_count()})", flush=True)
    store = ensure_store(args.preset, Path(args.data))
    rng = np.random.default_rng(0)
    train = rng.permutation(store.train_idx)
    batches = [np.sort(train[i * args.batch_size:(i + 1) * args.batch_size]) for i in range(args.batches)]
    batches = [b for b in batches if len(b)]
    print(f"{store.path.name}: N={store.num_nodes:,} E={store.num_edges:,}; {len(batches)} batches of "
          f"{args.batch_size} seeds, fanouts {fanouts}", flush=True)
    memory = NeighbourLists.resident(store)
    g = store.graph()
    dgl_sampler, our_sampler = dgl.dataloading.NeighborSampler(fanouts), Sampler(memory, fanouts, 7)
    inputs = {"ours": [], "dgl": []}

    def ours(i, seeds):
        inputs["ours"].append(len(our_sampler.sample(seeds, 0, i).input_nodes))

    def theirs(i, seeds):
        dgl.seed(i)
        inputs["dgl"].append(len(dgl_sampler.sample(g, torch.from_numpy(seeds))[0]))

    table = BenchTable(args.csv or Path(args.data) / "bench" / "sampler.csv")
    for t in [int(x) for x in args.threads.split(",")]:
        def one():
            numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
            torch.set_num_threads(t)
            dgl.utils.set_num_threads(t)
            a, b = timed(ours, batches), timed(theirs, batches)
            print(f"  {t} thread(s): ours {a * 1e3:8.1f} ms/batch, DGL {b * 1e3:8.1f} ms/batch, "
                  f"ours {b / a:.2f}x DGL's speed  (load {loadavg()})", flush=True)
            return {"threads": t, "ours_ms": a * 1e3, "dgl_ms": b * 1e3, "speed_vs_dgl": b / a, "load": loadavg()}

        table.run(f"in memory, {t} thread(s)", one)
    if inputs["ours"] and inputs["dgl"]:
        print(f"  inputs per batch: ours {statistics.mean(inputs['ours']):,.0f}, DGL "
              f"{statistics.mean(inputs['dgl']):,.0f} (the same distribution: uniform without replacement)")

    path = store.path / "indices.bin"
    table.run("random 4K limit", lambda: {"iops": random_read_limit(path)})

    def from_disk():
        drop_file_cache(path)
        disk = NeighbourLists(store, capacity=0)
        sampler = Sampler(disk, fanouts, 7)
        per_batch = timed(lambda i, seeds: sampler.sample(seeds, 0, i), batches)
        st = disk.stats
        rate = st.pages / st.seconds if st.seconds else 0.0
        disk.close()
        limit = table.ok("random 4K limit")
        vs = (f"= {rate / limit['iops']:.2f}x the random 4 KiB limit of {limit['iops']:,.0f} IOPS (64 threads, "
              "same file, same run; target >= 0.8x)" if limit else f"against the limit: {table.na('random 4K limit')}")
        print(f"\nfrom disk ({numba.get_num_threads()} thread(s)): {per_batch * 1e3:.1f} ms/batch; lists read in "
              f"{st.calls} calls, {st.pages:,} pages, {st.requests:,} requests, {st.seconds:.2f} s inside reads: "
              f"{rate:,.0f} pages/s {vs}")
        return {"threads": numba.get_num_threads(), "ours_ms": per_batch * 1e3, "calls": st.calls, "pages": st.pages,
                "requests": st.requests, "read_s": st.seconds, "pages_per_s": rate,
                "vs_limit": rate / limit["iops"] if limit else None}

    table.run("from disk", from_disk)
    print("\nours / DGL speed in memory: " + ", ".join(
        f"{r['threads']} thread(s) {r['speed_vs_dgl']:.2f}x" if r["status"] == "ok" else f"{r['config']} n/a"
        for r in table.rows if r["config"].startswith("in memory")) + " (target >= 1.5x)")
    print(f"loadavg at end: {loadavg()}")


if __name__ == "__main__":
    sys.exit(main())
