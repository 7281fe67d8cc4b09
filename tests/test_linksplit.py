"""Link-prediction edge splits: exact, leak-free, a function of the edge set and seed alone; link stores."""
import json
import zlib

import numpy as np
import pytest

from oocgnn.cli import main
from oocgnn.datasets import GraphData, csr_from_edges, load_npz
from oocgnn.errors import StoreError, UserError
from oocgnn.linksplit import hold_out, pair_keys, parse_edge_split
from oocgnn.store import open_store
from oocgnn.storemeta import meta_checksum
from oocgnn.storewrite import write_store

N = 300


def edges(seed=0, n=N, m=2500):
    """Random edges with repeats, both directions and self-loops."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, m), rng.integers(0, n, m)


def graph(src, dst, n=N):
    indptr, indices = csr_from_edges(src, dst, n)
    rng = np.random.default_rng(1)
    return GraphData("g", indptr, indices, rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 3, n),
                     np.arange(0, n // 10), np.arange(n // 10, n // 5), np.arange(n // 5, n // 3))


def canonical(src, dst):
    """The undirected edges {a, b}, a < b, of an edge list (self-loops dropped, repeats merged)."""
    return {(min(a, b), max(a, b)) for a, b in zip(src.tolist(), dst.tolist()) if a != b}


def entries(indptr, indices):
    """The topology's directed entries."""
    return {(v, int(u)) for v in range(len(indptr) - 1) for u in indices[indptr[v]:indptr[v + 1]]}


def as_pairs(arr):
    return [tuple(p) for p in np.asarray(arr).tolist()]


@pytest.mark.parametrize("fractions", [(0.85, 0.05, 0.10), (0.5, 0.3, 0.2)])
def test_the_split_partitions_the_canonical_edges_exactly_and_holds_out_both_directions(fractions):
    src, dst = edges()
    want = canonical(src, dst)
    g = hold_out(graph(src, dst), fractions, seed=4)
    topo = entries(g.indptr, g.indices)
    assert all((b, a) in topo for a, b in topo)                            # still symmetric
    train = {(a, b) for a, b in topo if a < b}
    val, test = as_pairs(g.links["val"]), as_pairs(g.links["test"])
    assert len(set(val)) == len(val) and len(set(test)) == len(test) and all(a < b for a, b in val + test)
    assert train | set(val) | set(test) == want
    assert not (train & set(val)) and not (train & set(test)) and not (set(val) & set(test))
    for a, b in val + test:                                                # no leak, either direction
        assert (a, b) not in topo and (b, a) not in topo
    m = len(want)
    assert (len(val), len(test)) == (round(fractions[1] * m), round(fractions[2] * m))   # exact counts
    assert g.task == "link" and not len(g.train_idx) and not len(g.val_idx) and not len(g.test_idx)
    assert g.info["link"] == {"split": "random", "fractions": list(fractions), "seed": 4}
    # the rule: in pair-key order, train, then val, then test
    pairs = np.array(sorted(want))
    order = [tuple(p) for p in pairs[np.argsort(pair_keys(pairs[:, 0], pairs[:, 1], N, 4))].tolist()]
    assert set(order[:len(train)]) == train and set(order[len(train) + len(val):]) == set(test)


def test_the_split_is_a_function_of_the_edge_set_and_seed_alone(tmp_path):
    """Edge order, repeats and direction in the source, the chunking of the passes and files versus RAM change
    nothing; another seed changes the split."""
    src, dst = edges()
    base = hold_out(graph(src, dst), (0.7, 0.1, 0.2), seed=9)
    perm = np.random.default_rng(5).permutation(len(src))
    flip = np.random.default_rng(6).random(len(src)) < 0.5
    s2, d2 = np.where(flip, dst, src)[perm], np.where(flip, src, dst)[perm]
    s2, d2 = np.concatenate([s2, s2[:300]]), np.concatenate([d2, d2[:300]])
    for g in (hold_out(graph(s2, d2), (0.7, 0.1, 0.2), seed=9),
              hold_out(graph(src, dst), (0.7, 0.1, 0.2), seed=9, chunk_edges=7),
              hold_out(graph(src, dst), (0.7, 0.1, 0.2), seed=9, workdir=tmp_path, chunk_edges=100)):
        for k in ("indptr", "indices"):
            assert np.array_equal(getattr(g, k), getattr(base, k)), k
        for s in ("val", "test"):
            assert np.array_equal(g.links[s], base.links[s]), s
    other = hold_out(graph(src, dst), (0.7, 0.1, 0.2), seed=10)
    assert not np.array_equal(other.links["val"], base.links["val"])


