"""Keeping credentials out of what the agent shows: URLs and secret files.

A server URL may carry credentials (``https://admin:S3cret@host``); the agent refuses
them at start, and everything it prints or serves that could name a URL (configuration
errors, ``/status``, metric labels) goes through ``mask_url_credentials`` as well, so a
URL from elsewhere (a cluster's answer) does not show them either.

Key and token files are secrets of the node: one that the group or others may read is
named, with its mode, in one warning at start (``readable_by_others``).
"""

import os
import re
import stat
from typing import Optional
from urllib.parse import urlsplit

MASK = "***"
# ``scheme://userinfo@``: the userinfo of a URL, anywhere in a text.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s'\"]*@")


def url_has_credentials(url: str) -> bool:
    """Whether ``url`` has a userinfo part (``user@`` or ``user:password@``)."""
    return "@" in urlsplit(url.strip()).netloc


def mask_url_credentials(text: str) -> str:
    """``text`` with the userinfo of every URL in it replaced by ``***``."""
    return _USERINFO.sub(lambda match: f"{match.group('scheme')}{MASK}@", text)


def readable_by_others(path: str) -> Optional[int]:
    """The permission bits of the file at ``path`` when its group or others may read
    it, else None (also when it cannot be examined: reading it reports that)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return stat.S_IMODE(mode)
    return None
