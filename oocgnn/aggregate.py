"""Message passing on blocks without DGL: sum/mean aggregation, attention-weighted aggregation and
edge softmax over a `Block`'s CSC arrays, on any torch device.

* `BlockTensors`: a block's CSC arrays as torch tensors on one device (made once per block and
  device, `BlockTensors.of`); the transpose (CSR, for the backward pass) is built on first use.
* On the CPU the kernels are numba loops over destination rows (parallel, GIL released, float32),
  each with a hand-written backward (`torch.autograd.Function`): copy_u+sum/mean is an SpMM,
  its gradient the SpMM of the transpose; u_mul_e+sum (GAT) adds the per-edge dot product. These
  are DGL's `update_all(copy_u, sum/mean)`, `update_all(u_mul_e, sum)`, `apply_edges(u_add_v)` and
  `edge_softmax`. Every sum runs in a fixed order (rows, or the transpose's rows; no atomics), so
  a step's gradients are the same at every call and any thread count.
* On other devices (CUDA) they are plain torch ops with torch's autograd: a sparse CSR matmul for
  sum/mean, gather-scale-`index_add_` for the weighted sum, scatter max/sum for the softmax (the
  GPU box's measurements, `shared/notes/gpu-box.md`). `backend="torch"` (or the module's
  `BACKEND`) forces them on the CPU, which is how the tests check them without a GPU.

Aggregation runs in float32 under autocast (bf16 matmuls, fp32 sums), like DGL's SpMM.
"""
from __future__ import annotations

import warnings

import numba
import numpy as np
import torch

from .blocks import _PAR_LOCK, Block   # one lock for every parallel launch: the sampler's and ours

__all__ = ["BlockTensors", "aggregate", "aggregate_with_dst", "weighted_sum", "attention_logits", "edge_softmax"]

_PAR_MIN = 1 << 15             # edges x width below which one thread beats a parallel launch


class BlockTensors:
    """One block's CSC on `device`: indptr int64 [num_dst+1], indices int64 [E] (local src ids)."""

    def __init__(self, block: Block, device, non_blocking=False):
        device = torch.device(device)
        self.device, self.num_src, self.num_dst = device, block.num_src, block.num_dst
        self.num_edges = block.num_edges
        self.indptr_np = np.ascontiguousarray(block.indptr, dtype=np.int64)
        self.indices_np = np.ascontiguousarray(block.indices, dtype=np.int64)
        self.indptr = torch.from_numpy(self.indptr_np).to(device, non_blocking=non_blocking)
        self.indices = torch.from_numpy(self.indices_np).to(device, non_blocking=non_blocking)
        self._t = self._dst = self._csr = self._csr_t = None

    @classmethod
    def of(cls, block, device, non_blocking=False) -> "BlockTensors":
        """The block's tensors on `device`, made once and kept on the block (a BlockTensors passes)."""
        if isinstance(block, BlockTensors):
            return block
        device = torch.device(device)
        cache = block.__dict__.setdefault("_tensors", {})
        key = str(device)
        if key not in cache:
            cache[key] = cls(block, device, non_blocking)
        return cache[key]

    def __repr__(self):
        return f"BlockTensors(num_src={self.num_src}, num_dst={self.num_dst}, num_edges={self.num_edges}, " \
               f"device={self.device})"

    @property
    def degrees(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    # -- numba (CPU) -------------------------------------------------------------------------
    def transpose_np(self):
        """(t_indptr int64 [num_src+1], t_dst int64 [E], t_eid int64 [E]): in-edges grouped by source."""
        if self._t is None:
            self._t = _transpose(self.indptr_np, self.indices_np, self.num_src)
        return self._t

    def edge_ids_np(self):
        """int64 [E]: 0..E-1 (the CSC's own edge order)."""
        if getattr(self, "_eid", None) is None:
            self._eid = np.arange(self.num_edges, dtype=np.int64)
        return self._eid

    # -- torch (any device) ------------------------------------------------------------------
    def dst(self) -> torch.Tensor:
        """int64 [E]: each edge's local dst id (CSC order)."""
        if self._dst is None:
            self._dst = torch.repeat_interleave(torch.arange(self.num_dst, device=self.device), self.degrees,
                                                output_size=self.num_edges)
        return self._dst

    def csr(self, mean: bool) -> torch.Tensor:
        """The [num_dst, num_src] sparse CSR matrix of sum (or mean) aggregation."""
        if self._csr is None or self._csr[0] != mean:
            if mean:
                values = (1.0 / self.degrees.clamp(min=1).float())[self.dst()]
            else:
                values = torch.ones(self.num_edges, device=self.device)
            with warnings.catch_warnings():              # "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                self._csr = (mean, torch.sparse_csr_tensor(self.indptr, self.indices, values,
                                                           size=(self.num_dst, self.num_src),
                                                           check_invariants=False))
        return self._csr[1]