def test_the_split_is_the_same_at_any_thread_count():
    import numba
    import torch
    src, dst = edges(3)
    numba_threads, torch_threads = numba.get_num_threads(), torch.get_num_threads()
    got = []
    try:
        for t in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(t)
            torch.set_num_threads(t)
            got.append(hold_out(graph(src, dst), (0.85, 0.05, 0.1), seed=2, chunk_edges=64))
    finally:
        numba.set_num_threads(numba_threads)
        torch.set_num_threads(torch_threads)
    for s in ("val", "test"):
        assert np.array_equal(got[0].links[s], got[1].links[s])
    assert np.array_equal(got[0].indices, got[1].indices)


@pytest.mark.parametrize("spec, msg", [("0.8,0.1", "TRAIN,VAL,TEST"), ("0.8,0.3,0.1", "sum to 1.2"),
                                       ("0.9,0.1,0", "> 0"), ("a,b,c", "e.g."), ("0.8,0.1,nan", "e.g.")])
def test_bad_edge_splits_are_refused(spec, msg):
    with pytest.raises(UserError, match="bad --edge-split") as e:
        parse_edge_split(spec)
    assert msg in str(e.value)
    assert parse_edge_split("given") is None and parse_edge_split("0.6, 0.2, 0.2") == (0.6, 0.2, 0.2)


def test_too_few_edges_and_a_second_split_are_refused():
    with pytest.raises(UserError, match="every part needs one"):
        hold_out(graph(np.array([0, 1, 2]), np.array([1, 2, 3]), n=5), (0.85, 0.05, 0.1))
    g = hold_out(graph(*edges()), (0.8, 0.1, 0.1))
    with pytest.raises(UserError, match="its own edge split"):
        hold_out(g, (0.8, 0.1, 0.1))


def test_a_given_split_is_removed_from_the_topology_in_both_directions():
    src, dst = edges()
    g = graph(src, dst)
    topo = entries(g.indptr, g.indices)
    inside = sorted(p for p in topo if p[0] < p[1])[:5]
    val = np.array([(b, a) for a, b in inside[:3]] + [(0, 0)])          # reversed, and a self-loop
    test = np.array(inside[3:] + [(7, 299)] if (7, 299) not in topo else inside[3:])
    held = hold_out(GraphData(**{**g.__dict__, "links": {"val": val, "test": test}}))
    after = entries(held.indptr, held.indices)
    assert after == {(a, b) for a, b in topo if (min(a, b), max(a, b)) not in set(inside)}
    assert held.info["link"] == {"split": "given", "removed_from_topology": 5}
    assert np.array_equal(held.links["val"], val) and np.array_equal(held.links["test"], test)   # as given


# --- link stores ---------------------------------------------------------------------------------

@pytest.fixture
def link_store(tmp_path):
    g = hold_out(graph(*edges()), (0.8, 0.1, 0.1), seed=1)
    order = np.random.default_rng(2).permutation(N)
    return g, write_store(g, tmp_path / "s", order=order, part_offsets=[0, 100, N], progress=False)


def test_a_link_store_holds_the_held_out_edges_in_store_ids(link_store):
    g, s = link_store
    assert s.task == "link" and s.meta["link"]["train"] == g.num_edges // 2 == s.num_edges // 2
    assert s.meta["link"]["split"] == "random" and s.meta["link"]["negatives"] == "none"
    assert s.meta["num_classes"] == 3 and s.meta["splits"] == {"train": 0, "val": 0, "test": 0}
    orig = s.orig_ids
    topo = {(int(orig[v]), int(orig[u])) for v, u in entries(s.indptr, s.indices)}
    assert topo == entries(g.indptr, g.indices)
    for split in ("val", "test"):
        pairs = s.link_edges(split)
        assert pairs.dtype == np.int64 and pairs.shape == g.links[split].shape
        assert np.array_equal(orig[pairs], g.links[split])
        assert s.link_negatives(split) is None
    with pytest.raises(UserError, match="no held-out 'train'"):
        s.link_edges("train")
    summary = s.summary()
    assert summary["task"] == "link" and summary["link_val_edges"] == len(g.links["val"])
    assert open_store(s.path, verify="full").task == "link"


