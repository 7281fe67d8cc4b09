"""GNN models on blocks (message-flow graphs, `oocgnn.blocks.Block`): GraphSAGE, GAT, GIN, and an
MLP control. The layers are DGL's modules, fed each block's `to_dgl()`.

Every model takes `(blocks, x)` where `x` holds the input rows of `blocks[0]` and returns
logits for the destination nodes of `blocks[-1]` (the seeds). A block's destination nodes come
first among its sources, which is what `h[:block.num_dst]` uses.

`forward` is a loop over `layer(i, block, h)`, so an executor can stop before the last layer,
replace some of its input rows (OUTRE's historical embeddings of layer L−1) and finish.
"""
from __future__ import annotations

import dgl.nn as dglnn
import torch.nn as nn
import torch.nn.functional as F

from .errors import UserError


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


class SAGE(BlockModel):
    """GraphSAGE with mean aggregation (Hamilton et al. 2017), as in DGL's example."""

    def __init__(self, in_dim, hidden, out_dim, num_layers=2, dropout=0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.layers = nn.ModuleList(dglnn.SAGEConv(a, b, "mean") for a, b in zip(dims, dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def layer(self, i, block, h):
        h = self.layers[i](block.to_dgl(), (h, h[:block.num_dst]))
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
            self.layers.append(dglnn.GATConv(d, out_dim if last else hidden // heads,
                                             1 if last else heads, allow_zero_in_degree=True))
            d = self.hidden_width(hidden, heads)
        self.dropout = nn.Dropout(dropout)

    def layer(self, i, block, h):
        h = self.layers[i](block.to_dgl(), (h, h[:block.num_dst]))
        return self.dropout(F.elu(h.flatten(1))) if i < len(self.layers) - 1 else h.mean(1)


class GIN(BlockModel):
    """Graph isomorphism network (Xu et al. 2019): sum aggregation, a 2-layer MLP per layer."""

    def __init__(self, in_dim, hidden, out_dim, num_layers=2, dropout=0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * num_layers
        self.layers = nn.ModuleList(
            dglnn.GINConv(nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b)), "sum",
                          learn_eps=True)
            for a, b in zip(dims, dims[1:]))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(num_layers))
        self.head = nn.Linear(hidden, out_dim)
        self.dropout = nn.Dropout(dropout)

    def layer(self, i, block, h):
        h = self.dropout(F.relu(self.norms[i](self.layers[i](block.to_dgl(), (h, h[:block.num_dst])))))
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
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


MODELS = {"sage": SAGE, "gat": GAT, "gin": GIN, "mlp": MLP}


def hidden_width(name, hidden) -> int:
    """Width of model `name`'s hidden embeddings h^(l) for a `hidden` setting."""
    if name not in MODELS or not hasattr(MODELS[name], "hidden_width"):
        raise UserError(f"model {name!r} has no hidden message-passing layers")
    return MODELS[name].hidden_width(hidden)


def build_model(name, in_dim, hidden, out_dim, num_layers, dropout=0.5) -> nn.Module:
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name](in_dim, hidden, out_dim, num_layers=num_layers, dropout=dropout)
