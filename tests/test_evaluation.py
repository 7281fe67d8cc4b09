"""Layer-wise evaluation against per-batch evaluation of the same nodes with the same neighbourhoods."""
import numpy as np
import pytest
import torch

from oocgnn.evaluation import READ_FLOOR, LayerwiseEval
from oocgnn.models import build_model
from oocgnn.sampler import Sampler
from oocgnn.topology import NeighbourLists
from oocgnn.nodetask import evaluate


def _per_batch_logits(model, sampler, feats, nodes, batch_size):
    """The oracle: `nodetask.evaluate`'s sampling, logits instead of accuracy."""
    model.eval()
    out = []
    with torch.no_grad():
        for i, lo in enumerate(range(0, len(nodes), batch_size)):
            inp, _, blocks = sampler.sample(nodes[lo:lo + batch_size], 0, i)
            out.append(model(blocks, feats[torch.from_numpy(inp)]))
    return torch.cat(out)


@pytest.fixture(scope="module")
def setting(fennel16):
    store = fennel16
    feats = torch.from_numpy(store.reader("memory").read_range(0, store.num_nodes).copy())
    nodes = np.sort(np.concatenate([store.val_idx, store.test_idx]))
    return store, feats, nodes


@pytest.mark.parametrize("model_name", ["sage", "gat", "gin"])
@pytest.mark.parametrize("fanouts", [[5, 3], [-1, -1], [4, 3, 2]])
def test_layerwise_equals_one_batch(setting, model_name, fanouts):
    """Sampled neighbourhoods: each node's draw depends only on its key, so per-batch evaluation in one
    batch sees exactly the layer-wise neighbourhoods; same logits."""
    store, feats, nodes = setting
    torch.manual_seed(0)
    model = build_model(model_name, store.feat_dim, 32, store.num_classes, len(fanouts))
    sampler = Sampler(NeighbourLists.resident(store), fanouts, 11)
    want = _per_batch_logits(model, sampler, feats, nodes, len(nodes))
    ev = LayerwiseEval(sampler, fanouts, nodes, store.feat_dim, lambda ids: feats[torch.from_numpy(ids)],
                       budget=1 << 30, dst_chunk=300)
    got = ev.logits(model)
    assert ev.spilled == []
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_name", ["sage", "gat"])
def test_layer_calls_shrink_to_their_working_bound_and_compute_the_same(setting, monkeypatch, model_name):
    """A layer call gathers its sources' rows and its edges' messages: with a small bound the destination
    chunks shrink until each call fits (or holds one node), and the logits are the one-batch oracle's."""
    import oocgnn.evaluation as evaluation
    store, feats, nodes = setting
    monkeypatch.setattr(evaluation, "WORK_FLOOR", 64 << 10)
    torch.manual_seed(2)
    model = build_model(model_name, store.feat_dim, 32, store.num_classes, 2)
    sampler = Sampler(NeighbourLists.resident(store), [8, 5], 5)
    want = _per_batch_logits(model, sampler, feats, nodes, len(nodes))
    ev = LayerwiseEval(sampler, [8, 5], nodes, store.feat_dim, lambda ids: feats[torch.from_numpy(ids)],
                       budget=0, widths=[store.feat_dim, 32])
    torch.testing.assert_close(ev.logits(model), want, rtol=1e-4, atol=1e-4)
    for i, (_, chunks) in enumerate(ev.layers):
        assert len(chunks) > 1 and all(ev._work(b, i) <= 64 << 10 or len(b.dst_nodes) == 1 for _, b, _ in chunks)
    assert ev.memory()["layer_call"] <= 64 << 10