def test_training_edges_train_in_a_fixed_coin_flip_direction_the_same_under_any_relabelling(link_store, tmp_path):
    """`Store.train_edges`: every training pair once, its direction a coin fixed per pair by its original ids
    (`linksplit.train_directions`), not by store id: in store-id order partition 0's nodes would be the sources
    (the side a batch does not corrupt) of nearly all their edges and the last partition's of none. Another
    relabelling of the same split (another order and parts) trains the same directed pairs."""
    g, s = link_store
    e, orig = s.train_edges, s.orig_ids
    assert e.shape == (g.num_edges // 2, 2) and e.dtype == np.int64
    undirected = {(min(a, b), max(a, b)) for a, b in as_pairs(orig[e])}
    assert len(undirected) == len(e) and all(p in entries(g.indptr, g.indices) for p in undirected)
    assert 0.45 < (e[:, 0] < e[:, 1]).mean() < 0.55                        # not store-id order
    part = np.searchsorted(s.part_offsets, np.arange(N), side="right") - 1
    sources = np.bincount(part[e[:, 0]], minlength=2) / np.bincount(part[e].ravel(), minlength=2)
    assert (np.abs(sources - 0.5) < 0.05).all(), sources                     # each partition's nodes: half sources
    other = write_store(g, tmp_path / "other", order=np.random.default_rng(9).permutation(N),
                        part_offsets=[0, 50, 170, N], progress=False)
    assert set(as_pairs(other.orig_ids[other.train_edges])) == set(as_pairs(orig[e]))


def _rewrite_meta(path, edit):
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    meta["checksum"] = meta_checksum(meta)
    (path / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "link_val.npy").unlink(), "missing file link_val.npy"),
    (lambda p: _rewrite_meta(p, lambda m: m["link"].update(val=m["link"]["val"] + 1)), "link_val.npy has shape"),
    (lambda p: _rewrite_meta(p, lambda m: m["link"].update(train=1)), "training edges"),
    (lambda p: _rewrite_meta(p, lambda m: m.pop("link")), "no 'link' record"),
    (lambda p: _rewrite_meta(p, lambda m: m.update(task="graph")), "task 'graph'"),
    (lambda p: _rewrite_meta(p, lambda m: m["files"].pop("link_test.npy")), "link_test.npy"),
    (lambda p: _rewrite_meta(p, lambda m: m["link"].update(negatives="pairs")), "val_negatives"),
])
def test_a_damaged_link_store_is_refused(link_store, damage, message):
    _, s = link_store
    damage(s.path)
    with pytest.raises(StoreError, match="store") as e:
        open_store(s.path)
    assert message in str(e.value)


def test_a_held_out_id_out_of_range_is_caught_when_the_files_are_checked(link_store):
    _, s = link_store
    pairs = np.load(s.path / "link_test.npy")
    pairs[3, 1] = N + 7
    np.save(s.path / "link_test.npy", pairs)
    _rewrite_meta(s.path, lambda m: m["files"]["link_test.npy"].update(
        crc32=zlib.crc32((s.path / "link_test.npy").read_bytes())))
    with pytest.raises(StoreError, match="link_test.npy holds a node id outside"):
        open_store(s.path)
    assert open_store(s.path, verify=False).task == "link"      # sizes and shapes only


def test_force_replaces_a_link_store(link_store):
    g, s = link_store
    write_store(graph(*edges()), s.path, force=True, progress=False)
    t = open_store(s.path)
    assert t.task == "node" and not (s.path / "link_val.npy").exists()


# --- prepare --task link ---------------------------------------------------------------------------

def test_prepare_link_on_the_tiny_preset_partitions_the_training_topology_only(tmp_path, monkeypatch):
    """The partitioner is given the training topology (no held-out edge): what it sees is the store's
    topology before relabelling."""
    from oocgnn import partition as part
    from oocgnn.csrsource import CSRSource
    seen = []
    real = part.partition

    def spy(source, *a, **kw):
        csr = CSRSource.of(source)
        seen.append(entries(csr.indptr, csr.indices()))
        return real(source, *a, **kw)
    monkeypatch.setattr(part, "partition", spy)
    out = tmp_path / "tiny-link"
    assert main(["prepare", "synthetic", "--preset", "tiny", "--task", "link", "--partitioner", "fennel", "--parts",
                 "4", "--seed", "2", "--out", str(out), "--quiet"]) == 0
    s = open_store(out)
    orig = s.orig_ids
    held = {(int(a), int(b)) for split in ("val", "test") for a, b in orig[s.link_edges(split)]}
    assert len(seen) == 1 and seen[0] == {(int(orig[v]), int(orig[u])) for v, u in entries(s.indptr, s.indices)}
    assert not any(p in seen[0] or p[::-1] in seen[0] for p in held)
    link = s.meta["link"]
    m = link["train"] + link["val"] + link["test"]
    assert (link["val"], link["test"]) == (round(0.05 * m), round(0.1 * m)) and link["seed"] == 2
    assert s.meta["source"]["partition"]["method"] == "fennel"


