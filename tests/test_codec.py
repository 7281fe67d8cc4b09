"""Compressed feature stores (`prepare --feature-dtype`, F2CGT): rows round-trip within their quantisation
error, every policy trains on them and reads what the simulator counts, a run on int8 rows equals the run on
a float32 store of the decoded rows, and the budget counts the stored bytes."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from oocgnn.codec import CODEC_FILE, Codec
from oocgnn.errors import StoreError, UserError
from oocgnn.policies import make_plan
from oocgnn.resident import CachedReader
from oocgnn.store import open_store
from oocgnn.storewrite import write_store
from oocgnn.train import train

from .test_executor import RUNS, _assert_agree, _cfg, _simulated


def _awkward(data, seed=0):
    """`data` with features of very different ranges per column: scaled, shifted, negative, one constant."""
    x = np.asarray(data.features[np.arange(data.num_nodes)], dtype=np.float32)
    rng = np.random.default_rng(seed)
    x = x * rng.uniform(0.01, 300, x.shape[1]).astype(np.float32) + rng.uniform(-50, 50, x.shape[1]).astype(np.float32)
    x[:, 3] = 7.25
    return dataclasses.replace(data, features=x)


@pytest.fixture(scope="module")
def fennel16_order(fennel16):
    return np.asarray(fennel16.orig_ids), np.asarray(fennel16.part_offsets)


@pytest.fixture(scope="module", params=["float16", "int8"])
def compressed(request, tiny_data, fennel16_order, tmp_path_factory):
    """The tiny graph in fennel16's order and parts, its rows stored as float16 or int8."""
    order, offsets = fennel16_order
    return write_store(tiny_data, tmp_path_factory.mktemp("codec") / request.param, order=order,
                       part_offsets=offsets, partitioner="fennel", progress=False, feature_dtype=request.param)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_rows_round_trip_within_their_quantisation_error(tiny_data, tmp_path, dtype):
    data = _awkward(tiny_data)
    x = data.features
    store = write_store(data, tmp_path / dtype, progress=False, feature_dtype=dtype)
    assert store.feature_dtype == dtype and store.row_bytes == data.feat_dim * np.dtype(dtype).itemsize
    assert (store.path / "features.bin").stat().st_size == store.num_nodes * store.row_stride
    assert (store.path / CODEC_FILE).is_file() == (dtype == "int8")
    with store.reader("direct") as reader:
        raw = reader.read_rows(np.arange(store.num_nodes))
    assert raw.dtype == np.dtype(dtype)
    got = store.codec.decode_np(raw)
    want = x[np.asarray(store.orig_ids)]
    err = np.abs(got - want)
    bound = store.codec.max_error(x.min(0), x.max(0))
    if dtype == "float32":
        assert np.array_equal(got, want)
        return
    assert (err <= bound).all(), float((err - bound).max())
    assert err.max() > 0                                   # it does compress
    assert err[:, 3].max() == 0                            # a constant column is exact
    if dtype == "float16":
        assert np.array_equal(raw, want.astype(np.float16))
    else:                                                  # the bound is tight: int8 uses its 255 steps
        assert err.max() > 0.3 * bound.max()
        assert raw.min() == -128 and raw.max() == 127
    torch_rows = store.codec.decode(torch.from_numpy(raw))
    assert torch_rows.dtype == torch.float32 and np.array_equal(torch_rows.numpy(), got)


def test_float16_refuses_features_it_cannot_hold(tiny_data, tmp_path):
    x = np.asarray(tiny_data.features[np.arange(tiny_data.num_nodes)], dtype=np.float32).copy()
    x[5, 2] = 1e6
    with pytest.raises(UserError, match="beyond float16"):
        write_store(dataclasses.replace(tiny_data, features=x), tmp_path / "s", progress=False, feature_dtype="float16")
    assert not (tmp_path / "s").exists()
    with pytest.raises(UserError, match="feature-dtype"):
        write_store(tiny_data, tmp_path / "t", progress=False, feature_dtype="int4")


def test_a_damaged_codec_table_is_refused(tiny_data, tmp_path):
    store = write_store(tiny_data, tmp_path / "s", progress=False, feature_dtype="int8")
    table = np.load(store.path / CODEC_FILE)
    table[0, 1] = -1.0
    np.save(store.path / CODEC_FILE, table)
    with pytest.raises(StoreError, match="checksum mismatch in feature_codec.npy"):
        open_store(store.path)
    (store.path / CODEC_FILE).unlink()
    with pytest.raises(StoreError, match="missing file feature_codec.npy"):
        open_store(store.path, verify=False)
    meta = json.loads((store.path / "meta.json").read_text())
    assert meta["dtype"] == "int8" and CODEC_FILE in meta["files"]


