"""Evaluation as a plan: layer-wise inference over the store in its own order.

DGL's offline inference (the `inference` of its GraphSAGE example; Hamilton et al. 2017 §3.1's
layer-by-layer forward): instead of sampling each evaluation batch's L-hop tree and reading its input
rows (rows re-read by every batch that reaches them, in random order), compute layer 1 for every node
the evaluated ids need, then layer 2 from those embeddings, and so on. Only the L-hop in-neighbourhood
of the evaluated ids is computed: layer i's destination nodes are the sources of layer i+1's.

Neighbourhoods: the evaluation fanouts (-1: all neighbours, DGL's offline inference), each node's
layer-i neighbours drawn once with the sampler's key (seed, 0, 0, i, node). A node's draw depends only
on that key, so the result equals per-batch evaluation (`nodetask.evaluate`) of the same nodes in one batch,
and with full neighbourhoods at any batch size (the oracle tests).

Reads: the input rows (layer 0's sources) are read once per evaluation, sorted in store order, in
chunks of `read_chunk` bytes (`rows(ids)`: coalesced direct reads, outside the run's I/O accounting).
Where the first layer projects each source row on its own before aggregating (GraphSAGE and GAT on
features wider than their projection, `models.BlockModel.projection_width`), each chunk of rows is
projected as it is read and the input table holds the projections: every row multiplied once, not once
per destination chunk that gathers it, and a table of the projection's width instead of the features'.
Memory: the blocks (kept across evaluations: the neighbourhoods do not change), the input rows and
each layer's embeddings; a table that does not fit what `budget` leaves is spilled to an unnamed
temporary file (in $TMPDIR; gone with the process, even a killed one). A layer call's working memory
(its sources' rows and its edges' messages, at the layer's input width) is bounded too: destination
chunks shrink until a call takes at most a quarter of the budget (`WORK_FLOOR` at least), so that wide
features do not make one call of 8,192 nodes hold hundreds of MiB beside the budget.
"""
from __future__ import annotations

import os
import tempfile

import numba
import numpy as np
import torch

from .blocks import sample_layer
from .device import autocast
from .metrics import Tally

READ_CHUNK = 64 << 20        # bytes of input rows read per call
DST_CHUNK = 8192             # destination nodes per layer call, at most
WORK_FLOOR = 64 << 20        # a layer call's inputs and messages may take this much, or a quarter of the budget
READ_FLOOR = 4 << 20         # the read buffer may take this much, or a quarter of the budget (up to READ_CHUNK)


@numba.njit(nogil=True, cache=True)
def _permute_rows(rows, perm):
    """rows[i] <- rows[perm[i]] for a permutation `perm`, in place (cycle by cycle, one row of scratch): a
    spilled table's rows come back in file order and leave in the block's order without a second copy."""
    done = np.zeros(len(perm), dtype=np.bool_)
    tmp = np.empty(rows.shape[1], dtype=rows.dtype)
    for start in range(len(perm)):
        if done[start]:
            continue
        tmp[:] = rows[start]
        i = start
        while True:
            done[i] = True
            j = perm[i]
            if j == start:
                rows[i] = tmp
                break
            rows[i] = rows[j]
            i = j


