"""Files replaced whole or not at all.

What the agent keeps on disk between restarts (the pool's certificates, the addresses
its coordinator names last resolved to) must survive a crash or a power loss at any
moment: each file is written to a synced temporary file beside it, renamed over the
old one, and the directory is synced, so a crash leaves each file either old or new,
never partly written, and no temporary file behind.
"""

import contextlib
import os
import tempfile
from collections.abc import Mapping

__all__ = ["replace_files_atomically", "fsync_directory"]


def fsync_directory(directory: str) -> None:
    """Sync ``directory`` itself, so that renames in it survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temporary(final: str, data: bytes, mode: int) -> str:
    """A synced temporary file beside ``final`` holding ``data``; returns its path."""
    fd, path = tempfile.mkstemp(dir=os.path.dirname(final),
                                prefix=f".{os.path.basename(final)}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _remove_quietly(path)
        raise
    os.close(fd)
    return path


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def replace_files_atomically(directory: str, contents: Mapping[str, bytes],
                             mode: int = 0o600) -> None:
    """Write ``{file name: bytes}`` into ``directory`` with ``mode``: every file to a
    synced temporary first, then all renamed over the old ones, then the directory
    synced. A crash leaves each file either old or new, never partly written."""
    staged = []
    try:
        for name, data in contents.items():
            final = os.path.join(directory, name)
            staged.append((_write_temporary(final, data, mode), final))
    except BaseException:
        for temporary, _ in staged:
            _remove_quietly(temporary)
        raise
    try:
        for temporary, final in staged:
            os.replace(temporary, final)
    except BaseException:
        for temporary, _ in staged:
            _remove_quietly(temporary)
        raise
    fsync_directory(directory)