# ---------------------------------------------------------------------------------------------
# numba kernels. One Python source each, compiled twice: serial and parallel (prange = range in the
# serial twin). All arrays float32/int64, C-contiguous.

def _spmm_src(indptr, indices, x, mean, out):
    """out[j] = sum (or mean) of x[indices[e]] over e in indptr[j]:indptr[j+1]."""
    d = x.shape[1]
    for j in numba.prange(len(indptr) - 1):
        lo, hi = indptr[j], indptr[j + 1]
        row = out[j]
        row[:] = 0.0
        for e in range(lo, hi):
            xs = x[indices[e]]
            for k in range(d):
                row[k] += xs[k]
        if mean and hi > lo:
            s = np.float32(1.0) / np.float32(hi - lo)
            for k in range(d):
                row[k] *= s


def _spmm_t_src(t_indptr, t_dst, indptr, g, mean, out):
    """out[s] = sum over edges s -> j of g[j] (/ deg j): the transpose's SpMM (grad of x)."""
    d = g.shape[1]
    for s in numba.prange(len(t_indptr) - 1):
        row = out[s]
        row[:] = 0.0
        for e in range(t_indptr[s], t_indptr[s + 1]):
            j = t_dst[e]
            gj = g[j]
            if mean:
                c = np.float32(1.0) / np.float32(indptr[j + 1] - indptr[j])
                for k in range(d):
                    row[k] += c * gj[k]
            else:
                for k in range(d):
                    row[k] += gj[k]


def _wsum_src(indptr, indices, eid, x, w, out):
    """out[j, h] = sum over t in row j of w[eid[t], h] * x[indices[t], h]  (x [S, H, F], w [E, H],
    out [rows, H, F]): GAT's weighted sum on the CSC (eid = edge ids), and its gradient of x on the
    transpose (rows = sources, indices = their dst, eid = the edge ids)."""
    nh, f = x.shape[1], x.shape[2]
    for j in numba.prange(len(indptr) - 1):
        row = out[j]
        row[:, :] = 0.0
        for t in range(indptr[j], indptr[j + 1]):
            xs = x[indices[t]]
            e = eid[t]
            for h in range(nh):
                c = w[e, h]
                for k in range(f):
                    row[h, k] += c * xs[h, k]


def _wsum_grad_w_src(indptr, indices, x, g, gw):
    """gw[e, h] = <g[j, h], x[indices[e], h]> for e into j."""
    nh, f = x.shape[1], x.shape[2]
    for j in numba.prange(len(indptr) - 1):
        gj = g[j]
        for e in range(indptr[j], indptr[j + 1]):
            xs = x[indices[e]]
            for h in range(nh):
                acc = np.float32(0.0)
                for k in range(f):
                    acc += gj[h, k] * xs[h, k]
                gw[e, h] = acc


def _softmax_src(indptr, e, out):
    """out[:, h] = softmax of e[:, h] over each dst's in-edges."""
    nh = e.shape[1]
    for j in numba.prange(len(indptr) - 1):
        lo, hi = indptr[j], indptr[j + 1]
        if hi == lo:
            continue
        for h in range(nh):
            m = e[lo, h]
            for t in range(lo + 1, hi):
                m = max(m, e[t, h])
            s = np.float32(0.0)
            for t in range(lo, hi):
                v = np.exp(e[t, h] - m)
                out[t, h] = v
                s += v
            inv = np.float32(1.0) / s
            for t in range(lo, hi):
                out[t, h] *= inv