class _Table:
    """Rows of sorted ids `ids` ([len(ids), dim] float32): in RAM, or in a temporary file (spilled).

    A spilled table is written and read with pwrite/pread, never memory-mapped: a mapped file's touched
    pages count in the process's RSS, which a spill is there to bound (the page cache holds them instead)."""

    def __init__(self, ids, dim, in_ram: bool):
        self.ids, self.dim, self.in_ram = ids, int(dim), in_ram
        if in_ram:
            self.rows = torch.empty((len(ids), self.dim), dtype=torch.float32)
            self._file = None
        else:
            # unnamed (O_TMPFILE where the OS has it): no file outlives a killed process
            self._file = tempfile.TemporaryFile(prefix="oocgnn-eval-", suffix=".bin")
            self.rows = None

    @property
    def nbytes(self) -> int:
        return len(self.ids) * self.dim * 4

    def write(self, lo, values: torch.Tensor):
        if self.in_ram:
            self.rows[lo:lo + len(values)] = values
        else:
            buf = np.ascontiguousarray(values.numpy(), dtype=np.float32)
            os.pwritev(self._file.fileno(), [memoryview(buf).cast("B")], lo * self.dim * 4)

    def take(self, pos: np.ndarray) -> torch.Tensor:
        if self.in_ram:
            return self.rows[torch.from_numpy(pos)]
        return torch.from_numpy(self._read(np.asarray(pos, dtype=np.int64)))

    def _read(self, pos) -> np.ndarray:
        """Rows at `pos` from the file: one pread per run of consecutive positions, in file order."""
        uniq, inverse = np.unique(pos, return_inverse=True)
        out = np.empty((len(uniq), self.dim), dtype=np.float32)
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        starts, ends = np.r_[0, breaks], np.r_[breaks, len(uniq)]
        fd, row = self._file.fileno(), self.dim * 4
        flat = memoryview(out).cast("B")
        for a, b in zip(starts.tolist(), ends.tolist()):
            got = os.preadv(fd, [flat[a * row:b * row]], int(uniq[a]) * row)
            if got != (b - a) * row:
                raise OSError(f"short read of a spilled evaluation table: {got} of {(b - a) * row} bytes")
        inverse = inverse.reshape(-1)
        if len(uniq) == len(pos):                  # a block's sources: distinct, so a permutation, in place
            _permute_rows(out, inverse)
            return out
        return out[inverse]

    def all_rows(self) -> torch.Tensor:
        return self.rows if self.in_ram else torch.from_numpy(self._read(np.arange(len(self.ids))))

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def eval_budget(plan) -> int:
    """Bytes layer-wise evaluation may hold in RAM (the rest spills to a temporary file): what the plan
    leaves of the budget, since evaluation runs while the plan's residents are held; a baseline the
    budget does not bound (inmemory, mmap) evaluates within the budget itself."""
    if not plan.budgeted:
        return plan.budget
    return max(0, plan.budget - plan.resident_bytes())


