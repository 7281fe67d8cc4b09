"""Where the model runs: `--device auto|cpu|cuda[:N]`, `--precision fp32|bf16`, and the runtime stage
that moves each batch to the device.

On a GPU the step's compute is ~10x cheaper than gathering its rows on the CPU (the GPU box's
measurements, `shared/notes/gpu-box.md`), so the copy must not wait for it and the CPU must not wait
for the GPU: `HostToDevice` gathers into pinned host buffers (two, used in turn) and copies them
with `non_blocking` on a side stream, which the compute stream waits for only when it needs the
rows; the CPU meanwhile samples and gathers the next batch while the GPU still runs the previous
step (Ginex and MariusGNN pipeline the same way). `LossMeter` reads each step's loss one step
late, so that checking it does not synchronise the two. On the CPU both are pass-throughs.

Whether the copies overlap compute is measured, not assumed: CUDA events time each copy on the side
stream, the moment the compute stream is ready for it and the end of the step's compute
(`HostToDevice.step_done`); `HostToDevice.timing()` sums the copies' seconds, the part of them the
compute stream waited for, and the GPU's compute seconds.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

from .aggregate import BlockTensors
from .config import PRECISIONS
from .errors import UserError
from .units import current_rss

DEVICES = "auto | cpu | cuda | cuda:N"


def resolve_device(name: str) -> torch.device:
    """torch.device for a --device value; auto is cuda when torch sees a GPU. A cuda device that is
    not there is a UserError (one line, exit 2)."""
    name = str(name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use {DEVICES}") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"unknown device {name!r}; use {DEVICES}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise UserError(f"--device {name}: {why} (torch {torch.__version__}); use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def cuda_host_memory(device: torch.device) -> int:
    """Bytes of host memory (RSS) that CUDA itself takes in this process: its context and the libraries a
    training step loads (cuBLAS, cuSPARSE, autograd on the device), measured by using them once on a tiny
    problem; 0 on the CPU. Every GPU run carries it whatever its policy, like the interpreter: it is reported
    beside the peak RSS, not charged to the memory budget. Measured at a process's first call (make it
    before anything else touches the GPU), the same number after."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    if _CUDA_HOST:
        return _CUDA_HOST[0]
    before = current_rss()
    with warnings.catch_warnings():                     # torch's "sparse CSR is in beta"
        warnings.simplefilter("ignore")
        w = torch.ones(8, 8, device=device, requires_grad=True)
        a = torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), torch.ones(2), (2, 8)).to(device)
        x = torch.ones(8, 8, device=device).index_add_(0, torch.tensor([0], device=device),
                                                      torch.ones(1, 8, device=device))
        (a @ (x @ w)).sum().backward()
        torch.cuda.synchronize(device)
    _CUDA_HOST.append(max(0, current_rss() - before))
    return _CUDA_HOST[0]


_CUDA_HOST = []                                         # the process's measurement


def autocast(device: torch.device, precision: str):
    """The forward pass's precision: bf16 autocast (matmuls in bfloat16, sums in float32), or none."""
    if precision not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def blocks_of(ctx) -> list:
    """The blocks a batch's model input runs on: a list of blocks, or a history plan's pruned blocks."""
    return ctx if isinstance(ctx, list) else ctx.pruned_blocks


