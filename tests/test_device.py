"""--device and --precision: a missing GPU is one line and exit 2; the CPU path passes batches through;
on a GPU (tests marked `cuda`, skipped without one) training matches the CPU's and the copies overlap."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from oocgnn.config import TrainConfig
from oocgnn.device import HostToDevice, LossMeter, resolve_device
from oocgnn.errors import UserError
from oocgnn.train import train

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("tpu", "gpu0", "cuda:x"):
        with pytest.raises(UserError, match="unknown device"):
            resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_gpu_is_one_line_and_exit_2(tiny_store, tmp_path):
    with pytest.raises(UserError, match="--device cuda"):
        resolve_device("cuda")
    r = subprocess.run([sys.executable, "-m", "oocgnn", "train", str(tiny_store.path), "--device", "cuda",
                        "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--device cuda" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run" / "log.csv").exists()


def test_bad_precision_is_refused(tiny_store):
    with pytest.raises(UserError, match="precision"):
        TrainConfig.create(store=str(tiny_store.path), precision="fp8")


def test_cpu_stage_passes_batches_through():
    h2d, x = HostToDevice("cpu"), torch.randn(5, 3)
    assert h2d.buffer(5, 3) is None
    assert h2d([x], [])[0] is x and h2d.bytes == 0
    h2d.step_done()
    assert h2d.timing()["overlap"] is None and h2d.timing()["steps_timed"] == 0
    meter = LossMeter("cpu")
    assert meter.push(3, 0, torch.tensor(1.5)) == [(3, 0, 1.5)] and meter.flush() == []


def test_cpu_run_records_device_and_precision(tiny_store, tmp_path):
    s = train(TrainConfig.create(store=str(tiny_store.path), epochs=1, device="cpu", precision="bf16",
                                 progress=False, out=str(tmp_path / "run")))
    assert s["device"] == "cpu" and s["precision"] == "bf16" and "h2d" in s["stage_s"]
    assert s["h2d"]["bytes"] == 0 and s["cuda_host_memory"] == 0 and np.isfinite(s["log"]["train_loss"].iloc[-1])


@cuda
@pytest.mark.parametrize("policy", ["inmemory", "hierbatching", "outre"])
def test_cuda_run_matches_the_cpu_run(fennel16, tmp_path, policy):
    """Same seed, same batches: the GPU's losses follow the CPU's (float sums in another order)."""
    runs = {}
    for device in ("cpu", "cuda"):
        runs[device] = train(TrainConfig.create(
            store=str(fennel16.path), policy=policy, epochs=2, dropout=0.0, device=device, memory_budget="4MB",
            progress=False, out=str(tmp_path / device)))
    a, b = runs["cpu"]["log"], runs["cuda"]["log"]
    h2d = runs["cuda"]["h2d"]
    assert h2d["bytes"] > 0 and h2d["pinned_bytes"] > 0
    assert runs["cpu"]["cuda_host_memory"] == 0
    assert h2d["steps_timed"] == runs["cuda"]["steps"] and h2d["copy_s"] > 0 and h2d["gpu_compute_s"] > 0
    assert 0 <= h2d["copy_waited_s"] <= h2d["copy_s"] and 0 <= h2d["overlap"] <= 1
    np.testing.assert_allclose(a["train_loss"].iloc[1:], b["train_loss"].iloc[1:], rtol=1e-3)
    assert abs(a["val_acc"].iloc[-1] - b["val_acc"].iloc[-1]) <= 0.01


@cuda
@pytest.mark.parametrize("policy", ["inmemory", "ginex"])
def test_cuda_decodes_compressed_rows_after_the_copy(tiny_data, fennel16, tmp_path, policy):
    """On an int8 store the GPU run copies the input rows as stored (a quarter of float32's bytes) and
    decodes them there: its losses follow the CPU run's on the same store, which decodes before."""
    from oocgnn.storewrite import write_store
    int8 = write_store(tiny_data, tmp_path / "int8", order=fennel16.orig_ids, part_offsets=fennel16.part_offsets,
                       partitioner="fennel", progress=False, feature_dtype="int8")
    runs = {}
    for name, store, device in (("cpu", int8, "cpu"), ("cuda", int8, "cuda"), ("float32", fennel16, "cuda")):
        runs[name] = train(TrainConfig.create(
            store=str(store.path), policy=policy, epochs=2, dropout=0.0, device=device, memory_budget="16MB",
            progress=False, out=str(tmp_path / name)))
    a, b = runs["cpu"]["log"], runs["cuda"]["log"]
    np.testing.assert_allclose(a["train_loss"].iloc[1:], b["train_loss"].iloc[1:], rtol=1e-3)
    assert abs(a["val_acc"].iloc[-1] - b["val_acc"].iloc[-1]) <= 0.01
    rows = runs["cuda"]["h2d"]["bytes"], runs["float32"]["h2d"]["bytes"]
    assert rows[0] < 0.5 * rows[1], rows                 # the rows dominate: a quarter of their bytes


@cuda
@pytest.mark.parametrize("model", ["sage", "gat", "gin"])
def test_cuda_first_steps_match_the_cpu(tiny_store, tmp_path, model):
    """Three steps of each model on `tiny`: the GPU's losses (its torch ops) equal the CPU's (numba kernels)."""
    losses = {}
    for device in ("cpu", "cuda"):
        s = train(TrainConfig.create(store=str(tiny_store.path), model=model, max_steps=3, eval_every=1,
                                     dropout=0.0, device=device, progress=False, out=str(tmp_path / device)))
        losses[device] = s["log"]["train_loss"].iloc[1:].to_numpy()
    assert len(losses["cpu"]) == 3 and np.isfinite(losses["cpu"]).all()
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4, atol=1e-5)


@cuda
def test_cuda_layers_match_the_cpu_kernels():
    """The torch ops a GPU runs against the CPU's numba kernels, same weights and blocks."""
    from oocgnn import models
    from oocgnn.blocks import sample_blocks
    rng = np.random.default_rng(0)
    n = 3000
    dst = np.sort(rng.integers(0, n, 30000))
    indptr = np.searchsorted(dst, np.arange(n + 1)).astype(np.int64)
    blocks = sample_blocks(indptr, rng.integers(0, n, 30000), np.arange(500), [10, 5], 0, 0, 0,
                           np.full(n, -1, np.int64))
    for name in ("sage", "gat", "gin"):
        torch.manual_seed(0)
        m = models.build_model(name, 16, 32, 5, 2, dropout=0.0)
        x = torch.randn(blocks[0].num_src, 16)
        ref = m(blocks, x)
        out = m.to("cuda")(blocks, x.cuda()).cpu()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
