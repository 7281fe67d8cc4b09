"""Oracle tests of oocgnn.blocks: our neighbour sampler and Block against brute force and DGL.

DGL's src order: `dgl.to_block(dgl.in_subgraph(g, frontier), frontier)` puts the dst nodes first
(in frontier order), then every other src node in order of first appearance scanning the edges in
CSC order (in_subgraph keeps the in-edges grouped by frontier order) -- exactly our order, so the
full-neighbourhood test asserts equality of ids and edge lists. This holds with DGL on one OpenMP
thread; on more threads DGL's to_block fills a concurrent hash map and the non-dst order is not
even repeatable, so the DGL tests run with torch.set_num_threads(1) (DGL shares torch's libgomp).
"""
import subprocess
import sys

import oocgnn  # noqa: F401  (first: it selects numba's workqueue threading layer)
import numba
import numpy as np
import pytest
from scipy.stats import chisquare

import oocgnn.blocks as B
from oocgnn.blocks import Block, sample_blocks, sample_layer
from oocgnn.datasets import csr_from_edges


def random_graph(n, m, seed=0):
    rng = np.random.default_rng(seed)
    return csr_from_edges(rng.integers(0, n, m), rng.integers(0, n, m), n)


def star(leaves):
    """Node 0 is the centre; nodes 1..leaves its neighbours."""
    return csr_from_edges(np.zeros(leaves, dtype=np.int64), np.arange(1, leaves + 1), leaves + 1)


def scratch_for(indptr):
    return np.full(len(indptr) - 1, -1, dtype=np.int32)


def layer(indptr, indices, frontier, fanout, scratch, seed=0, epoch=0, batch=0, lay=0):
    frontier = np.asarray(frontier, dtype=np.int64)
    return sample_layer(frontier, indptr[frontier], indptr[frontier + 1], indices, fanout, seed,
                        epoch, batch, lay, scratch)


def global_edges(block):
    """(src global, dst global) int64 [E] in CSC order."""
    s, d = block.edges()
    return block.src_nodes[s], block.dst_nodes[d]


def assert_block_invariants(block, frontier):
    assert block.indptr.dtype == block.indices.dtype == block.src_nodes.dtype == np.int64
    assert block.indptr.shape == (block.num_dst + 1,) and block.indptr[0] == 0
    assert block.indptr[-1] == block.num_edges and np.all(np.diff(block.indptr) >= 0)
    assert np.array_equal(block.dst_nodes, frontier)                 # dst first
    assert len(np.unique(block.src_nodes)) == block.num_src          # unique
    assert block.num_edges == 0 or 0 <= block.indices.min() <= block.indices.max() < block.num_src
    # src order: dst first, then first appearance among the picks in CSC order
    src, _ = global_edges(block)
    expected = list(frontier)
    seen = set(expected)
    for v in src.tolist():
        if v not in seen:
            seen.add(v)
            expected.append(v)
    assert block.src_nodes.tolist() == expected


@pytest.fixture
def dgl_one_thread():
    """DGL (sharing torch's OpenMP pool) on one thread: its to_block order is then repeatable."""
    dgl = pytest.importorskip("dgl")
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield dgl
    torch.set_num_threads(before)


@pytest.mark.parametrize("fanout", [0, 1, 3, 10, -1])
def test_picks_are_edges_min_fanout_distinct(fanout):
    indptr, indices = random_graph(300, 1500)
    scratch = scratch_for(indptr)
    frontier = np.random.default_rng(1).permutation(300)[:120]
    block = layer(indptr, indices, frontier, fanout, scratch, batch=7)
    assert_block_invariants(block, frontier)
    src, dst = global_edges(block)
    for j, v in enumerate(frontier):
        nbrs = indices[indptr[v]:indptr[v + 1]].astype(np.int64)
        got = src[dst == v]
        assert len(got) == (len(nbrs) if fanout == -1 else min(fanout, len(nbrs)))
        assert len(np.unique(got)) == len(got) and np.isin(got, nbrs).all()
        pos = np.searchsorted(nbrs, got)                    # lists are sorted: picks in list order
        assert np.all(np.diff(pos) > 0)
        if fanout == -1:
            assert np.array_equal(got, nbrs)
    assert (scratch == -1).all()


