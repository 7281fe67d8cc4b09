"""DiskGNN's packed batches (`policies.packed`): the packed file holds exactly each batch's sampled rows that
are not hot, training on it equals training in memory, its reads are the simulator's, its account is reported."""
import json

import numpy as np
import pytest

from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.io import PAGE
from oocgnn.policies import make_plan
from oocgnn.runtime import Runtime
from oocgnn.sampler import Sampler, sampled_steps
from oocgnn.simulate import simulate, summarize
from oocgnn.train import train


def _cfg(store, tmp_path, **kw):
    kw = {"policy": "packed", "epochs": 2, "batch_size": 128, "max_eval_nodes": 100, "progress": False,
          "memory_budget": "8MB", "out": str(tmp_path / kw.get("policy", "packed")),
          "pack_dir": str(tmp_path / "packs"), **kw}
    return TrainConfig.create(store=str(store.path), **kw)


def test_packed_batches_hold_exactly_the_sampled_rows(fennel16, tmp_path):
    """For every batch of the E epochs, sampled again here with a fresh sampler: its packed range holds its
    input rows that are not hot, each once, sorted, the bytes of features.bin's rows; ranges start on pages."""
    cfg = _cfg(fennel16, tmp_path, pack_epochs=3)
    plan = make_plan(fennel16, cfg)
    runtime = Runtime(fennel16, plan)
    runtime.setup()                                   # the hot rows, then packed.bin written
    p, d = plan.packing, plan.file.dir
    assert 0 < len(p.hot) <= plan.hot_rows and plan.file.reused is False
    starts, offsets, ids = (np.load(d / f"{n}.npy") for n in ("starts", "offsets", "ids"))
    stride, rb = fennel16.row_stride, fennel16.row_bytes
    packed = np.fromfile(d / "packed.bin", np.uint8).reshape(-1, stride)
    features = np.fromfile(fennel16.path / "features.bin", np.uint8).reshape(-1, stride)
    assert packed.nbytes == plan.pack_bytes == p.rows * stride
    hot = set(p.hot.tolist())
    sampler = Sampler(fennel16.neighbour_lists(), plan.fanouts, plan.seed)
    walked = list(sampled_steps(list(plan.steps(3)), sampler))
    assert len(walked) == len(starts) == len(p.counts) and sum(e == 2 for _, e, *_ in walked) > 0
    for i, epoch, b, step, sample in walked:
        mine = ids[offsets[i]:offsets[i + 1]]
        need = set(sample.input_nodes.tolist())
        assert set(mine.tolist()) | hot >= need
        assert mine.tolist() == sorted(need - hot)                 # exactly the non-hot rows, unique, sorted
        assert starts[i] * stride % PAGE == 0
        np.testing.assert_array_equal(packed[starts[i]:starts[i] + len(mine), :rb], features[mine, :rb])
    runtime.close()


def test_packed_trains_as_inmemory_and_reads_what_is_simulated(fennel16, tmp_path):
    """The same batches and features (only where the rows come from differs): the losses of inmemory; one
    range per batch, every page and request of it simulated; the pack's bytes and seconds in the summary;
    a second run reuses the file."""
    cfg = _cfg(fennel16, tmp_path)
    run = train(cfg)
    base = train(_cfg(fennel16, tmp_path, policy="inmemory"))
    np.testing.assert_allclose(run["log"]["train_loss"], base["log"]["train_loss"], rtol=1e-6)
    df = simulate(fennel16, make_plan(fennel16, cfg), epochs=cfg.epochs, progress=False)
    sim, setup = summarize(df).sum(), df.attrs["setup"]
    assert run["io"]["pages"] == sim["feature_pages_read"] + sim["load_feature_pages"]
    assert run["io"]["requests"] == sim["feature_requests"] + sim["load_feature_requests"]
    assert run["io_setup"]["pages"] == setup["load_feature_pages"] > 0
    assert sim["feature_pages_read"] == 0, "every row a batch needs is hot or in its packed range"
    assert run["io"]["calls"] == run["steps"] - int((df["load_feature_rows"] == 0).sum())
    assert run["pack_bytes"] == df.attrs["plan"]["pack_bytes"] > 0 and run["pack_s"] >= run["pack_sample_s"]
    assert run["pack_reused"] is False and run["pack_read_bytes"] == df.attrs["plan"]["pack_read_bytes"] > 0
    summary = json.loads((tmp_path / "packed" / "summary.json").read_text())
    assert summary["pack_bytes"] == run["pack_bytes"]
    again = train(_cfg(fennel16, tmp_path, out=str(tmp_path / "again")))
    assert again["pack_reused"] is True and again["pack_write_s"] == again["pack_read_bytes"] == 0
    np.testing.assert_array_equal(again["log"]["train_loss"], run["log"]["train_loss"])


def test_packed_memory_is_the_plans(fennel16, tmp_path):
    """The hot cache takes the `hot_share` of what the budget leaves; what the runtime allocates is the plan's."""
    full, half = (make_plan(fennel16, _cfg(fennel16, tmp_path, hot_share=s)) for s in (1.0, 0.5))
    assert 0 < half.hot_rows < full.hot_rows and full.resident_bytes() <= full.budget
    runtime = Runtime(fennel16, half)
    runtime.setup()
    assert runtime.memory() == half.memory()
    runtime.close()


def test_packed_refuses_too_few_epochs_and_a_full_disk(fennel16, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="pack-epochs 1 packs fewer epochs than the run's 2"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, pack_epochs=1))
    import oocgnn.policies.packed as packed
    monkeypatch.setattr(packed.shutil, "disk_usage", lambda path: type("U", (), {"free": 4096})())
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, pack_dir=str(tmp_path / "full")))
    runtime = Runtime(fennel16, plan)
    with pytest.raises(UserError, match="the disk has 4.0 KiB free"):
        runtime.setup()
    runtime.close()
    assert not (tmp_path / "full").exists() or not any((tmp_path / "full").iterdir())


def test_packed_works_on_a_compressed_store(tiny_data, tmp_path):
    """Rows are packed as stored (int8 here, at the store's stride): the run decodes them as inmemory does."""
    from oocgnn.partition import order_from_assignment, partition
    from oocgnn.storewrite import write_store
    assignment, _ = partition(tiny_data, "fennel", 16, cache_dir=False)
    order, offsets = order_from_assignment(assignment, 16)
    store = write_store(tiny_data, tmp_path / "int8", order=order, part_offsets=offsets, partitioner="fennel",
                        progress=False, feature_dtype="int8")
    run = train(_cfg(store, tmp_path, epochs=1))
    base = train(_cfg(store, tmp_path, policy="inmemory", epochs=1))
    np.testing.assert_allclose(run["log"]["train_loss"], base["log"]["train_loss"], rtol=1e-6)
    assert run["pack_bytes"] % store.row_stride == 0
