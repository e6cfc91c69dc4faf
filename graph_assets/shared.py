"""One copy of a graph for every archive version that carries the same graph files.

TorchServe unpacks each archive into its own directory, so two versions of a model would map two
copies of identical graph files and hold them twice in the page cache. ``share_store`` places a
store's files once under ``<cache_root>/<checksum>/`` (hard links where the filesystem allows,
else a copy) and every worker of every version maps them from there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from graph_assets.errors import StoreError
from graph_assets.store import META_FILE, open_store, read_meta, store_files


def share_store(store_dir: Path, cache_root: Path) -> Path:
    """Returns ``<cache_root>/<checksum>``, holding the files of ``store_dir``.

    The cached copy is reused only when its meta.json equals ``store_dir``'s byte for byte;
    ``open_store`` (with its checksum verification) then proves the arrays match that meta.
    A new entry is published only after ``store_dir`` itself opens with every check and checksum,
    so a corrupt archive fails naming its own file and never leaves a corrupt entry behind for
    the next version of the same graph to map.
    Safe when several workers start at once: the copy is built in a private directory and
    renamed into place, and a worker that loses the race uses the winner's.
    """
    store_dir = Path(store_dir)
    meta = read_meta(store_dir)
    checksum = meta["checksum"]
    meta_bytes = (store_dir / META_FILE).read_bytes()
    target = Path(cache_root) / checksum
    if target.is_dir():
        if (target / META_FILE).read_bytes() != meta_bytes:
            raise StoreError(
                f"{target} holds a different meta.json than {store_dir} for the same checksum; "
                f"delete {target} so the next worker recreates it"
            )
        return target
    open_store(store_dir, verify_checksum=True)
    Path(cache_root).mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{checksum[:12]}-", dir=cache_root))
    try:
        for name in (*store_files(meta), META_FILE):
            _link_or_copy(store_dir / name, staging / name)
        staging.chmod(0o755)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
            shutil.rmtree(staging, ignore_errors=True)  # another worker got there first
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copyfile(source, destination)