def test_gathered_rows_decode_the_same_on_either_side_of_the_copy(compressed):
    """`gather(stored=True)` then `decode` (the GPU's order: copy, then decode) equals `gather` (the CPU's);
    resident rows are held as stored, misses read through the fallback."""
    store = compressed
    cached = CachedReader(store.reader("direct"), store.num_nodes, 500, codec=store.codec)
    assert cached.rows.dtype == store.codec.torch_dtype
    cached.read_into(np.arange(0, 1000, 2), 0)
    ids = np.random.default_rng(1).permutation(store.num_nodes)[:700]
    x = cached.gather(ids)
    raw = cached.gather(ids, stored=True)
    assert x.dtype == torch.float32 and raw.dtype == store.codec.torch_dtype
    assert torch.equal(cached.decode(raw), x)
    with store.reader("memory") as every:
        assert np.array_equal(x.numpy(), store.codec.decode_np(every.read_rows(ids)))
    with pytest.raises(ValueError, match="codec stores"):
        CachedReader(store.reader("direct"), store.num_nodes, 10)          # float32 codec over compressed rows


COMPRESSED_RUNS = ["inmemory", "mmap", "hierbatching-disk", "hierbatching-sync", "outre", "outre-frequency",
                   "ginex", "ginex-disk", "macrobatch", "marius", "marius-beta", "composed"]


@pytest.mark.parametrize("name", COMPRESSED_RUNS)
def test_executed_io_on_compressed_rows_equals_simulated(compressed, tmp_path, name):
    """The smaller rows change every page count; the simulator follows them exactly (the test_executor
    oracle on the compressed store)."""
    cfg = _cfg(compressed, tmp_path, **{"policy": name, **RUNS[name]})
    run = train(cfg)
    _assert_agree(run, *_simulated(compressed, cfg), make_plan(compressed, cfg).exact_io)


@pytest.mark.parametrize("name", ["hierbatching", "ginex", "outre", "marius-beta", "composed"])
def test_a_run_on_int8_rows_equals_a_float32_run_on_the_decoded_rows(tiny_data, fennel16_order, tmp_path, name):
    """Compression changes the feature values and nothing else: the same plan's losses on the int8 store
    equal those on a float32 store holding exactly the decoded rows."""
    order, offsets = fennel16_order
    int8 = write_store(tiny_data, tmp_path / "int8", order=order, part_offsets=offsets, partitioner="fennel",
                       progress=False, feature_dtype="int8")
    x = np.asarray(tiny_data.features[np.arange(tiny_data.num_nodes)], dtype=np.float32)
    decoded = int8.codec.decode_np(int8.codec.encode(x))
    twin = write_store(dataclasses.replace(tiny_data, features=decoded), tmp_path / "twin", order=order,
                       part_offsets=offsets, partitioner="fennel", progress=False)
    logs = []
    for store in (int8, twin):
        cfg = _cfg(store, tmp_path / store.path.name, **{"policy": name, **RUNS[name], "epochs": 3})
        logs.append(pd.read_csv(f"{train(cfg)['run_dir']}/log.csv"))
    assert len(logs[0]) == len(logs[1]) and len(logs[0]) > 0
    np.testing.assert_array_equal(logs[0]["train_loss"].to_numpy(), logs[1]["train_loss"].to_numpy())
    np.testing.assert_array_equal(logs[0]["val_acc"].to_numpy(), logs[1]["val_acc"].to_numpy())


def test_the_budget_holds_more_compressed_rows(fennel16, compressed, tmp_path):
    """The plans count rows at their stored size: at one budget a Ginex cache holds 2x (float16) or 4x
    (int8) the float32 rows, and the runtime allocates what the plan declares."""
    from oocgnn.runtime import Runtime
    ratio = {"float16": 2, "int8": 4}[compressed.feature_dtype]
    caps = []
    for store in (fennel16, compressed):
        plan = make_plan(store, _cfg(store, tmp_path, policy="ginex", superbatch=4, memory_budget="3MB"))
        caps.append(plan.capacity() - plan.setup_rows() - 2 * plan.group_rows())
        runtime = Runtime(store, plan)
        try:
            assert runtime.memory()["feature_rows"] == plan.memory()["feature_rows"]
        finally:
            runtime.close()
    assert caps[1] >= ratio * caps[0] * 0.9, caps


