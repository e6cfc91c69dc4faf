"""Which archives take live updates over a graph in Redis (handler.tasks.spec.open_updates): a
node archive does, on the update log the same store served from its directory would use, and so
does a link archive (with precomputed rows)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graph_assets.live.log_lineage import update_log_path
from graph_assets.remote import RemoteStore, load_store, open_remote_store
from graph_assets.remote.connect import connect
from handler.settings import ServingSettings
from handler.tasks.spec import open_updates
from tests.edge_graph import edge_feature_store
from tests.servers.redis_server import RedisServer

SECRET = "a-secret-of-at-least-16-chars"


@pytest.fixture(scope="module")
def remote(
    tmp_path_factory: pytest.TempPathFactory, single_redis: RedisServer
) -> Iterator[RemoteStore]:
    store = edge_feature_store(tmp_path_factory.mktemp("edges"))
    url = single_redis.url.rsplit("/", 1)[0]
    client = connect(url, 5000)
    try:
        assert load_store(store, client, "policy", shown_url=url).complete
    finally:
        client.close()
    graph = open_remote_store(url, "policy", store.checksum, cache_mb=1, timeout_ms=5000)
    try:
        yield graph
    finally:
        graph.close()


def settings(task: str, state: Path) -> ServingSettings:
    section = {"task": task, "updates_enabled": True, "update_state_dir": str(state)}
    return ServingSettings.from_yaml_section(section)


def test_a_node_archive_takes_updates_on_the_stores_log(
    remote: RemoteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    live, policy = open_updates(remote, settings("node", tmp_path))
    assert live is not None and policy.enabled
    try:
        assert live.store is remote and live.overlay.base is remote
        assert update_log_path(remote, tmp_path) == tmp_path / remote.checksum / "updates.log"
        assert update_log_path(remote, tmp_path).exists()
    finally:
        live.close()


def test_a_link_archive_takes_updates_too(
    remote: RemoteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its precomputed rows are kept in Redis beside the graph (the link task asks for them)."""
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    live, policy = open_updates(remote, settings("link", tmp_path))
    assert live is not None and policy.enabled
    try:
        assert live.overlay.base is remote
    finally:
        live.close()
