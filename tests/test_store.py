"""The on-disk store: round trips, relabelling, atomic writes and validation errors."""
import json

import numpy as np
import pytest

from oocgnn.datasets import GraphData, csr_from_edges
from oocgnn.errors import StoreError, UserError
from oocgnn.io import PAGE
from oocgnn.store import open_store
from oocgnn.storemeta import meta_checksum
from oocgnn.storewrite import write_store


def _graph(n=300, d=100, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 4 * n), rng.integers(0, n, 4 * n)
    indptr, indices = csr_from_edges(src, dst, n)
    ids = rng.permutation(n)
    return GraphData("g", indptr, indices, rng.standard_normal((n, d)).astype(np.float32),
                     rng.integers(0, 5, n), ids[:30], ids[30:60], ids[60:120])


def _neighbour_sets(indptr, indices):
    return [set(indices[indptr[v]:indptr[v + 1]].tolist()) for v in range(len(indptr) - 1)]


@pytest.mark.parametrize("permute", [False, True])
def test_round_trip_by_id_mapping(tmp_path, permute):
    g = _graph()
    order = np.random.default_rng(1).permutation(g.num_nodes) if permute else None
    s = write_store(g, tmp_path / "s", order=order, progress=False)
    orig = s.orig_ids
    assert sorted(orig) == list(range(g.num_nodes))
    new_of_old = np.argsort(orig)
    # features, labels and splits read back equal the input through the id mapping
    feats = s.reader("memory").read_range(0, s.num_nodes)
    np.testing.assert_array_equal(feats, g.features[orig])
    np.testing.assert_array_equal(s.labels, g.labels[orig])
    for split in ("train_idx", "val_idx", "test_idx"):
        assert sorted(orig[getattr(s, split)]) == sorted(getattr(g, split))
    # the CSR is the same graph: neighbours of store id i map back to the source's
    src_sets = _neighbour_sets(g.indptr, g.indices)
    store_sets = _neighbour_sets(s.indptr, s.indices)
    for i in range(s.num_nodes):
        assert {int(orig[j]) for j in store_sets[i]} == src_sets[orig[i]]
        row = s.indices[s.indptr[i]:s.indptr[i + 1]]
        assert np.all(np.diff(row) > 0), "rows are sorted and deduplicated"
    assert np.array_equal(new_of_old[orig], np.arange(s.num_nodes))


def test_row_stride_keeps_rows_inside_pages(tmp_path):
    s = write_store(_graph(d=100), tmp_path / "s", progress=False)
    assert s.row_bytes == 400 and s.row_stride == 512
    assert PAGE % s.row_stride == 0
    assert s.features_path.stat().st_size == s.num_nodes * 512
    raw = np.fromfile(s.features_path, dtype=np.float32).reshape(s.num_nodes, 128)
    assert not raw[:, 100:].any(), "padding is zero"


def test_partition_offsets_recorded(tmp_path):
    g = _graph()
    s = write_store(g, tmp_path / "s", part_offsets=[0, 100, 250, 300], partitioner="test", progress=False)
    assert s.num_parts == 3 and list(s.part_offsets) == [0, 100, 250, 300]
    assert s.summary()["parts"] == 3 and s.meta["partitioner"] == "test"


def test_refuses_to_overwrite_and_force_replaces(tmp_path):
    g = _graph()
    write_store(g, tmp_path / "s", progress=False)
    with pytest.raises(UserError, match="already exists"):
        write_store(g, tmp_path / "s", progress=False)
    s = write_store(_graph(seed=5), tmp_path / "s", force=True, progress=False)
    np.testing.assert_array_equal(s.labels, _graph(seed=5).labels)
    assert [p.name for p in tmp_path.iterdir() if p.name != ".s.lock"] == ["s"], "no temporary directories left"


