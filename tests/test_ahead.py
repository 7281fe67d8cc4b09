"""Sample ahead, then fetch (Ginex superbatches, BatchGNN macrobatches) against their oracles: Belady's
changesets on the same trace, the macrobatch trace replay, the in-memory run's training, the samples'
bound and the budget."""
import threading

import numpy as np
import pytest

from oocgnn.ahead import BeladyFetch, chunks, sample_bound, sample_nbytes
from oocgnn.belady import belady_changesets, belady_naive, changeset_hits
from oocgnn.config import TrainConfig
from oocgnn.errors import UserError
from oocgnn.macrobatch import macrobatch_fetch
from oocgnn.policies import make_plan
from oocgnn.sampler import Sampler
from oocgnn.simulate import simulate
from oocgnn.trace import Trace, record_trace
from oocgnn.train import train


def _cfg(store, tmp_path, **kw):
    kw = {"epochs": 2, "batch_size": 128, "max_eval_nodes": 100, "progress": False,
          "out": str(tmp_path / kw.get("policy", "run")), "memory_budget": "4MB", **kw}
    return TrainConfig.create(store=str(store.path), **kw)


def _chunks(store, plan, epochs=1):
    sampler = Sampler(store.neighbour_lists(), plan.fanouts, plan.seed, plan.dense)
    return list(chunks(plan, ((i, e, b, s) for i, (e, b, s) in enumerate(plan.steps(epochs))), sampler.sample))


@pytest.mark.parametrize("sampler", ["per-hop", "dense"])
@pytest.mark.parametrize("fanouts", ["10,10", "3,5,2", "-1,4", "2,3,9"])
def test_samples_stay_within_the_planned_bound(fennel16, tmp_path, fanouts, sampler):
    """Every sampled batch's input rows and bytes are within `sample_bound`, so a chunk's samples are
    within what the plan counts for them (DENSE's reused draws included)."""
    cfg = _cfg(fennel16, tmp_path, policy="ginex", fanouts=fanouts, superbatch=3, memory_budget="64MB",
               sampler=sampler)
    plan = make_plan(fennel16, cfg)
    rows, nbytes = sample_bound(cfg.batch_size, plan.fanouts, fennel16.num_nodes, fennel16.num_edges, plan.dense)
    for items, _ in _chunks(fennel16, plan):
        assert len(items) <= 3 and len({(it[1], it[2] // 3) for it in items}) == 1, "one chunk, one epoch"
        assert all(len(it[4].input_nodes) <= rows for it in items)
        assert sample_nbytes(items) <= len(items) * nbytes
        assert 2 * sample_nbytes(items) <= plan.memory()["samples"]


@pytest.mark.parametrize("capacity", [0, 50, 700, 5000])
def test_belady_fetch_is_ginex_changesets_of_the_superbatch(fennel16, tmp_path, capacity):
    """A superbatch's fetch (computed over its own ids) is Belady's changesets of its trace in store
    ids: the same init and changes, the protocol holds, and the hits are the exhaustive oracle's."""
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="ginex", superbatch=6, memory_budget="64MB"))
    for items, _ in _chunks(fennel16, plan)[:2]:
        inputs = [it[4].input_nodes for it in items]
        fetch = BeladyFetch(capacity)(inputs)
        trace = Trace.from_batches(inputs, fennel16.num_nodes)
        init, sets = belady_changesets(trace, capacity)
        np.testing.assert_array_equal(fetch.resident, init)
        for (a, o, p), (a2, o2, p2) in zip(fetch.changes, sets, strict=True):
            for x, y in ((a, a2), (o, o2), (p, p2)):
                np.testing.assert_array_equal(x, y)
        hits = changeset_hits(trace, fetch.resident, fetch.changes, capacity)
        oracle = changeset_hits(trace, *belady_naive(trace, capacity), capacity)
        assert hits.sum() == oracle.sum()


@pytest.mark.parametrize("policy, kw", [("ginex", {"superbatch": 4, "memory_budget": "3MB"}),
                                        ("macrobatch", {"macrobatch": 3, "memory_budget": "8MB",
                                                        "static_cache": True, "topology": "disk"})])
def test_sampling_ahead_changes_time_not_training(fennel16, tmp_path, policy, kw):
    """Ginex §3.1: only the order of independent work changes, so the losses and accuracies are those of
    the in-memory run of the same seed, to the bit, while rows are read from disk."""
    ahead = train(_cfg(fennel16, tmp_path / "a", policy=policy, eval_every=7, **kw))
    base = train(_cfg(fennel16, tmp_path / "b", policy="inmemory", eval_every=7))
    cols = ["step", "train_loss", "val_acc", "test_acc"]
    assert ahead["log"][cols].equals(base["log"][cols])
    assert ahead["io"]["rows"] > 0 and ahead["stage_s"]["bg_sample"] > 0


def test_macrobatch_fetches_the_trace_replays_union(fennel16, tmp_path):
    """The rows a macrobatch run reads equal `macrobatch_fetch`'s count on the trace of the same batches
    (BatchGNN's fetched rows), for k = 1 (every batch's rows) and larger k, which read fewer."""
    trace = None
    fetched = {}
    for k in (1, 2, 5):
        cfg = _cfg(fennel16, tmp_path, policy="macrobatch", macrobatch=k, epochs=1, memory_budget="16MB")
        plan = make_plan(fennel16, cfg)
        if trace is None:
            trace = record_trace(fennel16, plan.schedule, plan.fanouts, seed=plan.seed, cache_dir=False)
        df = simulate(fennel16, plan, progress=False)
        fetched[k] = int(df["load_feature_rows"].sum())
        assert fetched[k] == int(macrobatch_fetch(trace, [k])["fetched_rows"].iloc[0])
        assert df["feature_rows_read"].sum() == 0, "every batch gathers from its macrobatch's union"
    assert fetched[1] == trace.accesses and fetched[5] < fetched[2] < fetched[1]


def test_a_superbatch_that_does_not_fit_says_what_would(fennel16, tmp_path):
    with pytest.raises(UserError, match=r"--superbatch 64 needs .* --superbatch (\d+) would fit") as e:
        make_plan(fennel16, _cfg(fennel16, tmp_path, policy="ginex", superbatch=64, memory_budget="5MB"))
    fits = int(str(e.value).rsplit("--superbatch ", 1)[1].split()[0])
    assert make_plan(fennel16, _cfg(fennel16, tmp_path, policy="ginex", superbatch=fits, memory_budget="5MB"))
    with pytest.raises(UserError, match=r"no macrobatch fits: --memory-budget .* would hold one of 1"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, policy="macrobatch", macrobatch=4, memory_budget="100KB"))
    for bad in ({"superbatch": -1}, {"macrobatch": -1}):
        with pytest.raises(UserError, match="must be >= 1"):
            _cfg(fennel16, tmp_path, **bad)


