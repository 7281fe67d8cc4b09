"""Faults in the caches a run keeps beside its stores (partitions, traces): validated when loaded, recomputed
when invalid, never fatal to write. The store's own faults are in test_faults_store.py."""
import errno
import json
import os

import numpy as np
import pytest


def _partition(data, cache):
    from oocgnn.partition import partition
    return partition(data, "random", 8, seed=3, cache_dir=cache)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "values-changed", "out-of-range", "other-parts"])
def test_a_damaged_partition_cache_is_recomputed(tiny_data, tmp_path, damage):
    from oocgnn.partition import CSRSource, cache_path
    fresh, _ = _partition(tiny_data, tmp_path)
    path = cache_path(CSRSource.of(tiny_data), "random", 8, 3, cache_dir=tmp_path)
    assert _partition(tiny_data, tmp_path)[1].cached.item()
    with np.load(path) as z:
        parts = {k: z[k] for k in z.files}
    if damage == "garbage":
        path.write_bytes(b"PK\x03\x04 not a zip")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:
        a = parts["assignment"].copy()
        if damage == "values-changed":
            a[:10] = (a[:10] + 1) % 8                # in range: only the checksum sees it
        elif damage == "out-of-range":
            a[0] = 99
        else:
            parts["report"] = np.array(json.dumps({**json.loads(str(parts["report"])), "parts": 9}))
        np.savez(path, **{**parts, "assignment": a})
    again, report = _partition(tiny_data, tmp_path)
    assert not report.cached.item()
    np.testing.assert_array_equal(again, fresh)
    assert _partition(tiny_data, tmp_path)[1].cached.item()     # and rewritten whole


def test_a_partition_cache_that_cannot_be_written_is_a_warning(tiny_data, tmp_path, monkeypatch):
    from oocgnn import partition as pmod
    real = os.replace

    def failing(a, b):
        raise OSError(errno.EROFS, "Read-only file system", str(b))
    monkeypatch.setattr(pmod.os, "replace", failing)
    with pytest.warns(UserWarning, match="partition cache not written.*Read-only"):
        assignment, report = _partition(tiny_data, tmp_path)
    monkeypatch.setattr(pmod.os, "replace", real)
    assert len(assignment) == tiny_data.num_nodes and not report.cached.item()
    assert not list(tmp_path.iterdir()), "no temporary file left"


def _trace(cache, fmt="npz"):
    from oocgnn.trace import cached_trace, synthetic_trace
    return cached_trace({"name": "zipf", "n": 500}, cache, lambda: synthetic_trace(500, 20, 30, seed=1), fmt=fmt)


@pytest.mark.parametrize("fmt", ["npz", "dir"])
@pytest.mark.parametrize("damage", ["garbage", "ids-changed", "ids-out-of-range"])
def test_a_damaged_trace_cache_is_rebuilt(tmp_path, fmt, damage):
    fresh = _trace(tmp_path, fmt)
    assert _trace(tmp_path, fmt).cached
    (path,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    if fmt == "npz":
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        if damage == "garbage":
            path.write_bytes(b"junk")
        else:
            arrays["features_ids"] = arrays["features_ids"].copy()
            arrays["features_ids"][0] = 10**6 if damage == "ids-out-of-range" else arrays["features_ids"][1]
            np.savez(path, **arrays)
    else:
        f = path / "features_ids.npy"
        if damage == "garbage":
            f.write_bytes(b"junk")
        else:
            ids = np.load(f)
            ids[0] = 10**6 if damage == "ids-out-of-range" else ids[1]
            np.save(f, ids)
    again = _trace(tmp_path, fmt)
    assert not again.cached
    np.testing.assert_array_equal(again.ids, fresh.ids)
    assert _trace(tmp_path, fmt).cached


def test_a_trace_cache_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch):
    from oocgnn import trace as tmod

    def failing(*a, **kw):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))
    monkeypatch.setattr(tmod.Trace, "save", failing)
    with pytest.warns(UserWarning, match="trace cache not written.*Read-only"):
        t = _trace(tmp_path)
    assert len(t) == 20 and not t.cached
