"""share_store: one cached copy per graph and meta.json, safe under concurrent workers, with the
entries no live worker holds removed."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from graph_assets import StoreError, generate_synthetic, open_store, share_store
from graph_assets.errors import UnsafeDirectory
from graph_assets.stored.shared import LOCK_FILE

REPO = Path(__file__).resolve().parents[3]
DEADLINE_S = 60
# A worker in another process: takes its entry, says so, and holds it until its stdin closes.
WORKER = (
    "import sys; from graph_assets import share_store; "
    "print(share_store(sys.argv[1], sys.argv[2]), flush=True); sys.stdin.read()"
)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("share") / "store"
    generate_synthetic(50, 200, path, feature_dim=4, num_classes=2)
    return path


def test_identical_graphs_share_one_directory_of_hard_links(store_dir, tmp_path):
    copy = tmp_path / "unpacked_v2"
    shutil.copytree(store_dir, copy)
    first = share_store(store_dir, tmp_path / "cache")
    second = share_store(copy, tmp_path / "cache")
    assert first == second
    assert first.name.startswith(open_store(store_dir).checksum + "-")
    assert (first / "features.0.npy").samefile(store_dir / "features.0.npy")
    assert open_store(first).num_nodes == 50


def test_different_graphs_get_different_directories(store_dir, tmp_path):
    other = tmp_path / "other"
    generate_synthetic(50, 200, other, feature_dim=4, num_classes=2, seed=1)
    assert share_store(store_dir, tmp_path / "cache") != share_store(other, tmp_path / "cache")


def test_concurrent_workers_end_with_one_copy(store_dir, tmp_path):
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(8) as pool:
        targets = set(pool.map(lambda _: share_store(store_dir, cache), range(16)))
    assert len(targets) == 1
    assert [p.name for p in cache.iterdir()] == [next(iter(targets)).name]


def test_a_cache_entry_with_another_meta_is_refused(store_dir, tmp_path):
    target = share_store(store_dir, tmp_path / "cache")
    meta = target / "meta.json"
    text = meta.read_text()
    meta.unlink()  # replace, not edit, the hard link
    meta.write_text(text.replace('"num_nodes": 50', '"num_nodes": 51'))
    with pytest.raises(StoreError, match=r"different meta\.json"):
        share_store(store_dir, tmp_path / "cache")


def test_a_version_that_only_renames_classes_gets_its_own_entry(store_dir, tmp_path):
    renamed = tmp_path / "renamed"
    shutil.copytree(store_dir, renamed)
    meta = json.loads((renamed / "meta.json").read_text())
    meta["class_names"] = ["fraud", "legit"]
    (renamed / "meta.json").write_text(json.dumps(meta))
    first = share_store(store_dir, tmp_path / "cache")
    second = share_store(renamed, tmp_path / "cache")
    assert first != second
    assert open_store(first).class_names != ["fraud", "legit"]
    assert open_store(second).class_names == ["fraud", "legit"]


def test_the_cache_root_is_created_private(store_dir, tmp_path):
    share_store(store_dir, tmp_path / "cache")
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700


def test_a_cache_root_others_can_write_is_refused(store_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)  # pre-created by someone else in a shared temp dir
    with pytest.raises(UnsafeDirectory, match="writable by its group or others"):
        share_store(store_dir, cache)
    assert list(cache.iterdir()) == []


def start_worker(store: Path, cache: Path) -> tuple[subprocess.Popen[str], Path]:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(store), str(cache)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline()  # the worker holds its entry once it prints it
    assert line, "the worker process died before it took its entry"
    return worker, Path(line.strip())


def stop_worker(worker: subprocess.Popen[str]) -> None:
    assert worker.stdin is not None
    worker.stdin.close()
    assert worker.wait(timeout=DEADLINE_S) == 0


@pytest.fixture()
def other_store(tmp_path: Path) -> Path:
    path = tmp_path / "other"
    generate_synthetic(50, 200, path, feature_dim=4, num_classes=2, seed=1)
    return path


def test_an_entry_no_live_worker_holds_is_removed(store_dir, other_store, tmp_path):
    cache = tmp_path / "cache"
    worker, old = start_worker(other_store, cache)
    stop_worker(worker)  # the only version on the old graph is gone
    ours = share_store(store_dir, cache)
    assert sorted(p.name for p in cache.iterdir()) == [ours.name]
    assert not old.exists()


def test_an_entry_a_live_worker_holds_is_kept_until_it_exits(store_dir, other_store, tmp_path):
    cache = tmp_path / "cache"
    worker, held = start_worker(other_store, cache)
    try:
        ours = share_store(store_dir, cache)
        assert sorted(p.name for p in cache.iterdir()) == sorted([ours.name, held.name])
        assert open_store(held).num_nodes == 50
    finally:
        stop_worker(worker)
    share_store(store_dir, cache)  # the next worker start removes it
    assert [p.name for p in cache.iterdir()] == [ours.name]


def wait_until_blocked_on(lock_file: Path) -> None:
    """Until some process waits for a lock on ``lock_file`` (/proc/locks marks waiters ->)."""
    inode = os.stat(lock_file).st_ino
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if "->" in fields and any(f.endswith(f":{inode}") for f in fields):
                return
        time.sleep(0.01)
    raise AssertionError(f"nobody waited for a lock on {lock_file}")


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
def test_a_worker_starting_on_an_entry_being_evicted_makes_a_fresh_one(store_dir, tmp_path):
    cache = tmp_path / "cache"
    worker, target = start_worker(store_dir, cache)
    stop_worker(worker)  # the entry is unused now
    old_lock = os.stat(target / LOCK_FILE).st_ino
    evictor = os.open(target / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(evictor, fcntl.LOCK_EX)  # an evictor found it unused and is about to move it
    started: list[Path] = []
    starting = threading.Thread(target=lambda: started.append(share_store(store_dir, cache)))
    starting.start()
    wait_until_blocked_on(target / LOCK_FILE)  # a new worker opened the entry's lock file
    os.rename(target, target.with_name(".evicted-test"))
    os.close(evictor)
    starting.join(DEADLINE_S)
    assert started == [target]
    assert os.stat(target / LOCK_FILE).st_ino != old_lock  # a fresh entry, not the evicted one
    assert open_store(target).num_nodes == 50
    assert [p.name for p in cache.iterdir()] == [target.name]  # the evicted copy is deleted
    probe = os.open(target / LOCK_FILE, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # and the new worker holds its entry
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