def test_distributed_ranks_read_a_compressed_store_shared(compressed, tmp_path):
    """Ranks holding only their own rows exchange float32 rows: refused, with the way out; `auto` then reads
    the store shared, each rank through the policy (2 ranks on localhost), its reads the simulator's."""
    from oocgnn.disttrain import RankView, exchanges, rank_config
    from oocgnn.distributed import owner_bounds
    from oocgnn.shards import RankData, write_shards
    from .test_distributed_policies import COMMON, _torchrun
    with pytest.raises(UserError, match="--rank-data shared"):
        RankData.open(compressed.path, 2, 0)
    with pytest.raises(UserError, match="float32"):
        write_shards(compressed, 2, out=tmp_path / "shards")
    settings = {**COMMON, "epochs": 2, "memory_budget": "3MB", "parts_per_megabatch": 4, "static_ratio": 0.02}
    cfg = _cfg(compressed, tmp_path, policy="hierbatching", **settings)
    assert not exchanges(cfg)                          # auto: hierbatching has a rank plan, but not for these rows
    two = _torchrun(compressed.path, tmp_path / "two", "hierbatching",
                    {k: v for k, v in settings.items() if k not in COMMON or k in ("epochs", "memory_budget")})
    assert two["world"] == 2 and two["feature_dtype"] == compressed.feature_dtype and two["best_val_acc"] > 0.3
    bounds = owner_bounds(compressed.part_offsets, 2)
    for record in two["ranks"]:
        view, rcfg = RankView(compressed, bounds, record["rank"]), rank_config(cfg, 2)
        _assert_agree(record, *_simulated(view, rcfg), make_plan(view, rcfg).exact_io)


def test_codec_fit_is_affine_per_column():
    codec = Codec.fit("int8", np.array([0.0, -1.0, 5.0], np.float32), np.array([255.0, 1.0, 5.0], np.float32))
    x = np.array([[0.0, -1.0, 5.0], [255.0, 1.0, 5.0], [128.0, 0.0, 5.0]], np.float32)
    q = codec.encode(x)
    assert q[:, 0].tolist() == [-128, 127, 0] and q[:, 1].tolist() == [-128, 127, 0]
    np.testing.assert_allclose(codec.decode_np(q)[:, 0], x[:, 0])
    assert np.array_equal(codec.decode_np(q)[:, 2], x[:, 2])


def test_the_summary_says_the_read_amplification(fennel16, compressed, tmp_path):
    """Pages moved per useful byte: about 1 for HierBatching's whole parts, more for Ginex's scattered misses,
    and more on smaller rows (a 4 KiB page per scattered row whatever its size)."""
    amp = {}
    for store in (fennel16, compressed):
        for name in ("hierbatching-disk", "ginex"):
            s = train(_cfg(store, tmp_path / f"{store.feature_dtype}-{name}", **{"policy": name, **RUNS[name]}))
            assert s["feature_dtype"] == store.feature_dtype
            assert s["read_amplification"] == round(s["io"]["bytes_read"] / s["io"]["bytes_requested"], 3)
            amp[store.feature_dtype, name] = s["read_amplification"]
    dtype = compressed.feature_dtype
    assert amp["float32", "hierbatching-disk"] < 1.1 and amp[dtype, "hierbatching-disk"] < 1.1
    assert amp["float32", "ginex"] > 1.5 and amp[dtype, "ginex"] > amp["float32", "ginex"]


def test_the_cost_model_follows_the_smaller_rows(fennel16, compressed, tmp_path):
    """Calibration runs on compressed rows (its slot loads read them as stored), and at the same knobs a plan's
    predicted disk bytes shrink with the rows (the simulator's pages at the stored stride)."""
    from oocgnn import costmodel
    from oocgnn.disk import DiskRates
    from oocgnn.simulate import simulate
    costs = costmodel.calibrate(compressed, _cfg(compressed, tmp_path, policy="ginex", hidden=16), steps=4,
                                cache=tmp_path)
    assert 0 < costs.slot_row_s < 1e-3 and costs.gather_s >= 0
    rates = DiskRates(seq_bytes_s=1e9, iops=5e4, iops_qd1=1e4)
    disk = {}
    for store in (fennel16, compressed):
        plan = make_plan(store, _cfg(store, tmp_path, policy="hierbatching", parts_per_megabatch=4, static_ratio=0.02))
        df = simulate(store, plan, epochs=1, progress=False)
        disk[store.feature_dtype] = costmodel.predict(store, plan, rates, costs, df=df)["disk_bytes"]
    ratio = {"float16": 2, "int8": 4}[compressed.feature_dtype]
    # a quarter (half) of the pages, and at most a page more at each end of a part's range (smaller rows end mid-page)
    assert disk["float32"] / ratio <= disk[compressed.feature_dtype] <= disk["float32"] / ratio * 1.1
