"""Label-balanced optimizer steps (`oocgnn.optsteps`): the counting rule, the weights, the gradient of an
accumulated step against one batch's (full neighbourhoods: the same computation), runs where accumulating
changes nothing, a run killed inside an accumulated step, and the simulator's history hits."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oocgnn.config import TrainConfig
from oocgnn.optsteps import StepCounter, accumulates, closes_and_weights, step_target
from oocgnn.train import train


def test_a_step_closes_at_its_target_at_a_full_batch_and_at_the_epoch_end():
    count = StepCounter(100, on=True)
    got = [count(e, n) for e, n in [(0, 30), (0, 30), (0, 30), (0, 30), (0, 30), (0, 120), (0, 10), (1, 30), (1, 80)]]
    #                                 step 0: 30+30+30+30 >= 100   step 1   full: alone  step 3  new epoch: step 4
    assert got == [0, 0, 0, 0, 1, 2, 3, 4, 4]
    off = StepCounter(100, on=False)
    assert [off(0, 30) for _ in range(4)] == [0, 1, 2, 3]
    assert step_target(1024, 200) == 200 and step_target(64, 500) == 64
    assert accumulates("auto", [20, 30], 200) and not accumulates("auto", [300, 300], 200)
    assert not accumulates("auto", [50], 200) and accumulates("on", [], 200) and not accumulates("off", [1], 200)


def test_closes_and_weights_one_process_and_ranks():
    close, w = closes_and_weights([0, 0, 0, 1, 1], [10, 20, 30, 5, 5], lambda x: x)
    assert close == [False, False, True, False, True]
    np.testing.assert_allclose(w, [10 / 60, 20 / 60, 30 / 60, 0.5, 0.5])
    # a rank padded (None) steps where any rank does; its weights are its share in each joint step
    other = [0.0, 1.0, 0.0, 0.0, 1.0]                   # the other rank closes after slots 1 and 4
    close, w = closes_and_weights([0, 0, 0, None, None], [10, 20, 30, 0, 0], lambda x: [max(a, b) for a, b in zip(x, other)])
    assert close == [False, True, True, False, True]
    np.testing.assert_allclose(w[:3], [1 / 3, 2 / 3, 1.0])
    assert closes_and_weights([], [], lambda x: x) == ([], [])


def test_an_accumulated_step_has_the_gradient_of_one_batch(tiny_store):
    """Full neighbourhoods (fanouts -1: nothing random) and no dropout: the mini-batches' losses weighted by
    their share give the gradient of the mean loss over all their seeds, as one batch of them does."""
    from oocgnn.models import build_model
    from oocgnn.sampler import Sampler
    sampler = Sampler(tiny_store.neighbour_lists(), [-1, -1], seed=0)
    x = torch.from_numpy(np.asarray(tiny_store.reader("memory").read_range(0, tiny_store.num_nodes)))
    y = torch.from_numpy(np.asarray(tiny_store.labels, dtype=np.int64))
    seeds = np.asarray(tiny_store.train_idx[:90], dtype=np.int64)

    def grads(batches, weights):
        torch.manual_seed(0)
        model = build_model("sage", tiny_store.feat_dim, 16, tiny_store.num_classes, 2, dropout=0.0)
        for k, (b, w) in enumerate(zip(batches, weights)):
            s = sampler.sample(b, 0, k)
            loss = F.cross_entropy(model(s.blocks, x[torch.from_numpy(s.input_nodes)]), y[torch.from_numpy(s.output_nodes)])
            (loss * w).backward()
        return [p.grad.clone() for p in model.parameters()]

    parts = [seeds[:20], seeds[20:50], seeds[50:]]
    _, w = closes_and_weights([0, 0, 0], [len(p) for p in parts], lambda v: v)
    for a, b in zip(grads([seeds], [1.0]), grads(parts, w)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _cfg(store, out, **kw):
    base = dict(store=str(store.path), policy="hierbatching", epochs=2, dropout=0.0, memory_budget="4MB", accumulate="auto",
                static_ratio=0.0, passes=1.0, max_eval_nodes=100, progress=False, out=str(out), seed=3)
    return TrainConfig.create(**{**base, **kw})


@pytest.mark.parametrize("kw", [{"parts_per_megabatch": 16, "batch_size": 96, "memory_budget": "8MB"},  # one group
                                {"parts_per_megabatch": 8, "batch_size": 64}])    # groups of >= a batch
def test_accumulating_changes_nothing_where_groups_hold_a_batch(fennel16, tmp_path, kw):
    on = train(_cfg(fennel16, tmp_path / "on", accumulate="on", **kw))
    off = train(_cfg(fennel16, tmp_path / "off", accumulate="off", **kw))
    assert on["optimizer_steps"]["accumulate"] and not off["optimizer_steps"]["accumulate"]
    assert on["optimizer_steps"]["total"] == off["optimizer_steps"]["total"] == off["steps"]
    np.testing.assert_array_equal(on["log"]["train_loss"][1:], off["log"]["train_loss"][1:])


def test_small_groups_accumulate_to_a_batch(fennel16, tmp_path):
    """Mega-batches of 2 of 16 parts hold ~62 labelled nodes; with a batch of 256 auto accumulates: about
    one optimizer step per 256 labelled nodes, and every step's label mix is the training set's or near it."""
    from oocgnn.policies import make_plan
    cfg = _cfg(fennel16, tmp_path / "run", parts_per_megabatch=2, batch_size=256)
    s = train(cfg)
    updates = [(step.update, len(step.seeds)) for _, _, step in make_plan(fennel16, cfg).steps(1)]
    assert s["optimizer_steps"]["accumulate"] and s["optimizer_steps"]["target"] == 256
    assert s["epoch_steps"] == len(updates) == 8 and s["steps"] == 16
    per_step = np.bincount([u for u, _ in updates], weights=[n for _, n in updates])
    assert s["optimizer_steps"]["per_epoch"] == len(per_step) == 2 and (per_step[:-1] >= 256).all()
    assert s["mixing"]["unit"] == "optimizer step" and s["mixing"]["train_mean"] == per_step.mean()


@pytest.mark.parametrize("passes", [1.0, 2.0, 1.5])
def test_a_step_covers_the_training_set_once_a_pass_where_it_is_smaller_than_a_batch(fennel16, tmp_path, passes):
    """A batch larger than the training set: with p passes over each mega-batch an epoch's seeds are every
    training node p times, group by group; a step's target is round(p·|train|), so the epoch is one optimizer
    step over every group (a target of |train| would close it after the first 1/p of the groups)."""
    from oocgnn.policies import make_plan
    cfg = _cfg(fennel16, tmp_path / "run", parts_per_megabatch=2, batch_size=4096, passes=passes, accumulate="on")
    plan = make_plan(fennel16, cfg)
    num_train = len(fennel16.train_idx)
    assert num_train < 4096 and plan.step_target == round(passes * num_train)
    steps = [(e, step.update, step.seeds) for e, _, step in plan.steps(2)]
    for epoch in (0, 1):
        seeds = np.concatenate([s for e, _, s in steps if e == epoch])
        assert {u for e, u, _ in steps if e == epoch} == {epoch}      # one optimizer step an epoch
        groups = len(plan.schedule.groups(epoch))               # each group rounds its fraction of a pass
        assert abs(len(seeds) - round(passes * num_train)) <= groups / 2
        assert set(seeds.tolist()) == set(np.asarray(fennel16.train_idx).tolist())
    assert step_target(1024, 200, 2.0) == 400 and step_target(256, 200, 2.0) == 256


def test_passes_auto_is_one_where_an_epoch_is_one_step_at_any_p(fennel16, link16, tmp_path):
    """--passes auto (the default): p = 1 where steps accumulate and 2·|train| <= B (an epoch is then one
    optimizer step at p = 1 as at p = 2), the paper's 2 elsewhere: a batch under twice the training set, a step
    per mini-batch, a link store (no labels to balance); a number asked is kept. The same for the composed
    policy and for a rank's HierBatching."""
    from oocgnn.policies import make_plan, passes_for
    from oocgnn.rankplans import make_rank_plan
    from oocgnn.sampler import Sampler
    from oocgnn.shards import RankData
    twice = 2 * len(fennel16.train_idx)
    cases = [({"batch_size": twice}, 1.0), ({"batch_size": twice - 1}, 2.0),
             ({"batch_size": twice, "accumulate": "off"}, 2.0), ({"batch_size": twice, "passes": 1.5}, 1.5),
             ({"batch_size": twice, "policy": "composed", "superbatch": 2, "memory_budget": "16MB"}, 1.0),
             ({"batch_size": twice - 1, "policy": "composed", "superbatch": 2, "memory_budget": "16MB"}, 2.0)]
    for kw, p in cases:
        plan = make_plan(fennel16, _cfg(fennel16, tmp_path / "run", parts_per_megabatch=2, **{"passes": "auto", **kw}))
        assert plan.schedule.passes == p, kw
        assert plan.accumulate == (kw.get("accumulate") != "off"), kw
    plan = make_plan(fennel16, _cfg(fennel16, tmp_path / "run", parts_per_megabatch=2, batch_size=twice, passes="auto"))
    assert plan.describe()["passes"] == 1.0 and plan.step_target == len(fennel16.train_idx)
    steps = [(e, step.update, step.seeds) for e, _, step in plan.steps(2)]
    assert [u for _, u, _ in steps] == [e for e, _, _ in steps], "one optimizer step an epoch"
    seeds = np.concatenate([s for e, _, s in steps if e == 1])
    np.testing.assert_array_equal(np.sort(seeds), np.sort(fennel16.train_idx))     # each training node once
    link = make_plan(link16, _cfg(link16, tmp_path / "link", parts_per_megabatch=2, batch_size=10**6,
                                    passes="auto", memory_budget="16MB"))
    assert link.schedule.passes == 2.0 and not link.accumulate
    assert passes_for(1024, 200, True) == 1.0 and passes_for(1024, 600, True) == passes_for(1024, 200, False) == 2.0
    for kw, p in [({"batch_size": twice}, 1.0), ({"batch_size": twice, "accumulate": "off"}, 2.0)]:
        cfg = _cfg(fennel16, tmp_path / "rank", passes="auto", static_ratio=0.05, memory_budget="400KB",
                   fanouts="5,5", **kw)
        data = RankData.open(fennel16.path, 2, 0)
        lists = data.lists()
        assert make_rank_plan(cfg, data, None, lists, Sampler(lists, [5, 5], 0), None).passes == p, kw


