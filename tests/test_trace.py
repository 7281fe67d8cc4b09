"""Traces: CSR invariants, page counts, unions, save/load round trips, the parameter-keyed cache."""
import numpy as np
import pytest

from oocgnn.errors import UserError
from oocgnn.io import PAGE
from oocgnn.trace import Trace, cached_trace, count_pages, record_trace, synthetic_trace, trace_key


def _batches(seed=0, n=50, t=12):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, rng.integers(0, 20)) for _ in range(t)]   # duplicates, empty ones


def test_from_batches_is_unique_sorted_csr():
    b = _batches()
    tr = Trace.from_batches(b, 50, params={"a": 1})
    assert len(tr) == len(b) and tr.offsets[0] == 0 and tr.offsets[-1] == len(tr.ids) == tr.accesses
    assert tr.ids.dtype == np.int32
    for i, ids in enumerate(tr.iterations()):
        assert np.array_equal(ids, np.unique(b[i]))
    assert np.array_equal(tr[-1], np.unique(b[-1]))
    assert np.array_equal(tr.counts(), np.bincount(np.concatenate([np.unique(x) for x in b]), minlength=50))
    assert np.array_equal(tr.sizes(), [len(np.unique(x)) for x in b])
    with pytest.raises(UserError):
        Trace.from_batches([[0, 50]], 50)
    with pytest.raises(UserError):
        Trace([0, 3, 2], [1, 2, 3], 5)


