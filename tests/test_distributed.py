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

from oocgnn.distributed import (Exchange, RankFeatures, fetch_macrobatch, owner, owner_bounds, rank_batches,
                                simulate_exchange, steps_per_epoch)
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


def _fetch_worker(rank, world, port, store_path, k, out):
    import torch.distributed as dist
    from oocgnn.sampler import Sampler
    from oocgnn.store import open_store
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=60))
    store = open_store(store_path)
    b = owner_bounds(store.part_offsets, world)
    sampler = Sampler(store.neighbour_lists(), [5, 5], 0)
    ex = Exchange(b, rank, world, store.feat_dim)
    ok, oracle = True, store.reader("memory")
    for policy in ("inmemory", "macrobatch"):
        feats = RankFeatures(store, policy, b, rank, 1 << 30)
        batches = rank_batches(store.train_idx, b, rank, 64, 0, 0)
        for c in range(0, len(batches), k):
            samples = [sampler.sample(s, 0, i * world + rank) for i, s in enumerate(batches[c:c + k], start=c)]
            mb = fetch_macrobatch(samples, feats, ex)
            for s in samples:        # oracle: the store's own rows, read directly
                ok &= torch.equal(mb.gather(s.input_nodes), torch.from_numpy(oracle.read_rows(s.input_nodes)))
        feats.close()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"ok": bool(ok), **ex.record()}, f)
    dist.destroy_process_group()


def test_exchange_fetches_the_stores_rows_and_counts_what_the_simulator_predicts(fennel16, tmp_path):
    import torch.multiprocessing as mp
    world, k = 2, 3
    ctx = mp.start_processes(_fetch_worker, args=(world, _free_port(), str(fennel16.path), k, str(tmp_path / "r")),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.time() + 240
    while not ctx.join(timeout=5):
        assert time.time() < deadline, "the 2-rank exchange did not finish in time"
    sim = simulate_exchange(fennel16, world, k, 64, [5, 5], seed=0)
    for r in range(world):
        got = json.loads((tmp_path / f"r.{r}").read_text())
        assert got["ok"]
        row = sim[sim["rank"] == r].iloc[0]
        for key in ("rows_sent", "rows_recv", "bytes_sent", "bytes_recv", "exchanges"):
            assert got[key] == 2 * int(row[key]), key        # two policies, the same batches: twice the epoch


def _torchrun(store, ranks, out, *args, timeout=420):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "oocgnn", "train", str(store), "--distributed", "--out", str(out), "--no-progress",
           "--batch-size", "64", "--fanouts", "5,5", "--max-eval-nodes", "0", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_two_ranks_train_as_one_and_exchange_what_the_simulator_predicts(fennel16, tmp_path):
    epochs = 15
    one = _torchrun(fennel16.path, 1, tmp_path / "one", "--epochs", epochs)
    two = _torchrun(fennel16.path, 2, tmp_path / "two", "--epochs", epochs, "--policy", "macrobatch",
                    "--macrobatch", 4, "--memory-budget", "8MB")
    k1 = _torchrun(fennel16.path, 2, tmp_path / "k1", "--epochs", 2, "--macrobatch", 1)
    assert one["exchange"]["rows_recv"] == 0 and two["steps"] == one["steps"]
    import pandas as pd
    acc = [pd.read_csv(tmp_path / d / "log.csv")["test_acc"].iloc[-3:].mean() for d in ("one", "two")]
    assert abs(acc[0] - acc[1]) <= 0.01, acc
    assert two["best_val_acc"] > 0.5                      # it learned (8 classes)
    for run, k, ep in ((two, 4, epochs), (k1, 1, 2)):     # executed traffic = simulated, rank by rank
        sim = simulate_exchange(fennel16, 2, k, 64, [5, 5], seed=0, epochs=ep).groupby("rank").sum()
        for rank in run["ranks"]:
            for key in ("rows_sent", "rows_recv", "bytes_sent", "bytes_recv", "exchanges"):
                assert rank[key] == int(sim.loc[rank["rank"], key]), (k, key)
    # BatchGNN Table 5's direction: k = 4 moves fewer rows than k = 1 (per epoch)
    assert two["exchange"]["rows_recv"] / epochs < k1["exchange"]["rows_recv"] / 2


@pytest.mark.slow
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
    from oocgnn import cli, disttrain
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if crash_at:
        fetch, calls = disttrain.fetch_macrobatch, [0]

        def crashing(samples, features, exchange, counted=True):
            calls[0] += counted
            if calls[0] == crash_at:
                raise KeyboardInterrupt
            return fetch(samples, features, exchange, counted)
        disttrain.fetch_macrobatch = crashing
    code = cli.main(argv)
    with open(f"{result}.{rank}", "w") as f:
        f.write(str(code))


def _spawn(argv, tmp_path, name, crash_at=0, world=2):
    import torch.multiprocessing as mp
    ctx = mp.start_processes(_cli_worker, args=(world, _free_port(), argv, crash_at, str(tmp_path / name)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.time() + 300
    while not ctx.join(timeout=5):
        assert time.time() < deadline, f"{name}: the ranks did not finish in time"
    return [int((tmp_path / f"{name}.{r}").read_text()) for r in range(world)]


@pytest.mark.slow
def test_a_killed_distributed_run_resumes_to_the_same_log(fennel16, tmp_path):
    import pandas as pd
    common = ["train", str(fennel16.path), "--distributed", "--no-progress", "--epochs", "2", "--batch-size", "64",
              "--fanouts", "5,5", "--macrobatch", "2", "--checkpoint-every", "5", "--max-eval-nodes", "200"]
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
