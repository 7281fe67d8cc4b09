"""Accuracy acceptance: the synthetic graph is learnable but not trivial; real graphs reach
their published in-memory GraphSAGE accuracy. Slow (about a minute each)."""
import os

import numpy as np
import pytest

from oocgnn.config import TrainConfig
from oocgnn.datasets import load_npz
from oocgnn.storewrite import write_store
from oocgnn.synthetic import generate
from oocgnn.train import train

from .conftest import shared_dataset

pytestmark = pytest.mark.slow


def _test_acc(store_path, tmp_path, seed=0, **kw):
    kw = {"max_eval_nodes": 0, **kw}
    cfg = TrainConfig.create(store=str(store_path), out=str(tmp_path / f"run-{kw.get('model', 'sage')}-{seed}"),
                             seed=seed, progress=False, **kw)
    return train(cfg)["test_at_best_val"]


def test_small_synthetic_needs_the_graph(tmp_path):
    """On `small`, 2-layer GraphSAGE beats an MLP on the same features by >= 10 points, < 95%."""
    store = write_store(generate("small"), tmp_path / "small", progress=False)
    sage = _test_acc(store.path, tmp_path, model="sage", epochs=4)
    mlp = _test_acc(store.path, tmp_path, model="mlp", epochs=4)
    assert sage >= mlp + 0.10, (sage, mlp)
    assert sage < 0.95, sage


# full-neighbourhood mini-batch inference (fanout -1), the usual protocol on these small graphs
FULL_EVAL = "-1,-1"


def _real(name, tmp_path):
    return write_store(load_npz(shared_dataset(name)), tmp_path / name, progress=False).path


def test_cora_public_split(tmp_path):
    path = _real("cora", tmp_path)
    accs = [_test_acc(path, tmp_path, seed=s, epochs=60, batch_size=64, lr=0.01,
                      eval_fanouts=FULL_EVAL) for s in range(3)]
    assert np.mean(accs) >= 0.78, accs


def test_amazon_photo(tmp_path):
    """Without weight decay: the default 5e-4 (GCN's on Planetoid) costs amazon_photo's given split 2.6 points
    at these settings (0.860 against 0.886, seeds 0-2, measured 2026-11-28)."""
    path = write_store(load_npz(shared_dataset("amazon_photo"), row_normalize=True), tmp_path / "ap",
                       progress=False).path
    accs = [_test_acc(path, tmp_path, seed=s, epochs=60, batch_size=64, lr=0.005, weight_decay=0.0,
                      eval_fanouts=FULL_EVAL) for s in range(3)]
    assert np.mean(accs) >= 0.88, accs


# -- out-of-core policies against the in-memory baseline (the executor's accuracy oracle) ------

def _partitioned(data, path, parts):
    from oocgnn.partition import partitioned_store
    return partitioned_store(data, path, "metis", parts).path


SMALL_EPOCHS = 4
OOC = {"hierbatching": {"static_ratio": 0.01, "passes": 2.0},
       "outre": {"history_ratio": 0.1, "staleness": 100},
       # sample ahead, then fetch: the in-memory run's training exactly (their defaults but S, k and
       # budgets that hold them on `small`: one batch's samples may be 124K rows there)
       "ginex": {"superbatch": 4},
       "macrobatch": {"memory_budget": "256MB"}}
AHEAD = ("ginex", "macrobatch")
# composed: HierBatching's mega-batches (its knobs above) with sampling over the graph, a Belady cache of the
# rows outside them (S = 4 as ginex's) and OUTRE's histories; its budget holds the samples of two chunks on `small`
COMPOSED = {**OOC["hierbatching"], **OOC["outre"], "superbatch": 4}
# MariusGNN's partition buffer, a quarter of p = 16 partitions (its Table 8's buffer), by ordering
MARIUS = {o: {"policy": "marius", "ordering": o, "buffer_parts": 4} for o in ("comet", "beta")}


def _means(path, tmp_path, knobs, **kw):
    """Test accuracy at best validation, mean of seeds 0-2, for each configuration of `knobs` (a policy's
    name, or a name with its "policy")."""
    return {name: np.mean([_test_acc(path, tmp_path / name, seed=s, **{"policy": name, **kw, **k}) for s in range(3)])
            for name, k in knobs.items()}


