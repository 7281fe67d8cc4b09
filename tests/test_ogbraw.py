"""`ogbraw`: OGB's raw layouts (CSV and ogbn-papers100M's binary) read in chunks, against the same graph
loaded whole; their errors; and the bounded-memory path."""
import gc
import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from oocgnn.csrbuild import NODE_BYTES
from oocgnn.datasets import csr_from_edges
from oocgnn.prepare import load_source
from oocgnn.errors import UserError
from oocgnn.ogbraw import load_ogb_raw

from .test_datasets import DST, N, SRC, assert_canonical, features

# --- OGB raw ------------------------------------------------------------------------------------

OGB_LABELS = [0, 1, 2, np.nan, 1, 2, 0, 1]                 # node 3 unlabelled
OGB_SPLITS = {"train": [0, 1, 2, 3], "valid": [4], "test": [5, 6, 7]}   # 3 is dropped


def write_csv_gz(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, header=False, index=False, compression="gzip")


def write_ogb(root, split_name="time", num_nodes=True):
    raw = root / "raw"
    write_csv_gz(raw / "edge.csv.gz", np.array([SRC, DST], np.int64).T)
    write_csv_gz(raw / "node-feat.csv.gz", features())
    with gzip.open(raw / "node-label.csv.gz", "wt") as f:    # NaN label as an empty line
        f.write("".join("\n" if np.isnan(v) else f"{v:.1f}\n" for v in OGB_LABELS))
    if num_nodes:
        with gzip.open(raw / "num-node-list.csv.gz", "wt") as f:
            f.write(f"{N}\n")
    for s, ids in OGB_SPLITS.items():
        write_csv_gz(root / "split" / split_name / f"{s}.csv.gz", np.array(ids).reshape(-1, 1))
    return root


def test_load_ogb_raw_streams_in_chunks(tmp_path):
    root = write_ogb(tmp_path / "ogbn_toy")
    many = load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "feat3")
    one = load_ogb_raw(root, chunk_rows=10**6, feature_dir=tmp_path / "feat1")
    for g in (many, one):
        assert g.name == "ogbn_toy" and g.info["source"] == "ogb_raw" and g.info["split"] == "time"
        assert_canonical(g.indptr, g.indices, SRC, DST, N)
        assert g.labels.tolist() == [0, 1, 2, -1, 1, 2, 0, 1] and g.num_classes == 3
        assert g.train_idx.tolist() == [0, 1, 2] and g.val_idx.tolist() == [4]
        assert g.test_idx.tolist() == [5, 6, 7] and g.info["unlabelled_dropped_from_splits"] == 1
        assert isinstance(g.features, np.memmap) and not g.features.flags.writeable
        assert g.features.dtype == np.float32 and np.allclose(g.features, features())
    for k in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(getattr(many, k), getattr(one, k)), k
    assert np.array_equal(many.features, one.features)
    assert Path(many.info["feature_file"]).parent == tmp_path / "feat3"


def test_load_ogb_raw_temporary_features_and_dispatch(tmp_path):
    write_ogb(tmp_path / "ogbn_toy", num_nodes=False)
    g = load_source(tmp_path, chunk_rows=2)              # parent dir with one dataset inside
    fpath = Path(g.info["feature_file"])
    assert g.info["feature_file_temporary"] and fpath.is_file()
    assert np.allclose(g.features[2:5], features()[2:5])
    del g
    gc.collect()
    assert not fpath.exists()                             # temp dir went with the features


