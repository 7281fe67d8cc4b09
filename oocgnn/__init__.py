"""oocgnn: a workbench for out-of-core GNN training on one machine.

Modules, in data-flow order: datasets, synthetic (sources) -> partition, staticcache -> store (the
on-disk format) -> io, direct, readers (readers and their I/O accounting), memcap -> schedules,
policies (a policy is a plan: steps that say what enters and leaves memory), sampler (the sampler
and the one walk every consumer shares) -> simulate, redundancy, importance, trace, cache, belady, macrobatch,
topology (exact I/O and cache replays without reading data) -> runtime, resident, history, ahead
(sample ahead, then fetch: Ginex, BatchGNN), aggregate and models (torch-native layers on blocks),
device (where the model runs), train (the executor: the same plan for real) -> sweep, compare (every
policy at one budget), plots, widgets, reports (notebooks executed by papermill, checked by nbval) and
benchtable (benchmarks' tables). config holds the settings, cli is the `oocgnn` command. The training
path imports no dgl.
"""
import os as _os
import warnings as _warnings

_os.environ.setdefault("DGLBACKEND", "pytorch")   # for the oracle tests and METIS, which import dgl
# numba's OpenMP layer would share (and resize) the libgomp pool that torch and DGL use;
# its own workqueue layer keeps the thread counts of the three libraries independent.
_os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
_warnings.filterwarnings("ignore", message=".*CPU affinity.*")

__version__ = "0.1.0"