def _softmax_grad_src(indptr, a, g, out):
    """out = a * (g - sum over the dst's edges of g * a)  (the softmax's vector-Jacobian product)."""
    nh = a.shape[1]
    for j in numba.prange(len(indptr) - 1):
        lo, hi = indptr[j], indptr[j + 1]
        for h in range(nh):
            s = np.float32(0.0)
            for t in range(lo, hi):
                s += g[t, h] * a[t, h]
            for t in range(lo, hi):
                out[t, h] = a[t, h] * (g[t, h] - s)


def _logits_src(indptr, indices, el, er, slope, out):
    """out[e, h] = leaky_relu(el[indices[e], h] + er[j, h]) for e into j (GAT's u_add_v)."""
    nh = el.shape[1]
    for j in numba.prange(len(indptr) - 1):
        for e in range(indptr[j], indptr[j + 1]):
            s = indices[e]
            for h in range(nh):
                z = el[s, h] + er[j, h]
                out[e, h] = z if z > 0 else z * slope


def _logits_grad_er_src(indptr, z, g, slope, gz, ger):
    """gz = g * leaky_relu'(z) per edge; ger[j] = sum of gz over j's in-edges."""
    nh = z.shape[1]
    for j in numba.prange(len(indptr) - 1):
        for h in range(nh):
            ger[j, h] = 0.0
        for e in range(indptr[j], indptr[j + 1]):
            for h in range(nh):
                v = g[e, h] if z[e, h] > 0 else g[e, h] * slope
                gz[e, h] = v
                ger[j, h] += v


def _logits_grad_el_src(t_indptr, t_eid, gz, gel):
    """gel[s] = sum of gz over the edges out of s (the transpose: a fixed order, no atomics)."""
    nh = gz.shape[1]
    for s in numba.prange(len(t_indptr) - 1):
        for h in range(nh):
            gel[s, h] = 0.0
        for t in range(t_indptr[s], t_indptr[s + 1]):
            e = t_eid[t]
            for h in range(nh):
                gel[s, h] += gz[e, h]


def _twins(fn):
    opts = dict(nogil=True, fastmath=True, cache=True)
    return numba.njit(**opts)(fn), numba.njit(parallel=True, **opts)(fn)


_spmm = _twins(_spmm_src)
_spmm_t = _twins(_spmm_t_src)
_wsum = _twins(_wsum_src)
_wsum_grad_w = _twins(_wsum_grad_w_src)
_softmax = _twins(_softmax_src)
_logits = _twins(_logits_src)
_logits_grad_er = _twins(_logits_grad_er_src)
_logits_grad_el = _twins(_logits_grad_el_src)
_softmax_grad = _twins(_softmax_grad_src)


def _launch(kernel, work, *args):
    """Run the parallel twin when the work is large and no other parallel launch is under way."""
    serial, parallel = kernel
    if work >= _PAR_MIN and numba.get_num_threads() > 1 and _PAR_LOCK.acquire(blocking=False):
        try:
            return parallel(*args)
        finally:
            _PAR_LOCK.release()
    return serial(*args)


@numba.njit(cache=True, nogil=True)
def _transpose(indptr, indices, num_src):
    """Counting sort of the CSC's edges by source: (t_indptr [S+1], t_dst [E], t_eid [E])."""
    ne = len(indices)
    t_indptr = np.zeros(num_src + 1, dtype=np.int64)
    for e in range(ne):
        t_indptr[indices[e] + 1] += 1
    for s in range(num_src):
        t_indptr[s + 1] += t_indptr[s]
    fill = t_indptr[:-1].copy()
    t_dst = np.empty(ne, dtype=np.int64)
    t_eid = np.empty(ne, dtype=np.int64)
    for j in range(len(indptr) - 1):
        for e in range(indptr[j], indptr[j + 1]):
            p = fill[indices[e]]
            t_dst[p] = j
            t_eid[p] = e
            fill[indices[e]] += 1
    return t_indptr, t_dst, t_eid


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).contiguous().numpy()