@pytest.mark.parametrize("policy, flag, default, budget", [("ginex", "superbatch", 16, "3MB"),
                                                            ("macrobatch", "macrobatch", 4, "6MB")])
def test_the_default_chunk_size_is_what_the_budget_holds(fennel16, tmp_path, policy, flag, default, budget):
    """Left at 0 (the default), S and k are their papers' defaults where those fit, else the largest halving
    that does: the size a refused explicit setting names, and the plan reports it; a resumed run's
    config.json holds 0 and fits the same size again."""
    roomy = make_plan(fennel16, _cfg(fennel16, tmp_path, policy=policy, memory_budget="64MB"))
    assert roomy.lookahead == default and roomy.describe() == {flag: default}
    tight = _cfg(fennel16, tmp_path, policy=policy, memory_budget=budget)
    assert tight.get(flag) == 0
    with pytest.raises(UserError, match=rf"--{flag} {default} needs .* --{flag} (\d+) would fit") as e:
        make_plan(fennel16, tight.replace(**{flag: default}))
    fits = int(str(e.value).rsplit(f"--{flag} ", 1)[1].split()[0])
    plan = make_plan(fennel16, tight)
    assert 1 <= fits < default and plan.lookahead == fits and plan.describe() == {flag: fits}
    assert plan.resident_bytes() <= plan.budget
    again = TrainConfig.create(**tight.to_dict())
    assert make_plan(fennel16, again).lookahead == fits