@pytest.mark.parametrize("stride,rbytes", [(64, 64), (512, 512), (512, 300), (4096, 4096), (8192, 5000), (3072, 3072)])
def test_pages_match_brute_force(stride, rbytes):
    tr = Trace.from_batches(_batches(1, n=200), 200, row_stride=stride, row_bytes=rbytes)
    for i, ids in enumerate(tr.iterations()):
        want = {p for v in ids for p in range(v * stride // PAGE, (v * stride + rbytes - 1) // PAGE + 1)}
        assert tr.pages()[i] == len(want)
        assert count_pages(ids[::-1], stride, rbytes) == len(want)


@pytest.mark.parametrize("k", [1, 2, 5, 12, 100])
def test_coarsen_is_union_of_k_iterations(k):
    tr = Trace.from_batches(_batches(2), 50)
    mb = tr.coarsen(k)
    assert len(mb) == -(-len(tr) // k) and mb.params["macrobatch"] == k
    for j, ids in enumerate(mb.iterations()):
        want = np.unique(np.concatenate([tr[i] for i in range(j * k, min(len(tr), (j + 1) * k))]))
        assert np.array_equal(ids, want)
    with pytest.raises(UserError):
        tr.coarsen(0)


def test_slice_and_streams():
    b = _batches(3)
    tr = Trace.from_batches(b, 50, neighbours=[x[:3] for x in b])
    s = tr.slice(3, 7)
    assert len(s) == 4 and all(np.array_equal(s[i], tr[3 + i]) for i in range(4))
    nb = tr.stream("neighbours")
    assert len(nb) == len(tr) and np.array_equal(nb[5], np.unique(b[5][:3]))
    assert tr.stream("features") is tr
    with pytest.raises(UserError):
        Trace.from_batches(b, 50).stream("neighbours")


def test_relabel_keeps_the_accesses_and_changes_the_layout():
    b = _batches(5, n=300, t=9)
    tr = Trace.from_batches(b, 300, params={"a": 1}, row_stride=512, neighbours=[x[:4] for x in b])
    perm = np.random.default_rng(0).permutation(300)
    r = tr.relabel(perm)
    assert r.params == {"a": 1, "relabelled": True} and (r.row_stride, r.row_bytes) == (512, 512)
    for i in range(len(tr)):
        assert np.array_equal(r[i], np.sort(perm[tr[i]]))
        assert np.array_equal(r.stream("neighbours")[i], np.sort(perm[tr.stream("neighbours")[i]]))
    assert np.array_equal(r.relabel(np.argsort(perm)).ids, tr.ids)
    assert np.array_equal(tr.relabel(np.arange(300)).pages(), tr.pages())
    assert tr.relabel(np.arange(300), row_stride=4096).row_bytes == 4096
    with pytest.raises(UserError):
        tr.relabel(perm[:-1])


@pytest.mark.parametrize("fmt", ["x.npz", "x_dir"])
def test_save_load_round_trip(tmp_path, fmt):
    b = _batches(4)
    tr = Trace.from_batches(b, 50, params={"seed": 4, "fanouts": [10, 5]}, row_stride=1024, row_bytes=800,
                            neighbours=b[::-1])
    tr.save(tmp_path / fmt)
    back = Trace.load(tmp_path / fmt)
    assert (back.num_nodes, back.params, back.row_stride, back.row_bytes) == (50, tr.params, 1024, 800)
    assert np.array_equal(back.offsets, tr.offsets) and np.array_equal(back.ids, tr.ids)
    assert back.ids.dtype == tr.ids.dtype
    for name in ("features", "neighbours"):
        a, c = tr.stream(name), back.stream(name)
        assert all(np.array_equal(a[i], c[i]) for i in range(len(a)))
    with pytest.raises(UserError):
        Trace.load(tmp_path / "missing")


@pytest.mark.parametrize("fmt", ["npz", "dir"])
def test_cached_trace_builds_once_per_key(tmp_path, fmt):
    calls = []

    def build(seed):
        calls.append(seed)
        return synthetic_trace(100, 6, 10, seed=seed)
    a = cached_trace({"name": "z", "seed": 1}, tmp_path, lambda: build(1), fmt=fmt)
    b = cached_trace({"seed": 1, "name": "z"}, tmp_path, lambda: build(1), fmt=fmt)   # same key, any order
    c = cached_trace({"name": "z", "seed": 2}, tmp_path, lambda: build(2), fmt=fmt)
    assert calls == [1, 2] and not a.cached and b.cached and not c.cached
    assert np.array_equal(a.ids, b.ids) and not np.array_equal(a.ids, c.ids)
    assert b.params == {"name": "z", "seed": 1} and len(list(tmp_path.iterdir())) == 2
    assert any(trace_key({"name": "z", "seed": 1}) in p.name for p in tmp_path.iterdir())
    cached_trace({"name": "z", "seed": 1}, False, lambda: build(1))
    assert calls == [1, 2, 1]


def test_synthetic_trace_is_seeded_and_skewed():
    a, b = synthetic_trace(1000, 20, 50, alpha=1.0, seed=3), synthetic_trace(1000, 20, 50, alpha=1.0, seed=3)
    assert np.array_equal(a.ids, b.ids) and np.all(a.sizes() == 50)
    assert all(np.all(np.diff(ids) > 0) for ids in a.iterations())
    counts = np.sort(a.counts())[::-1]
    assert counts[:10].sum() > 5 * counts[500:510].sum()      # popular ids recur
    assert not np.array_equal(a.ids, synthetic_trace(1000, 20, 50, alpha=1.0, seed=4).ids)


RECORDED = {"random": {"batch_size": 64}, "partition": {"batch_size": 64, "n_per_macro": 3},
            "megabatch": {"batch_size": 64, "parts_per_megabatch": 4, "static_ratio": 0.01}}


@pytest.mark.parametrize("name", list(RECORDED))
def test_record_trace_matches_simulate_and_is_cached(parted, tmp_path, name):
    """Per-iteration sizes equal simulate's input_nodes / neighbour_lists_needed (same seed, two
    epochs); the ids are the sampled ones; the second call loads the file; other keys rebuild."""
    from oocgnn.sampler import Sampler
    from oocgnn.schedules import make_schedule
    from oocgnn.simulate import simulate
    kw = RECORDED[name]
    tr = record_trace(parted, name, [4, 3], epochs=2, seed=5, cache_dir=tmp_path, **kw)
    df = simulate(parted, name, [4, 3], epochs=2, seed=5, progress=False, **kw)
    assert not tr.cached and len(tr) == len(df) and tr.num_nodes == parted.num_nodes
    assert np.array_equal(tr.sizes(), df["input_nodes"]) and np.array_equal(tr.sizes(), df["feature_rows_needed"])
    assert np.array_equal(tr.stream("neighbours").sizes(), df["neighbour_lists_needed"])
    assert (tr.row_stride, tr.row_bytes) == (parted.row_stride, parted.row_bytes)
    steps = list(make_schedule(name, parted, seed=5, **kw).epoch(1))
    j = len(steps) // 2                                            # batch j of epoch 1 ...
    i = len(tr) - len(steps) + j                                   # ... is iteration i
    blocks = Sampler(parted.neighbour_lists(), [4, 3], 5).sample(steps[j].seeds, 1, j, steps[j].visible).blocks
    assert np.array_equal(tr[i], np.unique(blocks[0].src_nodes))
    assert np.array_equal(tr.stream("neighbours")[i], np.unique(blocks[0].dst_nodes))
    again = record_trace(parted, name, [4, 3], epochs=2, seed=5, cache_dir=tmp_path, **kw)
    assert again.cached and np.array_equal(again.ids, tr.ids) and again.params == tr.params
    assert np.array_equal(again.stream("neighbours").ids, tr.stream("neighbours").ids)
    assert again.params["schedule"] == repr(make_schedule(name, parted, seed=5, **kw))
    assert len(list(tmp_path.iterdir())) == 1
    other = record_trace(parted, name, [4, 3], epochs=2, seed=6, cache_dir=tmp_path, **kw)
    fan = record_trace(parted, name, [4, 2], epochs=2, seed=5, cache_dir=tmp_path, **kw)
    assert not other.cached and not fan.cached and len(list(tmp_path.iterdir())) == 3
    assert not np.array_equal(other.ids, tr.ids) and fan.accesses < tr.accesses


def test_record_trace_takes_a_schedule_object(parted, tmp_path):
    from oocgnn.schedules import make_schedule
    sched = make_schedule("partition", parted, seed=2, **RECORDED["partition"])
    a = record_trace(parted, sched, [3], seed=2, cache_dir=tmp_path)
    b = record_trace(parted, "partition", [3], seed=2, cache_dir=tmp_path, **RECORDED["partition"])
    assert b.cached and np.array_equal(a.ids, b.ids)
    assert record_trace(parted, sched, [3], seed=2, cache_dir=False).cached is False
    with pytest.raises(UserError):
        record_trace(parted, sched, [3], cache_dir=False, batch_size=8)
    d = record_trace(parted, sched, [3], seed=2, cache_dir=tmp_path, fmt="dir")   # memory-mapped form
    assert not d.cached and np.array_equal(d.ids, a.ids)
    assert record_trace(parted, sched, [3], seed=2, cache_dir=tmp_path, fmt="dir").cached


def test_summary_and_superbatch_bytes_count_the_trace(fennel16):
    """A recorded trace's summary and its largest superbatch, against counts made by hand."""
    tr = record_trace(fennel16, "random", [5, 5], seed=0, cache_dir=False, batch_size=64)
    nb = tr.stream("neighbours")
    s = tr.summary()
    assert s["iterations"] == len(tr) and s["feature_rows"] == len(tr.ids) == tr.accesses
    assert s["unique_rows"] == len(set(tr.ids.tolist())) and s["neighbour_lists"] == len(nb.ids)
    assert s["rows_per_list"] == len(tr.ids) / len(nb.ids)
    per = [sum(len(tr[j]) + len(nb[j]) for j in range(i, min(i + 3, len(tr)))) * 4 for i in range(0, len(tr), 3)]
    assert tr.superbatch_bytes(3) == max(per)
