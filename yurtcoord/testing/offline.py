"""Configurations for agents that must start without reaching any peer.

Every peer URL is a loopback port that nothing listens on, and every directory the
agent writes to lies under the test's own directory: such an agent sends no traffic
off the machine and leaves nothing behind.
"""

import os
import socket

from yurtcoord.sim.agentini import ini_text


def closed_loopback_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def offline_ini(directory: str, node: str = "edge-1", pool: str = "pool-a",
                listen: str = "127.0.0.1:0") -> str:
    """ini text of an agent whose cloud, coordinator and etcd are all unreachable."""
    directory = os.path.abspath(directory)
    closed = f"https://127.0.0.1:{closed_loopback_port()}"
    return ini_text({
        "node": {"name": node, "pool": pool},
        "cloud": {"servers": closed},
        "coordinator": {"server": closed, "storage": closed,
                        "pki_dir": os.path.join(directory, "pki")},
        "pool_cache": {"local_cache_dir": os.path.join(directory, "cache")},
        "server": {"listen": listen},
    })


def localize_paths(ini_text: str, directory: str) -> str:

    """``ini_text`` with ``pki_dir`` and ``local_cache_dir`` moved under ``directory``."""
    directory = os.path.abspath(directory)
    lines = []
    for line in ini_text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "pki_dir":
            line = f"pki_dir = {os.path.join(directory, 'pki')}"
        elif key == "local_cache_dir":
            line = f"local_cache_dir = {os.path.join(directory, 'cache')}"
        lines.append(line)
    return "\n".join(lines) + "\n"
