"""This process's resident memory, for tests and benchmarks that bound it.

The figures come from ``/proc/self/status``: ``VmRSS`` (resident now) and ``VmHWM``
(the peak). ``reset_peak()`` makes the peak start again from the current resident
size where the kernel allows it, so that what ran before does not blur a figure.
"""


def status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(f"no {field} in /proc/self/status")


def reset_peak() -> bool:
    """Reset VmHWM to the current resident size; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        return False
    return True
