"""1 vs 2 ranks under torchrun on one machine, and a projection of the exchange to R = 2..64 ranks.

On the store data/<preset>-<partitioner><parts> (prepared when missing), trains with
`torchrun --standalone --nproc-per-node R -m oocgnn train STORE --distributed` for R = 1 and 2
(gloo on the CPU, or --device cuda; the same settings), and prints per run: rows and bytes exchanged,
mean epoch time, accuracy, and the 2-rank / 1-rank epoch-time ratio (on a 2-core machine expect no
speed-up: the point is correctness and traffic). The 2-rank run's executed traffic is checked against the simulator's.
Then, from the simulator alone (`distributed.simulate_exchange`: no communication), the rows and
bytes exchanged per epoch (summed over ranks) for each R in --project-ranks and k in --ks (BatchGNN
Table 5's direction: larger k, fewer rows).

    .venv/bin/python benchmarks/distributed.py [--preset small] [--parts 256] [--epochs 2]
        [--batch-size 1024] [--fanouts 10,10] [--macrobatch 4] [--project-ranks 2,4,8,16,32,64] [--ks 1,4,16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from oocgnn.benchtable import BenchTable, add_csv_argument, check_process  # noqa: E402


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def ensure_store(preset, partitioner, parts, data_dir: Path):
    from oocgnn.store import open_store
    path = data_dir / f"{preset}-{partitioner}{parts}"
    if not (path / "meta.json").is_file():
        print(f"preparing {path} ...", flush=True)
        r = subprocess.run([sys.executable, "-m", "oocgnn", "prepare", "synthetic", "--preset", preset,
                            "--partitioner", partitioner, "--parts", str(parts), "--out", str(path), "--quiet",
                            "--force"], capture_output=True, text=True, cwd=REPO)
        if r.returncode:
            raise SystemExit(f"prepare failed: {(r.stdout + r.stderr)[-2000:]}")
    return open_store(path, verify=False)


def run_ranks(store, ranks, out, args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
           "-m", "oocgnn", "train", str(store.path), "--distributed", "--out", str(out), "--force", "--no-progress",
           "--policy", args.policy, "--memory-budget", args.budget, "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--fanouts", args.fanouts, "--macrobatch", str(args.macrobatch),
           "--max-eval-nodes", str(args.eval_nodes), "--device", args.device]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    check_process(r)
    return json.loads((out / "summary.json").read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="small", help="synthetic preset of the store (tiny|small|medium|large)")
    ap.add_argument("--partitioner", default="fennel", help="partitioner of the store")
    ap.add_argument("--parts", type=int, default=256, help="partitions of the store (>= the largest R projected)")
    ap.add_argument("--policy", default="inmemory", help="per-rank policy: inmemory | macrobatch | hierbatching")
    ap.add_argument("--budget", default="256MB", help="--memory-budget of each rank")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each torchrun run")
    ap.add_argument("--batch-size", type=int, default=1024, help="global mini-batch size")
    ap.add_argument("--fanouts", default="10,10", help="sampling fanouts")
    ap.add_argument("--macrobatch", type=int, default=4, help="k of the executed runs")
    ap.add_argument("--eval-nodes", type=int, default=5000, help="--max-eval-nodes of the runs")
    ap.add_argument("--project-ranks", default="2,4,8,16,32,64", help="R of the simulated projection ('': none)")
    ap.add_argument("--ks", default="1,4,16", help="k of the simulated projection")
    ap.add_argument("--device", default="cpu", help="--device of the ranks: cpu, or cuda (each rank the GPU of its "
                                                       "local rank; ranks sharing one GPU use gloo for gradients)")
    ap.add_argument("--no-runs", action="store_true", help="only the projection (no torchrun runs)")
    ap.add_argument("--data", type=Path, default=REPO / "data", help="directory of the stores")
    add_csv_argument(ap, "bench/distributed.csv under --data")
    args = ap.parse_args(argv)
    import pandas as pd
    from oocgnn.distributed import TRAFFIC, projection, simulate_exchange

    store = ensure_store(args.preset, args.partitioner, args.parts, args.data)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    print(f"store {store.path}: N={store.num_nodes:,}, E={store.num_edges:,}, {store.num_parts} parts, "
          f"train {len(store.train_idx):,}; load {loadavg()}")
    bench = BenchTable(args.csv or args.data / "bench" / "distributed.csv")
    if not args.no_runs:
        runs = {}
        with tempfile.TemporaryDirectory(prefix="oocgnn-dist-") as tmp:
            for ranks in (1, 2):
                def one():
                    s = runs[ranks] = run_ranks(store, ranks, Path(tmp) / f"r{ranks}", args)
                    return {"ranks": ranks, "device": s["device"], "backend": s["backend"], "policy": s["policy"],
                            "k": s["macrobatch"], "epoch_s": s["epoch_s"],
                            "rows_exchanged": s["exchange"]["rows_recv"],
                            "lists_exchanged": s["exchange"]["lists_recv"],
                            "MiB_exchanged": round(s["exchange"]["bytes_recv"] / 2**20, 1),
                            "best_val": round(s["best_val_acc"], 4), "test_at_best": round(s["test_at_best_val"], 4)}

                bench.run(f"{ranks} rank{'s' if ranks > 1 else ''}", one)
        table = pd.DataFrame([{k: v for k, v in r.items() if k not in ("config", "status")}
                              for r in bench.rows if r["status"] == "ok"])
        print(f"\nexecuted ({args.epochs} epochs, batch {args.batch_size}, fanouts {args.fanouts}):")
        if not table.empty:
            print(table.to_string(index=False))
        for r in bench.failed():
            print(f"{r['config']}: {r['status']}")
        print(f"epoch time 2 ranks / 1 rank: {bench.ratio('2 ranks', '1 rank', 'epoch_s')[1]} "
              f"(2 cores shared by both ranks: no speed-up expected); load {loadavg()}")

        def check():
            sim = simulate_exchange(store, 2, args.macrobatch, args.batch_size, fanouts, epochs=args.epochs)
            return {"traffic_as_simulated": all(rk[key] == int(sim.groupby("rank")[key].sum()[rk["rank"]])
                                                for rk in runs[2]["ranks"] for key in TRAFFIC)}

        if 2 not in runs:
            print(f"2-rank traffic executed == simulated, rank by rank: {bench.na('2 ranks')}")
        elif bench.run("2-rank traffic check", check):
            same = bench.ok("2-rank traffic check")["traffic_as_simulated"]
            print(f"2-rank traffic executed == simulated, rank by rank: {same}")
    ks = [int(k) for k in args.ks.split(",")]
    worlds = [int(r) for r in args.project_ranks.split(",") if r and int(r) <= store.num_parts]
    if not worlds:
        return
    for world in worlds:                          # a row per R and k: one that fails leaves the others
        for k in ks:
            bench.run(f"projected R={world} k={k}",
                      lambda: projection(store, [world], [k], args.batch_size, fanouts).iloc[0].to_dict())
    proj = pd.DataFrame([{k: v for k, v in r.items() if k not in ("config", "status")}
                         for r in bench.rows if r["status"] == "ok" and r["config"].startswith("projected")])
    if proj.empty:
        return
    proj["GiB_per_epoch"] = (proj["bytes"] / 2**30).round(3)
    base = proj[proj.k == ks[0]].set_index("ranks")["rows"]
    proj[f"rows_vs_k{ks[0]}"] = (proj["rows"] / proj["ranks"].map(base)).round(3)
    print(f"\nsimulated exchange per epoch (summed over ranks; batch {args.batch_size}, fanouts {args.fanouts}):")
    print(proj.to_string(index=False))


if __name__ == "__main__":
    main()
