"""Bag-of-words input rows as CSR (`oocgnn.sparserows`): the conversion is exact, dense rows are turned
away, and the layers that project first give DGL's outputs and gradients (and the dense product's) on
mostly-zero features, through the sparse matmul."""
import numpy as np
import pytest
import torch

from oocgnn import models, sparserows
from oocgnn.blocks import sample_blocks
from oocgnn.sparserows import SparseRows

from .test_layers import random_csr


def bag_of_words(n, d, density, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 5, (n, d), generator=g).float()
    return counts * (torch.rand(n, d, generator=g) < density)


@pytest.fixture(scope="module")
def blocks():
    indptr, indices = random_csr()
    seeds = np.concatenate([np.arange(0, 1200, 3), np.arange(1850, 2000)])
    return sample_blocks(indptr, indices, seeds, [8, 5], 3, 0, 0, np.full(2000, -1, np.int64))


@pytest.fixture
def spy(monkeypatch):
    """Counts the sparse products taken."""
    calls = []
    real = SparseRows.linear

    def linear(self, *a, **kw):
        calls.append(self.shape)
        return real(self, *a, **kw)
    monkeypatch.setattr(SparseRows, "linear", linear)
    return calls


def test_csr_holds_exactly_the_rows():
    x = bag_of_words(700, 300, 0.02)
    x[5] = 0                                                    # an empty row
    rows = SparseRows.of(x)
    assert rows is not None and rows.shape == (700, 300)
    assert torch.equal(rows.head().to_dense(), x)
    assert torch.equal(rows.head(40).to_dense(), x[:40])
    assert rows.density == pytest.approx(float((x != 0).float().mean()))
    w, b = torch.randn(16, 300), torch.randn(16)
    torch.testing.assert_close(rows.linear(w, b, 40), torch.nn.functional.linear(x[:40], w, b))


def test_dense_or_unsuitable_rows_are_multiplied_densely():
    sparse = bag_of_words(700, 300, 0.02)
    assert SparseRows.of(torch.randn(700, 300)) is None                        # dense
    dense_tail = torch.cat([sparse[:300], torch.randn(400, 300)])               # the probe passes, the count not
    assert SparseRows.of(dense_tail) is None
    assert SparseRows.of(sparse, below=0.01) is None                            # denser than asked
    assert SparseRows.of(sparse, below=0) is None                               # turned off
    assert SparseRows.of(sparse.clone().requires_grad_()) is None               # rows that need a gradient
    assert SparseRows.of(sparse.double()) is None
    assert SparseRows.of(sparse[:0]) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert SparseRows.of(sparse) is None


WIDE = {   # layers that project before aggregating: ours, DGL's
    "sage": (lambda: models.SAGEConv(300, 16), "SAGEConv", lambda dglnn: dglnn.SAGEConv(300, 16, "mean")),
    "gat": (lambda: models.GATConv(300, 8, 4), "GATConv",
            lambda dglnn: dglnn.GATConv(300, 8, 4, allow_zero_in_degree=True)),
}


@pytest.mark.parametrize("name", WIDE)
def test_wide_layers_on_bag_of_words_match_dgl(name, blocks, spy):
    dglnn = pytest.importorskip("dgl.nn")
    make_ours, _, make_theirs = WIDE[name]
    block = blocks[0]
    torch.manual_seed(0)
    ours, theirs = make_ours(), make_theirs(dglnn)
    theirs.load_state_dict(ours.state_dict())
    x = bag_of_words(block.num_src, 300, 0.02)
    ya, yb = ours(block, x), theirs(block.to_dgl(), (x, x[:block.num_dst]))
    assert spy, "the sparse product was not taken"
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
    w = torch.randn(ya.shape, generator=torch.Generator().manual_seed(1))
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    for (na, pa), (nb, pb) in zip(sorted(ours.named_parameters()), sorted(theirs.named_parameters())):
        assert na == nb
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-4, msg=f"gradient of {na}")


@pytest.mark.parametrize("model", ["sage", "gat", "mlp"])
def test_models_on_bag_of_words_equal_the_dense_product(model, blocks, spy, monkeypatch):
    """The whole model, outputs and every gradient, with the sparse product and without it."""
    x = bag_of_words(blocks[0].num_src, 300, 0.02)

    def run():
        torch.manual_seed(0)
        m = models.build_model(model, 300, 32, 7, 2, dropout=0.0)
        y = m(blocks, x)
        y.square().sum().backward()
        return y.detach(), {k: p.grad for k, p in m.named_parameters()}

    sparse_y, sparse_g = run()
    assert spy
    monkeypatch.setattr(sparserows, "SPARSE_BELOW", 0.0)
    taken = len(spy)
    dense_y, dense_g = run()
    assert len(spy) == taken                                    # the dense product this time
    torch.testing.assert_close(sparse_y, dense_y, rtol=1e-5, atol=1e-5)
    for k in dense_g:
        torch.testing.assert_close(sparse_g[k], dense_g[k], rtol=1e-4, atol=1e-4, msg=f"gradient of {k}")


def test_evaluation_keeps_a_weight_s_transpose_until_the_weight_changes():
    """Without gradients a parameter's transpose is made once, and made again once the parameter changes (an
    optimizer step, a loaded state); with gradients it is made every call (the product's backward needs it)."""
    layer = torch.nn.Linear(300, 16)
    rows = SparseRows.of(bag_of_words(50, 300, 0.02))
    with torch.no_grad():
        first = sparserows.transposed(layer.weight)
        assert sparserows.transposed(layer.weight) is first
        torch.testing.assert_close(rows.linear(layer.weight, layer.bias), layer(rows.head().to_dense()))
        layer.weight.mul_(2.0)                                   # in place, as an optimizer step
        again = sparserows.transposed(layer.weight)
        assert again is not first and torch.equal(again, layer.weight.t())
        torch.testing.assert_close(rows.linear(layer.weight, layer.bias), layer(rows.head().to_dense()))
    assert sparserows.transposed(layer.weight) is not again
    y = rows.linear(layer.weight)
    y.sum().backward()
    assert layer.weight.grad is not None and torch.equal(layer.weight.grad, rows.head().to_dense().sum(0).expand(16, -1))
    with torch.no_grad():
        sparserows.transposed(layer.weight)
    key = id(layer.weight)
    assert key in sparserows._TRANSPOSED
    del layer, y                                                 # (y's graph holds the weight too)
    import gc
    gc.collect()
    assert key not in sparserows._TRANSPOSED                   # kept no longer than the parameter
