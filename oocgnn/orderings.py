"""Partition-buffer orderings (MariusGNN §5): which physical partitions the buffer holds, state by state.

A buffer holds `c` of `p` physical partitions; an ordering is the sequence of buffer states S_i of
one epoch (each a list of partition ids) and the assignment of each training node to one state
that holds its partition (its X_i). Three orderings:

- `beta`: Marius's BETA (OSDI '21; MariusGNN §5.1, Fig. 4): c − 1 partitions stay while every other
  one passes through the last slot, then they retire; one partition swapped per state, every pair
  of partitions co-resident at least once, near the I/O lower bound. Examples go to the *first*
  state that can take them (greedy), which correlates consecutive mini-batches.
- `comet`: MariusGNN's COMET (§5.1, Fig. 5): each epoch the physical partitions are grouped at
  random into `l` logical partitions of r = p/l, BETA runs over the logical ones with c_l = c·l/p of
  them in the buffer, and each example goes to a state drawn uniformly among those that hold it
  (deferred, randomised: balanced X_i, decorrelated batches).
- `sequential`: the control: disjoint groups of c consecutive partitions in store order, the same
  every epoch, each example with its group.

`assign` gives each example its state by the ordering's rule; `assign_by_neighbours` instead takes, among the
same states, the one holding most of a training node's neighbours (not MariusGNN's: its sampling stays inside
the buffer, and this loses the fewest neighbours to it).

`beta_loads(n, b)` is the closed form of BETA's partition loads (digest §3); the tests check the
states against it and the pair coverage against a brute-force count.
"""
from __future__ import annotations

import numpy as np

from .errors import UserError

ORDERINGS = ("comet", "beta", "sequential")
PLACEMENTS = ("neighbours", "ordering")     # a training node's state: most of its neighbours, or the ordering's rule


def beta_states(n: int, cap: int, rng) -> list[list[int]]:
    """BETA's buffer states over `n` partitions with room for `cap` (Marius' greedy one-swap traversal):
    a random first buffer; then, until no partition is left on disk, every on-disk partition cycles
    through the last slot while the first cap − 1 stay, and those cap − 1 retire, replaced one at a
    time by partitions still on disk. Consecutive states differ by one partition."""
    if cap < 2 or cap > n:
        raise UserError(f"a BETA buffer needs 2 <= capacity <= partitions, got capacity {cap} of {n}")
    perm = [int(x) for x in rng.permutation(n)]
    buf, disk = perm[:cap], perm[cap:]
    states = [list(buf)]
    while disk:
        rng.shuffle(buf)
        rng.shuffle(disk)
        for i in range(len(disk)):                    # each on-disk partition meets the cap − 1 fixed ones
            disk[i], buf[-1] = buf[-1], disk[i]
            states.append(list(buf))
        rng.shuffle(disk)
        for i in range(min(cap - 1, len(disk))):      # the fixed ones have met everyone: retire them
            buf[i] = disk[i]
            states.append(list(buf))
        disk = disk[cap - 1:]
    return states


def beta_loads(n: int, cap: int) -> int:
    """Partition loads of `beta_states(n, cap)` in closed form: cap + Σ_k (m_k + min(cap − 1, m_k)),
    m_0 = n − cap, m_{k+1} = m_k − min(cap − 1, m_k). Its states number loads − cap + 1."""
    loads, m = cap, n - cap
    while m > 0:
        loads += m + min(cap - 1, m)
        m -= min(cap - 1, m)
    return loads


def comet_states(p: int, c: int, l: int, rng) -> list[list[int]]:
    """COMET's buffer states: the p physical partitions grouped at random into `l` logical partitions of
    r = p / l, BETA over the logical ones with c_l = c·l/p in the buffer, each logical state expanded to
    its c physical partitions."""
    r, c_l = comet_shape(p, c, l)
    groups = rng.permutation(p).reshape(l, r)
    return [sorted(int(x) for g in state for x in groups[g]) for state in beta_states(l, c_l, rng)]


def _splits(p: int, c: int, l: int) -> bool:
    """Whether l logical partitions split p and c evenly with at least two in the buffer (MariusGNN §5.1)."""
    return p % l == 0 and (c * l) % p == 0 and c * l // p >= 2


def comet_shape(p: int, c: int, l: int) -> tuple[int, int]:
    """(r, c_l): physical partitions per logical one and logical partitions in the buffer; refuses an l
    that does not split p and c evenly (MariusGNN §5.1: p/c = l/c_l) or leaves fewer than 2 in the buffer."""
    if l < 2 or not _splits(p, c, l):
        divisors = [k for k in range(2, p + 1) if _splits(p, c, k)]
        raise UserError(f"COMET needs l logical partitions with p/l and c·l/p whole and c·l/p >= 2 "
                        f"(p={p}, c={c}); l={l} does not: choose l from {divisors or 'none (raise c)'}")
    return p // l, c * l // p