def test_a_run_killed_inside_an_accumulated_step_resumes_to_the_same_log(fennel16, tmp_path, kill_at):
    kw = dict(parts_per_megabatch=2, batch_size=256, epochs=2)
    whole = train(_cfg(fennel16, tmp_path / "whole", **kw))
    kill_at(4)                        # checkpointed after 3 mini-batches of ~62 labelled nodes: a step under way
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(fennel16, tmp_path / "cut", checkpoint_every=3, **kw))
    kill_at(None)
    resumed = train(TrainConfig.create(store=str(fennel16.path), resume=str(tmp_path / "cut"), progress=False))
    np.testing.assert_allclose(resumed["log"]["train_loss"][1:], whole["log"]["train_loss"][1:], rtol=1e-6)
    assert resumed["optimizer_steps"] == whole["optimizer_steps"]


def test_outre_histories_age_per_optimizer_step_executed_as_simulated(fennel16, tmp_path):
    from oocgnn.policies import make_plan
    from oocgnn.simulate import simulate
    cfg = _cfg(fennel16, tmp_path / "run", policy="outre", parts_per_macro=2, history_ratio=0.2, staleness=2,
               batch_size=256, memory_budget="1MB", epochs=1)
    run = train(cfg)
    assert run["optimizer_steps"]["accumulate"] and run["history_hits"] > 0
    sim = simulate(fennel16, make_plan(fennel16, cfg), epochs=1, progress=False)
    assert int(sim["history_hits"].sum()) == run["history_hits"]