def test_a_runs_layerwise_evaluation_stays_within_the_budget(tmp_path):
    """Wide rows (8 KiB), a 16 MB budget, every node evaluated (its 2-hop input: most of a 375 MiB feature
    file): the run's peak RSS grows over a warmed process (interpreter, torch, numba: the stated overhead's
    fixed part) by at most the budget + 256 MiB of working memory (a layer call's 64 MiB, the training
    batches', glibc's retained heap; 174 MiB measured). Layer calls of a fixed 8,192 nodes grew it by
    500 MiB (their sources' rows, beside the budget)."""
    from oocgnn.config import TrainConfig
    from oocgnn.storewrite import write_store
    from oocgnn.synthetic import SyntheticConfig, generate
    from oocgnn.train import train
    from oocgnn.units import trim_heap
    data = generate(SyntheticConfig(num_nodes=48_000, avg_degree=6, feat_dim=2048, num_communities=200,
                                    num_classes=8))
    store = write_store(data, tmp_path / "wide", part_offsets=list(range(0, 48_001, 500)), progress=False)
    kw = {"store": str(store.path), "policy": "hierbatching", "memory_budget": "16MB", "epochs": 1, "max_steps": 4,
          "hidden": 64, "batch_size": 256, "progress": False}
    train(TrainConfig.create(out=str(tmp_path / "warm"), max_eval_nodes=100, **kw))
    trim_heap()
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096   # noqa: E731
    before = rss()
    s = train(TrainConfig.create(out=str(tmp_path / "run"), max_eval_nodes=0, **kw))
    assert s["eval_mode"] == "layerwise" and s["eval_spilled"] == ["input_rows", "layer1", "layer2"]
    assert s["io_eval"]["unique_rows"] > store.num_nodes // 2
    assert s["peak_rss"] - before <= s["memory_budget"] + (256 << 20), (s["peak_rss"] - before) / 2**20


def test_full_neighbourhoods_equal_at_any_batch_size_and_when_spilled(setting):
    """Full neighbourhoods (DGL's offline inference): equal to per-batch evaluation in many batches,
    also when the budget sends every table to a temporary file; the confusion counts equal `nodetask.evaluate`'s."""
    store, feats, nodes = setting
    torch.manual_seed(1)
    model = build_model("sage", store.feat_dim, 32, store.num_classes, 2)
    sampler = Sampler(NeighbourLists.resident(store), [-1, -1], 3)
    want = _per_batch_logits(model, sampler, feats, nodes, 97)
    ev = LayerwiseEval(sampler, [-1, -1], nodes, store.feat_dim, lambda ids: feats[torch.from_numpy(ids)],
                       budget=0, dst_chunk=128, read_chunk=4096)
    torch.testing.assert_close(ev.logits(model), want, rtol=1e-4, atol=1e-4)
    assert ev.spilled == ["input_rows", "layer1", "layer2"]
    small = LayerwiseEval(sampler, [-1, -1], nodes, store.feat_dim, lambda ids: feats[torch.from_numpy(ids)],
                          budget=1 << 20)
    assert small.read_chunk == READ_FLOOR, "under a small budget, the floor beside it"
    share = LayerwiseEval(sampler, [-1, -1], nodes, store.feat_dim, lambda ids: feats[torch.from_numpy(ids)],
                          budget=64 << 20)
    assert share.read_chunk == (64 << 20) // 4, "the read buffer is a share of the budget, not a fixed 64 MiB"
    labels = torch.from_numpy(store.compact_labels())
    tallies = ev.tallies(model, labels, {"val": store.val_idx, "test": store.test_idx}, store.num_classes)
    gather = lambda ids: feats[torch.from_numpy(ids)]   # noqa: E731
    for name, ids in (("val", store.val_idx), ("test", store.test_idx)):
        want = evaluate(model, sampler, gather, labels, ids, 50, store.num_classes)
        assert np.array_equal(tallies[name].confusion, want.confusion) and tallies[name].confusion.sum() == len(ids)


def test_each_input_row_read_once_in_store_order(setting):
    """The input rows are the one-batch sample's input nodes, each read once, in ascending store order,
    by the first evaluation and again by every later one (blocks are kept, rows are not)."""
    store, feats, nodes = setting
    model = build_model("sage", store.feat_dim, 16, store.num_classes, 2)
    sampler = Sampler(NeighbourLists.resident(store), [6, 4], 5)
    calls = []

    def rows(ids):
        calls.append(ids.copy())
        return feats[torch.from_numpy(ids)]
    ev = LayerwiseEval(sampler, [6, 4], nodes, store.feat_dim, rows, budget=1 << 30, read_chunk=store.feat_dim * 4 * 100)
    ev.logits(model)
    read = np.concatenate(calls)
    assert len(calls) > 1 and (np.diff(read) > 0).all()
    assert np.array_equal(read, np.sort(sampler.sample(nodes, 0, 0).input_nodes))
    calls.clear()
    ev.logits(model)
    assert np.array_equal(np.concatenate(calls), read)