class _Aggregate(torch.autograd.Function):
    """(aggregate of x, x[:num_dst]): the dst rows come out of the same function so that their
    gradient is added into the aggregate's [num_src, D] gradient in place (autograd would zero-fill
    a second [num_src, D] tensor for the slice and add the two)."""

    @staticmethod
    def forward(ctx, x, g, mean):
        ctx.g, ctx.mean = g, mean
        out = np.empty((g.num_dst, x.shape[1]), np.float32)
        _launch(_spmm, g.num_edges * x.shape[1], g.indptr_np, g.indices_np, _np(x), mean, out)
        return torch.from_numpy(out), x[:g.num_dst].clone()

    @staticmethod
    def backward(ctx, grad, grad_dst):
        g = ctx.g
        t_indptr, t_dst, _ = g.transpose_np()
        out = torch.empty((g.num_src, grad.shape[1]), dtype=torch.float32)
        _launch(_spmm_t, g.num_edges * grad.shape[1], t_indptr, t_dst, g.indptr_np, _np(grad), ctx.mean,
                out.numpy())
        if grad_dst is not None:
            out[:g.num_dst] += grad_dst
        return out, None, None


class _WeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, g):
        x_np, w_np = _np(x), _np(w)
        ctx.g = g
        ctx.save_for_backward(x, w)
        out = np.empty((g.num_dst, x.shape[1], x.shape[2]), np.float32)
        _launch(_wsum, g.num_edges * x.shape[1] * x.shape[2], g.indptr_np, g.indices_np, g.edge_ids_np(),
                x_np, w_np, out)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad):
        g = ctx.g
        x, w = ctx.saved_tensors
        grad_np = _np(grad)
        work = g.num_edges * x.shape[1] * x.shape[2]
        gx = gw = None
        if ctx.needs_input_grad[0]:
            t_indptr, t_dst, t_eid = g.transpose_np()
            gx = np.empty((g.num_src, x.shape[1], x.shape[2]), np.float32)
            _launch(_wsum, work, t_indptr, t_dst, t_eid, grad_np, _np(w), gx)
            gx = torch.from_numpy(gx)
        if ctx.needs_input_grad[1]:
            gw = np.empty((g.num_edges, x.shape[1]), np.float32)
            _launch(_wsum_grad_w, work, g.indptr_np, g.indices_np, _np(x), grad_np, gw)
            gw = torch.from_numpy(gw)
        return gx, gw, None


class _AttentionLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, el, er, g, slope):
        out = np.empty((g.num_edges, el.shape[1]), np.float32)
        _launch(_logits, g.num_edges * el.shape[1], g.indptr_np, g.indices_np, _np(el), _np(er), np.float32(slope), out)
        z = torch.from_numpy(out)
        ctx.g, ctx.slope, ctx.num_src = g, slope, el.shape[0]
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        g, nh = ctx.g, z.shape[1]
        gz = np.empty((g.num_edges, nh), np.float32)
        ger = np.empty((g.num_dst, nh), np.float32)
        _launch(_logits_grad_er, g.num_edges * nh, g.indptr_np, z.numpy(), _np(grad), np.float32(ctx.slope), gz, ger)
        t_indptr, _, t_eid = g.transpose_np()
        gel = np.empty((ctx.num_src, nh), np.float32)
        _launch(_logits_grad_el, g.num_edges * nh, t_indptr, t_eid, gz, gel)
        return torch.from_numpy(gel), torch.from_numpy(ger), None, None


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, g):
        out = np.zeros(e.shape, np.float32)
        _launch(_softmax, g.num_edges * e.shape[1], g.indptr_np, _np(e), out)
        a = torch.from_numpy(out)
        ctx.g = g
        ctx.save_for_backward(a)
        return a

    @staticmethod
    def backward(ctx, grad):
        (a,) = ctx.saved_tensors
        out = np.empty(a.shape, np.float32)
        _launch(_softmax_grad, ctx.g.num_edges * a.shape[1], ctx.g.indptr_np, a.numpy(), _np(grad), out)
        return torch.from_numpy(out), None


