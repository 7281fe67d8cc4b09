"""Partitioners, their quality report and cache, the partition-ordered store, the static-cache analysis."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

from oocgnn import partition as P
from oocgnn.cli import main
from oocgnn.datasets import GraphData, csr_from_edges
from oocgnn.errors import UserError
from oocgnn.partition import (PARTITIONERS, megabatch_of_part, order_from_assignment, partition,
                              quality)
from oocgnn.staticcache import megabatch_degree_analysis, static_cache_candidates
from oocgnn.storewrite import write_store

K = 8


@pytest.fixture(scope="module")
def tiny_parts(tiny_data):
    """method -> (assignment, report) for K parts of the tiny community graph."""
    return {m: partition(tiny_data, m, K, cache_dir=False) for m in PARTITIONERS}


def _hand_graph():
    """Two triangles joined by an edge, a pendant node and an isolated node (8 nodes)."""
    edges = [(0, 1), (1, 2), (0, 2), (2, 3), (3, 4), (4, 5), (3, 5), (5, 6)]
    src, dst = np.array(edges).T
    indptr, indices = csr_from_edges(src, dst, 8)
    return indptr, indices, np.array([0, 1, 3, 5, 6])


@pytest.mark.parametrize("method", sorted(PARTITIONERS))
def test_every_partitioner_returns_k_nonempty_parts(tiny_data, tiny_parts, method):
    a, report = tiny_parts[method]
    assert a.shape == (tiny_data.num_nodes,) and a.dtype == np.int32
    assert a.min() == 0 and a.max() == K - 1
    assert len(np.unique(a)) == K
    row = report.iloc[0]
    assert len(report) == 1 and row.method == method and row.parts == K and row.nonempty_parts == K
    for col in ("edge_cut", "size_balance", "train_balance", "nbr_in_part", "nbr_in_megabatch",
                "seconds", "peak_rss"):
        assert np.isfinite(row[col]), col
    assert row.size_balance <= 1.1 + 1e-9 and row.train_balance < 1.5


def test_fennel_respects_its_caps(tiny_data):
    n, t = tiny_data.num_nodes, len(tiny_data.train_idx)
    for k, passes in ((K, 1), (K, 3), (37, 1)):
        a, _ = partition(tiny_data, "fennel", k, passes=passes, cache_dir=False)
        assert np.bincount(a, minlength=k).max() <= P.FENNEL_NU * n / k
        assert np.bincount(a[tiny_data.train_idx], minlength=k).max() <= P.FENNEL_NU * t / k
        assert len(np.unique(a)) == k


def test_restreaming_does_not_worsen_the_cut(tiny_data, tiny_parts):
    _, one = tiny_parts["fennel"]
    _, three = partition(tiny_data, "fennel", K, passes=3, cache_dir=False)
    assert three.edge_cut.item() <= one.edge_cut.item()


def test_metis_and_fennel_cut_far_fewer_edges_than_random(tiny_parts):
    cut = {m: r.edge_cut.item() for m, (_, r) in tiny_parts.items()}
    assert cut["random"] > 0.8                       # ~ 1 - 1/K on any graph
    assert cut["metis"] < 0.6 * cut["random"]
    assert cut["fennel"] < 0.75 * cut["random"]
    # random parts keep ~1/K of the neighbours, a mega-batch of n_d random parts ~n_d/K
    _, r = tiny_parts["random"]
    assert abs(r.nbr_in_part.item() - 1 / K) < 0.03


def test_quality_matches_brute_force():
    indptr, indices, train = _hand_graph()
    a = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    k, n_d, seed = 3, 2, 5
    q = quality(indptr, indices, a, train, n_d=n_d, seed=seed)
    nbrs = [indices[indptr[v]:indptr[v + 1]].tolist() for v in range(8)]
    mb_of_part = {}
    for i, p in enumerate(np.random.default_rng(seed).permutation(k)):
        mb_of_part[p] = i // n_d
    cut = sum(a[u] != a[v] for u in range(8) for v in nbrs[u]) / len(indices)
    in_part = [sum(a[u] == a[v] for u in nbrs[v]) / len(nbrs[v]) for v in range(8) if nbrs[v]]
    in_mb = [sum(mb_of_part[a[u]] == mb_of_part[a[v]] for u in nbrs[v]) / len(nbrs[v])
             for v in range(8) if nbrs[v]]
    assert q["edge_cut"] == pytest.approx(cut) and q["edge_cut"] == pytest.approx(4 / 16)
    assert q["nbr_in_part"] == pytest.approx(np.mean(in_part))
    assert q["nbr_in_megabatch"] == pytest.approx(np.mean(in_mb))
    assert q["size_balance"] == pytest.approx(3 / (8 / 3))
    assert q["train_balance"] == pytest.approx(2 / (5 / 3))          # parts hold 2, 2, 1 training nodes
    assert (q["parts"], q["nonempty_parts"], q["nodes"], q["edges"]) == (3, 3, 8, 16)


def test_order_from_assignment_is_stable():
    order, off = order_from_assignment(np.array([2, 0, 2, 1, 0]), parts=4)
    assert order.tolist() == [1, 4, 3, 0, 2] and off.tolist() == [0, 2, 3, 5, 5]


@pytest.mark.parametrize("method", ["metis", "fennel"])
def test_partition_ordered_store_reads_each_part_in_one_range(tiny_data, tiny_parts, tmp_path, method):
    a, _ = tiny_parts[method]
    order, offsets = order_from_assignment(a, K)
    store = write_store(tiny_data, tmp_path / "s", order=order, part_offsets=offsets,
                        partitioner=method, progress=False)
    assert store.num_parts == K and store.meta["partitioner"] == method
    assert np.array_equal(store.part_offsets, offsets) and offsets[-1] == tiny_data.num_nodes
    orig, sip = store.orig_ids, store.indptr
    itemsize = np.dtype(store.meta["index_dtype"]).itemsize
    with store.reader("direct") as reader:
        for k in range(K):
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            assert np.all(a[orig[lo:hi]] == k), "every node lies in its declared part"
            before = reader.stats.requests
            feats = reader.read_range(lo, hi)
            assert reader.stats.requests - before == 1
            np.testing.assert_array_equal(feats, tiny_data.features[orig[lo:hi]])
            # the part's edge lists: one contiguous read of indices.bin
            nbrs = np.fromfile(store.path / "indices.bin", dtype=store.meta["index_dtype"],
                               count=int(sip[hi] - sip[lo]), offset=int(sip[lo]) * itemsize)
            src = orig[np.repeat(np.arange(lo, hi), np.diff(sip[lo:hi + 1]))]
            got = np.sort(src * tiny_data.num_nodes + orig[nbrs])
            srcs = orig[lo:hi]
            deg = tiny_data.indptr[srcs + 1] - tiny_data.indptr[srcs]
            want_dst = np.concatenate([tiny_data.indices[tiny_data.indptr[v]:tiny_data.indptr[v + 1]]
                                       for v in srcs])
            want = np.sort(np.repeat(srcs, deg) * tiny_data.num_nodes + want_dst)
            np.testing.assert_array_equal(got, want)
    assert np.array_equal(store.labels, tiny_data.labels[orig])


def test_cache_is_reused_and_keyed_by_the_graph(tiny_data, tiny_store, tmp_path, monkeypatch):
    a1, r1 = partition(tiny_data, "fennel", K, cache_dir=tmp_path)
    files = list(tmp_path.glob("synthetic-fennel-k8-s0-*.npz"))
    assert len(files) == 1 and not r1.cached.item()

    def boom(*args):
        raise AssertionError("recomputed instead of reusing the cache")
    monkeypatch.setitem(PARTITIONERS, "fennel", boom)
    a2, r2 = partition(tiny_data, "fennel", K, cache_dir=tmp_path)
    assert r2.cached.item() and np.array_equal(a1, a2)
    assert r2.drop(columns="cached").equals(r1.drop(columns="cached"))
    _, r4 = partition(tiny_data, "fennel", K, cache_dir=tmp_path, n_d=2)   # report re-measured only
    assert r4.cached.item() and r4.n_d.item() == 2 and r4.seconds.item() == r1.seconds.item()
    # the identity-ordered store holds the same CSR and training set: same fingerprint
    a3, r3 = partition(tiny_store, "fennel", K, cache_dir=tmp_path)
    assert r3.cached.item() and np.array_equal(a1, a3)
    # another training set is another key
    other = GraphData(tiny_data.name, tiny_data.indptr, tiny_data.indices, tiny_data.features,
                      tiny_data.labels, tiny_data.train_idx[1:], tiny_data.val_idx, tiny_data.test_idx)
    with pytest.raises(AssertionError, match="recomputed"):
        partition(other, "fennel", K, cache_dir=tmp_path)


def test_fennel_streams_the_store_like_the_array(tiny_data, tiny_store, tiny_parts, monkeypatch):
    import oocgnn.csrsource as C
    monkeypatch.setattr(C, "CHUNK_EDGES", 1000)    # many chunks from indices.bin
    assert len(list(C.CSRSource.of(tiny_store).chunks())) > 10
    a, _ = partition(tiny_store, "fennel", K, cache_dir=False)
    assert np.array_equal(a, tiny_parts["fennel"][0])


@pytest.mark.parametrize("method, parts, msg", [
    ("kahip", 4, "unknown partitioner 'kahip'"), ("metis", 0, "parts must be in 1..8"),
    ("fennel", 9, "parts must be in 1..8")])
def test_bad_arguments_are_user_errors(method, parts, msg):
    indptr, indices, train = _hand_graph()
    g = GraphData("hand", indptr, indices, np.zeros((8, 2), np.float32), np.zeros(8, np.int64),
                  train, np.empty(0, np.int64), np.empty(0, np.int64))
    with pytest.raises(UserError, match=msg):
        partition(g, method, parts, cache_dir=False)


# --------------------------------------------------------------------------------------------- static cache

def test_static_cache_candidates_are_top_degree():
    deg = np.array([3, 9, 1, 9, 4, 0, 7, 2, 5, 6])
    assert static_cache_candidates(deg, 0.3).tolist() == [1, 3, 6]
    assert static_cache_candidates(deg, 0.0).tolist() == []


def _delta_brute(adj, mbs, static):
    """Σ_epochs Σ_i Δ(C_D^(i), C_S) straight from HierBatching Eq. 1–2."""
    total = 0
    for mb in mbs:
        for i in np.unique(mb):
            cd = mb == i
            total += adj[cd][:, cd | static].sum() - adj[cd][:, cd].sum()
    return int(total)


def test_megabatch_analysis_against_brute_force():
    rng = np.random.default_rng(3)
    n, parts, n_d, r_s, seed, epochs = 12, 6, 2, 0.25, 7, 2
    src, dst = rng.integers(0, n, 30), rng.integers(0, n, 30)
    indptr, indices = csr_from_edges(src, dst, n)
    adj = np.zeros((n, n), np.int64)
    adj[np.repeat(np.arange(n), np.diff(indptr)), indices] = 1
    a = np.arange(n) % parts
    buckets, pol = megabatch_degree_analysis(indptr, indices, a, n_d, r_s, seed=seed, epochs=epochs)
    sched = np.random.default_rng(seed)
    mbs = [megabatch_of_part(parts, n_d, sched)[a] for _ in range(epochs)]
    pol = pol.set_index("policy")
    k = int(r_s * n)
    best = max(_delta_brute(adj, mbs, np.isin(np.arange(n), s))
               for s in itertools.combinations(range(n), k))
    assert pol.loc["eq3_optimum", "gain"] == best, "Eq. 3 is the exact optimum for the schedule"
    deg_static = np.isin(np.arange(n), static_cache_candidates(np.diff(indptr), r_s))
    assert pol.loc["degree", "gain"] == _delta_brute(adj, mbs, deg_static)
    assert pol.loc["none", "without"] == sum(int(adj[mb[:, None] == mb[None, :]].sum()) for mb in mbs)
    for name, row in pol.iterrows():
        assert row.gain == row.gain_eq5 and row.retained == row.without + row.gain_eq5, name
    # the buckets split every node's full degree into before + gain + loss
    for name, b in buckets.groupby("policy"):
        assert b.nodes.sum() == n
        assert b.deg_before.sum() + b.gain.sum() + b.loss.sum() == pytest.approx(len(indices))
        assert b.gain.sum() == pytest.approx(pol.loc[name, "gain"] / epochs)


@pytest.mark.parametrize("method", ["metis", "random"])
def test_eq5_identity_and_policy_order_on_tiny(tiny_data, tiny_parts, method):
    a, _ = tiny_parts[method]
    buckets, pol = megabatch_degree_analysis(tiny_data.indptr, tiny_data.indices, a, n_d=2, r_s=0.02,
                                             seed=0, epochs=2)
    pol = pol.set_index("policy")
    assert (pol.retained == pol.without + pol.gain_eq5).all() and (pol.gain == pol.gain_eq5).all()
    g = pol.gain
    assert g["eq3_optimum"] >= g["degree"] >= g["random"] and g["degree"] > 2 * g["random"]
    assert pol.loc["degree", "vs_optimum"] > 0.9
    assert list(buckets.bucket.unique()) == ["0-5", "5-10", "10-20", "20-50", ">50"]
    if method == "random":   # no locality: a mega-batch keeps ~n_d/K of the edges (§8.5: = r_d)
        assert abs(pol.loc["none", "without_frac"] - 2 / K) < 0.02


# --------------------------------------------------------------------------------------------- CLI

def test_cli_prepare_partitioned_store_and_info(tmp_path):
    env = {**os.environ, "OOCGNN_PARTITION_CACHE": str(tmp_path / "cache")}
    store = tmp_path / "s"
    run = lambda *a: subprocess.run([sys.executable, "-m", "oocgnn", *map(str, a)],  # noqa: E731
                                    capture_output=True, text=True, timeout=300, env=env)
    r = run("prepare", "synthetic", "--preset", "tiny", "--partitioner", "fennel", "--parts", 8,
            "--out", store, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "edge_cut" in r.stdout and "fennel" in r.stdout
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1
    r = run("info", store)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert lines["parts"].strip() == "8" and lines["partitioner"].strip() == "fennel"
    assert float(lines["partition_edge_cut"]) < 0.7


@pytest.mark.parametrize("args, msg", [
    (["--partitioner", "kahip"], "unknown partitioner 'kahip'"),
    (["--partitioner", "metis", "--parts", "0"], "parts must be >= 1"),
    (["--partitioner", "random", "--parts", "5001"], "parts must be in 1..5,000"),
])
def test_cli_bad_partitioner_or_parts_exit_2(args, msg, tmp_path, capsys):
    rc = main(["prepare", "synthetic", "--preset", "tiny", "--out", str(tmp_path / "s"), "--quiet", *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "s").exists()


def test_partitioned_store_is_reused_only_when_it_matches(tmp_path, tiny_data, monkeypatch):
    from oocgnn import partition as P
    s = P.partitioned_store(tiny_data, tmp_path / "s", "fennel", 8, cache_dir=False)
    assert s.num_parts == 8 and s.meta["partitioner"] == "fennel"
    monkeypatch.setattr(P, "write_store", None, raising=False)        # a rewrite would fail below
    calls = []
    monkeypatch.setattr(P, "partition", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    assert P.partitioned_store(tiny_data, tmp_path / "s", "fennel", 8).num_parts == 8 and not calls
    monkeypatch.undo()
    assert P.partitioned_store(tiny_data, tmp_path / "s", "fennel", 4, cache_dir=False).num_parts == 4
