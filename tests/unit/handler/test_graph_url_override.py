"""``GNNSERVE_GRAPH_URL`` points an archive built with ``--graph-location redis://...`` at
another Redis (staging, production: the URL from a Kubernetes Secret) without a rebuild, under
the same ``redis[s]://host:port/NAME`` rules, with the recorded checksum still checked; a
malformed value, or one set for an archive whose graph is not in Redis, refuses the start in
one line. ``GNNSERVE_GRAPH_PASSWORD_FILE`` gives the graph's cluster its own password."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graph_assets import GraphStore, StoreError, generate_synthetic, open_store
from graph_assets.remote import RemoteGraphError, RemoteStore, load_store
from graph_assets.remote.connect import PASSWORD_FILE_VARIABLE, connect
from handler.graph.graph_source import (
    GRAPH_PASSWORD_FILE_VARIABLE,
    GRAPH_URL_VARIABLE,
    open_graph,
)
from handler.settings import ServingSettings
from tests.servers.ports import free_ports
from tests.servers.redis_server import MISSING, RedisServer, redis_server_binary

UNUSED = Path("unused")  # a graph in Redis has no directory in the archive


def graph(out: Path, seed: int) -> GraphStore:
    generate_synthetic(60, 240, out, feature_dim=4, num_classes=3, seed=seed)
    return open_store(out)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GraphStore]:
    return {
        "graph": graph(tmp_path_factory.mktemp("graph"), seed=0),
        "other": graph(tmp_path_factory.mktemp("other"), seed=1),
    }


def start_redis(home: Path) -> RedisServer:
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    return RedisServer(home).start()


def base_url(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}"


def load(server: RedisServer, store: GraphStore, prefix: str) -> None:
    client = connect(base_url(server), 2000)
    try:
        load_store(store, client, prefix, shown_url=base_url(server))
    finally:
        client.close()


@pytest.fixture(scope="module")
def production(single_redis: RedisServer, stores: dict[str, GraphStore]) -> RedisServer:
    """A Redis (the session's, tests/conftest.py) holding the graph under two names and another
    graph under a third."""
    load(single_redis, stores["graph"], "graph")
    load(single_redis, stores["graph"], "prod")
    load(single_redis, stores["other"], "other")
    return single_redis


def archive(location: str, checksum: str) -> ServingSettings:
    """The settings of an archive built with ``--graph-location location``."""
    return ServingSettings.from_yaml_section(
        {"graph_location": location, "graph_checksum": checksum, "remote_timeout_ms": 300}
    )


def staging_archive(checksum: str) -> ServingSettings:
    """An archive built against a staging Redis that this test never starts."""
    (port,) = free_ports(1)
    return archive(f"redis://127.0.0.1:{port}/graph", checksum)


@pytest.mark.parametrize("name", ["graph", "prod"])
def test_the_url_from_the_environment_replaces_the_recorded_one(
    production: RedisServer, stores: dict[str, GraphStore], name: str
) -> None:
    store = stores["graph"]
    settings = staging_archive(store.checksum)
    env = {GRAPH_URL_VARIABLE: f" {base_url(production)}/{name}\n"}
    opened = open_graph(UNUSED, settings, env)
    assert isinstance(opened, RemoteStore) and opened.checksum == store.checksum
    assert opened.keys.prefix == name and f":{production.port}" in opened.shown
    assert opened.num_nodes == store.num_nodes


def test_without_it_the_recorded_url_is_used(stores: dict[str, GraphStore]) -> None:
    settings = staging_archive(stores["graph"].checksum)
    with pytest.raises(StoreError) as refused:
        open_graph(UNUSED, settings, {GRAPH_URL_VARIABLE: "  "})
    assert str(refused.value).startswith("graph_location: Redis at redis://127.0.0.1:")


def test_the_recorded_checksum_is_still_checked(
    production: RedisServer, stores: dict[str, GraphStore]
) -> None:
    settings = staging_archive(stores["graph"].checksum)
    env = {GRAPH_URL_VARIABLE: f"{base_url(production)}/other"}
    with pytest.raises(RemoteGraphError) as refused:
        open_graph(UNUSED, settings, env)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{GRAPH_URL_VARIABLE}: ")
    assert stores["other"].checksum[:12] in message and "expected" in message


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("redis://10.0.0.5:6379", "redis://host:port/NAME"),
        ("http://10.0.0.5:6379/graph", "redis://host:port/NAME"),
        ("redis://10.0.0.5:6379/a/b", "redis://host:port/NAME"),
        ("redis://10.0.0.5:6379/graph?db=1", "redis://host:port/NAME"),
        ("redis://10.0.0.5:6379/no spaces", "prefix"),
        ("redis://:hunter22@10.0.0.5:6379/graph", "must not hold a password"),
        ("http://:hunter22@10.0.0.5/graph", "a URL holding a password"),
    ],
)
def test_a_malformed_value_refuses_the_start_in_one_line(value: str, words: str) -> None:
    settings = staging_archive("ab" * 32)
    with pytest.raises(RemoteGraphError) as refused:
        open_graph(UNUSED, settings, {GRAPH_URL_VARIABLE: value})
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{GRAPH_URL_VARIABLE}: ")
    assert words in message and "hunter22" not in message


@pytest.mark.parametrize("location", ["", "/srv/graphs/graph"])
def test_it_is_refused_for_an_archive_whose_graph_is_not_in_redis(location: str) -> None:
    section = {"graph_location": location, "graph_checksum": "ab" * 32} if location else {}
    settings = ServingSettings.from_yaml_section(section)
    with pytest.raises(StoreError) as refused:
        open_graph(UNUSED, settings, {GRAPH_URL_VARIABLE: "redis://10.0.0.5:6379/graph"})
    message = str(refused.value)
    assert "\n" not in message and "not in Redis" in message and "--graph-location" in message


def test_the_graph_may_have_its_own_password(tmp_path: Path, stores: dict[str, GraphStore]) -> None:
    """The update log's password file (GNNSERVE_REDIS_PASSWORD_FILE) names another Redis's
    password; the graph's cluster reads GNNSERVE_GRAPH_PASSWORD_FILE's."""
    server = start_redis(tmp_path / "redis")
    try:
        load(server, stores["graph"], "graph")
        admin = server.client()
        admin.config_set("requirepass", "graph-Pa55")
        admin.close()
        files = {}
        for name, secret in [("log", "log-Pa55"), ("graph", "graph-Pa55")]:
            files[name] = tmp_path / name
            files[name].write_text(secret + "\n")
            os.chmod(files[name], 0o600)
        settings = staging_archive(stores["graph"].checksum)
        env = {
            GRAPH_URL_VARIABLE: f"{base_url(server)}/graph",
            PASSWORD_FILE_VARIABLE: str(files["log"]),
        }
        with pytest.raises(StoreError) as refused:
            open_graph(UNUSED, settings, env)
        assert "\n" not in str(refused.value) and "Pa55" not in str(refused.value)
        env[GRAPH_PASSWORD_FILE_VARIABLE] = str(files["graph"])
        opened = open_graph(UNUSED, settings, env)
        assert isinstance(opened, RemoteStore) and opened.checksum == stores["graph"].checksum
    finally:
        server.stop()
