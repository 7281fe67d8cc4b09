"""Byte sizes: parse `256MB`, `1.5GiB`, `4096` and format them back; the process's peak RSS and the memory available."""
import math
import os
import re
import resource

from .errors import UserError

_UNITS = {"": 1, "B": 1,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30, '1G' -> 2**30, 4096 -> 4096."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise UserError(f"size must be >= 0, got {text}")
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise UserError(f"bad size {text!r}: use a number with an optional unit "
                        "(B, KB, MB, GB, KiB, MiB, GiB), e.g. 256MB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def format_size(n: float) -> str:
    """4.2 GiB style, for tables and messages."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _proc_kib(path, key):
    """The `key:` field of a /proc file (in kB) as bytes, or None where there is none."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss() -> int:
    """Resident set size of this process now, in bytes (0 where /proc has none)."""
    return _proc_kib("/proc/self/status", "VmRSS") or 0


def trim_heap() -> bool:
    """Hand the heap's free pages back to the OS (glibc's malloc_trim: free chunks inside the arenas too, not
    only the top), so that what a phase freed in pieces (a setup's transients, an evaluation's blocks) stops
    counting in RSS before the next phase allocates. False where there is no glibc."""
    import ctypes
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def peak_rss() -> int:
    """Peak resident set size of this process in bytes: VmHWM, else ru_maxrss.

    VmHWM belongs to this process's address space; ru_maxrss of a child also carries its
    parent's RSS at fork time (Linux keeps the larger across fork + exec).
    """
    hwm = _proc_kib("/proc/self/status", "VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def available_memory() -> int:
    """Bytes of memory available to a new allocation: /proc/meminfo's MemAvailable (free RAM plus what the
    kernel can reclaim, the page cache included), else the free pages."""
    avail = _proc_kib("/proc/meminfo", "MemAvailable")
    return avail if avail is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> bool:
    """Restart the VmHWM high-water mark at the current RSS (Linux clear_refs 5), so that
    runs in one process (sweeps, notebooks) each report their own peak. False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def three_fractions(text: str, bad: str, not_positive: str) -> tuple:
    """'A,B,C' -> three finite fractions, each > 0 (UserError `bad` for anything else, `not_positive` for a
    fraction <= 0): the shared part of `--split random:...` and `--edge-split`."""
    try:
        fracs = tuple(float(f) for f in text.split(","))
    except ValueError:
        raise UserError(bad) from None
    if len(fracs) != 3 or not all(math.isfinite(f) for f in fracs):
        raise UserError(bad)
    if min(fracs) <= 0:
        raise UserError(not_positive)
    return fracs
