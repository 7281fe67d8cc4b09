"""Link stores shared by the link tests (a test helper): a graph of twenty communities, split 80/10/10 into
training, validation and test edges (`conftest`'s `small_link` and `parted_link` write it), and a small link
run's settings."""
import numpy as np

from oocgnn.config import TrainConfig
from oocgnn.datasets import GraphData, csr_from_edges
from oocgnn.linksplit import hold_out

N, COMMUNITIES = 400, 20


def community_graph() -> GraphData:
    """Twenty communities (edges mostly inside one), features a noisy one-hot of the community; 80/10/10 split."""
    rng = np.random.default_rng(0)
    com = rng.integers(0, COMMUNITIES, N)
    src = rng.integers(0, N, 6000)
    same = rng.random(6000) < 0.9
    members = [np.flatnonzero(com == c) for c in range(COMMUNITIES)]
    dst = np.where(same, [rng.choice(members[com[s]]) for s in src], rng.integers(0, N, 6000))
    indptr, indices = csr_from_edges(src, dst, N)
    feat = (np.eye(COMMUNITIES)[com] + 0.5 * rng.standard_normal((N, COMMUNITIES))).astype(np.float32)
    empty = np.empty(0, np.int64)
    return hold_out(GraphData("com", indptr, indices, feat, com, empty, empty, empty), (0.8, 0.1, 0.1), seed=1)


def link_cfg(store, tmp_path, name="run", **kw) -> TrainConfig:
    """A small link run on `store`, written to tmp_path/name; `kw` overrides."""
    kw = {"epochs": 3, "batch_size": 512, "fanouts": "5,5", "hidden": 32, "negatives": 20, "negative_chunks": 4,
          "eval_every": 4, "lr": 0.01, **kw}
    return TrainConfig.create(store=str(store.path), out=str(tmp_path / name), progress=False, **kw)
