"""Link-prediction edge splits: validation and test edges held out of the training topology.

A link store's topology (indptr, indices) holds its training edges only, in both directions; its validation
and test edges are files beside it (`storemeta.LINK_FILES`). `hold_out` makes them, in one of two ways:

* Random (`prepare --task link --edge-split TRAIN,VAL,TEST`). The M undirected edges {a, b}, a < b, of the
  canonical CSR (self-loops dropped, deduplicated) are ordered by a key h = mix(mix((a·N + b) xor s)), s drawn
  from the seed, mix splitmix64's finaliser (Steele, Lea & Flood, OOPSLA 2014): a bijection of uint64, so
  distinct pairs get distinct keys and no tie is ever broken by position. In key order the first
  M − n_val − n_test pairs train, the next n_val = round(VAL·M) validate and the last n_test = round(TEST·M)
  test: the counts are exact. The two cut keys are found without holding the keys: a histogram of their top
  16 bits in one pass over the CSR, the keys of the two boundary buckets (about M / 65536 each) in a second.
  The split is a function of the edge set and the seed alone: the source's edge order and repeats,
  `--prepare-memory`'s chunking and thread counts do not change it (tests).
* Given (OGB `ogbl-*`: split/<name>/valid.pt and test.pt, read by `read_ogb_link_split`): the pairs as OGB
  lists them (order, direction and repeats kept, so per-edge negatives stay aligned); every held-out pair is
  removed from the topology in both directions (ogbl-collab's raw graph repeats some validation and test
  collaborations of earlier years; `removed_from_topology` in the store's meta.json counts the pairs removed).

A last pass over the CSR writes the training topology: an entry (u, v) is kept iff {u, v} is a training pair.
With a `workdir` (a bounded prepare) the new neighbour file and the held-out pairs are files there, read back
memory-mapped; otherwise arrays. Memory: a chunk of the CSR at a time, plus for a given split the sorted keys of
its held-out pairs (8 bytes a pair).
"""
from __future__ import annotations

import dataclasses
import pickle
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .errors import UserError
from .io import index_dtype, release_pages
from .units import three_fractions

DEFAULT_EDGE_SPLIT = (0.85, 0.05, 0.10)
HELD_OUT = ("val", "test")
CHUNK_EDGES = 1 << 20            # CSR entries per pass chunk: ~40 MB of temporaries
_BUCKET_SHIFT = np.uint64(48)    # histogram of the keys' top 16 bits
GOLDEN = 0x9E3779B97F4A7C15     # 2**64 / golden ratio, splitmix64's increment
DIRECTION_SEED = 0x64697265      # "dire": the training edges' directions (`train_directions`), not a split's seed
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def parse_edge_split(text):
    """`prepare --edge-split`: 'given' -> None (the source's own split); 'TRAIN,VAL,TEST' -> the fractions of
    the undirected edges, each > 0, summing to 1."""
    text = str(text).strip()
    if text == "given":
        return None
    bad = f"bad --edge-split {text!r}: use 'given' or TRAIN,VAL,TEST fractions of the edges, e.g. 0.85,0.05,0.1"
    fracs = three_fractions(text, bad, f"bad --edge-split {text!r}: every fraction must be > 0 (a run trains, "
                                       "validates and tests)")
    if abs(sum(fracs) - 1) > 1e-6:
        raise UserError(f"bad --edge-split {text!r}: the fractions sum to {sum(fracs):g}, not 1")
    return fracs


def mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic), in place."""
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def seed_word(seed: int) -> np.uint64:
    """A seed spread over 64 bits."""
    return mix64(np.array([(int(seed) + GOLDEN) % (1 << 64)], dtype=np.uint64))[0]


def pair_keys(a, b, num_nodes: int, seed: int) -> np.ndarray:
    """uint64 keys of the pairs (a[i], b[i]), a < b: a bijection of a·N + b for a given seed."""
    z = np.asarray(a, dtype=np.uint64) * np.uint64(num_nodes) + np.asarray(b, dtype=np.uint64)
    z ^= seed_word(seed)
    return mix64(mix64(z))


def train_directions(u, v, orig_ids) -> np.ndarray:
    """int64 [M, 2]: the training edges {u[i], v[i]} (store ids) as (source, destination), the source a fair coin's
    choice fixed per edge: bit 0 of `pair_keys` of its two original ids (smaller first) under a seed of its own
    (not a split's, whose key order picked the training pairs). A batch corrupts its edges' destinations
    (`negatives`), so a node learns to rank others from the side it is the source of: ordered by store id
    (u < v), a node of partition 0 of 16 was the source of 95 % of its edges and one of partition 15 of 3 %,
    where every held-out edge ranks its own source: amazon_photo's test MRR (random 16 parts) was 1.1 points
    lower in memory and 1.0 under COMET at c = 6 of 16 (seeds 0–2), which then also trained every pair of
    partitions' edges as one bucket, where MariusGNN assigns (i, j) and (j, i) to states apart. Keyed by original ids, a relabelling
    (another partitioner) trains the same directions."""
    u, v = np.asarray(u, dtype=np.int64), np.asarray(v, dtype=np.int64)
    ou, ov = np.asarray(orig_ids)[u], np.asarray(orig_ids)[v]
    lo, hi = np.minimum(ou, ov), np.maximum(ou, ov)
    larger_first = (pair_keys(lo, hi, len(orig_ids), DIRECTION_SEED) & np.uint64(1)).astype(bool)
    source = np.where(larger_first == (ou > ov), u, v)
    return np.stack([source, np.where(source == u, v, u)], axis=1)


def _csr_chunks(indptr, indices, max_edges):
    """(lo, hi, rows, neighbours): the entries of rows lo..hi-1 as int64 arrays, ~max_edges at a time."""
    n, lo = len(indptr) - 1, 0
    while lo < n:
        hi = int(np.searchsorted(indptr, indptr[lo] + max_edges, side="right")) - 1
        hi = min(n, max(hi, lo + 1))
        nbrs = np.asarray(indices[indptr[lo]:indptr[hi]], dtype=np.int64)
        release_pages(indices)
        yield lo, hi, np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr[lo:hi + 1])), nbrs
        lo = hi


def _random_cuts(indptr, indices, n, fractions, seed, chunk):
    """(t_val, t_test, counts): a pair with key h trains if h < t_val, validates if t_val <= h < t_test, else
    tests; `counts` the exact (train, val, test) pair counts."""
    hist = np.zeros(1 << 16, dtype=np.int64)
    for _, _, rows, nbrs in _csr_chunks(indptr, indices, chunk):
        up = rows < nbrs
        top = (pair_keys(rows[up], nbrs[up], n, seed) >> _BUCKET_SHIFT).astype(np.int64)
        hist += np.bincount(top, minlength=1 << 16)
    m = int(hist.sum())
    if 2 * m != len(indices):
        raise UserError(f"the topology has {len(indices):,} entries but {m:,} pairs a < b: an edge split needs the "
                        "canonical CSR (symmetric, no self-loops)")
    n_val, n_test = (int(round(f * m)) for f in fractions[1:])
    counts = (m - n_val - n_test, n_val, n_test)
    if min(counts) < 1:
        raise UserError(f"--edge-split {','.join(f'{f:g}' for f in fractions)} of {m:,} edges leaves "
                        f"{counts[0]}/{counts[1]}/{counts[2]} train/val/test edges; every part needs one")
    cum = np.cumsum(hist)
    ranks = (counts[0], counts[0] + counts[1])                 # the first pair of val and of test, in key order
    buckets = [int(np.searchsorted(cum, r, side="right")) for r in ranks]
    inside = {b: [] for b in buckets}
    for _, _, rows, nbrs in _csr_chunks(indptr, indices, chunk):
        up = rows < nbrs
        h = pair_keys(rows[up], nbrs[up], n, seed)
        top = (h >> _BUCKET_SHIFT).astype(np.int64)
        for b in inside:
            inside[b].append(h[top == b])
    cuts = []
    for r, b in zip(ranks, buckets):
        keys = np.concatenate(inside[b])
        at = r - (int(cum[b - 1]) if b else 0)
        cuts.append(np.partition(keys, at)[at])
    return cuts[0], cuts[1], counts


class _Sink:
    """Arrays appended chunk by chunk: to a raw file in `workdir` (read back memory-mapped), or kept in RAM."""

    def __init__(self, workdir, name, dtype, width=None):
        self.dtype, self.width, self.parts, self.count = np.dtype(dtype), width, [], 0
        self.f = tempfile.NamedTemporaryFile(dir=workdir, prefix=f"{name}-", suffix=".bin", delete=False) \
            if workdir is not None else None

    def add(self, arr):
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        self.count += len(arr)
        self.f.write(arr.tobytes()) if self.f else self.parts.append(arr)

    def finish(self) -> np.ndarray:
        shape = (self.count,) if self.width is None else (self.count, self.width)
        if self.f is None:
            return np.concatenate(self.parts).reshape(shape) if self.parts else np.empty(shape, self.dtype)
        self.f.close()
        return np.memmap(self.f.name, dtype=self.dtype, mode="r", shape=shape) if self.count else \
            np.empty(shape, self.dtype)


def hold_out(data, fractions=None, seed=0, workdir=None, chunk_edges=CHUNK_EDGES):
    """`data` (a `datasets.GraphData`) with its link split: the topology cut to the training edges, `links`
    holding the validation and test pairs (source ids), empty node splits and `info['link']` describing the split.

    `fractions` (train, val, test): a seeded random split of `data`'s edges, which must hold none yet. None: the
    split `data.links` was given (an OGB ogbl-* source), whose pairs are removed from the topology."""
    n = data.num_nodes
    indptr, indices = np.asarray(data.indptr), data.indices
    if fractions is not None:
        if data.links:
            raise UserError(f"{data.name}: has its own edge split (the source's); --edge-split fractions apply to "
                            "sources without one (use --edge-split given)")
        t_val, t_test, counts = _random_cuts(indptr, indices, n, fractions, seed, chunk_edges)
        info = {"split": "random", "fractions": [float(f) for f in fractions], "seed": int(seed)}

        def part(a, b):                       # 0 train, 1 val, 2 test
            h = pair_keys(a, b, n, seed)
            return (h >= t_val).astype(np.int8) + (h >= t_test)
    else:
        if not data.links:
            raise UserError(f"{data.name}: has no edge split of its own; give --edge-split TRAIN,VAL,TEST")
        held = np.unique(np.concatenate([_canonical_keys(data.links[s], n) for s in HELD_OUT]))
        info = {"split": "given"}

        def part(a, b):                       # 0 train, 1 held out
            key = a * np.int64(n) + b
            at = np.minimum(np.searchsorted(held, key), max(len(held) - 1, 0))
            return (held[at] == key).astype(np.int8) if len(held) else np.zeros(len(key), np.int8)

    kept = _Sink(workdir, "train-indices", index_dtype(n))
    pairs = {s: _Sink(workdir, f"link-{s}", np.int64, 2) for s in HELD_OUT} if fractions is not None else None
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    for lo, hi, rows, nbrs in _csr_chunks(indptr, indices, chunk_edges):
        cls = part(np.minimum(rows, nbrs), np.maximum(rows, nbrs))
        train = cls == 0
        kept.add(nbrs[train])
        new_indptr[lo + 1:hi + 1] = np.bincount(rows[train] - lo, minlength=hi - lo)
        if pairs is not None:
            up = rows < nbrs
            for i, s in enumerate(HELD_OUT, start=1):
                sel = up & (cls == i)
                pairs[s].add(np.stack([rows[sel], nbrs[sel]], axis=1))
    np.cumsum(new_indptr, out=new_indptr)
    new_indices = kept.finish()
    removed = (len(indices) - len(new_indices)) // 2
    links = dict(data.links) if pairs is None else {s: sink.finish() for s, sink in pairs.items()}
    if pairs is None:
        info["removed_from_topology"] = int(removed)
    else:
        assert removed == counts[1] + counts[2] and len(links["val"]) == counts[1], "the cuts miscounted"
    empty = np.empty(0, dtype=np.int64)
    return dataclasses.replace(data, indptr=new_indptr, indices=new_indices, train_idx=empty, val_idx=empty,
                               test_idx=empty, links=links,
                               info={**data.info, "link": {**data.info.get("link", {}), **info}})


def _canonical_keys(pairs, n) -> np.ndarray:
    """min·N + max of each pair (self-loops dropped: never in a topology)."""
    p = np.asarray(pairs, dtype=np.int64)
    a, b = np.minimum(p[:, 0], p[:, 1]), np.maximum(p[:, 0], p[:, 1])
    return (a * np.int64(n) + b)[a != b]


# ---------------------------------------------------------------------------------------------
# OGB ogbl-* splits: split/<name>/{train,valid,test}.pt (or split_dict.pt), torch-saved dicts of tensors
# (ogb/linkproppred/dataset.py, get_edge_split). Forms: 'edge' [M, 2] with 'edge_neg' [K, 2] negatives shared by
# all positives (ogbl-ppa, -collab, -ddi, -vessel: Hits@K, or ROC-AUC); 'source_node', 'target_node' [M] with
# 'target_node_neg' [M, K] per edge (ogbl-citation2: MRR). Knowledge graphs ('head', 'relation', 'tail':
# ogbl-wikikg2, -biokg) are refused.

def is_ogb_link_split(split_root: Path) -> bool:
    """Whether an OGB dataset's split/ holds link splits (valid.pt or split_dict.pt) rather than node ids."""
    return split_root.is_dir() and any((d / f).is_file() for d in split_root.iterdir() if d.is_dir()
                                       for f in ("valid.pt", "split_dict.pt"))


def _torch_load(path: Path):
    import torch
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as e:
        raise UserError(f"{path}: not a torch-saved dict of tensors ({str(e).splitlines()[0]})") from None


def _array(where, value) -> np.ndarray:
    import torch
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    value = np.asarray(value)
    if value.size and not np.issubdtype(value.dtype, np.integer):
        raise UserError(f"{where}: holds {value.dtype} values; node ids must be integers")
    return value.astype(np.int64, copy=False)


def _split_dicts(split_dir: Path) -> dict:
    if (split_dir / "split_dict.pt").is_file():
        d = _torch_load(split_dir / "split_dict.pt")
        if not isinstance(d, dict) or not {"valid", "test"} <= set(d):
            raise UserError(f"{split_dir / 'split_dict.pt'}: expected a dict with 'valid' and 'test'")
        return {"val": d["valid"], "test": d["test"]}
    out = {}
    for s, f in (("val", "valid.pt"), ("test", "test.pt")):
        if not (split_dir / f).is_file():
            raise UserError(f"missing file {split_dir / f}")
        out[s] = _torch_load(split_dir / f)
    return out


def read_ogb_link_split(split_dir, num_nodes: int):
    """(links, negatives) of an OGB link split directory: links {'val', 'test': int64 [M, 2]} (source, target
    as OGB lists them), plus {'val_neg', 'test_neg'} when OGB gives negatives; negatives 'pairs' (edge_neg
    [K, 2], shared by every positive), 'targets' (target_node_neg [M, K], one row per positive) or 'none'."""
    split_dir = Path(split_dir)
    links, kinds = {}, set()
    for s, d in _split_dicts(split_dir).items():
        where = f"{split_dir}: {'valid' if s == 'val' else s}"
        if not isinstance(d, dict):
            raise UserError(f"{where} is a {type(d).__name__}, not a dict of tensors")
        if {"head", "relation", "tail"} <= set(d):
            raise UserError(f"{where} holds (head, relation, tail) triples: a knowledge graph (ogbl-wikikg2, "
                            "ogbl-biokg); stores hold one edge type, so these are not supported")
        if "edge" in d:
            pos, neg, kind = _array(f"{where} edge", d["edge"]), d.get("edge_neg"), "pairs"
        elif {"source_node", "target_node"} <= set(d):
            src, dst = _array(f"{where} source_node", d["source_node"]), _array(f"{where} target_node", d["target_node"])
            if src.shape != dst.shape or src.ndim != 1:
                raise UserError(f"{where}: source_node {src.shape} and target_node {dst.shape} must be equal 1-D")
            pos, neg, kind = np.stack([src, dst], axis=1), d.get("target_node_neg"), "targets"
        else:
            raise UserError(f"{where} has keys {sorted(d)}; expected 'edge' (ogbl-ppa/collab/ddi/vessel) or "
                            "'source_node' and 'target_node' (ogbl-citation2)")
        if pos.ndim != 2 or pos.shape[1] != 2 or not len(pos):
            raise UserError(f"{where}: positive edges have shape {pos.shape}; expected [M, 2] with M >= 1")
        links[s] = pos
        if neg is not None:
            neg = _array(f"{where} negatives", neg)
            want = neg.ndim == 2 and len(neg) and (neg.shape[1] == 2 if kind == "pairs" else len(neg) == len(pos))
            if not want:
                raise UserError(f"{where}: negatives have shape {neg.shape}; expected "
                                + ("[K, 2] pairs" if kind == "pairs" else f"[{len(pos)}, K] targets"))
            links[f"{s}_neg"] = neg
        kinds.add(kind if neg is not None else "none")
    if len(kinds) != 1:
        raise UserError(f"{split_dir}: valid and test give negatives differently ({sorted(kinds)})")
    for key, arr in links.items():
        if arr.min() < 0 or arr.max() >= num_nodes:
            raise UserError(f"{split_dir}: {key} holds node ids outside 0..{num_nodes - 1}")
    return links, kinds.pop()
