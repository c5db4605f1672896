"""etcd releases with defects an operator of the pool must hear about.

etcd 3.5.0 to 3.5.2 can restart after a kill without writes they had acknowledged; the
pool store's health check warns in the log that such a pool etcd should be upgraded.
See docs/design.md, "etcd that forgets acknowledged writes".
"""

import re

__all__ = ["parse_version", "loses_acknowledged_writes_on_kill", "version_warning"]

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of ``"3.5.1"`` (``v`` prefix and suffixes allowed),
    or None when ``text`` is not such a version."""
    match = _VERSION.match(text or "")
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def loses_acknowledged_writes_on_kill(version: str | None) -> bool:
    """True for etcd 3.5.0 to 3.5.2 (see docs/design.md, "etcd that forgets
    acknowledged writes")."""
    parsed = parse_version(version)
    return parsed is not None and (3, 5, 0) <= parsed < (3, 5, 3)


def version_warning(version: str | None) -> str | None:

    """What an operator must know about an etcd reporting ``version``, or None."""
    if loses_acknowledged_writes_on_kill(version):
        return (f"etcd {version} can lose writes it acknowledged when it is killed "
                f"(etcd-io/etcd#13766); upgrade the pool etcd to 3.5.3 or later")
    return None
