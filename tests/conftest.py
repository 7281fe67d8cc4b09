"""Shared fixtures: small stores written once per session, and the ../shared datasets path."""
import os
from pathlib import Path

# DGL's OpenMP neighbour sampling is only reproducible on one thread; oracle tests compare
# runs step by step, so the suite runs single-threaded (set before torch/dgl load).
os.environ["OMP_NUM_THREADS"] = "1"

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
    from oocgnn.store import write_store
    return write_store(tiny_data, tmp_path_factory.mktemp("stores") / "tiny", progress=False)