BACKEND = "auto"    # the default of every function's `backend`: auto (numba on the CPU, torch elsewhere) | torch


def _use_numba(x: torch.Tensor, backend) -> bool:
    backend = BACKEND if backend is None else backend
    if backend not in ("auto", "numba", "torch"):
        raise ValueError(f"backend must be auto, numba or torch, not {backend!r}")
    return x.device.type == "cpu" and backend != "torch"


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def aggregate(block, x: torch.Tensor, mean=False, backend=None) -> torch.Tensor:
    """[num_dst, D]: the sum (mean=False) or mean of x [num_src, D] over each dst's in-neighbours
    (0 where a dst has none). DGL: update_all(copy_u, sum/mean)."""
    return aggregate_with_dst(block, x, mean, backend)[0]


def aggregate_with_dst(block, x: torch.Tensor, mean=False, backend=None):
    """(aggregate(block, x, mean), x[:num_dst] in float32): what SAGE and GIN combine; cheaper in the
    backward pass than slicing x apart."""
    g = BlockTensors.of(block, x.device)
    if x.shape[0] != g.num_src:
        raise ValueError(f"x has {x.shape[0]} rows, the block {g.num_src} source nodes")
    with torch.autocast(x.device.type, enabled=False):
        x = _fp32(x)
        if _use_numba(x, backend):
            return _Aggregate.apply(x, g, bool(mean))
        return torch.sparse.mm(g.csr(bool(mean)), x), x[:g.num_dst]


def weighted_sum(block, x: torch.Tensor, w: torch.Tensor, backend=None) -> torch.Tensor:
    """[num_dst, H, F]: sum over in-edges e = s -> j of w[e, h] * x[s, h] (x [num_src, H, F],
    w [E, H]). DGL: update_all(u_mul_e, sum), GAT's aggregation."""
    g = BlockTensors.of(block, x.device)
    with torch.autocast(x.device.type, enabled=False):
        x, w = _fp32(x), _fp32(w)
        if _use_numba(x, backend):
            return _WeightedSum.apply(x, w, g)
        msg = x[g.indices] * w.unsqueeze(-1)
        return x.new_zeros(g.num_dst, x.shape[1], x.shape[2]).index_add_(0, g.dst(), msg)


def attention_logits(block, el: torch.Tensor, er: torch.Tensor, negative_slope=0.2, backend=None) -> torch.Tensor:
    """[E, H]: leaky_relu(el[src] + er[dst]) per edge (el [num_src, H], er [num_dst, H]): GAT's
    unnormalised attention. DGL: apply_edges(u_add_v) + leaky_relu. Its CPU backward sums in a fixed
    order (torch's scatter-add of an index backward does not: runs would differ)."""
    g = BlockTensors.of(block, el.device)
    with torch.autocast(el.device.type, enabled=False):
        el, er = _fp32(el), _fp32(er)
        if _use_numba(el, backend):
            return _AttentionLogits.apply(el, er, g, float(negative_slope))
        return torch.nn.functional.leaky_relu(el[g.indices] + er[g.dst()], negative_slope)


def edge_softmax(block, e: torch.Tensor, backend=None) -> torch.Tensor:
    """[E, H]: e [E, H] normalised by a softmax over each dst's in-edges. DGL: edge_softmax."""
    g = BlockTensors.of(block, e.device)
    with torch.autocast(e.device.type, enabled=False):
        e = _fp32(e)
        if _use_numba(e, backend):
            return _EdgeSoftmax.apply(e, g)
        dst = g.dst().unsqueeze(1).expand_as(e)
        with torch.no_grad():                        # the shift cancels in the softmax and its gradient
            m = e.new_full((g.num_dst, e.shape[1]), float("-inf")).scatter_reduce(0, dst, e, "amax")
        ex = torch.exp(e - m.gather(0, dst))
        s = e.new_zeros(g.num_dst, e.shape[1]).index_add_(0, g.dst(), ex)
        return ex / s.gather(0, dst)