def test_prepare_link_writes_the_same_store_in_memory_and_under_a_memory_bound(tmp_path):
    stores = {}
    for mem in ("0", "1MiB"):
        stores[mem] = tmp_path / f"m{mem}"
        assert main(["prepare", "synthetic", "--preset", "tiny", "--task", "link", "--edge-split", "0.7,0.1,0.2",
                     "--prepare-memory", mem, "--out", str(stores[mem]), "--quiet"]) == 0
    files = sorted(p.name for p in stores["0"].iterdir())
    assert "link_val.npy" in files and files == sorted(p.name for p in stores["1MiB"].iterdir())
    for f in files:
        if f not in ("meta.json", ".verified.json"):
            assert (stores["0"] / f).read_bytes() == (stores["1MiB"] / f).read_bytes(), f


def test_prepare_link_on_an_npz_without_labels(tmp_path):
    src, dst = edges(7)
    np.savez(tmp_path / "g.npz", src=src, dst=dst, feat=np.ones((N, 3), np.float32))
    with pytest.raises(UserError, match="missing key"):
        load_npz(tmp_path / "g.npz")                                       # node classification needs labels
    out = tmp_path / "s"
    assert main(["prepare", str(tmp_path / "g.npz"), "--task", "link", "--edge-split", "0.6,0.2,0.2", "--seed", "5",
                 "--partitioner", "random", "--parts", "3", "--out", str(out), "--quiet"]) == 0
    s = open_store(out)
    assert s.num_classes == 0 and (s.labels == -1).all() and s.meta["link"]["fractions"] == [0.6, 0.2, 0.2]
    want = hold_out(load_npz(tmp_path / "g.npz", task="link"), (0.6, 0.2, 0.2), seed=5)
    for split in ("val", "test"):
        assert np.array_equal(s.orig_ids[s.link_edges(split)], want.links[split])