def auto_logical(p: int, c: int) -> int:
    """MariusGNN §6's rule: the fewest logical partitions l with p/c = l/c_l and c_l >= 2, which is l = 2p/c
    (two in the buffer) where that splits p and c evenly. Where it does not, the fewest l that does and still
    groups the physical partitions (l < p: p = 16, c = 6 gives l = 8, three in the buffer), so the budget's
    largest c is not cut to a divisor of 2p. A c whose only shape is l = p (p = 16, c = 5) gets 2p/c, which
    `comet_shape` refuses: logical partitions that are the physical ones have no random grouping, the
    mixing COMET's two levels exist for (on citeseer's random split c = 5, l = 16 lost 1.4 points where
    c = 4, l = 8 lost 0.5)."""
    mariusgnn = 2 * p // max(c, 1)
    return next((l for l in range(max(mariusgnn, 2), p + 1)
                 if _splits(p, c, l) and (l < p or l == mariusgnn)), mariusgnn)


def swap_size(ordering: str, p: int, c: int, l: int = 0) -> int:
    """Partitions one state change within an epoch brings in at most (what a prefetch needs room for):
    BETA one, COMET one logical partition (p / l; l = 0: `auto_logical`), sequential a whole group."""
    if ordering == "beta":
        return 1
    if ordering == "sequential":
        return c
    return p // (l or auto_logical(p, c))


def sequential_states(p: int, c: int) -> list[list[int]]:
    """Disjoint groups of c consecutive partitions in store order (the last may hold fewer)."""
    return [list(range(i, min(i + c, p))) for i in range(0, p, c)]


def epoch_states(ordering: str, p: int, c: int, l: int, rng) -> list[list[int]]:
    """The buffer states of one epoch of `ordering` (`rng`: that epoch's stream)."""
    if ordering == "beta":
        return beta_states(p, c, rng)
    if ordering == "comet":
        return comet_states(p, c, l, rng)
    if ordering == "sequential":
        return sequential_states(p, c)
    raise UserError(f"unknown ordering {ordering!r}; choose from {', '.join(ORDERINGS)}")


def assign(states, part_of_node: np.ndarray, p: int, how: str, rng) -> np.ndarray:
    """int64 [len(part_of_node)]: the state each example trains in, among the states holding its
    partition: the first (`greedy`, BETA's) or one drawn uniformly per example (`random`, COMET's)."""
    holding = [[] for _ in range(p)]
    for i, state in enumerate(states):
        for k in state:
            holding[k].append(i)
    if any(not h for h in holding):
        missing = [k for k, h in enumerate(holding) if not h]
        raise UserError(f"partitions {missing[:8]} are in no buffer state")
    counts = np.array([len(h) for h in holding], dtype=np.int64)
    start = np.concatenate(([0], np.cumsum(counts)[:-1]))
    flat = np.array([i for h in holding for i in h], dtype=np.int64)
    parts = np.asarray(part_of_node, dtype=np.int64)
    if how == "greedy":
        return flat[start[parts]]
    if how == "random":
        return flat[start[parts] + (rng.random(len(parts)) * counts[parts]).astype(np.int64)]
    raise UserError(f"unknown assignment {how!r}; choose greedy or random")


def neighbour_parts(store, nodes: np.ndarray, bounds: np.ndarray) -> tuple:
    """(rows, parts, counts): how many neighbours each of `nodes` has in each physical partition (`bounds`), as
    COO triples (row: position in `nodes`); read once from the store's lists, as the edge buckets are built."""
    indptr = np.asarray(store.indptr)
    lists = np.memmap(store.path / "indices.bin", dtype=store.meta["index_dtype"], mode="r") if store.num_edges else []
    rows, parts = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for lo in range(0, len(nodes), 1 << 16):
        chunk = np.asarray(nodes[lo:lo + (1 << 16)], dtype=np.int64)
        deg = indptr[chunk + 1] - indptr[chunk]
        row = np.repeat(np.arange(len(chunk)), deg)
        at = indptr[chunk][row] + np.arange(len(row)) - np.repeat(np.cumsum(deg) - deg, deg)   # each list's entries
        rows.append(row + lo)
        parts.append(np.searchsorted(bounds, np.asarray(lists[at], dtype=np.int64), side="right") - 1)
    p = len(bounds) - 1
    keys, counts = np.unique(np.concatenate(rows) * p + np.concatenate(parts), return_counts=True)
    return keys // p, keys % p, counts


