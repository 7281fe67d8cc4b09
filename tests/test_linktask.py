"""Link-prediction training (`linktask`, `edgeschedules.EdgeSchedule`): a run's loss falls and its log has the
link metrics, no held-out edge reaches a sampled block, runs are deterministic, what cannot run is refused, and
in-memory training on cora matches a plain-PyTorch full-graph reference (`tests/linkref.py`)."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from oocgnn.cli import main
from oocgnn.config import TrainConfig, task_defaults
from oocgnn.errors import UserError
from oocgnn.linkmetrics import snap_ties
from oocgnn.linktask import EVAL_SEED, build_link_model
from oocgnn.policies import make_plan
from oocgnn.rundir import LINK_LOG_COLUMNS, load_run
from oocgnn.sampler import Sampler, sampled_steps
from oocgnn.seeds import train_seeds
from oocgnn.store import open_store
from oocgnn.sweep import mixing_warnings, run_grid
from oocgnn.train import train

from .conftest import shared_dataset
from .linkref import train_reference
from .linkstores import link_cfg as _cfg


def test_a_link_run_learns_and_logs_mrr_and_hits(small_link, tmp_path):
    s = train(_cfg(small_link, tmp_path))
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    assert list(log.columns[:len(LINK_LOG_COLUMNS)]) == LINK_LOG_COLUMNS
    loss = log["train_loss"].dropna().to_numpy()
    assert len(loss) >= 3 and loss[-1] < loss[0], loss
    assert log["val_mrr"].iloc[-1] > log["val_mrr"].iloc[0] + 0.05, log["val_mrr"].tolist()
    assert s["target_metric"] == "mrr" and s["best_val_mrr"] == pytest.approx(log["val_mrr"].max())
    assert s["test_mrr_at_best_val"] == pytest.approx(log["test_mrr"][log["val_mrr"].idxmax()])
    assert s["eval_negatives"] == 100 and s["eval_edges"] == {"val": len(small_link.link_edges("val")),
                                                             "test": len(small_link.link_edges("test"))}
    assert "best_val_acc" not in s and s["mixing"] is None
    _, loaded, _ = load_run(tmp_path / "run")               # as `oocgnn report` reads it: the link columns
    assert list(loaded.columns) == LINK_LOG_COLUMNS and np.allclose(loaded["val_mrr"], log["val_mrr"])


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_a_collapsed_model_ranks_each_positive_among_its_ties_and_is_warned(small_link, tmp_path, monkeypatch,
                                                                           capsys, decoder):
    """Every embedding the same vector (the encoder's weights zero and frozen, its last bias not): OGB's rank of a
    positive tied with K negatives is 1 + K/2, not 1 or K + 1 by rounding; and the run says the scores collapsed."""
    import oocgnn.linktask as linktask
    real = linktask.build_link_model

    def collapsed(cfg, feat_dim):
        model = real(cfg, feat_dim)
        with torch.no_grad():
            for name, p in model.encoder.named_parameters():
                if name.endswith("1.fc_self.bias"):    # trains on, but every node's embedding stays this vector
                    p.copy_(torch.linspace(0.3, 2.0, p.numel()))
                else:
                    p.zero_().requires_grad_(False)
        return model

    monkeypatch.setattr(linktask, "build_link_model", collapsed)
    s = train(_cfg(small_link, tmp_path, decoder=decoder, epochs=1))
    assert s["best_val_mrr"] == pytest.approx(1 / (1 + 100 / 2))
    assert s["test_mrr_at_best_val"] == pytest.approx(1 / (1 + 100 / 2))
    err = capsys.readouterr().err
    assert err.count("scores have collapsed: 100% of the validation edges") == 1, err


def test_tie_snapping_keeps_distinct_scores_and_ties_rounding_noise():
    pos = torch.tensor([1.0, -2.0, 0.0])
    neg = torch.tensor([[1.0 + 3e-7, 1.1, 0.9], [-2.0 - 1e-6, -2.0 + 4e-6, -2.5], [0.0, 0.0, 0.0]])
    snapped, tied = snap_ties(pos, neg)
    assert snapped.tolist() == [[1.0, pytest.approx(1.1), pytest.approx(0.9)], [-2.0, pytest.approx(-2.0 + 4e-6), -2.5],
                                [0.0, 0.0, 0.0]]
    assert tied == pytest.approx(1 / 3)


def test_a_link_run_is_deterministic(small_link, tmp_path):
    a, b = (train(_cfg(small_link, tmp_path, name, epochs=2, decoder="mlp", negative_degree_fraction=0.5))
            for name in ("a", "b"))
    la, lb = (pd.read_csv(tmp_path / name / "log.csv") for name in ("a", "b"))
    assert la["train_loss"].equals(lb["train_loss"]) and la["val_mrr"].equals(lb["val_mrr"])
    assert a["best_val_mrr"] == b["best_val_mrr"]


def test_a_link_store_trains_without_weight_decay_unless_one_is_given(small_link, tmp_path):
    """A link store's default weight decay is 0 (`config.task_defaults`): a run left at the default trains exactly as
    one given 0, one given 5e-4 (the node default) keeps it, and a node store's default is untouched."""
    runs = {name: train(_cfg(small_link, tmp_path, name, epochs=1, **kw))
            for name, kw in (("default", {}), ("zero", {"weight_decay": 0.0}), ("given", {"weight_decay": 5e-4}))}
    saved = {name: json.loads((tmp_path / name / "config.json").read_text()) for name in runs}
    assert [saved[n]["weight_decay"] for n in ("default", "zero", "given")] == [0.0, 0.0, 5e-4]
    logs = {name: pd.read_csv(tmp_path / name / "log.csv") for name in runs}
    assert logs["default"]["train_loss"].equals(logs["zero"]["train_loss"])
    assert not logs["default"]["train_loss"].equals(logs["given"]["train_loss"])
    node = TrainConfig.create(store="s")
    assert task_defaults(node, "node").weight_decay == 5e-4
    assert task_defaults(node, "link").weight_decay == 0.0 and task_defaults(node, "link").given == node.given


def test_a_weight_decay_given_survives_seeds_and_sweeps(small_link, tmp_path):
    """`--seeds` and a sweep copy the config (`TrainConfig.replace`): a weight decay given, even the node default
    5e-4, is still given in each copy, and a sweep's own value is given too: neither falls back to a link store's 0."""
    given = _cfg(small_link, tmp_path, epochs=1, max_steps=1, eval_every=0, weight_decay=5e-4)
    assert task_defaults(given.replace(seed=3), "link").weight_decay == 5e-4
    assert task_defaults(_cfg(small_link, tmp_path).replace(weight_decay=5e-4), "link").weight_decay == 5e-4
    assert task_defaults(_cfg(small_link, tmp_path).replace(seed=3), "link").weight_decay == 0.0
    train_seeds(given.replace(out=str(tmp_path / "seeds")), [0])
    assert json.loads((tmp_path / "seeds" / "seed0" / "config.json").read_text())["weight_decay"] == 5e-4
    run_grid(_cfg(small_link, tmp_path, epochs=1, max_steps=1, eval_every=0), {"weight_decay": [5e-4]},
             seeds=(0,), out_root=str(tmp_path / "sweep"))
    saved = [json.loads(p.read_text())["weight_decay"] for p in (tmp_path / "sweep").rglob("config.json")]
    assert saved == [5e-4]


def test_held_out_edges_never_reach_a_sampled_block(small_link):
    """Neither the training steps' blocks nor evaluation's see a validation or test edge, in either direction."""
    cfg = TrainConfig.create(store=str(small_link.path), fanouts="-1,-1", batch_size=256, negatives=30)
    plan = make_plan(small_link, cfg)
    held = {(int(a), int(b)) for s in ("val", "test") for a, b in small_link.link_edges(s)}
    held |= {(b, a) for a, b in held}
    lists = small_link.neighbour_lists()
    seen = 0
    for _, _, _, step, sample in sampled_steps(plan, Sampler(lists, plan.fanouts, 0), epochs=2):
        assert np.array_equal(sample.output_nodes, step.seeds)
        assert set(step.link.edges.ravel()) | set(step.link.negatives.ravel()) <= set(step.seeds.tolist())
        for block in sample.blocks:
            src, dst = block.edges()
            pairs = zip(block.src_nodes[src].tolist(), block.src_nodes[dst].tolist())
            assert not held & set(pairs)
            seen += block.num_edges
    assert seen > 0
    train_pairs = {(int(a), int(b)) for a, b in plan.schedule.edges}
    assert not held & train_pairs and len(train_pairs) == small_link.num_edges // 2


@pytest.mark.parametrize("settings, message", [
    ({"target_metric": "acc"}, "does not apply to a link store"),
    ({"accumulate": "on"}, "a link store's batches are edges"),
])
def test_what_a_link_run_cannot_do_is_refused(small_link, tmp_path, settings, message):
    with pytest.raises(UserError, match=message):
        train(_cfg(small_link, tmp_path, **settings))


def test_a_policy_for_node_stores_only_is_refused_on_a_link_store(small_link, tmp_path, monkeypatch):
    """Every policy trains link stores now; one that did not would be refused with those that do."""
    from oocgnn.policies import POLICIES
    monkeypatch.setattr(POLICIES["composed"], "tasks", ("node",))
    with pytest.raises(UserError, match="policy composed does not train on link stores yet; policies that do: "
                                        "inmemory, mmap, hierbatching, outre, ginex, macrobatch, marius, packed$"):
        train(_cfg(small_link, tmp_path, policy="composed"))


def test_seeds_aggregate_a_link_store_s_mrr(small_link, tmp_path, capsys):
    cfg = _cfg(small_link, tmp_path, "seeds", epochs=2)
    agg = train_seeds(cfg, [0, 1])
    mrr = [json.loads((tmp_path / "seeds" / f"seed{s}" / "summary.json").read_text())["test_mrr_at_best_val"]
           for s in (0, 1)]
    assert mrr[0] != mrr[1]
    assert agg["test_mrr_at_best_val"]["values"] == mrr
    assert agg["test_mrr_at_best_val"]["mean"] == pytest.approx(np.mean(mrr))
    assert agg["best_val_acc"]["n"] == 0
    curve = pd.read_csv(tmp_path / "seeds" / "aggregate_log.csv")
    logs = [pd.read_csv(tmp_path / "seeds" / f"seed{s}" / "log.csv") for s in (0, 1)]
    assert np.allclose(curve["val_mrr_mean"], (logs[0]["val_mrr"] + logs[1]["val_mrr"]) / 2)
    main(["train", str(small_link.path), "--seeds", "0,1", "--epochs", "1", "--no-progress", "--batch-size", "512",
          "--fanouts", "5,5", "--hidden", "16", "--out", str(tmp_path / "cli")])
    assert "seeds 0,1: best val MRR 0." in capsys.readouterr().out
    out = tmp_path / "fig" / "r"                            # `report` over the seeds: MRR, mean ± std
    assert main(["report", str(tmp_path / "seeds"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"best val MRR {logs[0]['val_mrr'].max():.4f}" in printed and "test_mrr_at_best_val" in printed
    assert f"{100 * np.mean(mrr):.1f} ± " in printed and out.with_suffix(".png").stat().st_size > 1000
    assert "hits@50" not in printed                         # OGB's shared pairs' Hits@K only where they exist
    assert pd.read_csv(out.with_suffix(".csv"))["task"].eq("link").all()


def test_shared_hits_are_no_target_without_ogb_s_shared_negatives(small_link, tmp_path, capsys):
    assert main(["train", str(small_link.path), "--target-metric", "hits@50", "--out", str(tmp_path / "r")]) == 2
    assert "with OGB's shared negative pairs also hits@20" in capsys.readouterr().err


def test_report_refuses_to_mix_node_and_link_runs(small_link, tiny_store, tmp_path, capsys):
    train(_cfg(small_link, tmp_path, "link", epochs=1))
    train(TrainConfig.create(store=str(tiny_store.path), out=str(tmp_path / "node"), epochs=1, batch_size=512,
                             fanouts="5,5", max_eval_nodes=100, progress=False))
    assert main(["report", str(tmp_path / "link"), str(tmp_path / "node"), "--out", str(tmp_path / "r")]) == 2
    assert "mix node classification and link prediction" in capsys.readouterr().err
    assert not (tmp_path / "r.csv").exists()


def test_a_sweep_over_a_link_store_tabulates_mrr(small_link, tmp_path):
    cfg = _cfg(small_link, tmp_path, epochs=1)
    logs, table = run_grid(cfg, {"negatives": [5, 20]}, seeds=(0,), out_root=str(tmp_path / "sweep"))
    assert table["negatives"].tolist() == [5, 20] and "best_val_acc" not in table and "mixing_warns" not in table
    for _, row in table.iterrows():
        s = json.loads((tmp_path / "sweep" / f"inmemory-negatives={row['negatives']}-s0" / "summary.json").read_text())
        assert row["test_mrr_at_best_val"] == s["test_mrr_at_best_val"] and 0 < row["best_val_mrr"] <= 1
    assert set(logs["negatives"]) == {5, 20} and logs["val_mrr"].notna().all()
    assert mixing_warnings(cfg, {"negatives": [5, 20]}) == []


def test_mrr_is_refused_on_a_node_store(tiny_store, tmp_path):
    with pytest.raises(UserError, match="mrr does not apply to a node store"):
        train(TrainConfig.create(store=str(tiny_store.path), target_metric="mrr", out=str(tmp_path / "r"),
                                 progress=False))


@pytest.mark.slow
def test_in_memory_link_training_on_cora_matches_a_full_graph_reference(tmp_path):
    """Full neighbourhoods, no dropout or weight decay, every training edge in one batch with one shared set of negatives, the
    same initial weights: oocgnn's sampled blocks, model, loop and layer-wise evaluation against the reference's
    dense full-graph GraphSAGE, within 1 point of MRR (val and test at the best validation)."""
    out = tmp_path / "cora-link"
    assert main(["prepare", str(shared_dataset("cora")), "--task", "link", "--edge-split", "0.85,0.05,0.10",
                 "--out", str(out), "--quiet"]) == 0
    store = open_store(out)
    epochs, lr, negatives = 40, 0.01, 100
    cfg = TrainConfig.create(store=str(out), out=str(tmp_path / "run"), progress=False, epochs=epochs, lr=lr,
                             batch_size=10 ** 6, negatives=negatives, negative_chunks=1, fanouts="-1,-1",
                             dropout=0.0, weight_decay=0.0, max_eval_nodes=0)
    s = train(cfg)
    torch.manual_seed(cfg.seed)                            # the run's initial weights (train seeds so)
    init = [(c.fc_self.weight, c.fc_self.bias, c.fc_neigh.weight)
            for c in build_link_model(cfg, store.feat_dim).encoder.layers]
    ref = train_reference(out, init, epochs, lr, negatives, seed=cfg.seed, eval_seed=EVAL_SEED)
    val = np.array([r["val"]["mrr"] for r in ref])
    best = int(val.argmax())
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    print(f"cora: oocgnn best val MRR {s['best_val_mrr']:.4f}, test at best val {s['test_mrr_at_best_val']:.4f}; "
          f"reference {val.max():.4f}, {ref[best]['test']['mrr']:.4f}")
    assert np.abs(log["val_mrr"].to_numpy() - val).max() < 0.01
    assert s["best_val_mrr"] == pytest.approx(val.max(), abs=0.01)
    assert s["test_mrr_at_best_val"] == pytest.approx(ref[best]["test"]["mrr"], abs=0.01)
    assert s["best_val_mrr"] > 0.3                         # it learned: random ranking among 100 gives about 0.05


def test_ogb_shared_negative_pairs_are_evaluated_as_ogb_does(tmp_path, capsys, monkeypatch):
    """A store with OGB's shared negative pairs (ogbl-collab's layout): each held-out edge ranked among all of
    them (MRR, Hits@1, 3, 10) and OGB's 'hits@K' (a hit scores strictly above the K-th highest negative; every
    positive a hit with fewer than K negatives), against a brute-force float64 computation from the evaluated
    embeddings; the log, summary and printed line carry them."""
    from oocgnn.linktask import LinkEvaluation
    from .test_linksplit import write_ogbl
    root, *_ = write_ogbl(tmp_path / "ogbl_toy", "edge", True)
    store = tmp_path / "store"
    assert main(["prepare", str(root), "--task", "link", "--out", str(store), "--quiet"]) == 0
    seen = []
    embeddings = LinkEvaluation.embeddings

    def keep(self, model):
        h = embeddings(self, model)
        seen.append((self, model, h.numpy().astype(np.float64)))
        return h
    monkeypatch.setattr(LinkEvaluation, "embeddings", keep)
    assert main(["train", str(store), "--epochs", "2", "--batch-size", "64", "--fanouts", "5,5", "--hidden", "8",
                 "--negatives", "5", "--negative-chunks", "2", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert "among all 20 shared negative pairs (OGB's)" in capsys.readouterr().out
    log = pd.read_csv(tmp_path / "run" / "log.csv")
    evaluator, model, h = seen[-1]
    assert evaluator.shared and model.decoder.__class__.__name__ == "DotDecoder"
    for split in ("val", "test"):
        edges, pairs = evaluator.sets[split]
        assert pairs.shape == (20, 2)
        at = lambda p: np.searchsorted(evaluator.nodes, p)            # noqa: E731
        score = lambda p: (h[at(p[:, 0])] * h[at(p[:, 1])]).sum(1)    # noqa: E731
        pos, neg = score(edges), score(pairs)
        rank = 1 + ((neg[None] > pos[:, None]).sum(1) + (neg[None] >= pos[:, None]).sum(1)) / 2
        top = np.sort(neg)[::-1]
        want = {"mrr": np.mean(1 / rank), **{f"hits@{k}": np.mean(rank <= k) for k in (1, 3, 10)},
                **{f"hits@{k}": 1.0 if len(neg) < k else np.mean(pos > top[k - 1]) for k in (20, 50, 100)}}
        for m, v in want.items():
            assert log[f"{split}_{m}"].iloc[-1] == pytest.approx(v, abs=1e-6), (split, m)
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["eval_shared_negatives"] and s["eval_negatives"] == 20
    assert s["test_hits@50_at_best_val"] == 1.0             # 20 negatives < 50: OGB counts every positive a hit
    _, loaded, _ = load_run(tmp_path / "run")
    assert "val_hits@20" in loaded and "test_hits@100" in loaded
    # OGB selects ogbl-collab's model by Hits@50: the target metric may be a shared Hits@K here, and only here
    assert main(["train", str(store), "--epochs", "3", "--batch-size", "64", "--fanouts", "5,5", "--hidden", "8",
                 "--negatives", "5", "--negative-chunks", "2", "--out", str(tmp_path / "h20"), "--no-progress",
                 "--target-metric", "hits@20"]) == 0
    s = json.loads((tmp_path / "h20" / "summary.json").read_text())
    log = pd.read_csv(tmp_path / "h20" / "log.csv")
    best = log["val_hits@20"].idxmax()
    assert s["target_metric"] == "hits@20" and s["best_val_hits@20"] == log["val_hits@20"][best]
    assert s["test_mrr_at_best_val"] == pytest.approx(log["test_mrr"][best])
    capsys.readouterr()
    assert main(["train", str(tmp_path / "run").replace("run", "store"), "--target-metric", "hits@500"]) == 2
    assert "hits@500" in capsys.readouterr().err
    # --seeds aggregates them too
    assert main(["train", str(store), "--epochs", "2", "--batch-size", "64", "--fanouts", "5,5", "--hidden", "8",
                 "--negatives", "5", "--negative-chunks", "2", "--out", str(tmp_path / "seeds"), "--no-progress",
                 "--seeds", "0,1"]) == 0
    agg = json.loads((tmp_path / "seeds" / "aggregate.json").read_text())
    runs = [json.loads((tmp_path / "seeds" / f"seed{i}" / "summary.json").read_text()) for i in (0, 1)]
    for key in ("best_val_hits@20", "test_hits@50_at_best_val", "test_hits@100_at_best_val"):
        assert agg[key]["values"] == [r[key] for r in runs], key
    curves = pd.read_csv(tmp_path / "seeds" / "aggregate_log.csv")
    logs = [pd.read_csv(tmp_path / "seeds" / f"seed{i}" / "log.csv") for i in (0, 1)]
    assert np.allclose(curves["val_hits@20_mean"], (logs[0]["val_hits@20"] + logs[1]["val_hits@20"]) / 2)
    capsys.readouterr()
    assert main(["report", str(tmp_path / "seeds"), "--out", str(tmp_path / "fig" / "r")]) == 0   # and report
    assert "test_hits@50_at_best_val" in capsys.readouterr().out
