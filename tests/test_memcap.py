"""oocgnn.memcap: a nested memory cgroup really caps page cache faulted in through np.memmap."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from oocgnn import memcap
from oocgnn.errors import UserError

MiB = 2**20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _memory_line():
    return next((l for l in open("/proc/self/cgroup").read().splitlines() if ":memory:" in l
                 or l.startswith("0::")), None)


@pytest.fixture(autouse=True)
def no_leftover_cgroup():
    """Whatever happens in a test: back in the original group, no oocgnn_<pid>_* group left."""
    before = _memory_line()
    version, mnt, rel = memcap._locate()
    home = os.path.join(mnt, rel.lstrip("/")) if version else None
    yield
    if home is None:
        return
    if _memory_line() != before:
        with open(os.path.join(home, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    leftovers = glob.glob(os.path.join(home, f"*_{os.getpid()}_*"))
    for d in leftovers:
        os.rmdir(d)
    assert _memory_line() == before, "process was left in another memory cgroup"
    assert not leftovers, f"cgroups left behind: {leftovers}"


def test_probe_keys():
    p = memcap.probe()
    assert set(p) == {"possible", "version", "reason"}
    assert isinstance(p["possible"], bool) and isinstance(p["reason"], str) and p["reason"]
    assert p["version"] in ("v1", "v2", None)


def test_cap_bounds_memmap_page_cache(tmp_path):
    _need_cgroup()
    cap_bytes, size, page = 64 * MiB, 256 * MiB, 4096
    path = tmp_path / "data.bin"
    with open(path, "wb") as f:
        block = (np.arange(MiB) // page % 250 + 1).astype(np.uint8).tobytes()
        for _ in range(size // MiB):
            f.write(block)
    memcap.drop_file_cache(path)
    before = _memory_line()

    with memcap.MemoryCap(cap_bytes) as cap:
        assert cap.enforced, cap.reason
        assert _memory_line().rstrip("/").endswith("/" + cap.name)
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        total, max_usage = 0, 0
        for off in range(0, size, page):        # one byte per 4 KiB page, sequentially
            total += int(mm[off])
            if off % (256 * page) == 0:
                max_usage = max(max_usage, cap.usage())
        del mm
        peak, failcnt = cap.peak(), cap.failcnt()

    slack = 2 * MiB
    print(f"\ntouched {size // MiB} MiB under a {cap_bytes // MiB} MiB cap: peak "
          f"{peak / MiB:.1f} MiB, max sampled usage {max_usage / MiB:.1f} MiB, failcnt {failcnt}")
    assert total == size // MiB * sum(i % 250 + 1 for i in range(MiB // page))  # data really read
    assert peak <= cap_bytes + slack
    assert failcnt > 0 or max_usage <= cap_bytes + slack
    assert peak > cap_bytes // 2, "the file's pages were not charged to the cap (still cached?)"
    rec = json.loads(json.dumps(cap.record()))
    assert rec["peak"] == peak and rec["enforced"] is True and rec["limit"] == cap_bytes
    assert not os.path.exists(cap.path)
    assert _memory_line() == before


def test_bad_limit_raises():
    for bad in (0, -1, 16 * MiB - 1, 1.5 * 2**30, "64MiB", True, None):
        with pytest.raises(UserError):
            memcap.MemoryCap(bad)
    memcap.MemoryCap(16 * MiB)      # the minimum is accepted (not entered)


def test_unavailable_is_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(memcap, "_locate", lambda: ("v1", str(tmp_path / "nope"), "/a/b"))
    assert memcap.probe()["possible"] is False
    before = _memory_line()
    with memcap.MemoryCap(64 * MiB) as cap:
        assert cap.enforced is False
        assert "not found" in cap.reason
        assert cap.usage() is None and cap.peak() is None
    rec = cap.record()
    assert rec["enforced"] is False and rec["reason"] and rec["limit"] == 64 * MiB
    assert _memory_line() == before


def test_not_a_cgroupfs(monkeypatch, tmp_path):
    (tmp_path / "a").mkdir()
    monkeypatch.setattr(memcap, "_locate", lambda: ("v1", str(tmp_path), "/a"))
    with memcap.MemoryCap(64 * MiB) as cap:
        assert cap.enforced is False and "not a cgroup" in cap.reason
    assert os.listdir(tmp_path / "a") == []


def _need_cgroup():
    p = memcap.probe()
    if not p["possible"]:
        pytest.skip(f"no memory cgroup here: {p['reason']}")


def test_exception_inside_still_cleans_up():
    _need_cgroup()
    before = _memory_line()
    with pytest.raises(RuntimeError):
        with memcap.MemoryCap(32 * MiB, name="boom") as cap:
            assert cap.enforced and os.path.isdir(cap.path)
            raise RuntimeError("inside")
    assert not os.path.exists(cap.path) and _memory_line() == before
    assert cap.record()["enforced"] is True


def test_atexit_removes_group_left_entered():
    _need_cgroup()
    code = ("from oocgnn import memcap; cap = memcap.MemoryCap(32 * 2**20).__enter__(); "
            "assert cap.enforced, cap.reason; print(cap.path)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip()
    assert path and not os.path.exists(path)


def test_no_controller(monkeypatch):
    monkeypatch.setattr(memcap, "_locate", lambda: (None, None, "no memory controller"))
    with memcap.MemoryCap(64 * MiB) as cap:
        pass
    assert not cap.enforced and cap.reason == "no memory controller"
