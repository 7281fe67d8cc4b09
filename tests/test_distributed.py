"""Scale-out (oocgnn.distributed, oocgnn.disttrain): ownership, the exchange against the store's rows,
executed traffic against the simulator, 2-rank accuracy against 1 rank, and a dead rank ending the
other. Ranks run on localhost with gloo, every launch bounded by a timeout."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from oocgnn.distributed import (TRAFFIC, Exchange, RankFeatures, fetch_macrobatch, owner, owner_bounds,
                                rank_batches, sample_macrobatch, simulate_exchange, steps_per_epoch)
from oocgnn.errors import UserError


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_owner_bounds_cut_at_partitions_and_balance(fennel16):
    off = fennel16.part_offsets
    for world in (1, 2, 3, 5, 16):
        b = owner_bounds(off, world)
        assert b[0] == 0 and b[-1] == fennel16.num_nodes and len(b) == world + 1
        assert np.all(np.diff(b) > 0) and set(b.tolist()) <= set(off.tolist())
        ids = np.arange(fennel16.num_nodes)
        assert np.array_equal(np.bincount(owner(b, ids), minlength=world), np.diff(b))
        if world <= 3:     # the nearest partition offset: within the largest part of an even share
            assert np.abs(np.diff(b) - fennel16.num_nodes / world).max() <= np.diff(off).max()
    with pytest.raises(UserError, match="partitions"):
        owner_bounds(off, 17)


def test_rank_batches_split_the_training_nodes_by_owner(fennel16):
    train, world, bs = fennel16.train_idx, 3, 64
    b = owner_bounds(fennel16.part_offsets, world)
    per_rank = [rank_batches(train, b, r, bs, seed=0, epoch=1) for r in range(world)]
    assert all(len(p) == steps_per_epoch(len(train), bs) for p in per_rank)   # lockstep
    for r, batches in enumerate(per_rank):
        assert np.all(owner(b, np.concatenate(batches)) == r)
    assert np.array_equal(np.sort(np.concatenate([np.concatenate(p) for p in per_rank])), np.sort(train))


def test_macrobatching_sends_fewer_rows_simulated(fennel16):
    k1, k4 = (simulate_exchange(fennel16, 2, k, 64, [5, 5], seed=0) for k in (1, 4))
    assert k4.rows_recv.sum() < k1.rows_recv.sum()
    assert k4.exchanges.max() < k1.exchanges.max()
    # what one rank receives, the others sent
    assert k1.rows_recv.sum() == k1.rows_sent.sum() and k4.bytes_recv.sum() == k4.bytes_sent.sum()


def _fetch_worker(rank, world, port, store_path, k, out, source=None):
    import torch.distributed as dist
    from oocgnn.sampler import Sampler
    from oocgnn.store import open_store
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=60))
    from oocgnn.shards import RankData
    store = open_store(store_path)
    data = RankData.open(source or store_path, world, rank)     # the shared store, or this rank's shard
    b = data.bounds
    lists = data.lists()
    sampler, whole = Sampler(lists, [5, 5], 0), Sampler(store.neighbour_lists(), [5, 5], 0)
    ex = Exchange(b, rank, world, store.feat_dim)
    ok, same, oracle = True, True, store.reader("memory")
    for policy in ("inmemory", "macrobatch"):
        feats = RankFeatures(data, policy, 1 << 30)
        batches = rank_batches(store.train_idx, b, rank, 64, 0, 0)
        for c in range(0, len(batches), k):
            keys = [i * world + rank for i in range(c, c + len(batches[c:c + k]))]
            samples = sample_macrobatch(sampler, lists, ex, batches[c:c + k], 0, keys)
            mb = fetch_macrobatch(samples, feats, ex)
            for s, key in zip(samples, keys):   # oracles: the whole graph's sample, the store's own rows
                want = whole.sample(s.output_nodes, 0, key)
                same &= all(np.array_equal(x.src_nodes, y.src_nodes) and np.array_equal(x.indices, y.indices)
                            for x, y in zip(s.blocks, want.blocks))
                ok &= torch.equal(mb.gather(s.input_nodes), torch.from_numpy(oracle.read_rows(s.input_nodes)))
        feats.close()
    own = (lists.own_indptr[-1], int(store.indptr[b[rank + 1]] - store.indptr[b[rank]]))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"ok": bool(ok), "same": bool(same), "own": [int(x) for x in own], **ex.record()}, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("sharded", [False, True])
def test_exchange_fetches_the_stores_rows_and_counts_what_the_simulator_predicts(fennel16, tmp_path, sharded):
    """Each rank reads its rows and lists (from the shared store, or from its own shard written by
    `prepare --shards`), fetches the rest: samples equal the whole graph's, rows the store's, and the
    traffic the simulator's."""
    import torch.multiprocessing as mp
    from oocgnn.shards import write_shards
    world, k = 2, 3
    source = str(write_shards(fennel16, world, tmp_path / "shards", progress=False)) if sharded else None
    ctx = mp.start_processes(_fetch_worker, args=(world, _free_port(), str(fennel16.path), k, str(tmp_path / "r"),
                                                  source),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.time() + 240
    while not ctx.join(timeout=5):
        assert time.time() < deadline, "the 2-rank exchange did not finish in time"
    sim = simulate_exchange(fennel16, world, k, 64, [5, 5], seed=0)
    for r in range(world):
        got = json.loads((tmp_path / f"r.{r}").read_text())
        assert got["ok"] and got["same"], "the store's rows, and the samples of the whole graph"
        assert got["own"][0] == got["own"][1], "a rank holds its own lists, no more"
        assert got["lists_recv"] > 0 and got["list_entries_recv"] > got["lists_recv"]
        row = sim[sim["rank"] == r].iloc[0]
        for key in TRAFFIC:
            assert got[key] == 2 * int(row[key]), key        # two policies, the same batches: twice the epoch


def _torchrun(store, ranks, out, *args, timeout=420):
    """A torchrun job's summary; on the CPU unless `args` name another --device (the last one counts)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "oocgnn", "train", str(store), "--distributed", "--out", str(out), "--no-progress",
           "--batch-size", "64", "--fanouts", "5,5", "--max-eval-nodes", "0", "--device", "cpu", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_two_ranks_train_as_one_and_exchange_what_the_simulator_predicts(fennel16, tmp_path):
    import pandas as pd
    epochs = 15
    one = _torchrun(fennel16.path, 1, tmp_path / "one", "--epochs", epochs)
    two = _torchrun(fennel16.path, 2, tmp_path / "two", "--epochs", epochs, "--policy", "macrobatch",
                    "--macrobatch", 4, "--memory-budget", "8MB")
    k1 = _torchrun(fennel16.path, 2, tmp_path / "k1", "--epochs", 2, "--macrobatch", 1)
    from oocgnn.shards import write_shards                # the same run from per-rank shards: the same log
    shards = write_shards(fennel16, 2, tmp_path / "shards", progress=False)
    k1s = _torchrun(shards, 2, tmp_path / "k1s", "--epochs", 2, "--macrobatch", 1)
    cols = ["epoch", "step", "train_loss", "val_acc", "test_acc", "rows_recv", "lists_recv", "bytes_recv"]
    pd.testing.assert_frame_equal(*(pd.read_csv(tmp_path / d / "log.csv")[cols] for d in ("k1", "k1s")))
    assert [r["rows_recv"] for r in k1s["ranks"]] == [r["rows_recv"] for r in k1["ranks"]]
    assert one["exchange"]["rows_recv"] == 0 and two["steps"] == one["steps"]
    acc = [pd.read_csv(tmp_path / d / "log.csv")["test_acc"].iloc[-3:].mean() for d in ("one", "two")]
    assert abs(acc[0] - acc[1]) <= 0.01, acc
    assert two["best_val_acc"] > 0.5                      # it learned (8 classes)
    for run, k, ep in ((two, 4, epochs), (k1, 1, 2)):     # executed traffic = simulated, rank by rank
        sim = simulate_exchange(fennel16, 2, k, 64, [5, 5], seed=0, epochs=ep).groupby("rank").sum()
        for rank in run["ranks"]:
            for key in TRAFFIC:
                assert rank[key] == int(sim.loc[rank["rank"], key]), (k, key)
    # BatchGNN Table 5's direction: k = 4 moves fewer rows than k = 1 (per epoch)
    assert two["exchange"]["rows_recv"] / epochs < k1["exchange"]["rows_recv"] / 2


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_rank_device_is_the_cpu_or_refuses_a_missing_gpu():
    from oocgnn.disttrain import rank_device
    assert rank_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert rank_device("auto") == torch.device("cpu")
        with pytest.raises(UserError, match="--device cuda"):
            rank_device("cuda")


@cuda
def test_ranks_on_a_gpu_train_as_on_the_cpu(fennel16, tmp_path):
    """The same samples and exchanges on either device (traffic equal), the same learning; a rank with
    a GPU of its own sends gradients over nccl, ranks sharing one GPU over gloo."""
    import pandas as pd
    args = ("--epochs", 10, "--macrobatch", 2, "--dropout", 0)
    cpu = _torchrun(fennel16.path, 2, tmp_path / "cpu", *args, "--device", "cpu")
    shared = _torchrun(fennel16.path, 2, tmp_path / "shared", *args, "--device", "cuda")
    own = _torchrun(fennel16.path, 1, tmp_path / "own", *args, "--device", "cuda")
    nccl = "gloo (exchanges), nccl (gradients)"
    assert cpu["backend"] == "gloo" and own["backend"] == nccl
    assert shared["backend"] == ("gloo" if torch.cuda.device_count() < 2 else nccl)
    assert shared["device"].startswith("cuda") and shared["gpu"]
    for key in TRAFFIC:
        assert [r[key] for r in shared["ranks"]] == [r[key] for r in cpu["ranks"]], key
    logs = [pd.read_csv(tmp_path / d / "log.csv") for d in ("cpu", "shared")]
    np.testing.assert_allclose(logs[0]["train_loss"][1:4], logs[1]["train_loss"][1:4], rtol=1e-2)  # sums reordered
    acc = [log["test_acc"].iloc[-3:].mean() for log in logs] + [own["final_test_acc"]]
    assert max(acc) - min(acc) <= 0.03 and own["best_val_acc"] > 0.5, acc


def test_hierbatching_per_rank_learns_and_exchanges_nothing_but_gradients(fennel16, tmp_path):
    one = _torchrun(fennel16.path, 1, tmp_path / "one", "--epochs", 15)
    # r_s pinned at the paper's 0.01, where the 3-point tolerance was set (the two runs sample differently)
    hb = _torchrun(fennel16.path, 2, tmp_path / "hb", "--epochs", 15, "--policy", "hierbatching",
                   "--memory-budget", "800KB", "--passes", 1, "--static-ratio", 0.01)
    assert hb["exchange"]["rows_recv"] == 0 and hb["exchange"]["lists_recv"] == 0
    assert hb["steps"] >= one["steps"]         # batches cut per mega-batch (and per pass): a few more
    assert all(r["plan"]["parts_per_megabatch"] >= 1 for r in hb["ranks"])
    from oocgnn.config import TrainConfig      # the oracle: one process's HierBatching with both ranks' memory
    from oocgnn.train import train
    single = train(TrainConfig.create(store=str(fennel16.path), policy="hierbatching", epochs=15, batch_size=64,
                                      fanouts="5,5", max_eval_nodes=0, memory_budget="1600KB", passes=1.0,
                                      static_ratio=0.01, progress=False, out=str(tmp_path / "single")))
    assert hb["best_val_acc"] > 0.5 and abs(hb["test_at_best_val"] - single["test_at_best_val"]) <= 0.03
    assert one["test_at_best_val"] - hb["test_at_best_val"] <= 0.08     # mega-batches of few parts cost a little


def test_two_nodes_train_as_two_ranks_on_one(fennel16, tmp_path):
    """README's several-machines lines on localhost: two torchrun agents (--nnodes 2, one rank each, each
    its LOCAL_RANK 0) meet at a rendezvous and give the log of one agent with two ranks."""
    import pandas as pd
    args = ["--epochs", "2", "--macrobatch", "2", "--batch-size", "64", "--fanouts", "5,5", "--max-eval-nodes", "0",
            "--device", "cpu", "--no-progress"]
    port, out = _free_port(), tmp_path / "nodes"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank",
         str(node), "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "oocgnn", "train",
         str(fennel16.path), "--distributed", "--out", str(out), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in range(2)]
    try:
        for a in agents:
            _, err = a.communicate(timeout=300)
            assert a.returncode == 0, err[-3000:]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    one = _torchrun(fennel16.path, 2, tmp_path / "one", *args)
    nodes = json.loads((out / "summary.json").read_text())
    assert [r["rows"] for r in nodes["ranks"]] == [r["rows"] for r in one["ranks"]]
    cols = ["epoch", "step", "train_loss", "val_acc", "test_acc", "rows_recv", "lists_recv", "bytes_recv"]
    pd.testing.assert_frame_equal(*(pd.read_csv(d / "log.csv")[cols] for d in (out, tmp_path / "one")))


def test_distributed_evaluates_every_n_steps(fennel16, tmp_path):
    import pandas as pd
    s = _torchrun(fennel16.path, 2, tmp_path / "e", "--epochs", 2, "--macrobatch", 1, "--eval-every", 3)
    steps = pd.read_csv(tmp_path / "e" / "log.csv")["step"].tolist()
    assert steps == [0, *range(3, s["steps"] + 1, 3)] + ([s["steps"]] if s["steps"] % 3 else [])


@pytest.mark.parametrize("rank_data", ["own", "shared"])
def test_two_ranks_evaluate_the_metrics_of_one_process(binary, tmp_path, rank_data):
    """The evaluation before any step (the same initial weights everywhere), with full neighbourhoods (the
    same logits however the nodes are batched): the ranks' confusion counts summed and scores gathered give
    one process's accuracy, macro-F1 and ROC-AUC (own rows: exchanged batches; shared: layer-wise per rank)."""
    import pandas as pd
    from oocgnn.config import TrainConfig
    from oocgnn.train import train
    args = ("--epochs", 1, "--max-steps", 1, "--eval-fanouts=-1,-1", "--rank-data", rank_data)
    _torchrun(binary.path, 2, tmp_path / "two", *args)
    train(TrainConfig.create(store=str(binary.path), epochs=1, max_steps=1, batch_size=64, fanouts="5,5",
                             eval_fanouts="-1,-1", max_eval_nodes=0, device="cpu", progress=False,
                             out=str(tmp_path / "one")))
    cols = ["val_acc", "test_acc", "val_f1", "test_f1", "val_auc", "test_auc"]
    two, one = (pd.read_csv(tmp_path / d / "log.csv")[cols].iloc[0] for d in ("two", "one"))
    assert two.notna().all() and two.tolist() == pytest.approx(one.tolist(), abs=1e-12), (two, one)


