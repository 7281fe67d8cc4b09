"""The embedded default dataset: a degree-corrected planted-community graph.

A degree-corrected stochastic block model (Karrer & Newman 2011) in the form the
HierBatching digest (§8.3) asks for: heavy-tailed degree propensities (Pareto), power-law
community sizes, a mixing knob (the fraction of edges that leave their community), classes
derived from communities with label noise, and features = class centroid + Gaussian noise,
weak enough that the graph matters. Node ids are randomly permuted at the end so that the
source order carries no locality (partitioners must find it).

Seeded and deterministic. Features are a pure function of (seed, node id), computed on
demand, so the `large` preset is written to a store in chunks without ever holding its
4 GB feature matrix in memory.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numba
import numpy as np

from .datasets import GraphData, build_csr, csr_from_edges
from .errors import UserError


@dataclass(frozen=True)
class SyntheticConfig:
    num_nodes: int = 200_000
    avg_degree: float = 16.0          # target mean of the symmetrised degree
    feat_dim: int = 128
    num_communities: int = 1_000
    num_classes: int = 16
    mixing: float = 0.25              # fraction of edges whose endpoint is drawn outside the community
    degree_exponent: float = 1.6      # Pareto shape of the degree propensities (smaller = heavier tail)
    max_degree_ratio: float = 200.0   # propensity cap, in multiples of the minimum
    duplicate_allowance: float = 0.14 # extra edges drawn to make up for deduplicated repeats
    size_exponent: float = 1.5        # Pareto shape of community sizes
    label_noise: float = 0.10         # fraction of labels replaced by a uniformly random class
    signal: float = 1.0               # norm of the class centroids
    noise: float = 0.6                # per-dimension std of the feature noise (MLP ~42%, SAGE ~88% on small)
    train_frac: float = 0.10
    val_frac: float = 0.05
    test_frac: float = 0.10
    seed: int = 0

    def __post_init__(self):
        if self.num_nodes < 2 * self.num_communities or self.num_communities < 1:
            raise UserError("need at least 2 nodes per community")
        if not 0 <= self.mixing <= 1 or not 0 <= self.label_noise <= 1:
            raise UserError("mixing and label_noise are fractions in [0, 1]")
        if self.num_classes < 2 or self.num_classes > self.num_communities:
            raise UserError("num_classes must be in 2..num_communities")
        if self.train_frac + self.val_frac + self.test_frac > 1:
            raise UserError("train + val + test fractions exceed 1")


PRESETS = {
    "tiny": SyntheticConfig(num_nodes=5_000, avg_degree=12, num_communities=40, num_classes=8),
    "small": SyntheticConfig(num_nodes=200_000, avg_degree=16, num_communities=1_000),
    "medium": SyntheticConfig(num_nodes=1_000_000, avg_degree=16, num_communities=4_000),
    "large": SyntheticConfig(num_nodes=8_000_000, avg_degree=16, num_communities=16_000,
                             train_frac=0.02, val_frac=0.005, test_frac=0.01),
    # features (28M x 256 float32 = 28.7 GB) exceed this 24 GB machine's RAM; ~392M directed edges;
    # wide rows as in IGB keep the node count (and so an epoch on 2 cores) moderate
    "xlarge": SyntheticConfig(num_nodes=28_000_000, avg_degree=14, feat_dim=256, num_communities=56_000,
                              train_frac=0.005, val_frac=0.001, test_frac=0.002),
}


def preset(name: str, **overrides) -> SyntheticConfig:
    if name not in PRESETS:
        raise UserError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def _community_sizes(cfg: SyntheticConfig, rng) -> np.ndarray:
    """Power-law sizes (Pareto, capped at 20x the mean) summing to N, each >= 2."""
    k, n = cfg.num_communities, cfg.num_nodes
    raw = np.minimum(rng.pareto(cfg.size_exponent, k) + 1.0, 20.0 * n / k)
    sizes = np.maximum(2, np.floor(raw / raw.sum() * (n - 2 * k)).astype(np.int64) + 2)
    sizes[np.argmax(sizes)] += n - sizes.sum()       # absorb rounding in the largest
    return sizes


def _lookup(cdf, q):
    """searchsorted(cdf, q) for unsorted q, identical result, but with sorted queries:
    random probes into a large CDF miss the cache at every level, sorted ones walk it."""
    order = np.argsort(q)
    out = np.empty(len(q), dtype=np.int64)
    out[order] = np.searchsorted(cdf, q[order], side="right")
    return out


def _edge_chunks(cfg: SyntheticConfig, comm_start, comm_of, cdf, rng, chunk=1 << 23):
    """Undirected edge endpoints (before dedupe), in community-contiguous ids, a chunk at a time."""
    # heavy-tailed endpoints repeat pairs; oversample so the deduplicated mean degree hits the target
    m = edge_draws(cfg)
    total = cdf[-1]
    for lo in range(0, m, chunk):
        c = min(chunk, m - lo)
        src = _lookup(cdf, rng.random(c) * total)
        inside = rng.random(c) >= cfg.mixing
        # inside: draw the other end proportional to propensity within src's community
        cs = comm_of[src[inside]]
        a = np.where(comm_start[cs] > 0, cdf[comm_start[cs] - 1], 0.0)
        b = cdf[comm_start[cs + 1] - 1]
        dst = _lookup(cdf, rng.random(c) * total)
        dst[inside] = _lookup(cdf, a + rng.random(len(cs)) * (b - a))
        np.minimum(dst, cfg.num_nodes - 1, out=dst)
        yield src, dst


def _skip_edges(cfg: SyntheticConfig, rng, chunk=1 << 23):
    """Advance `rng` past `_edge_chunks`'s draws without drawing the edges (the same random() calls)."""
    m = edge_draws(cfg)
    for lo in range(0, m, chunk):
        c = min(chunk, m - lo)
        rng.random(c)
        inside = int((rng.random(c) >= cfg.mixing).sum())
        rng.random(c)
        rng.random(inside)


