"""The baselines: every row in memory, or the OS page cache over a memory map."""
from __future__ import annotations

from ..schedules import Step
from .base import _EMPTY, Plan, register


@register
class InMemoryPlan(Plan):
    """Every feature row resident (the NS baseline of HierBatching and Ginex); no budget applies."""
    listed = 0
    name, source, budgeted = "inmemory", "NS baseline", False
    tasks = ("node", "link")
    io_pattern = "nothing"

    def setup(self):
        data = ("features", "adjacency") if self.topology == "memory" else ("features",)
        return [Step(seeds=_EMPTY, enter_ranges=[(0, self.store.num_nodes)], data=data)]

    def setup_rows(self):
        return self.store.num_nodes


@register
class MmapPlan(Plan):
    """Features through np.memmap: the OS page cache is the only cache, bounded by a cgroup cap of
    budget + measured working set (`oocgnn.runtime`); the kernel decides what is read, so the
    simulator's count (every batch's rows, no cache) is an upper bound, not a prediction."""
    listed = 1
    name, source, reader, budgeted, exact_io = "mmap", "PyG+/DGL over mmap", "mmap", False, False
    tasks = ("node", "link")     # link: inmemory's batches of training edges, their rows through the map
    io_pattern = "page faults, one at a time"