@pytest.mark.parametrize("mutate, message", [
    (lambda r: (r / "raw/edge.csv.gz").unlink(), r"raw/edge.csv.gz"),
    (lambda r: (r / "raw/node-feat.csv.gz").unlink(), r"missing file .*node-feat.csv.gz"),
    (lambda r: (r / "raw/node-label.csv.gz").unlink(), r"missing file .*node-label.csv.gz"),
    (lambda r: (r / "split/time/valid.csv.gz").unlink(), r"missing file .*valid.csv.gz"),
    (lambda r: write_csv_gz(r / "raw/node-feat.csv.gz", features(N + 1)), "more than 8 rows"),
    (lambda r: write_csv_gz(r / "raw/node-feat.csv.gz", features(N - 2)), "has 6 rows"),
    (lambda r: write_csv_gz(r / "raw/edge.csv.gz", [[0, 1], [2, N]]), r"line 2 .*outside 0..7"),
    (lambda r: write_csv_gz(r / "raw/edge.csv.gz", [[0, 1, 2]]), "expected 2 columns"),
    (lambda r: write_csv_gz(r / "raw/num-node-list.csv.gz", [[9]]), r"says \[9\] nodes"),
    (lambda r: write_csv_gz(r / "split/time/test.csv.gz", [[4], [5]]), "val_idx and test_idx overlap"),
    (lambda r: write_csv_gz(r / "split/time/test.csv.gz", [[12]]), r"test.csv.gz: holds node ids"),
    (lambda r: write_csv_gz(r / "split/other/test.csv.gz", [[5]]), r"found \['other', 'time'\]"),
    (lambda r: write_csv_gz(r / "raw/node-label.csv.gz", [[0.5]] * N), "non-negative integers"),
])
def test_load_ogb_raw_errors(tmp_path, mutate, message):
    root = write_ogb(tmp_path / "ogbn_toy")
    mutate(root)
    with pytest.raises(UserError, match=message):
        load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "feat")
    assert not list(tmp_path.glob("feat/*.npy"))          # no half-written feature file left


def test_load_ogb_raw_explicit_split(tmp_path):
    root = write_ogb(tmp_path / "ogbn_toy")
    write_csv_gz(root / "split/other/train.csv.gz", [[0]])
    with gzip.open(root / "raw/node-label.csv.gz", "wt") as f:   # "nan" spelled out works too
        f.write("0\n1\n2\nnan\n1\n2\n0\n1\n")
    with pytest.raises(UserError, match="missing file .*other/valid.csv.gz"):
        load_ogb_raw(root, split="other")
    g = load_ogb_raw(root, split="time")
    assert g.train_idx.tolist() == [0, 1, 2] and g.labels[3] == -1


def test_load_ogb_raw_bounded_equals_in_memory(tmp_path):
    """The edges streamed through sorted runs (a 1 KiB sort budget beside the per-node arrays: a run every
    few edges) give the in-memory CSR exactly; the runs are gone and the neighbour file is in the workdir."""
    root = write_ogb(tmp_path / "ogbn_toy")
    work = tmp_path / "work"
    work.mkdir()
    bounded = load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "fb", prepare_memory=NODE_BYTES * N + 1024, workdir=work)
    plain = load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "fp")
    for k in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(np.asarray(getattr(bounded, k)), getattr(plain, k)), k
    assert np.asarray(bounded.indices).dtype == plain.indices.dtype
    assert [p.suffix for p in work.iterdir()] == [".bin"]


# --- OGB binary layout (ogbn-papers100M: raw/data.npz + raw/node-label.npz) -------------------------

def write_ogb_binary(root, compressed=False, pairs=False, **override):
    """ogbn-papers100M's raw layout at toy size: data.npz (edge_index [2, E] int64, node_feat [N, D]
    float32, node_year, num_nodes_list, num_edges_list), node-label.npz (node_label [N, 1] float32, NaN
    unlabelled), split/time/*.csv.gz."""
    raw = root / "raw"
    raw.mkdir(parents=True)
    edge_index = np.array([SRC, DST], np.int64)
    arrays = {"edge_index": edge_index.T.copy() if pairs else edge_index, "node_feat": features(),
              "node_year": np.arange(N, dtype=np.int64).reshape(-1, 1) + 2000,
              "num_nodes_list": np.array([N], np.int64), "num_edges_list": np.array([len(SRC)], np.int64)}
    arrays.update(override)
    (np.savez_compressed if compressed else np.savez)(raw / "data.npz", **arrays)
    np.savez_compressed(raw / "node-label.npz", node_label=np.array(OGB_LABELS, np.float32).reshape(-1, 1))
    for s, ids in OGB_SPLITS.items():
        write_csv_gz(root / "split" / "time" / f"{s}.csv.gz", np.array(ids).reshape(-1, 1))
    return root