def test_composeds_default_superbatch_leaves_most_of_the_budget_to_its_mega_batches(fennel16, tmp_path):
    """composed at --superbatch 0: 16 where two chunks' samples take at most a quarter of the budget, else
    the largest halving that does (cora's given split at a third of its features was refused at 16: its
    samples alone took 5.5 of its 7.1 MiB)."""
    roomy = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="composed", memory_budget="256MB"))
    assert roomy.lookahead == 16
    cfg = _cfg(fennel16, tmp_path, policy="composed", memory_budget="12MB")
    plan = make_plan(fennel16, cfg)
    assert 1 <= plan.lookahead < 16 and plan.samples_bytes() <= plan.budget // 4 < plan.samples_bytes(2 * plan.lookahead)
    assert plan.describe()["composed"]["belady"]["superbatch"] == plan.lookahead


def test_an_interrupted_run_stops_its_sampling_thread(fennel16, tmp_path, kill_at):
    kill_at(5)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(fennel16, tmp_path, policy="ginex", superbatch=2, memory_budget="3MB"))
    assert not [t for t in threading.enumerate() if t.name == "oocgnn-ahead"]


def test_union_buffers_sized_by_the_largest_union(fennel16, tmp_path):
    """--union-rows sizes the two buffers below the bound: the largest union `simulate` finds runs (and
    reads what the bound's run reads); one row less stops the simulation and the run with what to do."""
    cfg = _cfg(fennel16, tmp_path, policy="macrobatch", macrobatch=2, memory_budget="16MB", epochs=1)
    df = simulate(fennel16, make_plan(fennel16, cfg), progress=False)
    largest = int(df["load_feature_rows"].max())
    assert largest < make_plan(fennel16, cfg).group_rows()
    tight = cfg.replace(union_rows=largest)
    assert make_plan(fennel16, tight).memory()["feature_rows"] == 2 * largest * fennel16.row_bytes
    assert train(tight)["io"]["rows"] == df["load_feature_rows"].sum()
    short = cfg.replace(union_rows=largest - 1, out=str(tmp_path / "short"))
    with pytest.raises(UserError, match="raise --union-rows"):
        simulate(fennel16, make_plan(fennel16, short), progress=False)
    with pytest.raises(UserError, match="raise --union-rows"):
        train(short)


@pytest.mark.parametrize("kw", [{"policy": "ginex", "superbatch": 4, "memory_budget": "3MB"},
                                {"policy": "composed", "parts_per_megabatch": 4, "superbatch": 4, "memory_budget": "5MB",
                                 "history_ratio": 0.2, "staleness": 5},
                                {"policy": "packed", "memory_budget": "8MB", "hot_share": 0.5}],
                         ids=["ginex", "composed", "packed"])
def test_a_killed_sample_ahead_run_resumes_to_the_same_losses(fennel16, tmp_path, kill_at, kw):
    """Resumed mid-superbatch, the run samples the rest of that superbatch ahead again (its cache starts
    cold, so it may read more) and trains to the same losses and accuracies (composed: with its
    mega-batch reloaded and its histories restored)."""
    kw = {**kw, "checkpoint_every": 3}
    whole = train(_cfg(fennel16, tmp_path, out=str(tmp_path / "whole"), **kw))
    kill_at(5)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(fennel16, tmp_path, out=str(tmp_path / "killed"), **kw))
    kill_at(None)
    resumed = train(TrainConfig.create(store=str(fennel16.path), resume=str(tmp_path / "killed"), progress=False))
    assert resumed["resumed_at"] == 3
    cols = ["epoch", "step", "train_loss", "val_acc", "test_acc"]
    assert resumed["log"][cols].equals(whole["log"][cols])


