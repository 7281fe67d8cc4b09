"""Tests of the graph sources: canonical CSR, the .npz loader, `load_source` (OGB raw dirs: test_ogbraw.py)."""
from pathlib import Path

import numpy as np
import pytest

from oocgnn.datasets import GraphData, csr_from_edges, csr_to_edges, load_npz
from oocgnn.prepare import load_source
from oocgnn.errors import UserError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"

# 8 nodes; node 6 and 7 isolated (7 only via a self-loop). Duplicates, self-loops, both directions.
N = 8
SRC = [0, 1, 1, 2, 3, 3, 0, 4, 5, 5, 2, 7, 1]
DST = [1, 0, 2, 1, 3, 4, 1, 0, 4, 4, 5, 7, 2]
LABELS = [0, 1, 2, 0, 1, 2, 0, 1]
SPLITS = {"train_idx": [0, 1, 2], "val_idx": [3, 4], "test_idx": [5, 6, 7]}


def brute_force(src, dst, n):
    """Adjacency sets: no self-loops, both directions, no duplicates."""
    adj = [set() for _ in range(n)]
    for s, d in zip(src, dst):
        if s != d:
            adj[s].add(d)
            adj[d].add(s)
    return adj


def assert_canonical(indptr, indices, src, dst, n):
    adj = brute_force(src, dst, n)
    assert indptr.dtype == np.int64 and indptr.shape == (n + 1,) and indptr[0] == 0
    assert len(indices) == indptr[-1] == sum(len(a) for a in adj)
    for v in range(n):
        row = indices[indptr[v]:indptr[v + 1]].tolist()
        assert row == sorted(adj[v]), v        # sorted, deduped, symmetric, no self-loop


def features(n=N, d=3):
    return (np.arange(n * d, dtype=np.float32).reshape(n, d) / 7).astype(np.float32)


def test_csr_from_edges_canonical():
    indptr, indices = csr_from_edges(SRC, DST, N)
    assert_canonical(indptr, indices, SRC, DST, N)
    assert indices.dtype == np.int32
    deg = np.diff(indptr)
    assert deg[6] == 0 and deg[7] == 0                 # isolated, and self-loop-only
    s, d = csr_to_edges(indptr, indices)
    assert set(zip(s.tolist(), d.tolist())) == {(a, b) for a, b in zip(d.tolist(), s.tolist())}


def test_csr_from_edges_random_against_brute_force():
    rng = np.random.default_rng(0)
    for n in (1, 5, 40):
        src, dst = rng.integers(0, n, 200), rng.integers(0, n, 200)
        assert_canonical(*csr_from_edges(src, dst, n), src.tolist(), dst.tolist(), n)
    indptr, indices = csr_from_edges([], [], 3)                # no edges at all
    assert indptr.tolist() == [0, 0, 0, 0] and len(indices) == 0


def test_csr_from_edges_rejects_bad_ids():
    with pytest.raises(UserError, match="outside"):
        csr_from_edges([0, 5], [1, 2], 5)
    with pytest.raises(UserError, match="destinations"):
        csr_from_edges([0, 1], [1], 5)


def write_npz(path, **override):
    arrays = dict(src=np.array(SRC, np.int64), dst=np.array(DST, np.int64), feat=features(),
                  label=np.array(LABELS, np.int64),
                  **{k: np.array(v, np.int64) for k, v in SPLITS.items()})
    arrays.update(override)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_load_npz(tmp_path):
    g = load_npz(write_npz(tmp_path / "toy.npz"))
    assert isinstance(g, GraphData) and g.name == "toy"
    assert_canonical(g.indptr, g.indices, SRC, DST, N)
    assert g.features.dtype == np.float32 and np.array_equal(g.features, features())
    assert g.labels.dtype == np.int64 and g.labels.tolist() == LABELS
    assert g.num_classes == 3 and g.num_nodes == N and g.feat_dim == 3
    for k, v in SPLITS.items():
        assert getattr(g, k).dtype == np.int64 and getattr(g, k).tolist() == v
    assert g.info == {"source": "npz", "path": str(tmp_path / "toy.npz"), "name": "toy", "row_normalize": False}
    assert load_source(tmp_path / "toy.npz", name="x").name == "x"


