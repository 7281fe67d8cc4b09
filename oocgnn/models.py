"""GNN models on blocks (message-flow graphs, `oocgnn.blocks.Block`): GraphSAGE, GAT, GIN, and an
MLP control, on any torch device and without DGL.

The layers (`SAGEConv`, `GATConv`, `GINConv`) are torch-native re-implementations of DGL 1.1's
modules of the same names on our blocks (`oocgnn.aggregate`): the same parameters under the same
names, initialised in the same order (a seed gives the same weights as DGL's), and with the same
weights the same outputs and gradients (tests against DGL).

Every model takes `(blocks, x)` where `x` holds the input rows of `blocks[0]` and returns
logits for the destination nodes of `blocks[-1]` (the seeds). A block's destination nodes come
first among its sources, which is what `h[:block.num_dst]` uses.

`forward` is a loop over `layer(i, block, h)`, so an executor can stop before the last layer,
replace some of its input rows (OUTRE's historical embeddings of layer L−1) and finish.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from .aggregate import BlockTensors, aggregate_with_dst, attention_logits, edge_softmax, weighted_sum
from .errors import UserError
from .sparserows import SparseRows, input_linear


class SAGEConv(nn.Module):
    """GraphSAGE's mean aggregator (Hamilton et al. 2017): fc_self(h_dst) + fc_neigh(mean of h_src);
    projects before aggregating when that narrows the rows (as DGL does; mostly-zero rows as a sparse
    matmul, `oocgnn.sparserows`). DGL: SAGEConv(..., "mean")."""

    def __init__(self, in_feats, out_feats):
        super().__init__()
        self.in_feats, self.out_feats = in_feats, out_feats
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_self = nn.Linear(in_feats, out_feats, bias=True)
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    @property
    def projection_width(self) -> int:
        """Width of `project`'s rows where this layer projects before aggregating, else 0."""
        return 2 * self.out_feats if self.in_feats > self.out_feats else 0

    def project(self, h):
        """Each row's fc_neigh(h) | fc_self(h) [n, 2 out_feats]: `from_projection` finishes the layer."""
        rows = SparseRows.of(h)
        return torch.cat([input_linear(h, rows, self.fc_neigh.weight),
                          input_linear(h, rows, self.fc_self.weight, self.fc_self.bias)], 1)

    def from_projection(self, block, p):
        """forward(block, h) from p = project(h) of the block's sources."""
        o = self.out_feats
        h_neigh, _ = aggregate_with_dst(block, p[:, :o].contiguous(), mean=True)
        return p[:block.num_dst, o:] + h_neigh

    def forward(self, block, h):
        """h [num_src, in_feats] -> [num_dst, out_feats]."""
        if self.in_feats > self.out_feats:
            rows = SparseRows.of(h)                          # bag-of-words input: a sparse matmul
            h_neigh, _ = aggregate_with_dst(block, input_linear(h, rows, self.fc_neigh.weight), mean=True)
            return input_linear(h, rows, self.fc_self.weight, self.fc_self.bias, block.num_dst) + h_neigh
        h_neigh, h_dst = aggregate_with_dst(block, h, mean=True)
        return self.fc_self(h_dst) + self.fc_neigh(h_neigh)