def test_a_dead_rank_ends_the_other_with_a_clear_error(fennel16, tmp_path):
    port, out = _free_port(), tmp_path / "run"
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "oocgnn", "train", str(fennel16.path), "--distributed", "--out", str(out),
             "--epochs", "100000", "--batch-size", "64", "--fanouts", "5,5", "--dist-timeout", "30", "--no-progress"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.time() + 240
        while not (out / "log.csv").exists():                 # rank 0 logs once both train
            assert time.time() < deadline and procs[0].poll() is None, "the run did not start"
            time.sleep(0.5)
        time.sleep(2)
        procs[1].send_signal(signal.SIGKILL)
        t = time.time()
        _, err = procs[0].communicate(timeout=90)             # bounded: the timeout is 30 s
        assert procs[0].returncode not in (0, None)
        assert "another rank died" in err, err[-2000:]
        assert time.time() - t < 90
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _cli_worker(rank, world, port, argv, crash_at, result):
    """One rank running `oocgnn` argv; with crash_at, interrupted at its crash_at-th training exchange."""
    from oocgnn import cli, rankplans
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if crash_at:
        fetch, calls = rankplans.fetch_macrobatch, [0]

        def crashing(samples, features, exchange, counted=True):
            calls[0] += counted
            if calls[0] == crash_at:
                raise KeyboardInterrupt
            return fetch(samples, features, exchange, counted)
        rankplans.fetch_macrobatch = crashing
    code = cli.main(argv)
    with open(f"{result}.{rank}", "w") as f:
        f.write(str(code))


