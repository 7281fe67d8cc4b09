"""Redundancy Ratio (OUTRE Eq. 2) and history reuse against brute force on a hand-drawn graph."""
import numpy as np
import pytest

from oocgnn.datasets import GraphData, csr_from_edges
from oocgnn.importance import history_nodes, importance
from oocgnn.redundancy import redundancy_ratio, redundancy_table
from oocgnn.schedules import make_schedule
from oocgnn.simulate import simulate
from oocgnn.storewrite import write_store

# A 14-ring 0-1-...-13-0 with chords 0-2, 3-9, 5-11 and 1-7, and an isolated training node 14.
EDGES = [(0, 1), (0, 2), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10),
         (10, 11), (11, 12), (12, 13), (13, 0), (3, 9), (5, 11), (1, 7)]
N, TRAIN = 15, [0, 2, 4, 6, 8, 10, 12, 14]
CASES = [("random", {"batch_size": 3}),
         ("partition", {"batch_size": 2, "n_per_macro": 1}),
         ("megabatch", {"batch_size": 2, "parts_per_megabatch": 1, "static_ratio": 0.2}),
         ("megabatch", {"batch_size": 3, "parts_per_megabatch": 2, "static_ratio": 0.2,
                        "static_scope": "all"})]


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    src, dst = np.array(EDGES).T
    indptr, indices = csr_from_edges(src, dst, N)
    data = GraphData("hand", indptr, indices, np.arange(N * 3, dtype=np.float32).reshape(N, 3),
                     np.arange(N) % 2, np.array(TRAIN), np.array([1, 3]), np.array([5, 7]))
    order = np.random.default_rng(0).permutation(N)          # store ids != drawing ids
    return write_store(data, tmp_path_factory.mktemp("rr") / "hand", order=order,
                       part_offsets=[0, 5, 9, 15], progress=False)


def _nbrs(store):
    return [set(store.indices[store.indptr[v]:store.indptr[v + 1]].tolist()) for v in range(store.num_nodes)]


def _expand(nb, nodes, visible):
    return nodes | {w for v in nodes for w in nb[v] if w in visible}


def _brute(store, step, layers, history=frozenset()):
    """(hop sets F_0..F_L, input nodes and expanded nodes with history, skipped) by plain BFS."""
    nb = _nbrs(store)
    visible = set(range(store.num_nodes)) if step.visible is None else set(step.visible.tolist())
    hops = [set(step.seeds.tolist())]
    for _ in range(layers):
        hops.append(_expand(nb, hops[-1], visible))
    skipped = (hops[1] & set(history)) - hops[0]
    need = hops[1] - skipped                      # hop 1: skipped nodes are not expanded
    expanded = need
    for _ in range(layers - 1):                   # deeper: every needed node is (NEEDED included)
        expanded = need
        need = _expand(nb, need, visible)
    return hops, need, expanded, skipped


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("name,kw", CASES)
def test_rr_and_unique_counts_vs_bfs(hand, name, kw, layers):
    sch = make_schedule(name, hand, seed=1, **kw)
    df = simulate(hand, sch, [-1] * layers, epochs=2, progress=False)
    total_in = total_seeds = 0
    for epoch in (0, 1):
        rows = df[df.epoch == epoch].itertuples()
        for step, row in zip(sch.epoch(epoch), rows):
            hops, *_ = _brute(hand, step, layers)
            assert [getattr(row, f"unique_l{h}") for h in range(layers + 1)] == [len(f) for f in hops]
            assert row.input_nodes == len(hops[-1])
            total_in, total_seeds = total_in + len(hops[-1]), total_seeds + len(step.seeds)
    r = redundancy_ratio(hand, sch, [-1] * layers, epochs=2)
    assert r["rr"] == pytest.approx(total_in / total_seeds)          # Eq. 2
    assert r["seeds"] == 2 * len(TRAIN) and r["input_nodes"] == total_in


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("name,kw", [CASES[0], CASES[2]])
def test_history_pruning_vs_brute_force(hand, name, kw, layers):
    history = np.sort(np.argsort(-hand.degrees(), kind="stable")[:5])   # degree >= 3 nodes
    sch = make_schedule(name, hand, seed=2, **kw)
    df = simulate(hand, sch, [-1] * layers, history=history, progress=False)
    deg = hand.degrees()
    for step, row in zip(sch.epoch(0), df.itertuples()):
        hops, need, expanded, skipped = _brute(hand, step, layers, set(history.tolist()))
        assert row.history_hits == len(skipped)
        assert row.input_nodes_hist == len(need) <= row.input_nodes
        if name == "random":                      # nothing resident: every needed row / list is read
            assert row.feature_rows_read_hist == len(need)
            assert row.neighbour_lists_read_hist == sum(1 for v in expanded if deg[v] > 0)
        else:                                     # megabatch: all resident
            assert row.feature_rows_read_hist == row.neighbour_lists_read_hist == 0
    r = redundancy_ratio(hand, sch, [-1] * layers, history=history)
    assert r["rr_hist"] == pytest.approx(df.input_nodes_hist.sum() / df.seeds.sum())
    assert r["rr_hist"] <= r["rr"]
    assert r["history_nodes"] == 5


