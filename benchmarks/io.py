"""Raw O_DIRECT limits of this disk vs oocgnn.io.DirectReader, measured in one run.

Creates (or reuses) a feature file of D=128 float32 rows (512 B stride), drops it from the page
cache, then measures: raw sequential 1 MiB reads (QD1 and a few in flight), raw random 4 KiB reads
with many in flight (thread pools and io_uring), DirectReader's random-row gather and sequential
read_range. Prints medians and the reader/raw ratios (target >= 0.8).

    .venv/bin/python benchmarks/io.py [--size 4GiB] [--dir data/bench] [--rows 65536] [--keep]
"""
import argparse
import mmap
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oocgnn import direct as odirect  # noqa: E402
from oocgnn.benchtable import BenchTable, add_csv_argument  # noqa: E402
from oocgnn.units import format_size, parse_size  # noqa: E402

D, STRIDE, PAGE, MiB = 128, 512, 4096, 1 << 20


def loadavg():
    return open("/proc/loadavg").read().strip()


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def make_file(path, size):
    """Rows whose int32 view is r*128+c (verifiable), written with O_DIRECT in 64 MiB chunks."""
    rows = size // STRIDE
    if path.exists() and path.stat().st_size == rows * STRIDE:
        print(f"reusing {path} ({format_size(rows * STRIDE)})")
        return rows
    path.parent.mkdir(parents=True, exist_ok=True)
    chunk_rows = 64 * MiB // STRIDE
    buf = mmap.mmap(-1, chunk_rows * STRIDE)
    arr = np.frombuffer(buf, np.int32)
    base = np.arange(chunk_rows * D, dtype=np.int32)
    tmp = path.with_suffix(".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t = time.perf_counter()
    for r0 in range(0, rows, chunk_rows):
        n = min(chunk_rows, rows - r0)
        np.add(base, r0 * D, out=arr)
        os.pwrite(fd, memoryview(buf)[:n * STRIDE], r0 * STRIDE)  # n*512 is page-aligned unless last
        if (r0 // chunk_rows) % 16 == 15:
            print(f"  writing {path}: {format_size((r0 + n) * STRIDE)}", flush=True)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)
    dt = time.perf_counter() - t
    print(f"wrote {format_size(rows * STRIDE)} in {dt:.1f} s ({rows * STRIDE / dt / MiB:.0f} MiB/s)")
    return rows


def check_rows(out, ids):
    want = ids[:, None].astype(np.int64) * D + np.arange(D)
    if not np.array_equal(out.view(np.int32), want):
        raise SystemExit("ERROR: reader returned wrong rows")


# ---- raw device limits ----------------------------------------------------------------
def raw_threads(fd, offs, size, nthreads):
    """preadv of `size` bytes at each offset, split into per-thread lists (each its own buffer)."""
    parts = [offs[i::nthreads] for i in range(nthreads)]

    def work(part):
        b = mmap.mmap(-1, size)
        mv, pr = memoryview(b), os.preadv
        for o in part:
            pr(fd, [mv], o)

    ts = [threading.Thread(target=work, args=(p,)) for p in parts]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return time.perf_counter() - t


def raw_uring(fd, offs, size, depth):
    """io_uring readv, `depth` in flight, one Iovec per slot reused (the cheapest Python loop)."""
    L = odirect._L
    ring, cqe = L.Ring(), L.Cqe()
    L.io_uring_queue_init(depth, ring)
    b = mmap.mmap(-1, size * depth)
    mv = memoryview(b)
    iovs = [L.Iovec([mv[s * size:(s + 1) * size]]) for s in range(depth)]
    free = list(range(depth))
    n, sub, done, batch = len(offs), 0, 0, max(1, depth // 4)
    t = time.perf_counter()
    while done < n:
        while sub < n and free:
            s = free.pop()
            sqe = L.io_uring_get_sqe(ring)
            L.io_uring_prep_readv(sqe, fd, iovs[s], offs[sub])
            L.io_uring_sqe_set_data64(sqe, s)
            sub += 1
        L.io_uring_submit_and_wait(ring, min(depth - len(free), batch))
        for _ in range(L.io_uring_cq_ready(ring)):
            L.io_uring_wait_cqe(ring, cqe)
            c = cqe[0]
            if c.res != size:
                raise SystemExit(f"ERROR: io_uring read returned {c.res}")
            free.append(c.user_data)
            L.io_uring_cqe_seen(ring, c)
            done += 1
    dt = time.perf_counter() - t
    L.io_uring_queue_exit(ring)
    return dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="4GiB", help="feature file size (default 4GiB)")
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parents[1] / "data" / "bench"),
                    help="directory of the file (default data/bench)")
    ap.add_argument("--rows", type=int, default=65536, help="random rows per read_rows call (default 65536)")
    ap.add_argument("--ios", type=int, default=65536, help="raw random 4 KiB reads per repetition")
    ap.add_argument("--range-mib", type=int, default=256, help="MiB per sequential read (default 256)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per measurement (>= 3)")
    ap.add_argument("--threads", type=int, default=16, help="DirectReader threads (threads backend)")
    ap.add_argument("--queue-depth", type=int, default=64, help="DirectReader io_uring queue depth")
    ap.add_argument("--range-request", default="1MiB", help="DirectReader read_range request size")
    ap.add_argument("--range-depth", type=int, default=2, help="DirectReader read_range requests in flight")
    ap.add_argument("--keep", action="store_true", help="keep the file for the next run")
    add_csv_argument(ap, "io.csv under --dir")
    a = ap.parse_args(argv)
    reps = max(3, a.reps)
    path = Path(a.dir) / "features_d128.bin"
    table = BenchTable(a.csv or Path(a.dir) / "io.csv", columns=["unit", "median", "min", "max", "reps"])
    print(f"loadavg at start: {loadavg()}")
    rows = make_file(path, parse_size(a.size))
    size = rows * STRIDE
    drop_cache(path)
    rng = np.random.default_rng(12345)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    results = {}  # name -> (unit, [values])

    def record(name, unit, value):
        vals = results.setdefault(name, (unit, []))[1]
        vals.append(value)
        table.add(name, unit=unit, median=statistics.median(vals), min=min(vals), max=max(vals), reps=len(vals))

    def measure(name, fn):
        """fn() records its measurements; one that fails is a row saying why and is not run again."""
        if name not in dead and not table.run(name, fn):
            dead.add(name)

    def seq_offsets(nbytes, req):
        start = int(rng.integers(0, (size - nbytes) // req + 1)) * req  # a fresh region each time
        return list(range(start, start + nbytes, req))

    nseq = a.range_mib * MiB
    uring = odirect.uring_usable()
    print(f"measuring ({reps} reps each; liburing {'available' if uring else 'MISSING'}) ...", flush=True)
    # readers persist across calls (as in training): their buffers are warmed by one call first
    readers, dead = {}, set()
    for b in (["uring"] if uring else []) + ["threads"]:
        def open_reader():
            r = readers[b] = odirect.DirectReader(path, rows, D, backend=b, threads=a.threads,
                                                  queue_depth=a.queue_depth, range_depth=a.range_depth,
                                                  range_request=parse_size(a.range_request))
            r.read_rows(rng.choice(rows, a.rows, replace=False))
        if not table.run(f"reader[{b}]", open_reader) and b in readers:
            readers.pop(b).close()

    def raw_seq(name, read):
        measure(name, lambda: record(name, "MiB/s", nseq / MiB / read()))

    def raw_rand(name, read):
        def one():
            offs = (rng.choice(size // PAGE, a.ios, replace=False) * PAGE).tolist()
            record(name, "IOPS", a.ios / read(offs))
        measure(name, one)

    def gather(backend, r):
        r.stats.reset()
        ids = rng.choice(rows, a.rows, replace=False)
        out = r.read_rows(ids)
        s = r.stats
        check_rows(out, ids)
        record(f"reader[{backend}] gather rows/s", "rows/s", a.rows / s.seconds)
        record(f"reader[{backend}] gather pages/s", "IOPS", s.pages / s.seconds)
        record(f"reader[{backend}] gather requests/call", "req", s.requests)

    def read_range(backend, r):
        r.stats.reset()
        lo = int(rng.integers(0, rows - nseq // STRIDE))
        out = r.read_range(lo, lo + nseq // STRIDE)
        check_rows(out[::997], np.arange(lo, lo + nseq // STRIDE)[::997])
        record(f"reader[{backend}] read_range", "MiB/s", nseq / MiB / r.stats.seconds)

    for rep in range(reps):
        print(f"  rep {rep + 1}/{reps}  loadavg {loadavg()}", flush=True)
        raw_seq("raw seq 1MiB QD1", lambda: raw_threads(fd, seq_offsets(nseq, MiB), MiB, 1))
        raw_seq("raw seq 1MiB 4 threads", lambda: raw_threads(fd, seq_offsets(nseq, MiB), MiB, 4))
        if uring:
            raw_seq("raw seq 1MiB uring QD4", lambda: raw_uring(fd, seq_offsets(nseq, MiB), MiB, 4))
        for nt in (16, 32, 64):
            raw_rand(f"raw rand 4K {nt} threads", lambda offs: raw_threads(fd, offs, PAGE, nt))
        if uring:
            raw_rand("raw rand 4K uring QD64", lambda offs: raw_uring(fd, offs, PAGE, 64))
        for backend, r in readers.items():
            measure(f"reader[{backend}] gather", lambda: gather(backend, r))
            measure(f"reader[{backend}] read_range", lambda: read_range(backend, r))
    for r in readers.values():
        r.close()
    os.close(fd)

    med = {k: statistics.median(v) for k, (_, v) in results.items() if table.ok(k)}
    best_seq = max((v for k, v in med.items() if k.startswith("raw seq")), default=None)
    best_rand = max((v for k, v in med.items() if k.startswith("raw rand")), default=None)
    print(f"\nfile {path} ({format_size(size)}, {rows:,} rows x 512 B), "
          f"{a.rows:,} random rows per gather, {a.range_mib} MiB per sequential read, {reps} reps")
    print(f"{'measurement':<36}{'unit':>8}{'median':>12}{'min':>12}{'max':>12}{'vs raw best':>13}")
    for k, (unit, vals) in results.items():
        if k not in med:
            continue
        ratio, best = "", best_rand if unit == "IOPS" else best_seq
        if k.startswith("reader") and unit in ("IOPS", "MiB/s"):
            ratio = f"{med[k] / best:.2f}" if best else "-"
            table.add(k, vs_raw_best=med[k] / best if best else None)
        print(f"{k:<36}{unit:>8}{med[k]:>12,.0f}{min(vals):>12,.0f}{max(vals):>12,.0f}{ratio:>13}")
    for r in table.failed():
        print(f"{r['config']:<36}  {r['status']}")
    best_text = {"sequential": f"{best_seq:,.0f} MiB/s" if best_seq else "n/a (no raw sequential measurement ran)",
                 "random 4K": f"{best_rand:,.0f} IOPS" if best_rand else "n/a (no raw random measurement ran)"}
    print(f"raw best: sequential {best_text['sequential']}, random 4K {best_text['random 4K']} "
          "(target: reader >= 0.8 x)")
    print(f"loadavg at end: {loadavg()}")
    if not a.keep:
        path.unlink()
        print(f"deleted {path}")


if __name__ == "__main__":
    main()