def _spawn(argv, tmp_path, name, crash_at=0, world=2, worker=_cli_worker):
    """Run `worker` (rank, world, port, argv, crash_at, result) on `world` spawned ranks; their exit codes."""
    import torch.multiprocessing as mp
    ctx = mp.start_processes(worker, args=(world, _free_port(), argv, crash_at, str(tmp_path / name)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.time() + 300
    while not ctx.join(timeout=5):
        assert time.time() < deadline, f"{name}: the ranks did not finish in time"
    return [int((tmp_path / f"{name}.{r}").read_text()) for r in range(world)]


def test_a_killed_distributed_run_resumes_to_the_same_log(fennel16, tmp_path):
    import pandas as pd
    common = ["train", str(fennel16.path), "--distributed", "--no-progress", "--epochs", "2", "--batch-size", "64",
              "--fanouts", "5,5", "--macrobatch", "2", "--checkpoint-every", "5", "--max-eval-nodes", "200",
              "--threads", "1"]          # two runs equal to 1e-6 need one thread (2 threads: 1 run in 4 differs by ~1e-6)
    assert _spawn(common + ["--out", str(tmp_path / "whole")], tmp_path, "whole") == [0, 0]
    killed = tmp_path / "killed"
    assert _spawn(common + ["--out", str(killed)], tmp_path, "killed", crash_at=7) == [130, 130]
    assert (killed / "checkpoint.pt").exists() and not (killed / "summary.json").exists()
    assert _spawn(["train", str(fennel16.path), "--distributed", "--resume", str(killed), "--no-progress"],
                  tmp_path, "resumed") == [0, 0]
    a, b = (pd.read_csv(d / "log.csv") for d in (tmp_path / "whole", killed))
    cols = ["epoch", "step", "train_loss", "val_acc", "test_acc", "rows_recv", "bytes_recv"]
    pd.testing.assert_frame_equal(a[cols], b[cols], rtol=1e-6)
    s = [json.loads((d / "summary.json").read_text()) for d in (tmp_path / "whole", killed)]
    assert [r["rows_recv"] for r in s[0]["ranks"]] == [r["rows_recv"] for r in s[1]["ranks"]]


def test_shards_hold_each_ranks_rows_lists_and_labels_and_nothing_else(fennel16, tmp_path, capsys):
    """`prepare --shards R`: rank r's shard gives the same rows (local ids), lists, labels and splits as its
    range of the store, and holds only those; a shard refuses another world size and a missing file."""
    from oocgnn.cli import main
    from oocgnn.shards import RankData, write_shards
    from oocgnn.store import open_store
    out = write_shards(fennel16, 3, tmp_path / "sh", progress=False)
    whole = fennel16.reader("memory")
    labels = np.load(fennel16.path / "labels.npy")
    for r in range(3):
        a, b = RankData.open(out, 3, r), RankData.open(fennel16.path, 3, r)
        assert a.sharded and not b.sharded and (a.lo, a.hi) == (b.lo, b.hi)
        rows = np.arange(a.hi - a.lo)
        want = whole.read_rows(rows + a.lo)
        for d in (a, b):
            with d.reader() as rd:
                np.testing.assert_array_equal(rd.read_rows(rows), want)
            np.testing.assert_array_equal(d.labels(), labels[a.lo:a.hi])
            np.testing.assert_array_equal(d.train_idx, fennel16.train_idx)
            lists = d.lists()
            s, e, buf = lists.lists(np.arange(a.lo, a.hi))
            got = [buf[x:y].tolist() for x, y in zip(s, e)]
            assert got == [fennel16.indices[fennel16.indptr[v]:fennel16.indptr[v + 1]].tolist()
                           for v in range(a.lo, a.hi)]
        size = (out / f"rank{r}" / "features.bin").stat().st_size
        assert size == (a.hi - a.lo) * fennel16.row_stride, "its rows, no more"
    with pytest.raises(UserError, match="3 shards"):
        RankData.open(out, 2, 0)
    (out / "rank1" / "indices.bin").unlink()
    with pytest.raises(UserError, match="lacks indices.bin"):
        RankData.open(out, 3, 1)
    with pytest.raises(UserError, match="already holds shards"):
        write_shards(fennel16, 3, out, progress=False)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "precious.txt").write_text("x")
    with pytest.raises(UserError, match="not a shards directory"):
        write_shards(fennel16, 3, tmp_path / "plain", force=True, progress=False)
    assert (tmp_path / "plain" / "precious.txt").read_text() == "x"
    capsys.readouterr()
    store = tmp_path / "cli"
    assert main(["prepare", "synthetic", "--preset", "tiny", "--out", str(store), "--partitioner", "fennel",
                 "--parts", "8", "--shards", "2", "--quiet"]) == 0
    meta = json.loads((tmp_path / "cli-shards2" / "shards.json").read_text())
    assert meta["world"] == 2 and meta["bounds"][-1] == open_store(store).num_nodes
    assert main(["prepare", "synthetic", "--preset", "tiny", "--out", str(tmp_path / "none"), "--shards", "2"]) == 2
    assert "--shards 2 needs at least as many partitions" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "cli-shards2"), "--epochs", "1", "--no-progress"]) == 2
    assert "holds per-rank shards" in capsys.readouterr().err, "one process on shards: told to use torchrun"


