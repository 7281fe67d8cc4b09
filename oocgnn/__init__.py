"""oocgnn: a workbench for out-of-core GNN training on one machine.

Modules, in data-flow order: datasets/synthetic (sources) -> store (on-disk format) ->
io (readers) -> train (policies, executor, run logs) -> plots; cli is the `oocgnn` command.
"""
import os as _os
import warnings as _warnings

_os.environ.setdefault("DGLBACKEND", "pytorch")
# numba's OpenMP layer would share (and resize) the libgomp pool that torch and DGL use;
# its own workqueue layer keeps the thread counts of the three libraries independent.
_os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
_warnings.filterwarnings("ignore", message=".*CPU affinity.*")

__version__ = "0.1.0"
