"""This machine's disk, measured once per device: O_DIRECT sequential bytes/s and random 4 KiB reads/s at
the reader's queue depth and at depth 1 (`DiskRates`, `measure_disk`), and the cache under
~/.cache/oocgnn that keeps them and the cost model's calibrations (`costmodel.calibrate`)."""
from __future__ import annotations

import json
import mmap
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .io import PAGE

CACHE_VERSION = 7


def cache_dir(path=None) -> Path:
    """Where measured rates and calibrations are kept: `path`, $OOCGNN_CACHE, or ~/.cache/oocgnn."""
    return Path(path or os.environ.get("OOCGNN_CACHE") or Path.home() / ".cache" / "oocgnn").expanduser()


def load_cached(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if data.get("version") == CACHE_VERSION else {"version": CACHE_VERSION}
    except (OSError, ValueError):
        return {"version": CACHE_VERSION}


def save_cached(path: Path, data: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


@dataclass
class DiskRates:
    """This device's O_DIRECT rates: sequential bytes/s (`DirectReader.read_range`), random 4 KiB
    reads/s as `DirectReader.read_rows` issues them (many in flight) and one at a time (`iops_qd1`)."""
    seq_bytes_s: float
    iops: float
    iops_qd1: float
    device: str = ""

    def seconds(self, pages, requests, depth="deep"):
        """Seconds to read `pages` 4 KiB pages in `requests` requests (arrays or numbers)."""
        iops = self.iops if depth == "deep" else self.iops_qd1
        latency = max(0.0, 1.0 / iops - PAGE / self.seq_bytes_s)
        return np.asarray(requests) * latency + np.asarray(pages) * (PAGE / self.seq_bytes_s)


def device_key(path) -> str:
    st = os.stat(path)
    return f"dev{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def measure_disk(store, repeats=3, random_reads=8192, seq_bytes=256 << 20, cache=None,
                 refresh=False) -> DiskRates:
    """Measure (or read from the cache) the rates of the device holding `store`'s features.bin.

    Sequential: `read_range` over up to `seq_bytes` of the file; random: `read_rows` of
    `random_reads` distinct rows on distinct pages, spread over the file; depth 1: single
    O_DIRECT 4 KiB preads at random pages. Dirty pages are written back first (`os.sync`: a store just
    written is still being flushed, and its writeback slows reads several-fold), one untimed round warms
    the device, then medians of `repeats` rounds."""
    path = Path(store.features_path)
    key, file = device_key(path), cache_dir(cache) / "disk-rates.json"
    saved = load_cached(file)
    if key in saved and not refresh:
        return DiskRates(**saved[key])
    reader = store.reader("direct")
    rng = np.random.default_rng(0)
    n, stride = store.num_nodes, store.row_stride
    per_page = max(1, PAGE // stride)
    pages_total = max(1, n // per_page)
    seq_rows = int(min(n, max(1, seq_bytes // stride)))
    seq, deep, qd1 = [], [], []
    os.sync()
    try:
        for _ in range(repeats + 1):
            t = time.perf_counter()
            for lo in range(0, seq_rows, max(1, (8 << 20) // stride)):
                reader.read_range(lo, min(seq_rows, lo + max(1, (8 << 20) // stride)))
            seq.append(seq_rows * stride / (time.perf_counter() - t))
            pages = rng.choice(pages_total, min(random_reads, pages_total), replace=False)
            # every other page at most, so no two rows coalesce into one request
            ids = np.unique(pages - pages % 2) * per_page
            before = reader.stats.requests
            t = time.perf_counter()
            reader.read_rows(ids)
            deep.append((reader.stats.requests - before) / (time.perf_counter() - t))
            qd1.append(_qd1_rate(path, pages_total * per_page * stride, rng))
    finally:
        reader.close()
    seq, deep, qd1 = seq[1:], deep[1:], qd1[1:]          # the warm-up round
    rates = DiskRates(statistics.median(seq), statistics.median(deep), statistics.median(qd1), key)
    saved[key] = asdict(rates)
    save_cached(file, saved)
    return rates


def _qd1_rate(path, size, rng, reads=1024) -> float:
    """Random 4 KiB O_DIRECT reads per second, one at a time."""
    buf = mmap.mmap(-1, PAGE)
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    try:
        offsets = rng.integers(0, max(1, size // PAGE), reads) * PAGE
        t = time.perf_counter()
        for off in offsets:
            os.preadv(fd, [buf], int(off))
        return reads / (time.perf_counter() - t)
    finally:
        os.close(fd)
        buf.close()
