"""The synthetic planted-community generator: determinism, shape of the graph, lazy features."""
import numpy as np
import pytest

from oocgnn.errors import UserError
from oocgnn.synthetic import PRESETS, generate, preset


def test_deterministic_per_seed(tiny_data):
    again = generate("tiny")
    np.testing.assert_array_equal(again.indptr, tiny_data.indptr)
    np.testing.assert_array_equal(again.indices, tiny_data.indices)
    np.testing.assert_array_equal(again.labels, tiny_data.labels)
    np.testing.assert_array_equal(again.train_idx, tiny_data.train_idx)
    ids = np.array([0, 17, 4999, 17])
    np.testing.assert_array_equal(again.features[ids], tiny_data.features[ids])
    other = generate("tiny", seed=1)
    assert not np.array_equal(other.labels, tiny_data.labels)


def test_graph_is_canonical_and_heavy_tailed(tiny_data):
    g = tiny_data
    src = np.repeat(np.arange(g.num_nodes), g.degrees())
    assert not np.any(src == g.indices), "no self-loops"
    fwd = set(zip(src.tolist(), g.indices.tolist()))
    assert all((b, a) in fwd for a, b in fwd), "symmetric"
    assert len(fwd) == g.num_edges, "deduplicated"
    deg = g.degrees()
    target = PRESETS["tiny"].avg_degree
    assert 0.85 * target < deg.mean() < 1.15 * target
    assert deg.max() > 10 * np.median(deg), "heavy-tailed degrees"


def test_features_are_a_function_of_the_node_id(tiny_data):
    f = tiny_data.features
    assert f.shape == (5000, 128) and f.dtype == np.float32
    ids = np.random.default_rng(0).permutation(5000)[:300]
    whole = f[np.arange(5000)]
    np.testing.assert_array_equal(f[ids], whole[ids])
    np.testing.assert_array_equal(f[10:20], whole[10:20])


def test_features_carry_class_signal(tiny_data):
    """Nodes of one class are closer to each other's mean than to other classes' means."""
    x = tiny_data.features[np.arange(tiny_data.num_nodes)]
    cls = tiny_data.labels
    means = np.stack([x[cls == c].mean(0) for c in range(tiny_data.num_classes)])
    pred = np.argmax(x @ means.T - 0.5 * (means ** 2).sum(1), axis=1)
    acc = (pred == cls).mean()
    assert 1 / tiny_data.num_classes + 0.1 < acc < 0.95


def test_mixing_knob_controls_homophily():
    def same_community_label_fraction(mixing):
        g = generate("tiny", mixing=mixing, label_noise=0.0)
        src = np.repeat(np.arange(g.num_nodes), g.degrees())
        return (g.labels[src] == g.labels[g.indices]).mean()
    assert same_community_label_fraction(0.05) > same_community_label_fraction(0.6) + 0.3


def test_splits_disjoint_and_sized(tiny_data):
    cfg = PRESETS["tiny"]
    tr, va, te = tiny_data.train_idx, tiny_data.val_idx, tiny_data.test_idx
    assert len(tr) == int(cfg.train_frac * 5000) and len(va) == int(cfg.val_frac * 5000)
    assert len(np.intersect1d(tr, va)) == len(np.intersect1d(tr, te)) == len(np.intersect1d(va, te)) == 0


def test_bad_preset_and_config():
    with pytest.raises(UserError, match="unknown preset 'huge'"):
        preset("huge")
    with pytest.raises(UserError):
        preset("tiny", mixing=1.5)


@pytest.mark.parametrize("preset, memory", [("tiny", 1 << 12), ("small", 2 << 20)])
def test_bounded_generation_is_the_same_graph(tmp_path, preset, memory):
    """Edges through sorted runs under `prepare_memory` (the relabelling drawn by skipping the edges'
    draws first): the in-memory graph exactly, labels and splits included, and the same features."""
    from oocgnn.synthetic import generate
    plain = generate(preset)
    from oocgnn.csrbuild import NODE_BYTES
    memory += NODE_BYTES * plain.num_nodes          # the sort gets `memory`, beside the per-node arrays
    bounded = generate(preset, prepare_memory=memory, workdir=tmp_path)
    for k in ("indptr", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(getattr(bounded, k), getattr(plain, k)), k
    assert np.array_equal(np.asarray(bounded.indices), plain.indices)
    assert np.array_equal(bounded.features[:50], plain.features[:50])
    assert [p.suffix for p in tmp_path.iterdir()] == [".bin"]          # runs gone, the neighbour file kept
    with pytest.raises(ValueError, match="workdir"):
        generate(preset, prepare_memory=memory)


def test_edge_stream_is_the_generated_graphs_raw_edges(tiny_data):
    """The raw edges benchmarks sort are the generator's: their canonical CSR is its topology."""
    from oocgnn.datasets import csr_from_edges
    from oocgnn.synthetic import edge_stream
    src, dst = (np.concatenate(a) for a in zip(*edge_stream("tiny")))
    assert len(src) > tiny_data.indptr[-1] // 2                         # undirected draws, repeats included
    indptr, indices = csr_from_edges(src, dst, tiny_data.num_nodes)
    assert np.array_equal(indptr, tiny_data.indptr) and np.array_equal(indices, tiny_data.indices)


def test_xlarge_features_exceed_this_machines_memory():
    """The xlarge preset's reason to exist: its feature matrix is larger than 24 GB of RAM."""
    cfg = preset("xlarge")
    assert cfg.num_nodes * cfg.feat_dim * 4 > 26e9


def test_prepare_help_names_every_preset():
    from oocgnn.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["prepare"]
    text = next(a for a in sub._actions if a.dest == "preset").help
    assert text.startswith("synthetic preset: " + "|".join(PRESETS) + " ")