@pytest.mark.parametrize("passes", [1.0, 1.5])
def test_hierbatching_per_rank_trains_inside_its_own_megabatches(fennel16, passes):
    """A rank's HierBatching: each of its training nodes p times
    (floor(p) passes, then part of one more); a batch's sample stays inside its mega-batch ∪ static rows,
    all the rank's own, whose gathered rows are the store's; the mega-batch fits the budget."""
    from oocgnn.config import TrainConfig
    from oocgnn.policies import static_ratio_for
    from oocgnn.rankplans import make_rank_plan
    from oocgnn.sampler import Sampler
    from oocgnn.shards import RankData
    # r_s 0.05 of a rank's 2,500 rows: its static rows are held and copied into each mega-batch's rows
    cfg = TrainConfig.create(store=str(fennel16.path), policy="hierbatching", batch_size=64, fanouts="5,5",
                             passes=passes, static_ratio=0.05, memory_budget="400KB", progress=False)
    oracle, counts = fennel16.reader("memory"), []
    for rank in range(2):
        data = RankData.open(fennel16.path, 2, rank)
        lists = data.lists()
        plan = make_rank_plan(cfg, data, None, lists, Sampler(lists, [5, 5], 0), None)
        assert 1 <= plan.n_d < plan.num_parts
        chunks = plan.chunks(1)
        counts.append(len(chunks))
        own = fennel16.train_idx[(fennel16.train_idx >= data.lo) & (fennel16.train_idx < data.hi)]
        seen = np.concatenate([seeds for [(_, (_, _, seeds))] in chunks])
        times = np.bincount(np.searchsorted(own, seen), minlength=len(own))
        assert times.min() >= int(passes) and times.max() <= int(np.ceil(passes)), "each node p times"
        assert len(seen) == sum(int(np.floor(passes)) * len(t) + round((passes % 1) * len(t))
                                for _, t in plan._groups(1))
        assert all(len(np.unique(seeds)) == len(seeds) <= 32 for [(_, (_, _, seeds))] in chunks)
        stages = dict.fromkeys(("load", "sample"), 0.0)
        for chunk in chunks[:6]:
            [sample], gather = plan.prepare(1, chunk, stages)
            assert np.all((sample.input_nodes >= data.lo) & (sample.input_nodes < data.hi)), "its own rows only"
            assert np.isin(sample.input_nodes, plan.visible).all()
            np.testing.assert_array_equal(gather(sample.input_nodes).numpy(), oracle.read_rows(sample.input_nodes))
        assert plan.peak_rows * data.row_bytes <= cfg.memory_budget_bytes
    # each rank its own batches (the loop pads the fewer with empty steps): as many as one process cuts
    assert sum(counts) >= int(np.ceil(passes * steps_per_epoch(len(fennel16.train_idx), 64)))
    auto = make_rank_plan(cfg.replace(static_ratio="auto"), data, None, lists,
                          Sampler(lists, [5, 5], 0), None)        # of the rank's budget and rows
    # auto: of the rank's budget and rows, halved while no part fits beside it
    r_s = static_ratio_for(400_000, (data.hi - data.lo) * data.row_bytes)
    assert auto._fit(auto.static_ratio) >= 1 and 0 < auto.static_ratio <= r_s
    assert auto.static_ratio == r_s or auto._fit(2 * auto.static_ratio) == 0
    with pytest.raises(UserError, match="memory-budget"):
        make_rank_plan(cfg.replace(memory_budget="4KB"), RankData.open(fennel16.path, 2, 0), None, lists, None, None)


@pytest.mark.parametrize("env, words", [({"RANK": "0", "WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a whole number"),
                                        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
                                        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 with WORLD_SIZE=2"),
                                        ({"RANK": "0", "WORLD_SIZE": "0"}, "RANK=0 with WORLD_SIZE=0"),
                                        ({"MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a port"),
                                        ({"RANK": "0", "WORLD_SIZE": "2"}, "the ranks did not meet"),
                                        ({"RANK": "1", "WORLD_SIZE": "2"}, "the ranks did not meet")])
def test_a_bad_distributed_environment_is_one_line_in_bounded_time(fennel16, tmp_path, env, words):
    """A rank started by hand with a broken environment, or whose peers never come: one line naming the
    variable (or the address it waited at), exit 2, within the timeout, not a torch traceback."""
    full = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1", **env}
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "oocgnn", "train", str(fennel16.path), "--distributed", "--epochs", "1",
                        "--dist-timeout", "3", "--no-progress", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, env=full, timeout=120)
    err = r.stderr.strip()
    assert r.returncode == 2 and err.count("\n") == 0 and words in err and "Traceback" not in err, err[-2000:]
    assert time.time() - t < 60
