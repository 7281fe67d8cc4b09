"""The sampler over its topology sources, against oracles: DGL's induced subgraph, the in-RAM source
(for the on-disk one), the whole graph (for a visible set that keeps every list), brute-force edges."""
import numpy as np
import pytest

from oocgnn.errors import UserError
from oocgnn.sampler import Sampler, induced_csc, sampled_steps
from oocgnn.schedules import make_schedule
from oocgnn.simulate import Layout
from oocgnn.topology import NeighbourLists

FAN = [5, 4]


def _edges(store):
    return set(zip(np.repeat(np.arange(store.num_nodes), store.degrees()).tolist(), store.indices.tolist()))


def _same(a, b):
    np.testing.assert_array_equal(a.input_nodes, b.input_nodes)
    for x, y in zip(a.blocks, b.blocks):
        np.testing.assert_array_equal(x.src_nodes, y.src_nodes)
        np.testing.assert_array_equal(x.indptr, y.indptr)
        np.testing.assert_array_equal(x.indices, y.indices)


def test_megabatch_sampling_never_leaves_visible(parted):
    edges = _edges(parted)
    sampler = Sampler(parted.neighbour_lists(), FAN, seed=1)
    steps = list(make_schedule("megabatch", parted, batch_size=64, parts_per_megabatch=4, static_ratio=0.02).epoch(0))
    for s in steps[:12]:
        inp, out, blocks = sampler.sample(s.seeds, visible=s.visible)
        np.testing.assert_array_equal(out, s.seeds)
        assert np.isin(inp, s.visible).all()
        for b in blocks:
            src, dst = b.edges()
            gs, gd = b.src_nodes[src], b.dst_nodes[dst]
            assert np.isin(gs, s.visible).all() and np.isin(gd, s.visible).all()
            assert all(e in edges for e in zip(gd.tolist(), gs.tolist())), "global ids map back to real edges"
        np.testing.assert_array_equal(blocks[0].src_nodes, inp)


def test_seeded_per_batch_whatever_ran_before(parted):
    seeds = parted.train_idx[:50]
    sampler = Sampler(parted.neighbour_lists(), [10, 10], seed=0)
    a = sampler.sample(seeds, 0, 3)
    sampler.sample(seeds, 0, 4)                                        # other batches in between
    Sampler(parted.neighbour_lists(), [10, 10], seed=9).sample(seeds, 0, 3)
    _same(a, sampler.sample(seeds, 0, 3))
    assert not np.array_equal(a.input_nodes, sampler.sample(seeds, 0, 4).input_nodes)
    assert not np.array_equal(a.input_nodes, sampler.sample(seeds, 1, 3).input_nodes)
    with pytest.raises(UserError):
        sampler.sample(seeds, visible=np.arange(10, dtype=np.int64))


@pytest.mark.parametrize("dense", [False, True])
def test_batches_walked_in_lockstep_sample_as_one_at_a_time(parted, dense):
    """`sample_many` (a macrobatch layer by layer) gives each batch `sample`'s blocks; before each layer it
    names exactly the frontier nodes whose lists that layer reads for the first time (brute force)."""
    sampler = Sampler(parted.neighbour_lists(), [4, 3, 5], seed=2, dense=dense)
    seed_sets = [parted.train_idx[i:i + 40] for i in (0, 40, 80)]
    asked = []
    got = sampler.sample_many(seed_sets, 1, [7, 8, 9], before_layer=asked.append)
    want = [sampler.sample(s, 1, b) for s, b in zip(seed_sets, (7, 8, 9))]
    for a, b in zip(got, want):
        _same(a, b)
        np.testing.assert_array_equal(a.output_nodes, b.output_nodes)
    fronts = [[w.blocks[k].dst_nodes for w in want] for k in (2, 1, 0)]          # outermost layer first
    prev = [np.empty(0, np.int64)] * 3
    for layer, nodes in enumerate(asked):
        new = [f[len(p):] for f, p in zip(fronts[layer], prev)]
        np.testing.assert_array_equal(nodes, np.unique(np.concatenate(new)))
        prev = fronts[layer]
    assert len(asked) == 3