@pytest.mark.parametrize("extra, message", [
    (["--edge-split", "0.8,0.1,0.1"], "--edge-split applies to --task link"),
    (["--task", "link", "--edge-split", "0.8,0.3,0.1"], "bad --edge-split"),
    (["--task", "link", "--edge-split", "given"], "no edge split of its own"),
    (["--task", "link", "--split", "random:0.1,0.1,0.8"], "--split cuts labelled nodes"),
    (["--task", "link", "--shards", "2", "--partitioner", "random", "--parts", "2"], "--shards"),
])
def test_prepare_link_refuses_what_a_link_store_cannot_be(tmp_path, capsys, extra, message):
    out = tmp_path / "s"
    assert main(["prepare", "synthetic", "--preset", "tiny", "--out", str(out), "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err and not out.exists()


# --- OGB ogbl-* raw layout ---------------------------------------------------------------------------

def write_ogbl(root, form="edge", negatives=True, features=True, binary=False):
    """An ogbl-style dir: raw/edge.csv.gz (the training graph), node-feat, num-node-list, num-edge-list (or
    their binary layout, raw/data.npz, as ogbl-vessel's) and split/time/{train,valid,test}.pt; one validation
    pair is also in the raw graph (as in ogbl-collab)."""
    import gzip
    import torch
    raw, rng = root / "raw", np.random.default_rng(12)
    src, dst = edges(11)
    raw.mkdir(parents=True)
    feat = rng.standard_normal((N, 3)).round(3)
    if binary:
        np.savez(raw / "data.npz", edge_index=np.stack([src, dst]), node_feat=feat.astype(np.float32),
                 num_nodes_list=np.array([N]), num_edges_list=np.array([len(src)]))
    for name, rows in () if binary else (("edge", np.stack([src, dst], 1)), ("num-node-list", [[N]]),
                                         ("num-edge-list", [[len(src)]]), *((("node-feat", feat),) if features else ())):
        with gzip.open(raw / f"{name}.csv.gz", "wt") as f:
            f.write("".join(",".join(map(str, r)) + "\n" for r in np.asarray(rows).tolist()))
    raw_pairs = canonical(src, dst)
    fresh = [(a, b) for a, b in zip(*rng.integers(0, N, (2, 400)).tolist()) if a != b and (min(a, b), max(a, b))
             not in raw_pairs][:30]
    held = {"valid": np.array(fresh[:12] + [(int(src[0]), int(dst[0]))]), "test": np.array(fresh[12:])}
    split = root / "split" / "time"
    split.mkdir(parents=True)
    for name, pos in {"train": np.stack([src, dst], 1), **held}.items():
        pos = torch.from_numpy(pos)
        if form == "edge":
            d = {"edge": pos, **({"edge_neg": torch.randint(0, N, (20, 2))} if negatives and name != "train" else {})}
        elif form == "citation":
            d = {"source_node": pos[:, 0], "target_node": pos[:, 1],
                 **({"target_node_neg": torch.randint(0, N, (len(pos), 5))} if negatives and name != "train" else {})}
        else:
            d = {"head": pos[:, 0], "relation": torch.zeros(len(pos), dtype=torch.int64), "tail": pos[:, 1]}
        torch.save(d, split / f"{name}.pt")
    return root, src, dst, held


@pytest.mark.parametrize("form, negatives, binary", [("edge", "pairs", False), ("citation", "targets", False),
                                                     ("edge", "none", False), ("edge", "pairs", True)])
def test_an_ogbl_dir_loads_with_its_given_split_held_out(tmp_path, form, negatives, binary):
    import torch
    from oocgnn.prepare import load_source
    from oocgnn.ogbraw import load_ogb_raw
    root, src, dst, held = write_ogbl(tmp_path / "ogbl_toy", form, negatives != "none", binary=binary)
    g = load_source(tmp_path, task="link")
    assert g.task == "link" and g.num_classes == 0 and (g.labels == -1).all() and g.feat_dim == 3
    assert g.info["link"] == {"source_split": "time", "negatives": negatives, "split": "given",
                              "removed_from_topology": 1}
    assert np.array_equal(g.links["val"], held["valid"]) and np.array_equal(g.links["test"], held["test"])
    given = {k: torch.load(root / "split" / "time" / f"{k}.pt") for k in ("valid", "test")}
    if negatives != "none":
        key = "edge_neg" if form == "edge" else "target_node_neg"
        assert np.array_equal(g.links["val_neg"], given["valid"][key].numpy())
    held_pairs = {(min(a, b), max(a, b)) for s in ("valid", "test") for a, b in held[s].tolist()}
    want = {(a, b) for a, b in canonical(src, dst) if (a, b) not in held_pairs}
    assert entries(g.indptr, g.indices) == want | {(b, a) for a, b in want}
    bounded = load_ogb_raw(root, task="link", prepare_memory=1 << 20, workdir=tmp_path, chunk_rows=100)
    assert np.array_equal(bounded.indices, g.indices) and np.array_equal(bounded.indptr, g.indptr)

    out = tmp_path / "store"
    assert main(["prepare", str(root), "--task", "link", "--partitioner", "random", "--parts", "3", "--out", str(out),
                 "--quiet"]) == 0
    s = open_store(out, verify="full")
    assert s.meta["link"]["negatives"] == negatives and s.meta["link"]["removed_from_topology"] == 1
    for split in ("val", "test"):
        assert np.array_equal(s.orig_ids[s.link_edges(split)], g.links[split])
        neg = s.link_negatives(split)
        assert (neg is None) == (negatives == "none")
        if neg is not None:
            assert np.array_equal(s.orig_ids[neg], g.links[f"{split}_neg"])


@pytest.mark.parametrize("case, message", [
    ("kg", "knowledge graph"), ("no features", "no node-feat.csv.gz"), ("task node", "prepare it with --task link"),
    ("fractions", "has its own edge split"),
])
def test_what_an_ogbl_dir_cannot_give_is_refused(tmp_path, capsys, case, message):
    root, *_ = write_ogbl(tmp_path / "ogbl_toy", "kg" if case == "kg" else "edge", features=case != "no features")
    extra = {"task node": [], "fractions": ["--task", "link", "--edge-split", "0.8,0.1,0.1"]}.get(case,
                                                                                                ["--task", "link"])
    assert main(["prepare", str(root), "--out", str(tmp_path / "s"), "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_an_ogbn_dir_with_task_link_is_split_at_random(tmp_path):
    from tests.test_ogbraw import write_ogb
    root = write_ogb(tmp_path / "ogbn_toy")
    out = tmp_path / "s"
    assert main(["prepare", str(root), "--task", "link", "--edge-split", "0.5,0.25,0.25", "--out", str(out),
                 "--quiet"]) == 0
    s = open_store(out)
    assert s.meta["link"]["split"] == "random" and s.meta["link"]["val"] >= 1 and s.num_classes == 3