def test_failed_write_leaves_nothing(tmp_path):
    g = _graph()
    g.features = _Exploding(g.features)
    with pytest.raises(RuntimeError):
        write_store(g, tmp_path / "s", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == [".s.lock"], "only the (empty) lock file stays"


class _Exploding:
    """Feature source that fails halfway, like a disk-full or a killed generator."""

    def __init__(self, arr):
        self.arr, self.shape, self.dtype = arr, arr.shape, arr.dtype

    def __getitem__(self, ids):
        raise RuntimeError("source failed")


@pytest.fixture
def store_dir(tmp_path):
    write_store(_graph(), tmp_path / "s", progress=False)
    return tmp_path / "s"


def test_open_validates(store_dir):
    s = open_store(store_dir)
    assert s.num_nodes == 300 and s.feat_dim == 100


def test_missing_store(tmp_path):
    with pytest.raises(StoreError, match="directory not found"):
        open_store(tmp_path / "nope")


def test_missing_file(store_dir):
    (store_dir / "labels.npy").unlink()
    with pytest.raises(StoreError, match="missing file labels.npy"):
        open_store(store_dir)


def test_truncated_file(store_dir):
    with open(store_dir / "features.bin", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(StoreError, match="features.bin is truncated"):
        open_store(store_dir)


def test_shape_mismatch(store_dir):
    np.save(store_dir / "labels.npy", np.zeros(299, dtype=np.int64))
    meta = json.loads((store_dir / "meta.json").read_text())
    meta["files"]["labels.npy"]["bytes"] = (store_dir / "labels.npy").stat().st_size
    meta["checksum"] = meta_checksum(meta)          # re-stamped: only the shape check can see it
    (store_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"labels.npy has shape \(299,\)"):
        open_store(store_dir)


def test_dtype_mismatch(store_dir):
    np.save(store_dir / "labels.npy", np.zeros(300, dtype=np.float64))
    with pytest.raises(StoreError, match="labels.npy has shape .* dtype float64"):
        open_store(store_dir)


def test_checksum_mismatch(store_dir):
    open_store(store_dir)                       # verified once, stamp written
    with open(store_dir / "features.bin", "r+b") as f:
        f.seek(4096)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(StoreError, match="checksum mismatch in features.bin"):
        open_store(store_dir)


def test_unknown_version(store_dir):
    meta = json.loads((store_dir / "meta.json").read_text())
    meta["version"] = 7
    (store_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="unknown store format version 7"):
        open_store(store_dir)


def test_corrupt_meta(store_dir):
    (store_dir / "meta.json").write_text("{not json")
    with pytest.raises(StoreError, match="not valid JSON"):
        open_store(store_dir)


def test_store_graph_matches_csr(tiny_store):
    g = tiny_store.graph()
    assert g.num_nodes() == tiny_store.num_nodes and g.num_edges() == tiny_store.num_edges
    v = int(np.argmax(tiny_store.degrees()))
    nbrs = np.sort(g.in_edges(v)[0].numpy())
    np.testing.assert_array_equal(nbrs, tiny_store.indices[tiny_store.indptr[v]:tiny_store.indptr[v + 1]])


def test_features_mapped_from_a_file_are_gathered_by_direct_reads(tiny_data, tmp_path, monkeypatch):
    """A source whose features are a float32 file mapped in memory (OGB's, larger than RAM) is written in a
    partition order through DirectReader's sorted, coalesced reads: the same store, byte for byte."""
    from dataclasses import replace
    from oocgnn.direct import DirectReader
    np.save(tmp_path / "feat.npy", np.asarray(tiny_data.features))
    mapped = replace(tiny_data, features=np.load(tmp_path / "feat.npy", mmap_mode="r"))
    order = np.random.default_rng(0).permutation(tiny_data.num_nodes)
    calls = []
    read_rows = DirectReader.read_rows
    monkeypatch.setattr(DirectReader, "read_rows", lambda self, ids: calls.append(len(ids)) or read_rows(self, ids))
    a = write_store(tiny_data, tmp_path / "a", order=order, progress=False)
    b = write_store(mapped, tmp_path / "b", order=order, progress=False)
    assert sum(calls) == tiny_data.num_nodes                     # every row of b through the direct reader
    from oocgnn.storemeta import DATA_FILES
    for f in DATA_FILES:
        assert (a.path / f).read_bytes() == (b.path / f).read_bytes(), f


@pytest.mark.parametrize("mapped", ["file", "view"])
def test_relabelling_a_mapped_neighbour_file_keeps_its_pages_out_of_rss(tmp_path, monkeypatch, mapped):
    """Writing a store in a partition order from a memory-mapped neighbour file (a bounded prepare's) reads
    the scattered lists with pread: the file's pages never enter the resident set (< 4 MiB seen of a 64 MB
    file). Gathered through the map instead (a view of it, which the reader does not take for a file), each
    fault maps a page-cache folio (2 MiB here) and the file fills RSS: the measure can fail. Same store."""
    import re
    import oocgnn.storewrite as st
    n, deg = 200_000, 80
    path = tmp_path / "indices.bin"
    rng = np.random.default_rng(0)
    lists = np.sort(rng.integers(0, n, (n, deg)).astype(np.int32), axis=1)
    lists.tofile(path)
    mm = np.memmap(path, dtype=np.int32, mode="r")
    data = GraphData(name="mapped", indptr=np.arange(0, n * deg + 1, deg, dtype=np.int64),
                     indices=mm if mapped == "file" else mm[:], features=np.zeros((n, 1), np.float32),
                     labels=np.zeros(n, np.int64), train_idx=np.arange(10), val_idx=np.arange(10, 20),
                     test_idx=np.arange(20, 30), num_classes=1)

    def rss_file():
        return int(re.search(r"RssFile:\s+(\d+)", open("/proc/self/status").read()).group(1)) << 10

    seen, release = [], st.release_pages
    monkeypatch.setattr(st, "release_pages", lambda a: (seen.append(rss_file()), release(a)))
    release(mm)
    base = rss_file()
    order = rng.permutation(n)
    write_store(data, tmp_path / "s", order=order, progress=False)
    grew = max(seen) - base
    assert grew < 4 << 20 if mapped == "file" else grew > 32 << 20
    g = open_store(tmp_path / "s")
    new_of_old = np.argsort(order)
    v = 123
    assert np.array_equal(g.indices[g.indptr[v]:g.indptr[v + 1]], np.sort(new_of_old[lists[order[v]]]))
