"""Compaction of a graph of several node types and relations: after a seeded random stream of
typed updates, the compacted store holds exactly what base + log showed (each type's IDs,
features and removed IDs, each relation's edges with their features in their order, labels,
class names), a node model answers alike from either, and the new store continues the
lineage's log as a compacted one-type store does."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, open_store
from graph_assets.compact import compact, main, replay
from graph_assets.live.log_lineage import update_log_path
from graph_assets.live.operations import UpdateRejected
from graph_assets.live.overlay import GraphOverlay
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.protocol.error_table import api_error
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from tests.typed_graphs import fraud_store, node_recipe
from tests.typed_live_reference import live_nodes, random_typed_update


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_compact") / "store", 80, 15, 30, 250, 4)


def take_updates(live: LiveGraph, seed: int, count: int) -> None:
    """``count`` random typed updates, none removing a device (compaction refuses those:
    devices have no features, a model tells them apart by their index)."""
    rng, counter = random.Random(seed), [seed * 1000]
    taken = 0
    while taken < count:
        operations = random_typed_update(rng, live, counter)
        if operations[0]["type"] == "remove_node" and operations[0]["node_type"] == "device":
            continue
        live.update(UpdateRequest(operations))
        taken += 1


def compacted(store: GraphStore, state: Path, out: Path) -> GraphStore:
    compact(replay(store.path, update_log_path(store, state)), out)
    return open_store(out)


def labels_of(overlay: GraphOverlay, nodes: np.ndarray) -> list[int]:
    stored = overlay.base.num_nodes
    return [
        int(overlay.base.labels[n]) if n < stored else overlay.new_labels[n - stored]
        for n in nodes.tolist()
    ]


def graph_as_ids(overlay: GraphOverlay) -> dict:
    """What a graph shows in external IDs only (internal numbering differs between stores):
    per type each live node's feature row and label, per relation and destination the features
    of its edges from each source in in-list order (parallel edges keep theirs), removed IDs."""
    schema = overlay.schema
    nodes: dict[str, dict] = {}
    edges: dict[tuple[str, object], dict] = defaultdict(lambda: defaultdict(list))
    for index, node_type in enumerate(schema.node_types):
        every = np.arange(overlay.num_nodes, dtype=np.int64)
        live = every[overlay.types_of(every) == index]
        live = live[overlay.lookup(overlay.external_ids(live), node_type.name) == live]
        ids = overlay.external_ids(live)
        rows = overlay.feature_rows(live).tolist() if node_type.feature_dim else [[]] * len(ids)
        labels = labels_of(overlay, live) if index == 0 else [None] * len(ids)
        nodes[node_type.name] = dict(zip(ids, zip(rows, labels, strict=True), strict=True))
        for dst, dst_id in zip(live.tolist(), ids, strict=True):
            edge_ids = overlay.in_list_edge_ids(dst)
            relations = overlay.edge_relations(edge_ids)
            sources = overlay.external_ids(overlay.in_list(dst))
            for edge_id, r, src_id in zip(
                edge_ids.tolist(), relations.tolist(), sources, strict=True
            ):
                row = overlay.edge_feature_rows(np.array([edge_id], dtype=np.int64))[0]
                edges[(schema.relations[r].name, dst_id)][src_id].append(row.tolist())
    return {
        "nodes": nodes,
        "edges": {key: dict(value) for key, value in edges.items()},
        "class_names": overlay.base.class_names,
        "num_classes": overlay.base.num_classes,
    }


def answers(store: GraphStore, live: LiveGraph | None, arch: str, ids: list) -> np.ndarray:
    """The recipe's probabilities for the users ``ids`` with full neighbourhoods."""
    settings = ServingSettings.from_yaml_section({"fanouts": [-1, -1]})
    model = node_recipe(store, arch, hidden=8)
    engine = NodeClassificationEngine.create(
        store, model, settings, torch.device("cpu"), "1.0", live
    )
    served = []
    for start in range(0, len(ids), 20):
        (answer,) = engine.handle([{"body": {"node_ids": ids[start : start + 20]}}])
        assert answer.status == 200, answer.body
        served += [p["probabilities"] for p in answer.body["predictions"]]
    return np.array(served)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_compacted_store_holds_what_base_and_log_showed(store, tmp_path, seed):
    live = LiveGraph(store, update_log_path(store, tmp_path / "state"))
    take_updates(live, seed, 80)
    new = compacted(store, tmp_path / "state", tmp_path / "v2")
    assert new.checksum != store.checksum and new.folded_seq == 80
    assert new.schema.node_type_names == store.schema.node_type_names
    assert new.schema.edge_type_names == store.schema.edge_type_names
    assert graph_as_ids(GraphOverlay(new)) == graph_as_ids(live.overlay)
    removed = sorted(live.overlay.removed)
    assert removed, "the stream removes nodes"
    types = live.overlay.types_of(np.array(removed))
    for node, index in zip(removed, types.tolist(), strict=True):
        name = store.schema.node_types[index].name
        [node_id] = live.overlay.external_ids(np.array([node]))
        assert new.was_removed(node_id, name) and new.lookup([node_id], name)[0] == -1
    live.close()