def test_multi_hop_conventions():
    indptr, indices = random_graph(500, 2000)
    scratch = scratch_for(indptr)
    seeds = np.array([5, 17, 3, 400, 250], dtype=np.int64)
    blocks = sample_blocks(indptr, indices, seeds, [4, 3, 2], 1, 2, 3, scratch)
    assert len(blocks) == 3 and all(isinstance(b, Block) for b in blocks)
    assert np.array_equal(blocks[-1].dst_nodes, seeds)
    for i, b in enumerate(blocks):
        assert_block_invariants(b, b.dst_nodes)
        if i + 1 < len(blocks):
            assert np.array_equal(b.dst_nodes, blocks[i + 1].src_nodes)
        # blocks[i] uses fanouts[i] and layer key i
        again = layer(indptr, indices, b.dst_nodes, [4, 3, 2][i], scratch, 1, 2, 3, i)
        assert np.array_equal(again.src_nodes, b.src_nodes) and np.array_equal(again.indices, b.indices)
        assert np.diff(b.indptr).max() <= [4, 3, 2][i]
    assert (scratch == -1).all()
    assert sample_blocks(indptr, indices, np.empty(0, np.int64), [2, 2], 0, 0, 0, scratch)[0].num_src == 0


def test_full_neighbourhood_equals_dgl_to_block(dgl_one_thread):
    dgl = dgl_one_thread
    import torch
    indptr, indices = random_graph(400, 1600, seed=3)
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices.astype(np.int64)),
                           torch.empty(0, dtype=torch.int64))))
    seeds = np.random.default_rng(4).permutation(400)[:30]
    blocks = sample_blocks(indptr, indices, seeds, [-1, -1], 0, 0, 0, scratch_for(indptr))
    for b in blocks:
        frontier = torch.from_numpy(b.dst_nodes.copy())
        ref = dgl.to_block(dgl.in_subgraph(g, frontier), frontier)
        assert np.array_equal(ref.dstdata[dgl.NID].numpy(), b.dst_nodes)
        assert np.array_equal(ref.srcdata[dgl.NID].numpy(), b.src_nodes)       # exact order
        rs, rd = ref.edges(order="eid")
        s, d = b.edges()
        assert np.array_equal(rs.numpy(), s) and np.array_equal(rd.numpy(), d)


def test_to_dgl_in_sageconv(dgl_one_thread):
    dgl = dgl_one_thread
    import torch
    indptr, indices = random_graph(200, 900, seed=5)
    g = dgl.graph(("csc", (torch.from_numpy(indptr), torch.from_numpy(indices.astype(np.int64)),
                           torch.empty(0, dtype=torch.int64))))
    frontier = np.random.default_rng(6).permutation(200)[:40]
    ours = layer(indptr, indices, frontier, -1, scratch_for(indptr)).to_dgl()
    ref = dgl.to_block(dgl.in_subgraph(g, torch.from_numpy(frontier)), torch.from_numpy(frontier))
    assert ours.num_src_nodes() == ref.num_src_nodes() and ours.num_dst_nodes() == 40
    assert torch.equal(ours.dstdata[dgl.NID], torch.from_numpy(frontier))
    torch.manual_seed(0)
    conv = dgl.nn.SAGEConv(5, 7, "mean")
    feats = torch.randn(200, 5, dtype=torch.float32)
    outs, grads = [], []
    for blk in (ours, ref):
        x = feats.clone().requires_grad_(True)
        conv.zero_grad()
        y = conv(blk, x[blk.srcdata[dgl.NID]])
        (y ** 2).sum().backward()
        outs.append(y.detach())
        grads.append((x.grad.clone(), conv.fc_neigh.weight.grad.clone()))
    assert outs[0].shape == (40, 7)
    torch.testing.assert_close(outs[0], outs[1])
    for a, b in zip(*grads):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b)


