"""Shared fixtures: small stores written once per session, and the ../shared datasets path."""
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


def shared_dataset(name: str) -> Path:
    """Path of a real dataset in ../shared/datasets, or skip the test when it is absent."""
    path = SHARED_DATASETS / f"{name}.npz"
    if not path.is_file():
        pytest.skip(f"{path} not found (real datasets live in ../shared/datasets)")
    return path


@pytest.fixture(scope="session")
def tiny_data():
    from oocgnn.synthetic import generate
    return generate("tiny")


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory, tiny_data):
    from oocgnn.storewrite import write_store
    return write_store(tiny_data, tmp_path_factory.mktemp("stores") / "tiny", progress=False)


@pytest.fixture(scope="session")
def parted(tiny_data, tmp_path_factory):
    """The tiny graph in a random store order, cut into 13 uneven parts (no partitioner needed)."""
    import numpy as np
    from oocgnn.storewrite import write_store
    n = tiny_data.num_nodes
    cuts = np.sort(np.random.default_rng(8).choice(np.arange(1, n), 12, replace=False))
    return write_store(tiny_data, tmp_path_factory.mktemp("stores") / "parted",
                       order=np.random.default_rng(7).permutation(n),
                       part_offsets=np.concatenate([[0], cuts, [n]]), progress=False)


@pytest.fixture(scope="session")
def fennel16(tmp_path_factory, tiny_data):
    """The tiny graph partition-ordered into 16 FENNEL parts."""
    from oocgnn.partition import order_from_assignment, partition
    from oocgnn.storewrite import write_store
    assignment, _ = partition(tiny_data, "fennel", 16, cache_dir=False)
    order, offsets = order_from_assignment(assignment, 16)
    return write_store(tiny_data, tmp_path_factory.mktemp("stores") / "tiny16", order=order,
                       part_offsets=offsets, partitioner="fennel", progress=False)


@pytest.fixture(scope="session")
def com_graph():
    """`linkstores.community_graph`: twenty communities, its edges split 80/10/10."""
    from .linkstores import community_graph
    return community_graph()


@pytest.fixture(scope="session")
def small_link(com_graph, tmp_path_factory):
    from oocgnn.storewrite import write_store
    return write_store(com_graph, tmp_path_factory.mktemp("stores") / "com-link", progress=False)


@pytest.fixture(scope="session")
def parted_link(com_graph, tmp_path_factory):
    """The same graph in a random store order, cut into 8 even parts."""
    import numpy as np
    from oocgnn.storewrite import write_store
    n = com_graph.num_nodes
    return write_store(com_graph, tmp_path_factory.mktemp("stores") / "com-link8",
                       order=np.random.default_rng(3).permutation(n), part_offsets=np.linspace(0, n, 9).astype(np.int64),
                       progress=False)


@pytest.fixture(scope="session")
def link16(tmp_path_factory, tiny_data):
    """The tiny graph as a link store (a seeded 80/10/10 edge split), partition-ordered into 16 FENNEL parts of
    its training topology."""
    import dataclasses
    import numpy as np
    from oocgnn.linksplit import hold_out
    from oocgnn.partition import order_from_assignment, partition
    from oocgnn.storewrite import write_store
    empty = np.empty(0, np.int64)
    data = hold_out(dataclasses.replace(tiny_data, train_idx=empty, val_idx=empty, test_idx=empty), (0.8, 0.1, 0.1),
                    seed=1)
    assignment, _ = partition(data, "fennel", 16, cache_dir=False)
    order, offsets = order_from_assignment(assignment, 16)
    return write_store(data, tmp_path_factory.mktemp("stores") / "link16", order=order, part_offsets=offsets,
                       partitioner="fennel", progress=False)


@pytest.fixture(scope="session")
def by_label(tiny_data, tmp_path_factory):
    """The tiny graph in an order that follows the labels (parts of few classes, like METIS's on a
    homophilous graph), cut into 16 uneven parts."""
    import numpy as np
    from oocgnn.storewrite import write_store
    n = tiny_data.num_nodes
    noise = np.random.default_rng(3).random(n)
    order = np.lexsort((noise, np.asarray(tiny_data.labels))).astype(np.int64)
    cuts = np.sort(np.random.default_rng(4).choice(np.arange(1, n), 15, replace=False))
    return write_store(tiny_data, tmp_path_factory.mktemp("stores") / "bylabel", order=order,
                       part_offsets=np.concatenate([[0], cuts, [n]]), progress=False)


@pytest.fixture(scope="session")
def binary(tiny_data, tmp_path_factory):
    """The tiny graph with binary labels: its classes 0 and 1 positive (23 % of the nodes, so that predicting
    the majority scores 77 % accuracy), in 4 even parts."""
    import dataclasses
    import numpy as np
    from oocgnn.storewrite import write_store
    data = dataclasses.replace(tiny_data, labels=(tiny_data.labels <= 1).astype(np.int64), num_classes=2)
    return write_store(data, tmp_path_factory.mktemp("stores") / "binary",
                       part_offsets=np.linspace(0, data.num_nodes, 5).astype(np.int64), progress=False)


@pytest.fixture
def kill_at(monkeypatch):
    """`kill_at(t)`: training raises KeyboardInterrupt at its mini-batch t, counted from 0 when armed (a
    killed run), until `kill_at(None)` restores it."""
    from oocgnn import runtime
    forward = runtime.Runtime.forward

    def arm(t):
        if t is None:
            monkeypatch.setattr(runtime.Runtime, "forward", forward)
            return
        calls = iter(range(1 << 62))

        def killed(self, model, ctx, x, step):
            if next(calls) == t:
                raise KeyboardInterrupt
            return forward(self, model, ctx, x, step)
        monkeypatch.setattr(runtime.Runtime, "forward", killed)
    return arm
