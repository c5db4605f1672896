"""yurtcoord's version as ``twistd yurtcoord --version`` and ``yurtcoordctl --version``
print it.

The version is the installed package's (its metadata, written from ``setup.py`` by
``pip install``), not a constant of the source: an operator asking an agent or the
tool for its version wants what was installed on the node. Both commands run only
from an installed package (the console script, the twistd plugin); a source tree
imported without installing it says so instead of naming a version it cannot know.
"""

import importlib.metadata
import platform

DISTRIBUTION = "yurtcoord"
NOT_INSTALLED = "unknown (the yurtcoord package is not installed)"


def version() -> str:
    """The version of the installed ``yurtcoord`` package; ``NOT_INSTALLED`` when its
    metadata cannot be found."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def agent_version_line() -> str:
    """What ``twistd yurtcoord --version`` prints: yurtcoord's version, then the
    Twisted and Python the agent runs on (twistd's own ``--version`` names only
    Twisted's, which says nothing of the agent deployed)."""
    from twisted import copyright

    return (f"yurtcoord {version()} (Twisted {copyright.version}, "
            f"Python {platform.python_version()})")


def ctl_version_line() -> str:
    """What ``yurtcoordctl --version`` prints: the tool's package and its version."""
    return f"yurtcoordctl (yurtcoord) {version()}"