def test_uniform_on_a_star():
    indptr, indices = star(60)
    scratch = scratch_for(indptr)
    counts = np.zeros(61, dtype=np.int64)
    for batch in range(2400):
        b = layer(indptr, indices, [0], 5, scratch, seed=11, batch=batch)
        src, _ = global_edges(b)
        assert len(np.unique(src)) == 5
        counts[src] += 1
    assert counts[0] == 0
    assert chisquare(counts[1:]).pvalue > 1e-3                 # 12000 picks, 200 expected each
    # the first pick's position (the smallest of the 5): P(min = p) ~ C(59-p, 4), not uniform
    firsts = np.zeros(61, dtype=np.int64)
    for batch in range(2400):
        firsts[global_edges(layer(indptr, indices, [0], 5, scratch, seed=12, batch=batch))[0][0]] += 1
    from math import comb
    expected = np.array([comb(60 - p, 4) for p in range(1, 61)], dtype=float)
    expected *= 2400 / expected.sum()
    keep = expected >= 5                                       # chi-square needs filled cells
    obs = np.append(firsts[1:][keep], firsts[1:][~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert chisquare(obs, exp).pvalue > 1e-3


def test_picks_depend_only_on_the_key():
    indptr, indices = star(60)
    scratch = scratch_for(indptr)
    base = dict(seed=1, epoch=2, batch=3, lay=4)
    picks = lambda **kw: global_edges(layer(indptr, indices, [0], 5, scratch, **{**base, **kw}))[0]
    ref = picks()
    assert np.array_equal(ref, picks())                                     # equal keys
    for change in ({"seed": 9}, {"epoch": 9}, {"batch": 9}, {"lay": 9}):   # any other key
        assert not np.array_equal(ref, picks(**change)), change
    # a node's picks do not depend on the rest of the frontier or its position in it
    indptr, indices = random_graph(300, 3000)
    scratch = scratch_for(indptr)
    a = layer(indptr, indices, [10, 20, 30, 40], 4, scratch)
    b = layer(indptr, indices, [40, 77, 20], 4, scratch)
    sa, da = global_edges(a)
    sb, db = global_edges(b)
    for v in (20, 40):
        assert np.array_equal(sa[da == v], sb[db == v])


MASK, GOLDEN = (1 << 64) - 1, 0x9E3779B97F4A7C15


def py_mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def py_picks(key, degree, k):
    """Pure-Python reference: splitmix64 key, Lemire draws, Floyd, sorted list positions."""
    h = py_mix((key[0] + GOLDEN) & MASK)
    for x in key[1:]:
        h = py_mix(h ^ ((x + GOLDEN) & MASK))
    chosen = set()
    for j in range(degree - k, degree):
        h = (h + GOLDEN) & MASK
        t = ((py_mix(h) >> 32) * (j + 1)) >> 32
        chosen.add(j if t in chosen else t)
    return sorted(chosen)


def test_stream_and_floyd_match_a_python_reference():
    """The kernels equal pure Python (so no silent uint64 -> float promotion), for both Floyd
    variants (k <= _SMALL and k > _SMALL)."""
    key = (7, 1, 123456, 2, 2**33 + 5)
    state = B._key(*key)
    h = py_mix((key[0] + GOLDEN) & MASK)
    for x in key[1:]:
        h = py_mix(h ^ ((x + GOLDEN) & MASK))
    assert int(state) == h
    for n in (1, 2, 10, 1000, 2**31 + 11):
        state, t = B._below(np.uint64(state), n)
        h = (h + GOLDEN) & MASK
        assert int(t) == ((py_mix(h) >> 32) * n) >> 32 and 0 <= int(t) < n
    indptr, indices = star(300)
    scratch = scratch_for(indptr)
    for fanout in (1, 5, B._SMALL, B._SMALL + 1, 150, 299):
        for batch in range(3):
            src, _ = global_edges(layer(indptr, indices, [0], fanout, scratch, 3, 1, batch, 2))
            expected = indices[py_picks((3, 1, batch, 2, 0), 300, fanout)]
            assert np.array_equal(src, expected), (fanout, batch)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")
def test_same_blocks_at_any_thread_count():
    indptr, indices = random_graph(20_000, 100_000, seed=8)
    scratch = scratch_for(indptr)
    seeds = np.random.default_rng(9).choice(20_000, 1000, replace=False)
    before = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 1, 2):
            numba.set_num_threads(threads)
            runs.append(sample_blocks(indptr, indices, seeds, [10, 10], 5, 1, 2, scratch))
    finally:
        numba.set_num_threads(before)
    assert runs[0][0].num_edges >= B._PAR_MIN                  # the parallel path really ran
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            for f in ("indptr", "indices", "src_nodes"):
                assert np.array_equal(getattr(a, f), getattr(b, f))
    assert (scratch == -1).all()


def test_key_ids_give_the_same_picks_in_an_induced_subgraph():
    indptr, indices = random_graph(1000, 6000, seed=10)
    frontier = np.random.default_rng(11).choice(1000, 50, replace=False)
    glob = layer(indptr, indices, frontier, 3, scratch_for(indptr), seed=4, batch=2, lay=1)
    # the subgraph induced by frontier ∪ its neighbours keeps the lists of the frontier whole;
    # its lists arrive as one compact buffer, in local ids
    lists = [indices[indptr[v]:indptr[v + 1]].astype(np.int64) for v in frontier]
    nodes = np.unique(np.concatenate([frontier] + lists))          # local id -> global id
    buffer = np.searchsorted(nodes, np.concatenate(lists))
    ends = np.cumsum([len(x) for x in lists])
    local = sample_layer(np.searchsorted(nodes, frontier), ends - [len(x) for x in lists], ends,
                         buffer, 3, 4, 0, 2, 1, np.full(len(nodes), -1, np.int32),
                         key_ids=frontier)
    assert np.array_equal(nodes[local.src_nodes], glob.src_nodes)
    assert np.array_equal(local.indptr, glob.indptr) and np.array_equal(local.indices, glob.indices)
    # without the global keys the picks differ
    other = sample_layer(np.searchsorted(nodes, frontier), ends - [len(x) for x in lists], ends,
                         buffer, 3, 4, 0, 2, 1, np.full(len(nodes), -1, np.int32))
    assert not np.array_equal(nodes[other.src_nodes], glob.src_nodes)


def test_scratch_is_reset_and_bad_input_is_refused():
    indptr, indices = random_graph(100, 400)
    scratch = scratch_for(indptr)
    for fanout in (2, -1):
        sample_blocks(indptr, indices, [1, 2, 3], [fanout, fanout], 0, 0, 0, scratch)
        assert (scratch == -1).all()
    with pytest.raises(IndexError, match="duplicate"):
        layer(indptr, indices, [4, 5, 4], 2, scratch)
    assert (scratch == -1).all()
    with pytest.raises(IndexError):
        sample_blocks(indptr, indices, [1, 100], [2], 0, 0, 0, scratch)
    with pytest.raises(IndexError, match="neighbour"):
        layer(indptr, indices, [1, 2], -1, scratch[:50].copy())   # neighbours beyond scratch
    assert (scratch == -1).all()
    with pytest.raises(ValueError):
        layer(indptr, indices, [1], -2, scratch)


def test_imports_and_samples_without_dgl():
    code = ("import sys; sys.modules['dgl'] = None\n"
            "import numpy as np, oocgnn.blocks as B\n"
            "from oocgnn.datasets import csr_from_edges\n"
            "ip, ix = csr_from_edges(np.arange(9), np.arange(1, 10), 10)\n"
            "bl = B.sample_blocks(ip, ix, np.array([0, 5]), [2, 2], 0, 0, 0, np.full(10, -1, np.int32))\n"
            "assert bl[-1].dst_nodes.tolist() == [0, 5] and sys.modules['dgl'] is None\n"
            "print('ok', bl[0].num_src)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr


def test_threads_sampling_at_once_neither_abort_nor_differ():
    """workqueue aborts the process on concurrent parallel launches: the sampler must avoid them."""
    code = ("import oocgnn.blocks as B, threading, numpy as np, numba\n"
            "from oocgnn.datasets import csr_from_edges\n"
            "rng = np.random.default_rng(0)\n"
            "n = 50000\n"
            "ip, ix = csr_from_edges(rng.integers(0, n, 400000), rng.integers(0, n, 400000), n)\n"
            "seeds = rng.choice(n, 2000, replace=False)\n"
            "run = lambda sc, b: B.sample_blocks(ip, ix, seeds, [10, 10], 0, 0, b, sc)\n"
            "ref = [run(np.full(n, -1, np.int32), b)[0].indices for b in range(30)]\n"
            "out = {}\n"
            "def work(k):\n"
            "    sc = np.full(n, -1, np.int32)\n"
            "    out[k] = [run(sc, b)[0].indices for b in range(30)]\n"
            "ts = [threading.Thread(target=work, args=(k,)) for k in range(3)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "assert all(np.array_equal(a, b) for k in out for a, b in zip(out[k], ref))\n"
            "assert numba.threading_layer() == 'workqueue'\n"
            "print('ok', numba.get_num_threads())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]