def test_composed_chunks_stay_in_a_megabatch_and_fetch_only_outside_it(fennel16, tmp_path):
    """Composed: a chunk never spans two mega-batches, and its Belady cache holds and admits only rows
    outside the mega-batch ∪ static set, at positions of each batch's sorted input rows."""
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path, policy="composed", parts_per_megabatch=4, superbatch=5,
                                    static_ratio=0.05, history_ratio=0.0, memory_budget="5MB"))
    assert 0 < plan.cache_rows < fennel16.num_nodes
    groups = {}
    for items, fetch in _chunks(fennel16, plan, epochs=2):
        epoch, group = items[0][1], items[0][3].group
        assert len({(it[1], it[3].group, it[2] // 5) for it in items}) == 1, "one chunk, one mega-batch"
        groups[epoch, group] = groups.get((epoch, group), 0) + 1
        inside = plan.schedule._static_mask.copy()
        for lo, hi in plan.schedule.groups(epoch)[group][0]:
            inside[lo:hi] = True
        assert not inside[fetch.resident].any()
        for it, (admit, evict, pos) in zip(items, fetch.changes, strict=True):
            assert not inside[admit].any()
            np.testing.assert_array_equal(np.sort(it[4].input_nodes)[pos], admit)
    assert max(groups.values()) > 1, "mega-batches of several chunks"


def test_composed_budget_error_says_what_to_change(fennel16, tmp_path):
    """It names the knobs that would shrink the fixed memory, and not those already at their least (no static
    set at this budget, a mega-batch of one part, one buffer)."""
    with pytest.raises(UserError, match="lower --parts-per-megabatch, lower --history-ratio, use --no-pipeline "
                                        r"\(one buffer\), or raise --memory-budget"):
        make_plan(fennel16, _cfg(fennel16, tmp_path, policy="composed", parts_per_megabatch=8, memory_budget="1MB"))
    with pytest.raises(UserError) as e:
        make_plan(fennel16, _cfg(fennel16, tmp_path, policy="composed", parts_per_megabatch=1, pipeline=False,
                                 memory_budget="1MB"))
    assert "--parts-per-megabatch" not in str(e.value) and "--no-pipeline" not in str(e.value)
    assert "static set 0 B" in str(e.value) and "--static-ratio" not in str(e.value)
    assert str(e.value).endswith("; lower --history-ratio or raise --memory-budget")


def test_shared_settings_set_every_policy_that_has_them(fennel16):
    """One flag, one meaning: composed's mega-batch, superbatch and history settings are its parts'."""
    cfg = TrainConfig.create(store=str(fennel16.path), policy="composed", passes=3.0, superbatch=7, staleness=9)
    assert cfg.hierbatching.passes == cfg.composed.passes == cfg.get("passes") == 3.0
    assert cfg.ginex.superbatch == cfg.composed.superbatch == 7 and cfg.outre.staleness == cfg.composed.staleness == 9
    with pytest.raises(UserError, match="staleness must be >= 1"):
        TrainConfig.create(store=str(fennel16.path), policy="composed", staleness=0)


@pytest.mark.parametrize("policy", ["outre", "composed"])
def test_auto_staleness_is_the_papers_share_of_an_epoch(fennel16, policy):
    """--staleness auto (the default): OUTRE's 100 iterations are 1/15 of papers100M's epoch; here that share of
    the plan's own optimizer steps an epoch (counted from its step stream), at least 1 and at most 100; a given
    number is kept; anything but a whole number >= 1 or auto is refused."""
    from oocgnn.policies import make_plan
    from oocgnn.policies.base import PAPER_STEPS_PER_EPOCH, STALENESS
    for batch in (8, 16, 64):                                 # 500 training nodes: 63, 32 and 8 steps an epoch
        cfg = TrainConfig.create(store=str(fennel16.path), policy=policy, memory_budget="64MB", batch_size=batch,
                                 accumulate="off", history_ratio=0.1)
        plan = make_plan(fennel16, cfg)
        per_epoch = len({step.update for e, _, step in plan.steps(1)})
        assert per_epoch == sum(1 for _ in plan.schedule.steps(1))
        want = max(1, min(STALENESS, round(per_epoch * STALENESS / PAPER_STEPS_PER_EPOCH)))
        assert cfg.get("staleness") == "auto" and plan.staleness == plan.history.staleness == want
        assert want == {"outre": {8: 4, 16: 2, 64: 1}, "composed": {8: 8, 16: 4, 64: 1}}[policy][batch]  # (2 passes)
        assert make_plan(fennel16, cfg.replace(staleness=100)).history.staleness == 100
    for bad in ("0", "soon", "1.5"):
        with pytest.raises(UserError, match="staleness"):
            TrainConfig.create(store=str(fennel16.path), policy=policy, staleness=bad)


def test_the_sample_bound_uses_the_batches_real_size(fennel16):
    """500 training nodes: a batch of 1024 is one of 500, and the samples held are bounded for 500 seeds."""
    from oocgnn.policies import make_plan
    plans = [make_plan(fennel16, TrainConfig.create(store=str(fennel16.path), policy="macrobatch", memory_budget="64MB",
                                                    batch_size=b)) for b in (500, 1024)]
    assert len(fennel16.train_idx) == 500 and plans[0].samples_bytes() == plans[1].samples_bytes()