def test_out_of_core_matches_inmemory_on_small(tmp_path):
    """HierBatching (r_s = 0.01, p = 2) and OUTRE reach in-memory accuracy within 1 point (means of 3 seeds);
    Ginex and macrobatching train exactly as in memory (only the order of independent work changes)."""
    path = _partitioned(generate("small"), tmp_path / "small", 256)
    marius = {o: {**k, "memory_budget": "80MB"} for o, k in MARIUS.items()}
    composed = {"composed": {**COMPOSED, "memory_budget": "96MB"}}
    means = _means(path, tmp_path, {"inmemory": {}, **OOC, **marius, **composed}, epochs=SMALL_EPOCHS,
                   memory_budget="64MB", parts_per_megabatch=32, max_eval_nodes=3000)
    for policy in OOC:
        assert abs(means[policy] - means["inmemory"]) <= 0.01, means
    assert means["composed"] >= means["inmemory"] - 0.01, means
    for policy in AHEAD:
        assert means[policy] == means["inmemory"], means
    # MariusGNN §5.1: COMET recovers what BETA's correlated states lose (both sample inside the buffer only)
    assert means["comet"] >= means["inmemory"] - 0.01 and means["comet"] > means["beta"], means


def _ooc_real(name, tmp_path, epochs):
    """Means of 3 seeds on a seeded random 10/10/80 split (the HierBatching digest's protocol for
    small real graphs: the 20-per-class split is too small for mega-batch statistics)."""
    data = load_npz(shared_dataset(name)).resplit(0.1, 0.1, seed=0)
    path = _partitioned(data, tmp_path / name, 64)
    kw = dict(epochs=epochs, batch_size=256, lr=0.005, memory_budget="1GB", eval_batch_size=256,
              max_eval_nodes=3000)
    knobs = {"inmemory": {}, "hierbatching": {**OOC["hierbatching"], "parts_per_megabatch": 8},
             # ~3 iterations per epoch here: a staleness of 2 is OUTRE's 100-of-1500 in spirit
             "outre": {**OOC["outre"], "parts_per_macro": 32, "staleness": 2},
             # ginex: a cache of 40 % of the features (23 MB); macrobatch: two unions of up to every row
             "ginex": {"memory_budget": "24MB"}, "macrobatch": {"memory_budget": "64MB"}, **MARIUS,
             "composed": {**COMPOSED, "parts_per_megabatch": 8, "staleness": 2}}
    return _means(path, tmp_path, knobs, **kw)


def test_out_of_core_matches_inmemory_on_amazon_photo(tmp_path):
    means = _ooc_real("amazon_photo", tmp_path, epochs=30)
    for policy in OOC:
        assert means[policy] >= means["inmemory"] - 0.01, means
    assert means["composed"] >= means["inmemory"] - 0.01, means
    for policy in AHEAD:
        assert means[policy] == means["inmemory"], means
    assert means["comet"] >= means["inmemory"] - 0.01 and means["comet"] > means["beta"], means


@pytest.mark.skipif(not os.environ.get("OOCGNN_HEAVY"), reason="about 15 minutes on 2 cores "
                    "(6,805-dimensional features); set OOCGNN_HEAVY=1 to run")
def test_out_of_core_matches_inmemory_on_coauthor_cs(tmp_path):
    means = _ooc_real("coauthor_cs", tmp_path, epochs=10)
    for policy in OOC:
        assert means[policy] >= means["inmemory"] - 0.01, means


# -- precision: bf16 autocast against fp32 ---------------------------------------------------------

def test_bf16_within_half_a_point_of_fp32_on_small(tmp_path):
    """--precision bf16 (autocast, on the CPU) at the default settings: mean test accuracy at best
    validation over 3 seeds within 0.5 points of fp32's."""
    store = write_store(generate("small"), tmp_path / "small", progress=False)
    acc = {p: [_test_acc(store.path, tmp_path / p, seed=s, precision=p, max_eval_nodes=20_000)
               for s in range(3)] for p in ("fp32", "bf16")}
    assert abs(np.mean(acc["bf16"]) - np.mean(acc["fp32"])) <= 0.005, acc
