"""Durability of directory entries: a new file or directory survives a crash only once the
directory that holds it is fsync'd, not only the file itself."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Makes new entries in the directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
