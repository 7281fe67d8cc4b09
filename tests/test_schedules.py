"""Schedules: one contract over every policy, plus each policy's own guarantees."""
import numpy as np
import pytest

from oocgnn.errors import UserError
from oocgnn.schedules import SCHEDULES, Step, make_schedule

PARAMS = {"random": {"batch_size": 64},
          "partition": {"batch_size": 64, "n_per_macro": 3},
          "megabatch": {"batch_size": 64, "parts_per_megabatch": 4, "static_ratio": 0.02},
          "buffer": {"batch_size": 64, "physical_parts": 8, "buffer_parts": 4}}


def _steps(store, name, epoch=0, **kw):
    return list(make_schedule(name, store, **{**PARAMS[name], **kw}).epoch(epoch))


def _part_of(store, ids):
    return np.searchsorted(store.part_offsets, ids, side="right") - 1


def test_registry():
    assert set(SCHEDULES) == {"random", "partition", "megabatch", "buffer"}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_training_node_once_per_epoch(parted, name):
    for epoch in (0, 1):
        steps = _steps(parted, name, epoch)
        assert all(isinstance(s, Step) and s.seeds.dtype == np.int64 for s in steps)
        assert all(0 < len(s.seeds) <= 64 for s in steps)
        seen = np.sort(np.concatenate([s.seeds for s in steps]))
        np.testing.assert_array_equal(seen, parted.train_idx)   # each exactly once (p = 1)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_deterministic_per_seed_and_epoch(parted, name):
    def key(steps):
        return [(s.seeds.tolist(), s.group, s.enter_ranges, s.leave_ranges, s.enter_ids.tolist(),
                 None if s.visible is None else s.visible.tolist()) for s in steps]
    a, b = _steps(parted, name, 1, seed=3), _steps(parted, name, 1, seed=3)
    assert key(a) == key(b)
    assert key(a) != key(_steps(parted, name, 1, seed=4))
    assert key(a) != key(_steps(parted, name, 2, seed=3))


@pytest.mark.parametrize("name", ["partition", "megabatch"])
def test_groups_are_parts_and_residency_chains(parted, name):
    """A group's seeds lie in the ranges that entered with it; each group evicts the previous one."""
    n_group = PARAMS[name].get("n_per_macro") or PARAMS[name]["parts_per_megabatch"]
    resident = []
    for epoch in (0, 1):
        groups = {}
        for s in _steps(parted, name, epoch):
            if s.enter_ranges:
                assert s.leave_ranges == resident
                resident = s.enter_ranges
                assert all(lo < hi for lo, hi in resident)
                assert all(a[1] < b[0] for a, b in zip(resident, resident[1:])), "merged, sorted"
            groups.setdefault(s.group, []).append(s)
            ids = np.concatenate([np.arange(lo, hi) for lo, hi in resident])
            assert np.isin(s.seeds, ids).all()
        assert sorted(groups) == list(range(len(groups)))
        for steps in groups.values():
            assert steps[0].enter_ranges and not any(s.enter_ranges for s in steps[1:])
            parts = np.unique(_part_of(parted, np.concatenate([np.arange(lo, hi)
                                                               for lo, hi in steps[0].enter_ranges])))
            assert len(parts) <= n_group
    assert _steps(parted, "random")[0].enter_ranges == []


def test_partition_keeps_adjacency_and_samples_everywhere(parted):
    steps = _steps(parted, "partition")
    assert all(s.visible is None and s.data == ("adjacency",) for s in steps)
    assert all(len(s.enter_ids) == 0 for s in steps)


@pytest.mark.parametrize("passes,times", [(2, 2), (3.0, 3)])
def test_megabatch_passes_visit_each_training_node_p_times(parted, passes, times):
    seen = np.concatenate([s.seeds for s in _steps(parted, "megabatch", passes=passes)])
    counts = np.bincount(seen, minlength=parted.num_nodes)
    assert (counts[parted.train_idx] == times).all() and counts.sum() == times * len(parted.train_idx)


def test_megabatch_fractional_passes(parted):
    steps = _steps(parted, "megabatch", passes=1.5)
    counts = np.bincount(np.concatenate([s.seeds for s in steps]), minlength=parted.num_nodes)
    assert set(np.unique(counts[parted.train_idx])) == {1, 2}
    per_group = {}
    for s in steps:
        per_group.setdefault(s.group, []).append(s.seeds)
    expected = sum(len(np.unique(np.concatenate(v))) + round(0.5 * len(np.unique(np.concatenate(v))))
                   for v in per_group.values())
    assert counts.sum() == expected


@pytest.mark.parametrize("scope", ["adjacent", "all"])
def test_megabatch_static_cache_and_visible(parted, scope):
    sch = make_schedule("megabatch", parted, **{**PARAMS["megabatch"], "static_scope": scope})
    deg = parted.degrees()
    k = int(0.02 * parted.num_nodes)
    static = sch.static_ids
    assert len(static) == k and deg[static].min() >= np.sort(deg)[-k]
    setup = sch.setup()                       # the static cache: features and adjacency, all run
    np.testing.assert_array_equal(setup.enter_ids, static)
    assert set(setup.data) == {"features", "adjacency"} and not setup.enter_ranges and not len(setup.seeds)
    for epoch in (0, 1):
        steps = list(sch.epoch(epoch))
        assert all(len(s.enter_ids) == 0 and len(s.leave_ids) == 0 for s in steps), "static ids never move"
        for s in steps:
            if not s.enter_ranges:
                continue
            group = np.concatenate([np.arange(lo, hi) for lo, hi in s.enter_ranges])
            nbrs = np.concatenate([parted.indices[parted.indptr[v]:parted.indptr[v + 1]] for v in group])
            want = static if scope == "all" else np.intersect1d(static, nbrs)
            np.testing.assert_array_equal(s.visible, np.union1d(group, want))


@pytest.mark.parametrize("name,kw", [("nope", {}), ("random", {"batch_size": 0}),
                                     ("partition", {"n_per_macro": 0}),
                                     ("megabatch", {"passes": 0}), ("megabatch", {"static_scope": "x"}),
                                     ("megabatch", {"static_ratio": 2})])
def test_bad_parameters(parted, name, kw):
    with pytest.raises(UserError):
        make_schedule(name, parted, **kw)


def test_megabatch_visible_keeps_one_copy_of_the_topology(tiny_data, tmp_path):
    """Sampling graph and static adjacency share DGL's CSC: the store's indices are not cached too."""
    from oocgnn.storewrite import write_store
    store = write_store(tiny_data, tmp_path / "s", part_offsets=np.linspace(0, tiny_data.num_nodes, 9).astype(int),
                        progress=False)
    steps = list(make_schedule("megabatch", store, **PARAMS["megabatch"]).epoch(0))
    assert any(s.visible is not None and len(s.visible) for s in steps)
    assert "indices" not in vars(store), "an int32 copy of indices.bin would stay beside the int64 graph"