def test_a_spilled_table_leaves_no_file_behind(tmp_path, monkeypatch):
    """A spilled table lives in an unnamed temporary file: nothing in the temporary directory while it is
    open, so a killed run (no cleanup) leaves no 500 MB file behind; its rows read back as written."""
    import tempfile
    from oocgnn.evaluation import _Table
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    table = _Table(np.arange(50), 8, in_ram=False)
    values = torch.arange(400, dtype=torch.float32).reshape(50, 8)
    table.write(0, values)
    assert list(tmp_path.iterdir()) == []
    pos = np.array([3, 49, 0, 4, 5, 3, 48])          # runs, repeats, any order
    torch.testing.assert_close(table.take(pos), values[pos])
    torch.testing.assert_close(table.all_rows(), values)
    table.close()


def _rss_file() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) << 10
    pytest.skip("no RssFile in /proc/self/status")


def test_a_spilled_table_is_not_mapped_into_the_process():
    """A spill bounds the process's RSS: written and read with pwrite/pread, its pages stay in the page
    cache, never in RssFile (a memory-mapped table's touched pages counted there: +64 MiB here)."""
    from oocgnn.evaluation import _Table
    n, dim = 1 << 16, 256                           # 64 MiB
    table = _Table(np.arange(n), dim, in_ram=False)
    before = _rss_file()
    for lo in range(0, n, 4096):
        table.write(lo, torch.full((4096, dim), float(lo)))
    got = table.take(np.arange(0, n, 7))
    assert _rss_file() - before < 8 << 20
    assert torch.equal(got[:, 0], torch.from_numpy((np.arange(0, n, 7) // 4096 * 4096).astype(np.float32)))
    table.close()


def test_rows_are_permuted_in_place_as_fancy_indexing_would():
    from oocgnn.evaluation import _permute_rows
    rng = np.random.default_rng(4)
    for n in (1, 2, 7, 500):
        rows = rng.random((n, 5)).astype(np.float32)
        perm = rng.permutation(n)
        want = rows[perm]
        _permute_rows(rows, perm)
        assert np.array_equal(rows, want)


@pytest.mark.parametrize("model_name", ["sage", "gat"])
def test_a_projecting_first_layer_projects_each_input_row_once(setting, model_name, monkeypatch):
    """Features wider than the first layer's projection: every input row is projected once as it is read
    (not once per destination chunk that gathers it), the input table holds the projections, and the
    logits are those of the layer run on the raw rows chunk by chunk."""
    store, feats, nodes = setting
    torch.manual_seed(3)
    model = build_model(model_name, store.feat_dim, 16, store.num_classes, 2)
    width = model.projection_width(0)
    assert 0 < width < store.feat_dim
    sampler = Sampler(NeighbourLists.resident(store), [6, 4], 5)
    projected = []
    project = type(model).project

    def counted(self, i, h):
        projected.append(len(h))
        return project(self, i, h)
    monkeypatch.setattr(type(model), "project", counted)
    rows = lambda ids: feats[torch.from_numpy(ids)]   # noqa: E731
    ev = LayerwiseEval(sampler, [6, 4], nodes, store.feat_dim, rows, budget=1 << 30, dst_chunk=200)
    got = ev.logits(model)
    assert sum(projected) == len(ev.input_ids) and len(ev.layers[0][1]) > 1
    monkeypatch.setattr(type(model), "projection_width", lambda self, i: 0)     # the layer on raw rows
    raw = LayerwiseEval(sampler, [6, 4], nodes, store.feat_dim, rows, budget=1 << 30, dst_chunk=200).logits(model)
    torch.testing.assert_close(got, raw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, _per_batch_logits(model, sampler, feats, nodes, len(nodes)), rtol=1e-4, atol=1e-4)