class HostToDevice:
    """Moves a batch (input rows, blocks) to the model's device. `buffer(n, d)` is a pinned host
    tensor to gather into; `__call__` copies on a side stream and makes the compute stream wait for it."""

    def __init__(self, device: torch.device, slots: int = 2):
        self.device = torch.device(device)
        self.on_gpu = self.device.type == "cuda"
        self.bytes = 0                                  # copied host -> device
        self.copy_s = self.copy_waited_s = self.compute_s = 0.0
        self.steps_timed = 0
        if self.on_gpu:
            self.stream = torch.cuda.Stream(self.device)
            self._pinned = [None] * slots               # pinned host buffers, used in turn
            self._done = [None] * slots                 # the event after each buffer's last copy
            self._turn = 0
            self._copy = None                           # the last copy's (start, done, compute ready) events
            self._unread = []                           # (start, done, ready, step end) not yet read

    @property
    def pinned_bytes(self) -> int:
        return sum(b.nbytes for b in self._pinned if b is not None) if self.on_gpu else 0

    def buffer(self, n: int, d: int, dtype=torch.float32) -> torch.Tensor | None:
        """A pinned [n, d] host tensor of `dtype` free to write (its previous copy has finished), or None
        on the CPU (gather as usual)."""
        if not self.on_gpu:
            return None
        k = self._turn
        if self._done[k] is not None:
            self._done[k].synchronize()
        buf = self._pinned[k]
        if buf is None or buf.shape[0] < n or buf.shape[1] != d or buf.dtype != dtype:
            rows = max(n, int(1.25 * buf.shape[0]) if buf is not None and buf.dtype == dtype else n)
            self._pinned[k] = buf = torch.empty((rows, d), dtype=dtype, pin_memory=True)
        return buf[:n]

    def __call__(self, tensors, blocks) -> list:
        """`tensors` (input rows, labels) on the device, and every block's tensors (kept on the block),
        copied on the side stream; the compute stream waits for them."""
        if not self.on_gpu:
            return list(tensors)
        compute = torch.cuda.current_stream(self.device)
        start, done, ready = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            moved = [t.to(self.device, non_blocking=True) for t in tensors]
            graphs = [BlockTensors.of(b, self.device, non_blocking=True) for b in blocks]
            done.record(self.stream)
        self._done[self._turn] = done
        self._turn = (self._turn + 1) % len(self._pinned)
        ready.record(compute)                           # the compute stream has done all before this step
        compute.wait_event(done)
        self._copy = (start, done, ready)
        for t in moved + [a for g in graphs for a in (g.indptr, g.indices)]:
            t.record_stream(compute)                    # allocated on the side stream, used on compute
            self.bytes += t.nbytes
        return moved

    def step_done(self):
        """After a training step's compute is queued: ends the timing of its copy (no-op on the CPU)."""
        if not self.on_gpu or self._copy is None:
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record(torch.cuda.current_stream(self.device))
        self._unread.append((*self._copy, end))
        self._copy = None
        self._read(wait=False)

    def _read(self, wait: bool):
        """Sums the timings of the finished steps (all of them, waiting, when `wait`)."""
        while self._unread and (wait or self._unread[0][3].query()):
            start, done, ready, end = self._unread.pop(0)
            end.synchronize()
            copy = start.elapsed_time(done) / 1e3
            waited = min(copy, max(0.0, ready.elapsed_time(done) / 1e3))   # compute stream idle on the copy
            self.copy_s += copy
            self.copy_waited_s += waited
            self.compute_s += max(0.0, (ready.elapsed_time(end) / 1e3) - waited)
            self.steps_timed += 1

    def timing(self) -> dict:
        """The run's copies measured on the GPU: seconds copying, seconds of them the compute stream waited
        for (not overlapped), the overlapped fraction, and the compute stream's seconds of work
        (all None on the CPU)."""
        if not self.on_gpu:
            return {"copy_s": None, "copy_waited_s": None, "overlap": None, "gpu_compute_s": None,
                    "steps_timed": 0}
        self._read(wait=True)
        return {"copy_s": round(self.copy_s, 4), "copy_waited_s": round(self.copy_waited_s, 4),
                "overlap": round(1 - self.copy_waited_s / self.copy_s, 4) if self.copy_s else None,
                "gpu_compute_s": round(self.compute_s, 4), "steps_timed": self.steps_timed}


class LossMeter:
    """Training losses as floats without a device synchronisation per step: on a GPU each loss is copied
    to pinned host memory asynchronously and read at the next step (or at `flush`)."""

    def __init__(self, device: torch.device):
        self.on_gpu = torch.device(device).type == "cuda"
        self._pending = []                              # (step, epoch, host tensor, event)

    def push(self, step: int, epoch: int, loss: torch.Tensor) -> list:
        """Record this step's loss; returns [(step, epoch, value)] of the losses now known."""
        if not self.on_gpu:
            return [(step, epoch, float(loss.detach()))]
        host = torch.empty((), dtype=torch.float32, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        ready = self.flush() if self._pending else []
        self._pending.append((step, epoch, host, event))
        return ready

    def flush(self) -> list:
        """Every recorded loss not read yet, waiting for it."""
        out = []
        for step, epoch, host, event in self._pending:
            event.synchronize()
            out.append((step, epoch, float(host)))
        self._pending.clear()
        return out