class LayerwiseEval:
    """Layer-wise inference of `nodes` over `sampler`'s topology with `fanouts` (its seed keys the
    draws). `rows(sorted ids) -> [n, D] float32 tensor` gives feature rows; `budget` (bytes) bounds
    the blocks, the input rows and the embeddings held at once (what does not fit is spilled)."""

    def __init__(self, sampler, fanouts, nodes, feat_dim, rows, budget, dst_chunk=DST_CHUNK,
                 read_chunk=READ_CHUNK, widths=None):
        self.sampler, self.fanouts = sampler, [int(f) for f in fanouts]
        self.nodes = np.unique(np.asarray(nodes, dtype=np.int64))
        self.feat_dim, self.rows, self.budget = int(feat_dim), rows, int(budget)
        # each layer's input width (default: the features'), for the working memory of its calls
        self.widths = [int(w) for w in (widths or [feat_dim] * len(self.fanouts))]
        self.work = max(WORK_FLOOR, self.budget // 4)
        # the read buffer is part of the budget too: a quarter of it at most (64 MiB of reads under a 40 MB
        # budget took an mmap run past its memory cgroup's cap), and beside it READ_FLOOR at least, as a layer
        # call's WORK_FLOOR (a plan that fills its budget left OUTRE's evaluation 64 KiB a call on coauthor_cs:
        # 7,900 calls of two 27 KiB rows, 10 s an evaluation against 3 s of training an epoch)
        self.dst_chunk, self.read_chunk = int(dst_chunk), int(min(read_chunk, max(READ_FLOOR, self.budget // 4)))
        self.layers = None          # per layer: (sorted dst ids, [(lo, block, src positions)])
        self.spilled = []           # names of tables that went to a temporary file (last evaluation)

    # -- the plan: who needs whom, sampled once -------------------------------------------------
    def _plan(self):
        topo, s = self.sampler.topology, self.sampler
        layers, dst = [None] * len(self.fanouts), self.nodes
        for i in range(len(self.fanouts) - 1, -1, -1):
            chunks, srcs, lo, n = [], [], 0, self.dst_chunk
            while lo < len(dst):
                while True:        # a node's draw is keyed by the node: any chunking draws the same
                    frontier = dst[lo:lo + n]
                    starts, ends, buf = topo.lists(frontier)
                    block = sample_layer(frontier, starts, ends, buf, self.fanouts[i], s.seed, 0, 0, i, s.scratch)
                    work = self._work(block, i)
                    if work <= self.work or len(frontier) == 1:
                        break
                    n = max(1, min(len(frontier) - 1, int(len(frontier) * self.work / work)))
                chunks.append([lo, block])
                srcs.append(block.src_nodes)
                lo += len(frontier)
            layers[i] = (dst, chunks)
            dst = np.unique(np.concatenate(srcs)) if srcs else np.empty(0, np.int64)
        for i, (_, chunks) in enumerate(layers):       # where each block's sources sit in layer i's input
            src_ids = dst if i == 0 else layers[i - 1][0]
            for c in chunks:
                c.append(np.searchsorted(src_ids, c[1].src_nodes))
        self.input_ids, self.layers = dst, layers

    def _work(self, block, i) -> int:
        """Bytes a call of layer i on `block` gathers: its sources' rows and a message per edge."""
        return (len(block.src_nodes) + len(block.indices)) * self.widths[i] * 4

    def memory(self) -> dict:
        """Bytes of what an evaluation holds: blocks, input rows, embeddings (the widest layer's pair)."""
        if self.layers is None:
            self._plan()
        blocks = sum(b.indptr.nbytes + b.indices.nbytes + b.src_nodes.nbytes + p.nbytes
                     for _, chunks in self.layers for _, b, p in chunks)
        return {"blocks": blocks, "input_rows": len(self.input_ids) * self.feat_dim * 4,
                "read_chunk": min(self.read_chunk, len(self.input_ids) * self.feat_dim * 4),
                "layer_call": max((self._work(b, i) for i, (_, chunks) in enumerate(self.layers)
                                   for _, b, _ in chunks), default=0)}

    # -- the evaluation ----------------------------------------------------------------------
    def logits(self, model, device="cpu", precision="fp32") -> torch.Tensor:
        """Logits [len(self.nodes), C] of `model` (on `device`) for the sorted evaluated nodes."""
        if self.layers is None:
            self._plan()
        device = torch.device(device)
        mem = self.memory()
        left = self.budget - mem["blocks"] - mem["read_chunk"] - mem["layer_call"]
        self.spilled = []
        projected = model.projection_width(0) if hasattr(model, "projection_width") else 0
        table = self._table(self.input_ids, projected or self.feat_dim, left, "input_rows")
        left -= table.nbytes if table.in_ram else 0
        step = max(1, self.read_chunk // (self.feat_dim * 4))
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                for lo in range(0, len(self.input_ids), step):     # each input row read once, in store order
                    rows = self.rows(self.input_ids[lo:lo + step])
                    if projected:                                  # and projected once
                        with autocast(device, precision):
                            rows = model.project(0, rows.to(device))
                        rows = rows.float().cpu()
                    table.write(lo, rows)
                for i, (dst, chunks) in enumerate(self.layers):
                    out = None
                    for lo, block, pos in chunks:
                        h = table.take(pos).to(device)
                        with autocast(device, precision):
                            y = model.layer_from_projection(i, block, h) if i == 0 and projected else \
                                model.layer(i, block, h)
                        y = y.float().reshape(len(y), -1).cpu()
                        if out is None:
                            out = self._table(dst, y.shape[1], left, f"layer{i + 1}")
                        out.write(lo, y)
                    table.close()
                    left += table.nbytes if table.in_ram else 0
                    table = out if out is not None else _Table(dst, 1, True)
                    left -= table.nbytes if table.in_ram else 0
        finally:
            model.train(was)
        result = table.all_rows()
        table.close()
        return result

    def _table(self, ids, dim, left, name) -> _Table:
        in_ram = len(ids) * dim * 4 <= left
        if not in_ram:
            self.spilled.append(name)
        return _Table(ids, dim, in_ram)

    def tallies(self, model, labels: torch.Tensor, sets: dict, num_classes: int, device="cpu",
                precision="fp32") -> dict:
        """{name: `metrics.Tally` of model on the ids of sets[name]} (each a subset of `nodes`), one pass."""
        logits = self.logits(model, device, precision)
        out = {}
        for name, ids in sets.items():
            ids = np.asarray(ids, dtype=np.int64)
            out[name] = Tally(num_classes)
            out[name].add(logits[torch.from_numpy(np.searchsorted(self.nodes, ids))], labels[torch.from_numpy(ids)])
        return out