def test_evaluation_reads_are_reported_beside_the_runs(fennel16, tmp_path):
    """Layer-wise evaluation reads through its own reader: its rows and pages are in `io_eval`, not in `io`;
    each evaluation reads a row at most once, and only rows the plan does not hold."""
    s = train(_cfg(fennel16, tmp_path / "run", parts_per_megabatch=2, batch_size=256, max_eval_nodes=0))
    evaluations = len(s["log"])
    assert s["eval_mode"] == "layerwise" and evaluations == 3
    assert 0 < s["io_eval"]["unique_rows"] == s["io_eval"]["rows"] <= evaluations * fennel16.num_nodes
    assert s["io_eval"]["pages"] > 0 and s["io"]["calls"] > 0
    same = train(_cfg(fennel16, tmp_path / "again", parts_per_megabatch=2, batch_size=256, max_eval_nodes=0,
                      eval_every=3))       # more evaluations: more evaluation reads, the same run reads
    assert same["io"] == {**s["io"], "seconds": same["io"]["seconds"]}
    assert same["io_eval"]["rows"] > s["io_eval"]["rows"]
    for run in (s, same):                  # the log says them as they accrue: 0 before, the summary's at the end
        log = run["log"]
        assert log["eval_bytes_read"].is_monotonic_increasing and log["eval_bytes_read"].iloc[0] > 0
        assert log["eval_bytes_read"].iloc[-1] == run["io_eval"]["bytes_read"] + run["topology_io_eval"]["bytes_read"]
        assert log["eval_requests"].iloc[-1] == run["io_eval"]["requests"] + run["topology_io_eval"]["requests"]
        assert log["bytes_read"].iloc[-1] == run["io"]["bytes_read"]