@pytest.mark.parametrize("compressed, pairs", [(False, False), (True, False), (False, True)])
def test_load_ogb_binary_layout_equals_the_csv_layout(tmp_path, compressed, pairs):
    """The same graph in both layouts loads the same, streamed in chunks of 3 edges and through sorted runs
    under a 1 KiB sort budget; uncompressed features are memory-mapped inside data.npz, not copied."""
    csv = load_ogb_raw(write_ogb(tmp_path / "csv" / "ogbn_toy"), chunk_rows=3, feature_dir=tmp_path / "f")
    root = write_ogb_binary(tmp_path / "bin" / "ogbn_toy", compressed=compressed, pairs=pairs)
    work = tmp_path / "work"
    work.mkdir()
    for g in (load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "fb"),
              load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "fb2", prepare_memory=NODE_BYTES * N + 1024, workdir=work)):
        assert g.info["layout"] == "binary" and g.name == "ogbn_toy" and g.info["unlabelled_dropped_from_splits"] == 1
        for k in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
            assert np.array_equal(np.asarray(getattr(g, k)), getattr(csv, k)), k
        assert isinstance(g.features, np.memmap) and np.array_equal(g.features, csv.features)
        in_place = g.info["feature_file"] == str(root / "raw" / "data.npz")
        assert in_place == (not compressed)                 # compressed members are streamed to a .npy


def test_prepare_converts_the_papers100m_layout_with_the_bounded_path(tmp_path):
    """`oocgnn prepare` of the binary layout under --prepare-memory (its bounded path) writes the store the in-memory path
    writes, byte for byte, and it opens."""
    from oocgnn.cli import main
    from oocgnn.store import open_store
    from oocgnn.storemeta import DATA_FILES
    root = write_ogb_binary(tmp_path / "ogbn_papers100M")
    for memory, out in (("0", "mem"), ("1MiB", "bounded")):
        assert main(["prepare", str(root), "--out", str(tmp_path / out), "--prepare-memory", memory, "--quiet"]) in (0, None)
    for f in DATA_FILES:
        assert (tmp_path / "mem" / f).read_bytes() == (tmp_path / "bounded" / f).read_bytes(), f
    store = open_store(tmp_path / "bounded")
    assert (store.num_nodes, store.num_edges, store.feat_dim) == (N, csv_edges(), features().shape[1])


def csv_edges():
    return int(csr_from_edges(np.array(SRC), np.array(DST), N)[0][-1])


@pytest.mark.parametrize("mutate, message", [
    (lambda r: (write_ogb_binary(r) / "raw/node-label.npz").unlink(), r"missing file .*node-label.npz"),
    (lambda r: write_ogb_binary(r, num_nodes_list=np.array([9])), r"says \[9\] nodes"),
    (lambda r: write_ogb_binary(r, num_edges_list=np.array([3])), r"says \[3\] edges"),
    (lambda r: write_ogb_binary(r, node_feat=features(N - 1)), r"node_feat has shape \(7, 3\); expected \[8, D\]"),
    (lambda r: write_ogb_binary(r, edge_index=np.array([[0, 1], [2, N]], np.int64)), r"edge 2 .*outside 0..7"),
    (lambda r: write_ogb_binary(r, edge_index=np.zeros((3, 3), np.int64)), r"expected \[2, E\] or \[E, 2\]"),
])
def test_load_ogb_binary_errors(tmp_path, mutate, message):
    root = tmp_path / "ogbn_toy"
    mutate(root)
    with pytest.raises(UserError, match=message):
        load_ogb_raw(root, chunk_rows=3, feature_dir=tmp_path / "feat")


def test_nan_features_memory_mapped_in_place_are_refused_when_the_store_is_written(tmp_path):
    from oocgnn.storewrite import write_store
    feat = features()
    feat[5, 1] = np.nan
    g = load_ogb_raw(write_ogb_binary(tmp_path / "ogbn_toy", node_feat=feat))
    with pytest.raises(UserError, match=r"1 feature row\(s\) hold NaN .*source rows 5"):
        write_store(g, tmp_path / "store", progress=False)
    assert not (tmp_path / "store").exists()