def edge_draws(cfg: SyntheticConfig) -> int:
    """Undirected edges drawn, repeats and self-loops included: what `edge_stream` yields."""
    return int(round(cfg.num_nodes * cfg.avg_degree / 2 * (1 + cfg.duplicate_allowance)))


def generate(cfg: SyntheticConfig | str = "small", *, prepare_memory: int | None = None, workdir=None,
             progress=False, **overrides) -> GraphData:
    """Build the graph (topology, labels, splits) and a lazy feature source.

    With `prepare_memory` (bytes: the prepare's, per-node arrays first, `csrbuild.sort_memory`), the edges
    stream through `csrbuild.CSRBuilder` (sorted runs under `workdir`, merged by source range) instead of one in-memory sort: the same graph, byte for byte, with
    the edge list never held whole; its neighbour ids are then a memory-mapped file in `workdir`, which
    must outlive the returned data (until the store is written)."""
    cfg = preset(cfg, **overrides) if isinstance(cfg, str) else replace(cfg, **overrides)
    rng = np.random.default_rng(cfg.seed)
    n = cfg.num_nodes
    comm_start, comm_of, cdf = _communities(cfg, rng)
    if prepare_memory is None:
        src, dst = (np.concatenate(a) for a in zip(*_edge_chunks(cfg, comm_start, comm_of, cdf, rng)))
        del cdf
        # random relabelling: the source order carries no locality
        perm = rng.permutation(n)
        src, dst = perm[src], perm[dst]
        indptr, indices = csr_from_edges(src, dst, n)
        del src, dst
    else:
        perm, after = _relabelling_ahead(cfg, rng)
        indptr, indices = _bounded_csr(cfg, comm_start, comm_of, cdf, rng, perm, prepare_memory, workdir, progress)
        rng.bit_generator.state = after
        del cdf
    community = np.empty(n, dtype=np.int64)
    community[perm] = comm_of
    del comm_of, perm
    class_of_comm = rng.permutation(cfg.num_communities) % cfg.num_classes
    true_class = class_of_comm[community]
    labels = true_class.copy()
    flip = rng.random(n) < cfg.label_noise
    labels[flip] = rng.integers(0, cfg.num_classes, int(flip.sum()))
    order = rng.permutation(n)
    n_tr, n_va, n_te = (int(f * n) for f in (cfg.train_frac, cfg.val_frac, cfg.test_frac))
    train, val, test = (np.sort(order[a:b]) for a, b in
                        ((0, n_tr), (n_tr, n_tr + n_va), (n_tr + n_va, n_tr + n_va + n_te)))
    centers = rng.standard_normal((cfg.num_classes, cfg.feat_dim))
    centers *= cfg.signal / np.linalg.norm(centers, axis=1, keepdims=True)
    features = SyntheticFeatures(centers.astype(np.float32), true_class.astype(np.int32),
                                 cfg.noise, cfg.seed)
    info = {"source": "synthetic", **asdict(cfg)}
    return GraphData(name="synthetic", indptr=indptr, indices=indices, features=features,
                     labels=labels, train_idx=train, val_idx=val, test_idx=test,
                     num_classes=cfg.num_classes, info=info)


