"""Directories that only this user may use: the update state and the shared graph cache.

Whoever can write the update state directory controls the graph (every worker replays its log,
and the update key is checked only on requests), and whoever can write the graph cache chooses
what workers map. Both default to fixed names in the shared temp directory, where another user
could create them first. ``ensure_private_dir`` creates such a directory mode 0700, or accepts
an existing one only when it is this user's, with no access for group or others, and reached
through no symbolic link that someone else could have made or changed.

The link rule: a link in the path is followed only when nobody but root or this user could have
made or replaced it, that is when the link and the directory holding it are owned by root or by
this user and that directory is not writable by its group or others. System links (macOS's
``/tmp -> private/tmp``) and a user's own links in their own directories pass; a link planted in
a shared ``/tmp`` does not. Its target is then trusted as its maker chose it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

from graph_assets.durable import fsync_path
from graph_assets.errors import UnsafeDirectory

logger = logging.getLogger(__name__)

_SHARED = stat.S_IRWXG | stat.S_IRWXO
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def ensure_private_dir(path: Path | str) -> Path:
    """``path`` (made absolute), created 0700 with any missing parents, or checked when it exists.

    Raises `UnsafeDirectory`, one line naming the path, the problem and the fix, when it is
    another user's, writable by group or others, not a directory, or reached through an untrusted
    link. One of ours that group or others may only read or enter (made before this check
    existed) is narrowed to 0700 with a warning: nobody else could have written into it.
    """
    path = Path(path).absolute()
    for component in (*reversed(path.parents), path):
        _make_or_check_link(component, path)
    _check_private(path)
    return path


def _make_or_check_link(component: Path, path: Path) -> None:
    try:
        info = os.lstat(component)
    except FileNotFoundError:
        # Another worker may make it first: then it is checked like any existing one.
        with contextlib.suppress(FileExistsError):
            os.mkdir(component, 0o700)
            fsync_path(component.parent)  # durable, like the update log written inside it
        info = os.lstat(component)
    if stat.S_ISLNK(info.st_mode):
        holder = os.stat(component.parent)
        trusted = (0, os.geteuid())
        if (
            info.st_uid not in trusted
            or holder.st_uid not in trusted
            or holder.st_mode & _WRITABLE_BY_OTHERS
        ):
            raise UnsafeDirectory(
                f"{path}: {component} is a symbolic link that another user could have made or "
                f"changed (link owned by uid {info.st_uid}, in a directory owned by uid "
                f"{holder.st_uid}, mode {stat.S_IMODE(holder.st_mode):04o}); use the real path "
                f"{os.path.realpath(path)} if it is yours, or a directory of your own"
            )


def _check_private(path: Path) -> None:
    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory; remove it or use another path")
    if info.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}): "
            "another user made it and may have planted what it holds; remove it, or use a "
            "directory of your own"
        )
    if mode & _WRITABLE_BY_OTHERS:
        raise UnsafeDirectory(
            f"{path} is writable by its group or others (mode {mode:04o}): another user may "
            "have planted what it holds; remove it (or check its contents and chmod 700 it), "
            "or use a directory of your own"
        )
    if mode & _SHARED:
        logger.warning("%s was mode %04o: narrowed to 0700 (private to this user)", path, mode)
        os.chmod(path, 0o700)