@pytest.mark.parametrize("override, message", [
    (dict(label=None), "missing key.*label"),
    (dict(train_idx=None, test_idx=None), "missing key.*train_idx, test_idx"),
    (dict(feat=features(N - 1)), "feat has 7 rows but label has 8"),
    (dict(feat=np.zeros(N, np.float32)), "feat must be a 2-D"),
    (dict(dst=np.array(DST[:-1], np.int64)), "src has 13 entries but dst has 12"),
    (dict(src=np.array(SRC, np.float64)), "src must be a 1-D integer"),
    (dict(dst=np.array(DST[:-1] + [N], np.int64)), "outside 0..7"),
    (dict(val_idx=np.array([2, 3], np.int64)), "train_idx and val_idx overlap"),
    (dict(test_idx=np.array([5, 9], np.int64)), "test_idx holds node ids outside"),
    (dict(label=np.array([-3] + LABELS[1:], np.int64)), "labels must be 0..C-1"),
])
def test_load_npz_errors(tmp_path, override, message):
    path = write_npz(tmp_path / "bad.npz", **override)
    with pytest.raises(UserError, match=message):
        load_npz(path)


def test_load_npz_not_an_npz(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_npz(tmp_path / "nope.npz")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(UserError, match="not a readable .npz"):
        load_npz(tmp_path / "text.npz")
    np.save(tmp_path / "arr.npy", np.zeros(3))
    with pytest.raises(UserError, match="not an .npz archive"):
        load_npz(tmp_path / "arr.npy")


def test_load_source_rejects_unknown(tmp_path):
    with pytest.raises(UserError, match="does not exist; accepted sources: a .npz"):
        load_source(tmp_path / "missing.npz")
    (tmp_path / "graph.csv").write_text("0,1\n")
    with pytest.raises(UserError, match="not a recognised graph source.*raw/edge.csv.gz"):
        load_source(tmp_path / "graph.csv")
    with pytest.raises(UserError, match="not a recognised"):
        load_source(tmp_path)                              # a dir without any dataset
    with pytest.raises(UserError, match="only apply to OGB"):
        load_source(write_npz(tmp_path / "toy.npz"), chunk_rows=3)


# --- real data ----------------------------------------------------------------------------------

def test_real_cora():
    path = SHARED / "cora.npz"
    if not path.is_file():
        pytest.skip(f"real dataset not available: {path}")
    g = load_source(path)
    assert (g.num_nodes, g.num_edges, g.feat_dim, g.num_classes) == (2708, 10556, 1433, 7)
    assert (len(g.train_idx), len(g.val_idx), len(g.test_idx)) == (140, 500, 1000)
    assert g.features.dtype == np.float32 and g.labels.dtype == np.int64
    deg = g.degrees()
    src, dst = np.repeat(np.arange(g.num_nodes), deg), g.indices.astype(np.int64)
    assert not (src == dst).any()
    key, rkey = src * g.num_nodes + dst, dst * g.num_nodes + src
    assert np.array_equal(np.sort(key), np.sort(rkey)) and len(np.unique(key)) == len(key)


def test_load_npz_row_normalize(tmp_path):
    p = tmp_path / "n.npz"
    np.savez(p, src=np.array([0, 1]), dst=np.array([1, 2]), feat=np.array([[1, 1, 2], [0, 0, 0], [3, 0, 1]], np.float32),
             label=np.array([0, 1, 0]), train_idx=np.array([0]), val_idx=np.array([1]), test_idx=np.array([2]))
    f = load_npz(p, row_normalize=True).features
    np.testing.assert_allclose(f, [[0.25, 0.25, 0.5], [0, 0, 0], [0.75, 0, 0.25]])
