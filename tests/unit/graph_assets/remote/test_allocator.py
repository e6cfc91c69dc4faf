"""Freed read buffers go back to the operating system: the count waits for its threshold, a
heap full of freed block-sized buffers shrinks when released (glibc), and a cold read of a
RemoteStore releases once while a warm one does not."""

from __future__ import annotations

import os

import numpy as np
import pytest

from graph_assets import GraphStore
from graph_assets.remote import allocator, load_store, open_remote_store
from graph_assets.remote.allocator import FreedBuffers
from graph_assets.remote.connect import connect
from tests.servers.redis_server import RedisServer

_MB = 1 << 20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_release_waits_for_the_threshold_then_starts_counting_again() -> None:
    freed = FreedBuffers(threshold=100)
    freed.received(60)
    freed.release()
    assert (freed.pending, freed.trims) == (60, 0)
    freed.received(40)
    freed.release()
    assert (freed.pending, freed.trims) == (0, 1)
    freed.release()  # nothing received since
    assert freed.trims == 1


@pytest.mark.skipif(allocator._TRIM is None, reason="no malloc_trim: not glibc")
def test_freed_block_buffers_pinned_in_the_heap_go_back_when_released() -> None:
    # A cold read's values: 16 KiB bytes objects (32 rows of 128 float32), with small objects
    # that stay alive between them, so that free() cannot shrink the heap from its top.
    values, pins = [], []
    for _ in range(4096):  # 64 MiB
        values.append(b"v" * (16 << 10))
        pins.append(b"p" * 1024)
    del values
    retained = _resident_bytes()
    freed = FreedBuffers(threshold=1)
    freed.received(64 * _MB)
    freed.release()
    assert freed.trims == 1
    assert retained - _resident_bytes() > 32 * _MB
    assert len(pins) == 4096


def test_a_cold_read_releases_once_and_a_warm_one_does_not(
    single_redis: RedisServer, typed_store: GraphStore
) -> None:
    client = connect(single_redis.url, 5000)
    try:
        load_store(typed_store, client, "freed", shown_url=single_redis.url, block_size=8)
    finally:
        client.close()
    view = open_remote_store(
        single_redis.url, "freed", typed_store.checksum, cache_mb=4, timeout_ms=2000
    )
    try:
        view.freed = FreedBuffers(threshold=1)
        users = np.arange(typed_store.schema.target_type.num_nodes)
        view.feature_rows(users)
        assert (view.freed.trims, view.freed.pending) == (1, 0)
        assert view.counters.bytes_read > 0
        view.feature_rows(users)  # cached: nothing received, nothing to give back
        assert view.freed.trims == 1
    finally:
        view.close()
