"""Durability of files and directory entries: a new file or directory survives a crash only once the
directory that holds it is fsync'd, not only the file itself."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """Makes the file ``path`` durable, or the new entries of the directory ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
