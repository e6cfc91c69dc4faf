"""One copy of a graph for every archive version that carries the same graph files.

TorchServe unpacks each archive into its own directory, so two versions of a model would map two
copies of identical graph files and hold them twice in the page cache. ``share_store`` places a
store's files once under ``<cache_root>/<checksum>-<meta digest>/`` (hard links where the
filesystem allows, else a copy) and every worker of every version maps them from there. The name
covers everything a worker reads: the checksum covers the arrays, the digest of meta.json the
rest (class names), so versions that differ only there get entries of their own.

Entries nobody uses are removed. Every worker holds a shared ``flock`` on its entry's lock file
for as long as it lives (the kernel drops it when the process dies); a worker that has taken its
own entry removes every other entry whose lock it can take exclusively without waiting. An
entry is renamed away under that exclusive lock before it is deleted, and a worker re-checks,
once it holds the shared lock, that the lock file it holds is still its entry's, so a worker
never starts on an entry that is being removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from graph_assets.errors import StoreError
from graph_assets.private_dir import ensure_private_dir
from graph_assets.stored.store import META_FILE, StoreMeta, open_store, read_meta, store_files

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
_EVICTED = ".evicted-"
# The shared locks this process holds on the entries it maps: kept open for the process's life.
_held: list[int] = []


def share_store(store_dir: Path, cache_root: Path) -> Path:
    """``<cache_root>/<entry>`` with the files of ``store_dir``, locked against eviction until this
    process exits; entries no live process holds are removed.

    ``cache_root`` is created private to this user, or refused when it is not
    (graph_assets.private_dir): whoever writes it chooses what workers map. The cached copy is
    reused only when its meta.json equals ``store_dir``'s byte for byte; ``open_store`` (with its
    checksum verification) then proves the arrays match that meta.
    A new entry is published only after ``store_dir`` itself opens with every check and checksum,
    so a corrupt archive fails naming its own file and never leaves a corrupt entry behind for
    the next version of the same graph to map.
    Safe when several workers start at once: the copy is built in a private directory and
    renamed into place, and a worker that loses the race uses the winner's.
    """
    store_dir = Path(store_dir)
    root = ensure_private_dir(cache_root)
    meta = read_meta(store_dir)
    meta_bytes = (store_dir / META_FILE).read_bytes()
    target = root / entry_name(meta["checksum"], meta_bytes)
    lock = _hold(target)
    while lock is None:
        lock = _publish(store_dir, meta, target)
    if (target / META_FILE).read_bytes() != meta_bytes:
        os.close(lock)
        raise StoreError(
            f"{target} holds a different meta.json than {store_dir} although its name says they "
            f"match; delete {target} so the next worker recreates it"
        )
    _held.append(lock)
    _evict_unused(root, keep=target.name)
    return target


def entry_name(checksum: str, meta_bytes: bytes) -> str:
    """The graph checksum, then the first 16 hex digits of meta.json's SHA-256."""
    return f"{checksum}-{hashlib.sha256(meta_bytes).hexdigest()[:16]}"


def _hold(entry: Path) -> int | None:
    """A shared lock on ``entry``'s lock file, or None when there is no such entry (any more)."""
    path = entry / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits while an evictor renames the entry away
        if _is_file_at(fd, path):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def _publish(store_dir: Path, meta: StoreMeta, target: Path) -> int | None:
    """Verifies ``store_dir`` and places a copy at ``target``, returning the shared lock on it;
    None when another worker's entry took the place and was removed again before we locked it."""
    open_store(store_dir, verify_checksum=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=target.parent))
    lock = -1
    try:
        # Locked before it can be seen under its name: no evictor ever finds it unlocked.
        lock = os.open(staging / LOCK_FILE, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(lock, fcntl.LOCK_SH)
        for name in (*store_files(meta), META_FILE):
            _link_or_copy(store_dir / name, staging / name)
        os.rename(staging, target)
    except BaseException as error:
        if lock >= 0:
            os.close(lock)
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and target.is_dir():
            return _hold(target)  # another worker got there first
        raise
    return lock


def _evict_unused(root: Path, keep: str) -> None:
    """Removes the entries under ``root`` that no live process holds a shared lock on."""
    for entry in root.iterdir():
        if entry.name.startswith(_EVICTED):  # left by an evictor that died while deleting
            shutil.rmtree(entry, ignore_errors=True)
        elif not entry.name.startswith(".") and entry.name != keep:
            try:
                _evict_if_unused(entry)
            except OSError as error:  # a cache left as it was never stops a worker starting
                logger.warning("could not remove unused graph cache entry %s: %s", entry, error)


def _evict_if_unused(entry: Path) -> None:
    path = entry / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return  # not an entry of this layout (delete those by hand), or already removed
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a worker maps it
        if not _is_file_at(fd, path):
            return  # another evictor removed it, and a worker may have republished it
        trash = entry.with_name(f"{_EVICTED}{entry.name}-{secrets.token_hex(8)}")
        os.rename(entry, trash)
    finally:
        os.close(fd)
    shutil.rmtree(trash, ignore_errors=True)


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed, not replaced)."""
    try:
        at_path = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)


def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)