def test_importance_saved_sample_vs_tree_sizes(hand):
    """saved_sample[u] = Σ over batches where u is a non-seed hop-1 node of |u's (L−1)-hop tree| − 1."""
    layers, nb = 3, _nbrs(hand)

    def tree(v, h):
        return 1 + sum(tree(w, h - 1) for w in nb[v]) if h else 1
    prof = importance(hand, [-1] * layers, schedule="random", seed=4, batch_size=3)
    want, bound = np.zeros(N, int), 0
    for step in make_schedule("random", hand, batch_size=3, seed=4).epoch(0):
        hops, *_ = _brute(hand, step, layers)
        for u in hops[1] - hops[0]:
            want[u] += tree(u, layers - 1) - 1
        bound += len(hops[-1]) - len(hops[1])
    np.testing.assert_array_equal(prof["saved_sample"], want)
    assert (prof["saved_gather"] >= 0).all() and prof["saved_gather"].sum() <= bound
    assert (prof["saved_gather"][want == 0] == 0).all()
    np.testing.assert_array_equal(prof["degree"], hand.degrees())


@pytest.mark.parametrize("by", ["degree", "importance"])
def test_history_reuse_lowers_rr_and_reads(tiny_store, by):
    h = history_nodes(tiny_store, 0.2, by=by, fanouts=[10, 10], seed=1, batch_size=256)
    assert len(h) == int(0.2 * tiny_store.num_nodes) and np.all(np.diff(h) > 0)
    r = redundancy_ratio(tiny_store, "random", [10, 10], history=h, batch_size=256)
    assert r["rr_hist"] < r["rr"] and 0 < r["rr_reduction"] < 1
    assert r["feature_rows_read_hist"] < r["feature_rows_read"]
    assert r["feature_pages_read_hist"] <= r["feature_pages_read"]
    assert r["neighbour_lists_read_hist"] <= r["neighbour_lists_read"]
    if by == "degree":
        deg = tiny_store.degrees()
        assert deg[h].min() >= np.sort(deg)[-len(h)]


def test_redundancy_table_and_errors(tiny_store):
    t = redundancy_table(tiny_store, {"rand": ("random", {"batch_size": 500}),
                                      "rand2": make_schedule("random", tiny_store, batch_size=500)}, [5, 5])
    assert list(t.label) == ["rand", "rand2"] and (t.rr > 1).all()
    assert t.rr.iloc[0] == t.rr.iloc[1]
    from oocgnn.errors import UserError
    with pytest.raises(UserError):
        history_nodes(tiny_store, 0.1, by="pagerank")
    with pytest.raises(UserError):
        redundancy_ratio(tiny_store, "random", [5], history=[1, 2])


def test_random_vs_partition_is_the_two_ratios_and_batch_seen_their_sizes(fennel16):
    """The notebook's comparison row: the two RRs as `redundancy_ratio` gives them, and the partition
    batch a training node is in (Σ|N_b|² / Σ|N_b|) from the schedule's own batches; macro batches of
    more parts make bigger micro batches."""
    from oocgnn.redundancy import batch_seen, parts_per_macro, random_vs_partition
    npm = parts_per_macro(fennel16, 64, 2)
    assert npm == max(1, round(2 * 64 * 16 / len(fennel16.train_idx)))
    row = random_vs_partition(fennel16, [5, 5], 64, npm, seed=3)
    r = redundancy_ratio(fennel16, "random", [5, 5], seed=3, batch_size=64)
    p = redundancy_ratio(fennel16, "partition", [5, 5], seed=3, batch_size=64, n_per_macro=npm)
    assert (row["rr_random"], row["rr_partition"]) == (r["rr"], p["rr"])
    assert row["change_%"] == pytest.approx(100 * (p["rr"] / r["rr"] - 1))
    sizes = [len(s.seeds) for s in make_schedule("partition", fennel16, batch_size=64, n_per_macro=npm,
                                                 seed=3).epoch(0)]
    assert row["batch_seen_partition"] == pytest.approx(sum(b * b for b in sizes) / sum(sizes))
    assert max(sizes) <= 64 and batch_seen(fennel16, 64, 1, seed=3) < batch_seen(fennel16, 64, 16, seed=3) <= 64
