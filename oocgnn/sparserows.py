"""Mostly-zero input rows (bag-of-words features) projected as a sparse matmul.

A first layer that projects before aggregating (GraphSAGE and GAT when the features are wider than the
hidden layer, and the MLP control) multiplies every sampled row by a [out, in] weight. On bag-of-words
features most of that work multiplies zeros: coauthor_cs's 6,805 columns hold 60 non-zeros a row
(0.9 %), citeseer's and cora's about 1 %. `SparseRows.of(h)` turns such rows into CSR (a numba pass
that counts, then one that copies) and `linear` multiplies the CSR by the weight with
`torch.sparse.mm`, whose backward gives the weight's gradient (the features need none). The result
is the dense product's up to float32 summation order.

Only float32 rows on the CPU, outside autocast, that need no gradient, and only when their density is
below `SPARSE_BELOW` (first probed on the leading rows, so that dense features cost one small count):
on a GPU, or on dense features, the dense product is the fast one.
"""
from __future__ import annotations

import warnings
import weakref

import numba
import numpy as np
import torch
import torch.nn.functional as F

SPARSE_BELOW = 0.1        # density (non-zeros / entries) under which rows go sparse
_PROBE_ROWS = 256         # leading rows counted first, to turn dense rows away cheaply
_TRANSPOSED = {}          # id(parameter) -> (a weak reference to it, its version, its transpose), gradients off


def transposed(weight) -> torch.Tensor:
    """weight.t(), contiguous: `torch.sparse.mm` copies a transposed operand on every call (5 ms for a
    [512, 6805] weight, against 0.1 ms for the product of a few rows). While gradients are off (evaluation:
    many calls, unchanged weights) a parameter's copy is kept until its version changes."""
    if torch.is_grad_enabled() or not isinstance(weight, torch.nn.Parameter):
        return weight.t().contiguous()
    key = id(weight)
    hit = _TRANSPOSED.get(key)
    if hit is not None and hit[0]() is weight and hit[1] == weight._version:
        return hit[2]
    if hit is None:                                   # forgotten with the parameter
        weakref.finalize(weight, _TRANSPOSED.pop, key, None)
    wt = weight.detach().t().contiguous()
    _TRANSPOSED[key] = (weakref.ref(weight), weight._version, wt)
    return wt


def input_linear(h, rows, weight, bias=None, n=None) -> torch.Tensor:
    """F.linear(h[:n], weight, bias), through `rows` (`SparseRows.of(h)`: h as CSR, or None) where it is one."""
    if rows is not None:
        return rows.linear(weight, bias, n)
    return F.linear(h if n is None else h[:n], weight, bias)


@numba.njit(cache=True, nogil=True)
def _count(x, crow):
    for r in range(x.shape[0]):
        n = 0
        for c in range(x.shape[1]):
            if x[r, c] != 0:
                n += 1
        crow[r + 1] = crow[r] + n


@numba.njit(cache=True, nogil=True)
def _fill(x, crow, col, val):
    for r in range(x.shape[0]):
        k = crow[r]
        for c in range(x.shape[1]):
            if x[r, c] != 0:
                col[k] = c
                val[k] = x[r, c]
                k += 1


class SparseRows:
    """A float32 [n, d] matrix as CSR (crow int64 [n+1], col int64 [nnz], val float32 [nnz])."""

    def __init__(self, crow, col, val, shape):
        self.crow, self.col, self.val, self.shape = crow, col, val, tuple(shape)

    @classmethod
    def of(cls, h, below=None) -> "SparseRows | None":
        """`h` as CSR when sparse input applies to it (see the module) and its density is below `below`
        (default `SPARSE_BELOW`); else None: multiply it densely."""
        below = SPARSE_BELOW if below is None else below
        if (below <= 0 or not isinstance(h, torch.Tensor) or h.dim() != 2 or h.device.type != "cpu"
                or h.dtype != torch.float32 or h.requires_grad or torch.is_autocast_enabled("cpu")
                or h.shape[0] == 0 or h.shape[1] == 0):
            return None
        probe = h[:_PROBE_ROWS]
        if int(torch.count_nonzero(probe)) > below * probe.numel():
            return None
        x = h.detach().contiguous().numpy()
        crow = np.zeros(x.shape[0] + 1, dtype=np.int64)
        _count(x, crow)
        nnz = int(crow[-1])
        if nnz > below * x.size:
            return None
        col, val = np.empty(nnz, dtype=np.int64), np.empty(nnz, dtype=np.float32)
        _fill(x, crow, col, val)
        return cls(torch.from_numpy(crow), torch.from_numpy(col), torch.from_numpy(val), x.shape)

    @property
    def density(self) -> float:
        return len(self.val) / max(1, self.shape[0] * self.shape[1])

    def head(self, n=None) -> torch.Tensor:
        """The leading `n` rows (all by default) as a torch sparse CSR tensor (views, no copy)."""
        n = self.shape[0] if n is None else int(n)
        end = int(self.crow[n])
        with warnings.catch_warnings():             # "Sparse CSR tensor support is in beta state"
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(self.crow[:n + 1], self.col[:end], self.val[:end],
                                           size=(n, self.shape[1]))

    def linear(self, weight, bias=None, n=None) -> torch.Tensor:
        """F.linear(rows[:n], weight, bias): [n, out] from weight [out, in]."""
        out = torch.sparse.mm(self.head(n), transposed(weight))
        return out if bias is None else out + bias
