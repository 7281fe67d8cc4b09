"""An honest memory cap for page-cache baselines (e.g. an np.memmap reader).

The cap is a memory cgroup nested UNDER this process's current group (never at
the root, which would take the process out of its accounting group). Memory
cgroups count page cache as well as anonymous memory, so the limit is a total
budget: RSS allocated inside plus the file pages faulted in inside.

Caveat: pages charged before entering stay charged to the old group (v1 does not
move charges by default, ``memory.move_charge_at_immigrate=0``; v2 never moves
them). So the cap bounds only what is faulted in AFTER entering: the page cache
of data read inside (if it was not already cached, see ``drop_file_cache``)
plus new allocations. The RSS the process already had is not counted, and
neither are file pages already cached by anyone (measured: a warm 256 MiB file
read inside a 64 MiB cap peaked at 0.75 MiB), so drop the file's cache first.
"""
import atexit
import itertools
import numbers
import os
import time
from pathlib import Path

from .errors import UserError
from .io import drop_file_cache  # noqa: F401  (re-exported: caps and cache drops go together)

MIN_LIMIT = 16 * 2**20
PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTS = "/proc/self/mounts"
_counter = itertools.count()
_active = []          # caps this process created and is still inside (for atexit)


def _read(path):
    return Path(path).read_text()


def _write(path, text):
    Path(path).write_text(str(text))


def _try(fn, *args):
    """fn(*args), or None on OSError (cgroup files come and go)."""
    try:
        return fn(*args)
    except OSError:
        return None


def _locate():
    """(version, mount point, own group path) of the memory controller, or (None, None, reason)."""
    lines = [l.split(":", 2) for l in _read(PROC_CGROUP).splitlines() if l.count(":") >= 2]
    mounts = [l.split() for l in _read(PROC_MOUNTS).splitlines()]
    v1 = next((l[2] for l in lines if "memory" in l[1].split(",")), None)
    if v1 is not None:
        mnt = next((m[1] for m in mounts if m[2] == "cgroup" and "memory" in m[3].split(",")),
                   "/sys/fs/cgroup/memory")
        return "v1", mnt, v1
    v2 = next((l[2] for l in lines if l[0] == "0" and l[1] == ""), None)
    mnt = next((m[1] for m in mounts if m[2] == "cgroup2"), None)
    if v2 is None or mnt is None:
        return None, None, "no memory controller: neither a v1 ':memory:' line nor a v2 '0::' group"
    return "v2", mnt, v2


def _v2_blocker(mnt, group):
    """Why a v2 child of `group` cannot get memory.max, or None if it can (best effort).

    No-internal-processes rule: 'memory' can be enabled in a non-root group's
    subtree_control only once it holds no processes, so we go ahead only if we are
    its sole process (we move into the child first, and undo '+memory' on exit).
    """
    if "memory" not in _read(os.path.join(group, "cgroup.controllers")).split():
        return f"v2: 'memory' is not in {group}/cgroup.controllers (bound to v1 or not delegated)"
    if os.path.realpath(group) == os.path.realpath(mnt):
        return None      # the root is exempt from the rule
    procs = _read(os.path.join(group, "cgroup.procs")).split()
    if procs != [str(os.getpid())]:
        return (f"v2: {group} holds other processes ({len(procs)}); enabling 'memory' in its "
                "subtree_control would break the no-internal-processes rule")
    return None


def probe(trial=True) -> dict:
    """Can this process create a capped memory cgroup here? {possible, version, reason}.

    With `trial`, also creates and removes an empty nested group to prove write access.
    """
    version, why = None, None
    try:
        version, mnt, rel = _locate()
        group = os.path.join(mnt, rel.lstrip("/")) if version else None
        if version is None:
            why = rel
        elif not os.path.isdir(group):
            why = f"own group {group} not found"
        elif not os.access(group, os.W_OK):
            why = f"{group} is not writable"
        elif version == "v2":
            why = _v2_blocker(mnt, group)
        if why is None and trial:
            os.mkdir(test := os.path.join(group, f"oocgnn_probe_{os.getpid()}_{next(_counter)}"))
            os.rmdir(test)
    except OSError as e:
        why = f"{type(e).__name__}: {e}"
    return {"possible": why is None, "version": version,
            "reason": why or f"nested groups under {group}"}