@pytest.mark.parametrize("arch", ["sage", "rgcn"])
def test_a_node_model_answers_alike_from_base_and_log_and_from_the_compacted_store(
    store, tmp_path, arch
):
    live = LiveGraph(store, update_log_path(store, tmp_path / "state"))
    take_updates(live, 7, 80)
    new = compacted(store, tmp_path / "state", tmp_path / "v2")
    ids = live.overlay.external_ids(live_nodes(live, 0))
    before = answers(store, live, arch, ids)
    after = answers(new, None, arch, ids)
    assert float(np.abs(before - after).max()) <= 1e-5
    assert (before.argmax(axis=1) == after.argmax(axis=1)).all()
    live.close()


def test_the_compacted_store_continues_the_lineage_log(store, tmp_path):
    """Updates through either version reach the other; compacting again keeps the one log; a
    removed ID of any type stays refused."""
    state = tmp_path / "state"
    old = LiveGraph(store, update_log_path(store, state))
    take_updates(old, 5, 40)
    new_store = compacted(store, state, tmp_path / "v2")
    new = LiveGraph(new_store, update_log_path(new_store, state))
    assert new.log is not None and old.log is not None and new.log.path == old.log.path
    assert new.overlay.is_empty and new.overlay.seq == 40
    take_updates(old, 6, 15)
    take_updates(new, 8, 15)
    old.sync()
    new.sync()
    assert old.overlay.seq == new.overlay.seq == 70
    assert graph_as_ids(new.overlay) == graph_as_ids(old.overlay)
    third = compacted(new_store, state, tmp_path / "v3")
    assert third.update_log is not None and third.log_base == store.checksum
    assert graph_as_ids(GraphOverlay(third)) == graph_as_ids(new.overlay)
    merchant = int(store.tables[1].ids[0])
    new.update(UpdateRequest([{"type": "remove_node", "id": merchant, "node_type": "merchant"}]))
    again = compacted(new_store, state, tmp_path / "v4")
    assert again.was_removed(merchant, "merchant")
    follower = LiveGraph(again, update_log_path(again, state))
    with pytest.raises(UpdateRejected) as refused:
        follower.update(
            UpdateRequest(
                [{"type": "add_node", "id": merchant, "x": [0.0] * 4, "node_type": "merchant"}]
            )
        )
    answer = api_error(refused.value)
    assert answer is not None and answer.status == 409 and "IDs are not reused" in answer.message
    for graph in (old, new, follower):
        graph.close()


def test_a_type_and_relations_left_empty_are_kept(tmp_path):
    """Every merchant removed: the compacted store keeps the type with no nodes and the
    payments (with their two edge-feature columns) with no edges, and the users' answers are
    still the ones base + log gave."""
    store = fraud_store(tmp_path / "store", 6, 2, 3, 5, 1)
    live = LiveGraph(store, update_log_path(store, tmp_path / "state"))
    merchants = live.overlay.external_ids(live_nodes(live, store.schema.type_index("merchant")))
    live.update(
        UpdateRequest(
            [{"type": "remove_node", "id": i, "node_type": "merchant"} for i in merchants]
        )
    )
    new = compacted(store, tmp_path / "state", tmp_path / "v2")
    assert [t.num_nodes for t in new.schema.node_types] == [6, 0, 3]
    counts = {r.name: r.num_edges for r in new.schema.relations}
    assert counts["user__pays__merchant"] == counts["merchant__rev_pays__user"] == 0
    uses = store.schema.relations[store.schema.relation_index("user__uses__device")]
    assert counts["user__uses__device"] == uses.num_edges > 0
    pays = new.schema.relations[new.schema.relation_index("user__pays__merchant")]
    assert pays.edge_feature_names == ("amount", "hour")
    assert graph_as_ids(GraphOverlay(new)) == graph_as_ids(live.overlay)
    ids = live.overlay.external_ids(live_nodes(live, 0))
    assert np.abs(answers(store, live, "sage", ids) - answers(new, None, "sage", ids)).max() < 1e-6
    live.close()


def test_removed_nodes_of_a_featureless_type_are_refused_in_one_line(store, tmp_path, capsys):
    """A model tells devices apart by their index within the type: compaction would shift it."""
    live = LiveGraph(store, tmp_path / "updates.log")
    live.update(UpdateRequest([{"type": "remove_node", "id": "d3", "node_type": "device"}]))
    live.close()
    argv = ["--store", str(store.path), "--log", str(tmp_path / "updates.log")]
    assert main([*argv, "--out", str(tmp_path / "v2")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "removed 1 device node(s) (first: 'd3')" in error
    assert not (tmp_path / "v2").exists()


def test_the_command_compacts_a_typed_store(store, tmp_path, capsys):
    live = LiveGraph(store, tmp_path / "updates.log")
    take_updates(live, 9, 20)
    live.close()
    argv = ["--store", str(store.path), "--log", str(tmp_path / "updates.log")]
    assert main([*argv, "--out", str(tmp_path / "v2")]) == 0
    new = open_store(tmp_path / "v2")
    out = capsys.readouterr().out
    assert f"{new.num_nodes} nodes, {new.num_edges} edges" in out and "at seq 21" in out
