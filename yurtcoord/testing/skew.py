"""Agents whose clocks are off: libfaketime preloaded into one ``twistd`` process.

Edge nodes cut off from the cloud lose NTP and drift, and devices without a
battery-backed clock boot minutes off. The end-to-end tests reproduce that per agent:
``skewed_clock_environment(120)`` is the environment that shifts the wall clock of the
process it is given to by +120 s (``LD_PRELOAD`` of ``libfaketime.so.1`` with
``FAKETIME``), the process itself, not a ``faketime`` wrapper that forks, so that the
signals a test sends reach the agent. The monotonic clock is left alone: only the time
that other machines see in the leases an agent writes is off.

A node's cloud lease is then judged by the increases of its renewTime that the test
sees (``yurtcoord.testing.cloudleases.CloudLeaseSampler.longest_gap``), as the node
lifecycle controller judges it, never by the time the renewTime names.
"""

import glob
import os
from typing import Dict, Optional

# Where Debian's faketime package puts the library, per architecture.
LIBFAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"


def libfaketime_path() -> Optional[str]:
    """The libfaketime to preload, None when the faketime package is not installed."""
    found = sorted(glob.glob(LIBFAKETIME_GLOB))
    return found[0] if found else None


def skewed_clock_environment(offset: float) -> Dict[str, str]:
    """Variables that shift a process's wall clock by ``offset`` seconds (whole
    seconds; negative for a clock behind). Raises RuntimeError without libfaketime."""
    library = libfaketime_path()
    if library is None:
        raise RuntimeError(f"no libfaketime at {LIBFAKETIME_GLOB} (Debian package faketime)")
    preload = " ".join(filter(None, [library, os.environ.get("LD_PRELOAD")]))
    return {"LD_PRELOAD": preload, "FAKETIME": f"{int(offset):+d}s",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DONT_RESET": "1"}
