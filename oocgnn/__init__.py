"""oocgnn: a workbench for out-of-core GNN training on one machine.

Modules, in data-flow order: datasets/synthetic (sources) -> store (on-disk format) ->
io (readers) -> train (policies, executor, run logs) -> plots; cli is the `oocgnn` command.
"""
import os as _os
import warnings as _warnings

_os.environ.setdefault("DGLBACKEND", "pytorch")
_warnings.filterwarnings("ignore", message=".*CPU affinity.*")

__version__ = "0.1.0"
