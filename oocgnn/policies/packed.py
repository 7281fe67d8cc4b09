"""DiskGNN (arXiv 2405.05231): offline sampling into packed batches.

A pre-processing pass samples every batch of the next E epochs (`pack_epochs`) with the run's own
sampler and seed (counter-based: the batches training samples are these), counts how often each row
is an input, keeps the most accessed rows in a static cache (the `hot_share` of what the budget
leaves, resident all run), and writes `packed.bin`: for each batch, its other input rows (unique,
sorted by id) one after the other at the store's stride and encoding, each batch's range starting on
a 4 KiB page. Training then reads one sequential range of packed.bin per batch, in the background
while the batch before it trains (the sample-ahead stage, `oocgnn.ahead`, with chunks of one batch:
its `ChunkFetch.span`), and gathers the rest from the hot cache.

The packed file lives in a cache keyed by what it holds (`pack_dir`, default `packed/` beside the
store, e.g. `data/stores/packed/`: git-ignored like the stores): a second run of the same batches
reuses it. Its bytes and the pre-processing seconds (sampling + writing) are part of the plan's
account (`describe()`, the run summary); the pre-pass's reads of features.bin are its own, outside
the run's I/O, like the setup's profiling. `simulate` counts the same reads as the executor (one range
per batch, `io.range_chunks`) without writing the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import UserError
from ..io import PAGE
from ..ranking import top_ids
from ..schedules import Step
from ..units import format_size
from .base import Plan, register, setting
from .sampleahead import SampleAheadPlan


class Packing(NamedTuple):
    """The pre-pass's result: `hot` (sorted ids cached all run), per batch of the E epochs (in step
    order) the first packed row `starts[i]` and the row count `counts[i]`, `rows` (the file's rows,
    padding included), `batches` (each batch's packed ids, sorted; dropped once the file is written),
    `seconds` (sampling and choosing), `key` (a hash of what the file holds), `read_pages` (the 4 KiB pages
    of features.bin that writing it reads: each batch's rows in one call)."""
    hot: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    rows: int
    batches: list | None
    seconds: float
    key: str
    read_pages: int


def pack_layout(counts, row_stride) -> tuple[np.ndarray, int]:
    """(first row of each batch, rows in all) of packing `counts` rows per batch at `row_stride`, each
    batch's range starting on a page (a row never straddles one: `io.feature_row_stride`)."""
    align = max(1, PAGE // int(row_stride))
    sizes = -(-np.asarray(counts, dtype=np.int64) // align) * align
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return starts, int(sizes.sum())


@register
class PackedPlan(SampleAheadPlan):
    """DiskGNN: batches sampled offline for E epochs, their non-hot input rows packed per batch into one
    file; a static cache of the most accessed rows (setup); each step one sequential read of its batch's
    range, into one of two buffers while the previous batch trains."""
    listed = 8
    name, source, size_flag = "packed", "DiskGNN (offline sampling, packed batches)", "pack"
    io_pattern = "one sequential packed range per batch, in the background"
    tasks = ("node", "link")     # link: a batch's endpoints' and negatives' samples, packed as a node batch's
    # not among the tuner's candidates (`tune.GRID`) yet: the cost model predicts epochs, and this plan's pre-pass
    # (sampling E epochs, then reading and writing every batch's rows once) would go uncharged; `compare` runs it
    grid = ()
    fetch_reads_ahead, pipeline = True, True

    @dataclass
    class Options:
        pack_epochs: int = setting(0, "E: epochs whose batches the pre-pass samples and packs (0: the run's "
                                      "epochs; fewer than the run's is refused)")
        hot_share: float = setting(1.0, "share of what the budget leaves for a static cache of the rows the packed "
                                        "batches access most (not packed)")
        pack_dir: str = setting("", "directory of packed-batch files, one per packing (default: packed/ beside "
                                    "the store)")

        def __post_init__(self):
            if self.pack_epochs < 0:
                raise UserError(f"pack_epochs must be >= 1 (0: the run's epochs), got {self.pack_epochs}")
            if not 0 <= self.hot_share <= 1:
                raise UserError(f"hot_share is a fraction in [0, 1], got {self.hot_share}")

    def __init__(self, store, cfg):
        super().__init__(store, cfg)
        self.epochs = self.options.pack_epochs or cfg.epochs
        if self.epochs < cfg.epochs:
            raise UserError(f"policy packed: --pack-epochs {self.epochs} packs fewer epochs than the run's "
                            f"{cfg.epochs}; pack at least as many (0: the run's)")
        self.lookahead, self.hot_rows = 1, 0
        self._group = min(store.num_nodes, self.sample_rows())
        self._choose_topology()
        left = max(0, self.budget - self.resident_bytes())
        self.hot_rows = int(min(store.num_nodes, left * self.options.hot_share // store.row_bytes))
        self._group = min(store.num_nodes - self.hot_rows, self.sample_rows())
        self.fetcher = self._fetch
        self.file = None                 # the `PackedFile` a runtime wrote or reused (its account)

    # -- memory ------------------------------------------------------------------------------
    def setup_rows(self):
        return self.hot_rows

    def group_rows(self):
        """A batch's packed rows: at most its input rows' bound, and at most the rows not hot."""
        return self._group

    def check_budget(self):
        return Plan.check_budget(self)

    # -- the pre-pass --------------------------------------------------------------------------
    @cached_property
    def packing(self) -> Packing:
        """Sample every batch of the E epochs (the run's sampler, seed and steps: the batches training
        samples), choose the hot rows, lay out the rest per batch. No feature is read."""
        from ..sampler import Sampler, sampled_steps   # numba: imported when used
        from ..trace import count_pages
        t = time.perf_counter()
        sampler = Sampler(self.profile_lists(), self.fanouts, self.seed, self.dense)
        inputs = [np.unique(s.input_nodes) for *_, s in sampled_steps(list(self.steps(self.epochs)), sampler)]
        counts = np.bincount(np.concatenate(inputs), minlength=self.store.num_nodes) if inputs else \
            np.zeros(self.store.num_nodes, np.int64)
        hot = top_ids(counts, min(self.hot_rows, np.count_nonzero(counts)))   # rows some batch accesses
        is_hot = np.zeros(self.store.num_nodes, bool)
        is_hot[hot] = True
        batches = [ids[~is_hot[ids]] for ids in inputs]
        sizes = np.array([len(b) for b in batches], np.int64)
        starts, rows = pack_layout(sizes, self.store.row_stride)
        h = hashlib.sha1(json.dumps({"store": self.store.meta.get("checksum"), "dtype": self.store.codec.name,
                                     "stride": self.store.row_stride}).encode())
        for a in (hot, sizes, *batches):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        pages = sum(count_pages(ids, self.store.row_stride, self.store.row_bytes) for ids in batches if len(ids))
        return Packing(hot, starts, sizes, rows, batches, time.perf_counter() - t, h.hexdigest()[:16], pages)

    @property
    def pack_bytes(self) -> int:
        """Bytes of packed.bin (from the pre-pass: no file needed)."""
        return self.packing.rows * self.store.row_stride

    def setup(self):
        """The lists first, then the hot rows: the pre-pass runs (when this generator is resumed) by sampling
        through whatever lists a runtime placed by then, as OUTRE's profile does."""
        yield from super().setup()
        if self.hot_rows and len(self.packing.hot):
            yield Step(seeds=np.empty(0, np.int64), enter_ids=self.packing.hot, data=("features",))

    def pack_path(self) -> Path:
        base = Path(self.options.pack_dir) if self.options.pack_dir else Path(self.store.path).parent / "packed"
        return base / f"{Path(self.store.path).name}-{self.packing.key}"

    def fetch_reader(self, store):
        """The reader of a batch's range: over packed.bin, written now unless a same packing left it; the
        batches' ids are then read from its index on disk (memory-mapped), not kept in RAM."""
        self.file = PackedFile(store, self.packing, self.pack_path())
        reader = self.file.open()
        self.__dict__["packing"] = self.file.packing = self.packing._replace(batches=None)
        return reader

    # -- the steps -----------------------------------------------------------------------------
    def chunk_fetch(self, items, inputs):
        """A batch's fetch: its packed range (`span`), holding exactly its input rows that are not hot."""
        from ..ahead import ChunkFetch   # torch: imported when used, not with this module
        (i, epoch, b, *_), = items
        p = self.packing
        if i >= len(p.starts):
            raise UserError(f"step {i} is past the {len(p.starts)} packed batches of {self.epochs} epochs")
        ids = np.unique(inputs[0])
        ids = ids[~np.isin(ids, p.hot, assume_unique=True)]
        packed = p.batches[i] if p.batches is not None else self.file.batch(i) if self.file is not None else None
        if len(ids) != p.counts[i] or (packed is not None and not np.array_equal(ids, packed)):
            raise UserError(f"batch {b} of epoch {epoch} samples other rows than the pre-pass packed: the packed "
                            "file does not match this run's sampler")
        return ChunkFetch(ids, None, True, span=(int(p.starts[i]), int(p.starts[i] + p.counts[i])))

    def _fetch(self, inputs):
        raise AssertionError("packed fetches come from chunk_fetch")

    def describe(self):
        out = {"pack_epochs": self.epochs, "hot_rows": self.hot_rows}
        if "packing" in self.__dict__:       # computed (by the setup or a simulation): its account
            p = self.packing
            out.update(pack_bytes=self.pack_bytes, pack_batches=len(p.starts), pack_rows=int(p.counts.sum()),
                       pack_sample_s=round(p.seconds, 3), pack_read_bytes=p.read_pages * PAGE)
        if self.file is not None:
            out.update(self.file.describe())
            out["pack_s"] = round(self.packing.seconds + self.file.seconds, 3)
        return out

    @staticmethod
    def summary_lines(summary):
        if "pack_bytes" not in summary:
            return []
        how = "reused" if summary.get("pack_reused") else f"written in {summary.get('pack_write_s', 0):.2f} s"
        return [f"packed: {summary['pack_batches']} batches of {summary['pack_epochs']} epochs, "
                f"{format_size(summary['pack_bytes'])} on disk ({how}; sampled in {summary['pack_sample_s']:.2f} s), "
                f"{summary['hot_rows']:,} hot rows resident"]


class PackedFile:
    """packed.bin of a `Packing` in `directory` (written there atomically unless a file of the same key
    is), and the direct reader of its rows (the store's stride and encoding)."""

    def __init__(self, store, packing, directory):
        self.store, self.packing, self.dir = store, packing, Path(directory)
        self.path = self.dir / "packed.bin"
        self.seconds, self.reused, self.read_bytes = 0.0, False, 0
        self._index = None                   # (offsets, ids) memory-mapped from the index (`batch`)

    def nbytes(self) -> int:
        return self.packing.rows * self.store.row_stride

    def _valid(self) -> bool:
        try:
            meta = json.loads((self.dir / "packed.json").read_text())
        except (OSError, ValueError):
            return False
        return meta.get("key") == self.packing.key and self.path.exists() and \
            self.path.stat().st_size == self.nbytes()

    def write(self):
        """Read each batch's rows from features.bin (its own reader: not the run's I/O) and write them at
        their packed rows; the index (starts, counts, ids) beside them."""
        t, p, store = time.perf_counter(), self.packing, self.store
        if p.batches is None:
            raise UserError("this packing's batches were released; make the plan again to write it")
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.dir.parent).free
        if self.nbytes() > free:
            raise UserError(f"policy packed: the packed batches need {format_size(self.nbytes())} in "
                            f"{self.dir.parent} but the disk has {format_size(free)} free; lower --pack-epochs, "
                            f"raise --memory-budget (more hot rows), or choose another --pack-dir")
        tmp = self.dir.with_name(f".{self.dir.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        stride = store.row_stride
        with store.reader("direct") as reader, open(tmp / "packed.bin", "wb") as f:
            f.truncate(self.nbytes())
            for start, ids in zip(p.starts, p.batches):
                if not len(ids):
                    continue
                rows = reader.read_rows(ids)                  # as stored: float32, float16 or int8
                buf = np.zeros((len(ids), stride), np.uint8)
                buf[:, :store.row_bytes] = rows.view(np.uint8).reshape(len(ids), -1)
                f.seek(int(start) * stride)
                f.write(buf.tobytes())
            self.read_bytes = reader.stats.bytes_read
        offsets = np.zeros(len(p.batches) + 1, np.int64)
        np.cumsum([len(b) for b in p.batches], out=offsets[1:])
        np.save(tmp / "starts.npy", p.starts)
        np.save(tmp / "offsets.npy", offsets)
        np.save(tmp / "ids.npy", np.concatenate(p.batches) if p.batches else np.empty(0, np.int64))
        np.save(tmp / "hot.npy", p.hot)
        (tmp / "packed.json").write_text(json.dumps({"key": p.key, "store": str(store.path), "rows": p.rows,
                                                     "row_stride": stride, "dtype": store.codec.name,
                                                     "batches": len(p.starts)}))
        if self.dir.exists():                                  # a stale or half-made packing of this key
            shutil.rmtree(self.dir)
        os.replace(tmp, self.dir)
        self.seconds = time.perf_counter() - t

    def open(self):
        """The direct reader over packed.bin (written first unless a valid one is there)."""
        from ..direct import DirectReader
        if self._valid():
            self.reused = True
        else:
            self.write()
        return DirectReader(self.path, self.packing.rows, self.store.feat_dim, row_stride=self.store.row_stride,
                            dtype=self.store.codec.dtype)

    def batch(self, i) -> np.ndarray:
        """The packed ids of batch i, from the index beside packed.bin."""
        if self._index is None:
            self._index = tuple(np.load(self.dir / f"{n}.npy", mmap_mode="r") for n in ("offsets", "ids"))
        offsets, ids = self._index
        return np.asarray(ids[offsets[i]:offsets[i + 1]])

    def describe(self) -> dict:
        """This run's part of the account: where, whether reused, the seconds and bytes it read writing."""
        return {"pack_path": str(self.dir), "pack_reused": self.reused, "pack_write_s": round(self.seconds, 3),
                "pack_read_bytes": int(self.read_bytes)}
