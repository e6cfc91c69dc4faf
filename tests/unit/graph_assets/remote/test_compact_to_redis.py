"""``python -m graph_assets.compact --redis-url URL --redis-prefix NAME``: the compacted store is
written, then loaded into a real Redis Cluster under NAME, and reads there equal the new store's;
the old graph's name is refused (it holds the graph that serving archives read)."""

from __future__ import annotations

import numpy as np
import pytest

from graph_assets import GraphStore, open_store
from graph_assets.compact import main
from graph_assets.remote import load_store, open_remote_store
from graph_assets.remote.connect import connect
from handler.live.live_graph import LiveGraph, UpdateRequest
from tests.servers.redis_cluster import LocalCluster


def test_the_compacted_store_is_loaded_under_its_new_name(
    redis_cluster: LocalCluster, typed_store: GraphStore, tmp_path, capsys: pytest.CaptureFixture
) -> None:
    live = LiveGraph(typed_store, tmp_path / "updates.log")
    live.update(
        UpdateRequest(
            [
                {"type": "add_node", "id": 9001, "x": [1.0, 2.0, 3.0, 4.0],
                 "node_type": "merchant"},
                {"type": "add_edge", "src": "u1", "dst": 9001, "edge_type": "user__pays__merchant",
                 "attr": [42.0, 7.0]},
            ]
        )
    )  # fmt: skip
    live.close()
    old = connect(redis_cluster.url, 5000)
    try:
        load_store(typed_store, old, "before", shown_url=redis_cluster.url)
    finally:
        old.close()
    argv = ["--store", str(typed_store.path), "--log", str(tmp_path / "updates.log")]
    cluster = ["--redis-url", redis_cluster.url]
    out = tmp_path / "v2"
    assert main([*argv, "--out", str(out), *cluster, "--redis-prefix", "after"]) == 0
    new = open_store(out)
    assert "prefix after" in capsys.readouterr().out
    view = open_remote_store(redis_cluster.url, "after", new.checksum, cache_mb=0, timeout_ms=2000)
    try:
        nodes = np.arange(new.num_nodes)
        assert np.array_equal(view.in_lists(nodes).indices, np.asarray(new.indices))
        assert view.external_ids(nodes) == new.external_ids(nodes)
        [merchant] = view.lookup([9001], node_type="merchant")
        assert np.array_equal(view.feature_rows(np.array([merchant])), [[1.0, 2.0, 3.0, 4.0]])
    finally:
        view.close()
    again = tmp_path / "v3"
    assert main([*argv, "--out", str(again), *cluster, "--redis-prefix", "before"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"the store at {again} is written" in error


def test_the_url_and_the_name_go_together(typed_store: GraphStore, tmp_path) -> None:
    argv = ["--store", str(typed_store.path), "--log", str(tmp_path / "updates.log")]
    with pytest.raises(SystemExit):
        main([*argv, "--out", str(tmp_path / "v2"), "--redis-url", "redis://127.0.0.1:1"])