def assign_by_neighbours(states, part_of_node: np.ndarray, nbr_parts: tuple, rng) -> np.ndarray:
    """int64 [len(part_of_node)]: the state each example trains in, among the states holding its partition, the
    one holding the most of its neighbours (`nbr_parts`: `neighbour_parts`' triples), ties drawn uniformly. A
    node's own partition is in each such state, so its cut neighbours decide: sampling stays inside the buffer
    (MariusGNN §5.2), and this state loses the fewest of them. MariusGNN draws the state at random (`assign`)."""
    rows, parts, counts = nbr_parts
    part_of_node = np.asarray(part_of_node, dtype=np.int64)
    n = len(part_of_node)
    p = max(max((max(s) for s in states), default=0), int(parts.max(initial=0)), int(part_of_node.max(initial=0))) + 1
    best, choice = np.full(n, -1.0), np.full(n, -1, dtype=np.int64)
    for i, state in enumerate(states):
        member = np.zeros(p, dtype=bool)
        member[list(state)] = True
        score = np.bincount(rows[member[parts]], weights=counts[member[parts]], minlength=n) + rng.random(n)
        better = member[part_of_node] & (score > best)
        best[better], choice[better] = score[better], i
    if (choice < 0).any():
        raise UserError(f"partitions {sorted(set(part_of_node[choice < 0].tolist()))[:8]} are in no buffer state")
    return choice


def pair_coverage(states, p: int) -> np.ndarray:
    """bool [p, p]: which pairs of partitions share at least one state (the brute-force check)."""
    seen = np.zeros((p, p), dtype=bool)
    for state in states:
        s = np.asarray(state)
        seen[np.ix_(s, s)] = True
    return seen


def first_shared(states, p: int) -> np.ndarray:
    """int [p, p]: the first state in which each pair of partitions is co-resident (-1: never), the
    picture of an ordering's coverage."""
    first = np.full((p, p), -1, dtype=np.int64)
    for i, state in enumerate(states):
        s = np.asarray(state)
        block = first[np.ix_(s, s)]
        first[np.ix_(s, s)] = np.where(block < 0, i, block)
    return first


def describe(states, sizes=None) -> dict:
    """An epoch of `states`: their number, partition loads and edge-bucket loads walking them from an
    empty buffer (a bucket per ordered pair, diagonal included), and with `sizes` (examples per state)
    the coefficient of variation of |X_i| and its max/mean (MariusGNN §5.1's balance)."""
    held, parts, buckets = set(), 0, 0
    for state in states:
        new = set(state) - held
        parts += len(new)
        buckets += len(state) ** 2 - (len(state) - len(new)) ** 2
        held = set(state)
    out = {"states": len(states), "partition_loads": parts, "bucket_loads": buckets}
    if sizes is not None:
        sizes = np.asarray(sizes, dtype=float)
        out.update(cv_examples=float(sizes.std() / sizes.mean()), max_over_mean=float(sizes.max() / sizes.mean()))
    return out


def partition_tallies(state_of_bucket: np.ndarray, edges_of_bucket: np.ndarray) -> np.ndarray:
    """float [S, p]: for each partition k, the share of the training edges with an endpoint in k that have
    trained by the end of each state (MariusGNN §6's tallies t_i^v, per partition: a node's edges spread over
    the partitions of its neighbours, so a partition's share is its nodes' under the paper's uniform degrees).
    `state_of_bucket` int [p, p]: the state each edge bucket (i, j) trains in (-1: no edges), `edges_of_bucket`
    [p, p]: its edges, each edge in one bucket; an edge of (i, j) counts for partition i and for j (once if
    i = j)."""
    state = np.asarray(state_of_bucket)
    edges = np.asarray(edges_of_bucket, dtype=np.float64)
    if state.shape != edges.shape or state.ndim != 2 or state.shape[0] != state.shape[1]:
        raise UserError("state_of_bucket and edges_of_bucket must be two [p, p] arrays")

    def by_partition(e):
        return e.sum(axis=1) + e.sum(axis=0) - np.diag(e)

    n_states = int(state.max()) + 1 if state.size and state.max() >= 0 else 0
    per_state = np.stack([by_partition(np.where(state == i, edges, 0.0)) for i in range(n_states)]) \
        if n_states else np.zeros((0, len(state)))
    total = by_partition(edges)
    return np.cumsum(per_state, axis=0)[:, total > 0] / total[total > 0]


def permutation_bias(state_of_bucket: np.ndarray, edges_of_bucket: np.ndarray) -> float:
    """MariusGNN §6's Edge Permutation Bias B over partitions: the widest gap, after any state, between the
    share of one partition's edges trained and another's (`partition_tallies`). 0: every partition advances
    together (one state, or the same share each state); near 1: some partitions' edges all train before
    others' begin (BETA's greedy assignment)."""
    t = partition_tallies(state_of_bucket, edges_of_bucket)
    return float((t.max(axis=1) - t.min(axis=1)).max()) if t.size else 0.0