class GATConv(nn.Module):
    """Graph attention (Veličković et al. 2018): per head, softmax over in-edges of
    leaky_relu(a_l·Wh_src + a_r·Wh_dst) weights the sum of Wh_src; output [num_dst, heads, out_feats].
    DGL: GATConv(in, out, heads, allow_zero_in_degree=True) (no dropout, no residual, bias)."""

    def __init__(self, in_feats, out_feats, num_heads, negative_slope=0.2):
        super().__init__()
        self.num_heads, self.out_feats, self.negative_slope = num_heads, out_feats, negative_slope
        self.fc = nn.Linear(in_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.bias = nn.Parameter(torch.empty(num_heads * out_feats))
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        nn.init.constant_(self.bias, 0)

    @property
    def projection_width(self) -> int:
        """Width of `project`'s rows (H·F features and 2H attention logits a row) where they are narrower
        than the input, else 0."""
        width = self.num_heads * (self.out_feats + 2)
        return width if width < self.fc.in_features else 0

    def _project(self, h):
        """(W h [n, H·F], attention logits [n, 2H]) of each row."""
        # a_l·(W h) = (W^T a_l)·h: the attention logits from a [2H, in] matmul (cheaper than DGL's two
        # products over [num_src, H, F] and their backward passes)
        H = self.num_heads
        w_heads = self.fc.weight.view(H, self.out_feats, -1)                    # [H, F, in]
        attn = torch.cat([torch.einsum("hfi,hf->hi", w_heads, self.attn_l[0]),
                          torch.einsum("hfi,hf->hi", w_heads, self.attn_r[0])])  # [2H, in]
        rows = SparseRows.of(h)                                                 # bag-of-words input
        return input_linear(h, rows, self.fc.weight), input_linear(h, rows, attn)

    def _finish(self, block, feat, logits):
        """The layer from its sources' W h (contiguous) and attention logits."""
        H = self.num_heads
        feat = feat.view(-1, H, self.out_feats)                                 # [num_src, H, F]
        el, er = logits[:, :H], logits[:block.num_dst, H:]                      # [num_src, H], [num_dst, H]
        g = BlockTensors.of(block, feat.device)
        e = attention_logits(g, el, er, self.negative_slope)                    # [E, H]
        out = weighted_sum(g, feat, edge_softmax(g, e))
        return out + self.bias.view(1, self.num_heads, self.out_feats)

    def project(self, h):
        """Each row's W h [n, H·F] and attention logits [n, 2H], side by side: `from_projection` finishes."""
        return torch.cat(self._project(h), 1)

    def from_projection(self, block, p):
        """forward(block, h) from p = project(h) of the block's sources."""
        HF = self.num_heads * self.out_feats
        return self._finish(block, p[:, :HF].contiguous(), p[:, HF:])

    def forward(self, block, h):
        return self._finish(block, *self._project(h))


class GINConv(nn.Module):
    """Graph isomorphism layer (Xu et al. 2019): apply_func((1 + eps) h_dst + sum of h_src), eps
    learnable. DGL: GINConv(apply_func, "sum", learn_eps=True)."""

    def __init__(self, apply_func, init_eps=0.0):
        super().__init__()
        self.apply_func = apply_func
        self.eps = nn.Parameter(torch.tensor([float(init_eps)]))

    def forward(self, block, h):
        neigh, h_dst = aggregate_with_dst(block, h)
        rst = (1 + self.eps) * h_dst + neigh
        return self.apply_func(rst)


class BlockModel(nn.Module):
    """A stack of message-passing layers; subclasses define `layer(i, block, h)`."""

    @staticmethod
    def hidden_width(hidden: int, **kw) -> int:
        """Width of a hidden layer's output h^(l) for a `hidden` setting (what histories store)."""
        return int(hidden)

    def forward(self, blocks, x):
        for i, block in enumerate(blocks):
            x = self.layer(i, block, x)
        return x

    def projection_width(self, i) -> int:
        """Width of layer i's per-row projection where the layer projects each source row on its own before
        aggregating (`project`, then `layer_from_projection`: layer-wise evaluation projects every input row
        once instead of once per chunk that gathers it), else 0."""
        return getattr(self.layers[i], "projection_width", 0)

    def project(self, i, h):
        return self.layers[i].project(h)

    def layer_from_projection(self, i, block, p):
        """layer(i, block, h) from p = project(i, h) of the block's sources."""
        return self._activate(i, self.layers[i].from_projection(block, p))


class SAGE(BlockModel):
    """GraphSAGE with mean aggregation (Hamilton et al. 2017), as in DGL's example."""

    def __init__(self, in_dim, hidden, out_dim, num_layers=2, dropout=0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims, dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def layer(self, i, block, h):
        return self._activate(i, self.layers[i](block, h))

    def _activate(self, i, h):
        return self.dropout(F.relu(h)) if i < len(self.layers) - 1 else h


class GAT(BlockModel):
    """Graph attention (Veličković et al. 2018): `heads` heads per hidden layer, 1 at the output."""

    @staticmethod
    def hidden_width(hidden, heads=4):
        """`heads` heads of hidden // heads features each, concatenated."""
        return (int(hidden) // heads) * heads

    def __init__(self, in_dim, hidden, out_dim, num_layers=2, dropout=0.5, heads=4):
        super().__init__()
        self.layers = nn.ModuleList()
        d = in_dim
        for i in range(num_layers):
            last = i == num_layers - 1
            self.layers.append(GATConv(d, out_dim if last else hidden // heads, 1 if last else heads))
            d = self.hidden_width(hidden, heads)
        self.dropout = nn.Dropout(dropout)

    def layer(self, i, block, h):
        return self._activate(i, self.layers[i](block, h))

    def _activate(self, i, h):
        return self.dropout(F.elu(h.flatten(1))) if i < len(self.layers) - 1 else h.mean(1)


class GIN(BlockModel):
    """Graph isomorphism network (Xu et al. 2019): sum aggregation, a 2-layer MLP per layer."""

    def __init__(self, in_dim, hidden, out_dim, num_layers=2, dropout=0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * num_layers
        self.layers = nn.ModuleList(
            GINConv(nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b)))
            for a, b in zip(dims, dims[1:]))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(num_layers))
        self.head = nn.Linear(hidden, out_dim)
        self.dropout = nn.Dropout(dropout)

    def layer(self, i, block, h):
        h = self.dropout(F.relu(self.norms[i](self.layers[i](block, h))))
        return self.head(h) if i == len(self.layers) - 1 else h


class MLP(nn.Module):
    """Features of the seeds only, no graph: the control that shows what the graph adds."""

    def __init__(self, in_dim, hidden, out_dim, num_layers=2, dropout=0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x[:blocks[-1].num_dst]
        rows = SparseRows.of(h)                                      # bag-of-words input
        for i, layer in enumerate(self.layers):
            h = input_linear(h, rows, layer.weight, layer.bias) if i == 0 else layer(h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


MODELS = {"sage": SAGE, "gat": GAT, "gin": GIN, "mlp": MLP}


class DGLLayer(nn.Module):
    """DGL's module matching one of our layers, holding that layer's weights (under DGL's names, which
    are ours), called as ours: (block, h) -> module(block.to_dgl(), (h, h[:num_dst])). The oracle of
    the tests and benchmarks/models.py; imports DGL."""

    def __init__(self, layer):
        super().__init__()

        import dgl.nn as dglnn
        if isinstance(layer, SAGEConv):
            self.module = dglnn.SAGEConv(layer.in_feats, layer.out_feats, "mean")
        elif isinstance(layer, GATConv):
            self.module = dglnn.GATConv(layer.fc.in_features, layer.out_feats, layer.num_heads,
                                        negative_slope=layer.negative_slope, allow_zero_in_degree=True)
        elif isinstance(layer, GINConv):
            self.module = dglnn.GINConv(copy.deepcopy(layer.apply_func), "sum", learn_eps=True)
        else:
            raise TypeError(f"no DGL twin for {type(layer).__name__}")
        self.module.load_state_dict(layer.state_dict())

    def forward(self, block, h):
        return self.module(block.to_dgl(), (h, h[:block.num_dst]))


def dgl_twin(model: BlockModel) -> BlockModel:
    """A copy of `model` whose message-passing layers are DGL's, with the same weights (imports DGL)."""
    twin = copy.deepcopy(model)
    twin.layers = nn.ModuleList(DGLLayer(layer) for layer in model.layers)
    return twin


def hidden_width(name, hidden) -> int:
    """Width of model `name`'s hidden embeddings h^(l) for a `hidden` setting."""
    if name not in MODELS or not hasattr(MODELS[name], "hidden_width"):
        raise UserError(f"model {name!r} has no hidden message-passing layers")
    return MODELS[name].hidden_width(hidden)


def build_model(name, in_dim, hidden, out_dim, num_layers, dropout=0.5) -> nn.Module:
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name](in_dim, hidden, out_dim, num_layers=num_layers, dropout=dropout)
