"""share_store: one cached copy per graph checksum, safe under concurrent workers."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from graph_assets import StoreError, generate_synthetic, open_store, share_store


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
    assert first.name == open_store(store_dir).checksum
    assert (first / "features.npy").samefile(store_dir / "features.npy")
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
