"""Replacing a directory safely: under a lock, in one atomic step, cleaning up after killed writers.

A writer builds its directory as `.NAME.tmp-PID` beside the target and `swap_in` puts it in place
with one `renameat2(RENAME_EXCHANGE)` (Linux), so a kill at any instant leaves the old or the new
directory at the target, never neither. Where the exchange is not supported the old directory is
first moved to `.NAME.old-PID`; if a kill falls between the two renames, the next writer (`writing`)
puts it back, and `leftovers` lets a reader report it. `writing(path)` holds an exclusive lock on
`.NAME.lock` for the whole write, so two writers of one target cannot both win.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from .errors import UserError


def temp_path(path: Path, kind: str = "tmp") -> Path:
    """`.NAME.tmp-PID` (a directory being written), `.NAME.old-PID` (the one it replaces) or
    `.NAME.prepare-PID` (`prepare`'s sorted edge runs and neighbour file while it builds the graph)."""
    return path.parent / f".{path.name}.{kind}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leftovers(path: Path) -> list[tuple[Path, str, int, bool]]:
    """(path, "tmp", "old" or "prepare", pid, pid still running) of every writer's temporary beside `path`."""
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(tmp|old|prepare)-(\d+)$")
    try:
        names = sorted(os.listdir(path.parent))
    except OSError:
        return []
    found = []
    for name in names:
        if m := pattern.match(name):
            pid = int(m.group(2))
            found.append((path.parent / name, m.group(1), pid, pid != os.getpid() and _alive(pid)))
    return found


def describe_leftovers(path: Path) -> list[str]:
    """One line per leftover of a killed writer (for `oocgnn info` and a missing store's error)."""
    lines = []
    for p, kind, pid, alive in leftovers(path):
        if alive:
            lines.append(f"{p.name}: process {pid} is writing {path.name} now")
        elif kind == "old":
            lines.append(f"{p.name}: the previous {path.name}, moved aside by a writer (pid {pid}) that was "
                         f"killed{'' if path.exists() else ' before it put the new one in place'}; the next "
                         f"write of {path.name} {'removes' if path.exists() else 'restores'} it")
        elif kind == "prepare":
            lines.append(f"{p.name}: the edge runs of a killed `prepare` of {path.name} (pid {pid}); the next "
                         f"write of {path.name} removes them")
        else:
            lines.append(f"{p.name}: an unfinished {path.name} left by a killed writer (pid {pid}); the next "
                         f"write of {path.name} removes it")
    return lines


def recover(path: Path) -> list[str]:
    """Clean dead writers' leftovers (call with the lock held): an `.old` directory is put back when
    the target is missing (a kill between the two renames), everything else is removed."""
    notes = []
    for p, kind, pid, alive in leftovers(path):
        if pid == os.getpid() or (kind == "prepare" and alive):   # a prepare sorts its edges before the lock
            continue
        if kind == "old" and not os.path.lexists(path):
            os.rename(p, path)
            notes.append(f"restored {path} from {p.name} (a writer was killed while replacing it)")
        else:
            shutil.rmtree(p, ignore_errors=True)
            notes.append(f"removed {p.name} (left by a killed writer, pid {pid})")
    return notes


@contextmanager
def writing(path: Path, what: str = "store", wait: bool = False):
    """Hold `path`'s write lock, after `recover`; yields the notes of what was cleaned up. While another
    process holds it: refused with a UserError, or with `wait` (a cache that both processes need, such as
    a store's edge buckets) waited for, saying so once on stderr; the caller then finds what it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.parent / f".{path.name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise UserError(f"another process is writing the {what} at {path} (it holds {lock}); "
                                "wait for it to finish or stop it") from None
            print(f"oocgnn: another process is writing the {what} at {path}; waiting for it", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield recover(path)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2); False where the system or filesystem cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _fsync_dir(path: Path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def swap_in(tmp: Path, path: Path):
    """Put the finished directory `tmp` at `path`: renamed there, or exchanged with the directory
    already there (then removed) so the target always holds one of them."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
    elif _exchange(tmp, path):
        shutil.rmtree(tmp)                     # now the old directory
    else:
        old = temp_path(path, "old")
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old)
    _fsync_dir(path.parent)