class MemoryCap:
    """`with MemoryCap(limit_bytes) as cap:` runs the body in a nested memory cgroup.

    Never raises for an unavailable cgroup: then `cap.enforced` is False and
    `cap.reason` says why. Charges made before entering are not counted (see the
    module docstring). Child processes started inside are moved back on exit too.
    """

    def __init__(self, limit_bytes, name=None):
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, numbers.Integral) \
                or limit_bytes < MIN_LIMIT:
            raise UserError(f"memory cap must be an int >= {MIN_LIMIT} bytes (16 MiB), got {limit_bytes!r}")
        self.limit = int(limit_bytes)
        self.name = f"{name or 'oocgnn'}_{os.getpid()}_{next(_counter)}"
        self.enforced, self.reason, self.version, self.path = False, "not entered", None, None
        self._home = self._mnt = None
        self._pid, self._final = os.getpid(), {}

    def _f(self, name):
        return os.path.join(self.path, name)

    def __enter__(self):
        p = probe(trial=False)
        self.version, self.reason = p["version"], p["reason"]
        if not p["possible"]:
            return self
        _, self._mnt, rel = _locate()
        self._home = os.path.join(self._mnt, rel.lstrip("/"))
        self.path = os.path.join(self._home, self.name)
        try:
            os.mkdir(self.path)
            if not os.path.exists(self._f("cgroup.procs")):   # the kernel adds it in a cgroupfs
                os.rmdir(self.path)
                raise OSError(f"{self._home} is not a cgroup filesystem")
        except OSError as e:
            self.reason, self.path = f"cannot create {self.path}: {e}", None
            return self
        try:   # v1: no charges move with us (move_charge_at_immigrate stays 0)
            if self.version == "v1":
                _write(self._f("memory.limit_in_bytes"), self.limit)
                # no swap escape; set after limit_in_bytes (memsw must be >= it); optional
                _try(_write, self._f("memory.memsw.limit_in_bytes"), self.limit)
                _write(self._f("cgroup.procs"), os.getpid())        # moves all threads
            else:
                _write(self._f("cgroup.procs"), os.getpid())   # first: home must be empty
                _write(os.path.join(self._home, "cgroup.subtree_control"), "+memory")
                _write(self._f("memory.max"), self.limit)
            if _locate()[2].rstrip("/").rsplit("/", 1)[-1] != self.name:
                raise OSError("the process did not move into the group")
        except OSError as e:
            self.reason = f"cannot cap {self.path}: {e}"
            self._leave()
            return self
        self.enforced, self.reason = True, f"{self.version} memory cgroup {self.path}"
        _active.append(self)
        return self

    def __exit__(self, *exc):
        if self.path and os.getpid() == self._pid:       # never from a forked child
            if not self._final:
                self._final = {"usage": self.usage(), "peak": self.peak(), "failcnt": self.failcnt()}
            self._leave()
            if self in _active and not os.path.isdir(self.path):
                _active.remove(self)
        return False

    def _leave(self):
        """Move every process here back home (v2: undo +memory), then rmdir with retries."""
        if self.version == "v2" and os.path.realpath(self._home) != os.path.realpath(self._mnt):
            _try(_write, os.path.join(self._home, "cgroup.subtree_control"), "-memory")
        for pid in (_try(_read, self._f("cgroup.procs")) or str(os.getpid())).split():
            _try(_write, os.path.join(self._home, "cgroup.procs"), pid)
        for i in range(10):
            try:
                return os.rmdir(self.path)
            except FileNotFoundError:
                return
            except OSError as e:
                if i == 9:
                    self.reason += f"; could not remove {self.path}: {e}"
                time.sleep(0.05 * (i + 1))

    def set_limit(self, limit_bytes):
        """Change the limit while inside, e.g. once the working set has been measured.

        Raises OSError when the kernel refuses (a limit below unreclaimable usage).
        """
        limit = int(limit_bytes)
        if limit < MIN_LIMIT:
            raise UserError(f"memory cap must be >= {MIN_LIMIT} bytes (16 MiB), got {limit}")
        if self.enforced and self.version == "v1":
            files = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"]
            for name in files if limit < self.limit else files[::-1]:   # memsw >= mem at all times
                (_write if name == files[0] else lambda *a: _try(_write, *a))(self._f(name), limit)
        elif self.enforced:
            _write(self._f("memory.max"), limit)
        self.limit = limit

    def reset_peak(self):
        """Restart the high-water mark (v1; v2 keeps its peak since entering)."""
        if self.enforced and self.version == "v1":
            _try(_write, self._f("memory.max_usage_in_bytes"), 0)

    def _num(self, key, v1name, v2name):
        if self._final:
            return self._final[key]
        text = _try(_read, self._f(v1name if self.version == "v1" else v2name)) if self.path else None
        return int(text) if text and text.strip().isdigit() else None

    def usage(self):
        """Bytes currently charged to the group (page cache included); None if unknown."""
        return self._num("usage", "memory.usage_in_bytes", "memory.current")

    def peak(self):
        """High-water mark of charged bytes since entering; None if unknown (v2 < 5.19)."""
        return self._num("peak", "memory.max_usage_in_bytes", "memory.peak")

    def failcnt(self):
        """How often the limit was hit (v1 memory.failcnt, v2 memory.events 'max').

        Measured here (kernel 6.18, v1): stays 0 even while reclaim holds usage at
        the limit, so judge whether the cap bound by peak() ~= limit instead.
        """
        if self._final or self.version == "v1":
            return self._num("failcnt", "memory.failcnt", None)
        ev = _try(_read, self._f("memory.events")) if self.path else None
        ev = dict(l.split() for l in ev.splitlines()) if ev else {}
        return int(ev["max"]) if "max" in ev else None

    def record(self) -> dict:
        """JSON-able summary for a run's summary file."""
        return {"enforced": self.enforced, "reason": self.reason, "version": self.version,
                "limit": self.limit, "peak": self.peak(), "failcnt": self.failcnt()}


@atexit.register
def _cleanup():
    """Leave and remove any group this process created and did not remove yet."""
    for cap in reversed(list(_active)):
        cap.__exit__(None, None, None)