@pytest.mark.parametrize("size", [1, 37, 2500, "all"])
def test_induced_csc_is_dgl_node_subgraph(parted, size):
    """The induced subgraph is exactly DGL's node_subgraph (same neighbour order)."""
    import dgl
    import torch
    g = parted.graph()
    n = parted.num_nodes
    visible = np.arange(n) if size == "all" else np.sort(np.random.default_rng(size).choice(n, size, replace=False))
    indptr, indices = induced_csc(parted.neighbour_lists(), visible)
    want = dgl.node_subgraph(g, torch.from_numpy(visible)).adj_tensors("csc")
    np.testing.assert_array_equal(indptr, want[0].numpy())
    np.testing.assert_array_equal(indices, want[1].numpy())


def test_a_visible_set_that_keeps_every_list_samples_as_the_whole_graph(parted):
    """Nodes keep their random keys inside a subgraph: where it keeps their lists whole, the same picks."""
    sampler = Sampler(parted.neighbour_lists(), FAN, seed=4)
    seeds = np.sort(parted.train_idx[:40])
    _same(sampler.sample(seeds, 1, 2, visible=np.arange(parted.num_nodes)), sampler.sample(seeds, 1, 2))
    induced = induced_csc(parted.neighbour_lists(), np.arange(parted.num_nodes))
    other, vis = Sampler(parted.neighbour_lists(), FAN, seed=4), np.arange(parted.num_nodes)
    other.prepare(vis, induced)                                       # a loader built it: the same
    _same(other.sample(seeds, 1, 2, visible=vis), sampler.sample(seeds, 1, 2))


@pytest.mark.parametrize("cache", ["none", "some", "all"])
def test_disk_topology_samples_as_in_memory_and_reads_what_layout_counts(parted, cache):
    """Lists read from indices.bin give the same samples as the resident CSR; per layer the sampler
    reads only the new frontier's missing lists, in one call each, the pages and requests the
    simulator's Layout counts."""
    memory = parted.neighbour_lists()
    deg = parted.degrees()
    cached = {"none": np.empty(0, np.int64), "some": np.arange(0, parted.num_nodes, 3),
              "all": np.arange(parted.num_nodes)}[cache]
    disk = NeighbourLists(parted, capacity=int(deg[cached].sum()))
    disk.place_ids(cached, 0)
    disk.reader.stats.reset()
    resident = np.zeros(parted.num_nodes, bool)
    resident[cached] = True
    lay = Layout(parted)
    for b in range(4):
        seeds = np.sort(parted.train_idx[b * 60:(b + 1) * 60])
        before = disk.stats.snapshot()
        got, want = Sampler(disk, [6, 5, 4], 2).sample(seeds, 0, b), Sampler(memory, [6, 5, 4], 2).sample(seeds, 0, b)
        _same(got, want)
        pages = requests = calls = 0
        for i in range(2, -1, -1):
            known = got.blocks[i + 1].num_dst if i < 2 else 0
            new = got.blocks[i].dst_nodes[known:]
            miss = new[~resident[new] & (deg[new] > 0)]
            if len(miss):
                p, r = lay.list_reads(miss)
                pages, requests, calls = pages + p, requests + r, calls + 1
        delta = disk.stats - before
        assert (delta.pages, delta.requests, delta.calls) == (pages, requests, calls)
    if cache == "all":
        assert disk.stats.calls == 0
    disk.close()


def test_sampled_steps_walks_the_steps_in_order(parted):
    sch = make_schedule("partition", parted, batch_size=64, n_per_macro=3, seed=2)
    sampler = Sampler(parted.neighbour_lists(), FAN, seed=2)
    walked = list(sampled_steps(sch, sampler, epochs=2))
    assert [(e, b) for _, e, b, _, _ in walked] == [(e, b) for e, b, _ in sch.steps(2)]
    assert [i for i, *_ in walked] == list(range(len(walked)))
    i, e, b, step, sample = walked[7]
    _same(sample, sampler.sample(step.seeds, e, b, step.visible))