def _communities(cfg: SyntheticConfig, rng):
    """(first id of each community + N, community of each id, CDF of the degree propensities)."""
    sizes = _community_sizes(cfg, rng)
    comm_start = np.concatenate([[0], np.cumsum(sizes)])
    comm_of = np.repeat(np.arange(cfg.num_communities), sizes)
    theta = np.minimum(rng.pareto(cfg.degree_exponent, cfg.num_nodes) + 1.0, cfg.max_degree_ratio)
    return comm_start, comm_of, np.cumsum(theta)


def _relabelling_ahead(cfg: SyntheticConfig, rng):
    """The random relabelling, which is drawn after the edges: found by skipping their draws. `rng` is left
    where the edges start; returns (the relabelling, the generator state after it)."""
    before = rng.bit_generator.state
    _skip_edges(cfg, rng)
    perm = rng.permutation(cfg.num_nodes)
    after = rng.bit_generator.state
    rng.bit_generator.state = before
    return perm, after


def edge_stream(cfg: SyntheticConfig | str, **overrides):
    """The undirected edges `generate` draws (before symmetrising and deduplicating), in final node ids,
    as (src, dst) int64 chunks of 8M: the raw edge list a real source would give, for sort benchmarks."""
    cfg = preset(cfg, **overrides) if isinstance(cfg, str) else replace(cfg, **overrides)
    rng = np.random.default_rng(cfg.seed)
    comm_start, comm_of, cdf = _communities(cfg, rng)
    perm, _ = _relabelling_ahead(cfg, rng)
    for src, dst in _edge_chunks(cfg, comm_start, comm_of, cdf, rng):
        yield perm[src], perm[dst]


def _bounded_csr(cfg, comm_start, comm_of, cdf, rng, perm, memory, workdir, progress):
    """The CSR of `_edge_chunks`' edges relabelled by `perm`, built under `memory` (`datasets.build_csr`);
    the in-memory path's chunks, since the order of the draws depends on them (~0.5 GB of draws at a time)."""
    chunks = ((perm[src], perm[dst]) for src, dst in _edge_chunks(cfg, comm_start, comm_of, cdf, rng))
    return build_csr(chunks, cfg.num_nodes, memory, workdir, progress)


class SyntheticFeatures:
    """Lazy float32 [N, D] features: row v = centroid[class(v)] + noise(seed, v).

    Indexable by an id array (or slice) like a NumPy array; rows are computed on demand
    by a counter-based generator, so any subset in any order costs only its own size.
    """

    def __init__(self, centers, true_class, noise, seed):
        self.centers, self.true_class = centers, true_class
        self.noise, self.seed = float(noise), int(seed)
        self.shape = (len(true_class), centers.shape[1])
        self.dtype = np.dtype(np.float32)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, ids):
        ids = np.arange(self.shape[0])[ids] if isinstance(ids, slice) else np.asarray(ids, np.int64)
        out = np.empty((len(ids), self.shape[1]), dtype=np.float32)
        _fill_features(out, ids, self.true_class, self.centers, np.float32(self.noise),
                       np.uint64(self.seed))
        return out

    def __array__(self, dtype=None, copy=None):
        return self[:].astype(dtype or np.float32, copy=False)


@numba.njit(inline="always")
def _splitmix64(x):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@numba.njit(parallel=True, cache=True)
def _fill_features(out, ids, true_class, centers, noise, seed):
    d = out.shape[1]
    base = _splitmix64(seed)
    for i in numba.prange(len(ids)):
        v = np.uint64(ids[i])
        c = true_class[ids[i]]
        for j in range(0, d, 2):
            h1 = _splitmix64(base ^ (v * np.uint64(2 * d + 1) + np.uint64(j)))
            h2 = _splitmix64(h1)
            u1 = ((h1 >> np.uint64(11)) + np.uint64(1)) * (1.0 / 9007199254740993.0)
            u2 = (h2 >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            r = np.sqrt(-2.0 * np.log(u1)) * noise      # Box-Muller: two normals per pair
            out[i, j] = centers[c, j] + r * np.cos(2.0 * np.pi * u2)
            if j + 1 < d:
                out[i, j + 1] = centers[c, j + 1] + r * np.sin(2.0 * np.pi * u2)
