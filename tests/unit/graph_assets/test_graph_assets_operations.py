"""Update operations decoded once into typed records (graph_assets.live.operations): every field
checked against the graph, the canonical form the log stores (format 2, types named), records
written before (format 1) read the same, and a log of a newer format refused."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from graph_assets import GraphStore
from graph_assets.errors import UpdateLogCorrupt
from graph_assets.live.operations import (
    LOG_FORMAT,
    AddEdge,
    AddNode,
    Rejection,
    RemoveNode,
    SetEdgeFeatures,
    UpdateRejected,
    decode_operations,
    encode_operations,
)
from graph_assets.live.update_log import MAGIC, UpdateLog
from tests.edge_graph import edge_feature_store
from tests.typed_graphs import fraud_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("operations"))


def test_operations_decode_to_typed_records_of_the_graph(store):
    ids = store.external_ids(np.arange(3))
    raw = [
        {"type": "add_node", "id": "new_1", "x": [1, 2.5, 0, 0, 0, 0], "label": 1},
        {"type": "add_edge", "src": ids[0], "dst": "new_1", "attr": [3, 4]},
        {"type": "set_edge_features", "src": ids[1], "dst": ids[2], "attr": [1.0, 2.0]},
        {"type": "remove_node", "id": ids[2], "node_type": "node"},
    ]
    add, edge, features, removal = decode_operations(raw, store)
    assert isinstance(add, AddNode) and add.x.dtype == np.float32 and add.label == 1
    assert add.node_type == "node"
    assert isinstance(edge, AddEdge) and edge.attr is not None and edge.attr.tolist() == [3, 4]
    assert edge.edge_type == "node__to__node"
    assert isinstance(features, SetEdgeFeatures) and isinstance(removal, RemoveNode)
    encoded = encode_operations([add, edge, features, removal])
    assert encoded[0] == {
        "type": "add_node",
        "id": "new_1",
        "x": [1.0, 2.5, 0.0, 0.0, 0.0, 0.0],
        "label": 1,
        "node_type": "node",
    }
    assert encoded[1]["edge_type"] == "node__to__node"
    again = decode_operations(json.loads(json.dumps(encoded)), store)
    assert encode_operations(again) == encoded


@pytest.mark.parametrize(
    ("operation", "words"),
    [
        ({"type": "add_node", "id": "a", "x": [1] * 6, "node_type": "user"}, "not a node type"),
        ({"type": "remove_edge", "src": 1, "dst": 2, "edge_type": "a__b__c"}, "not an edge type"),
        ({"type": "add_node", "id": True, "x": [1] * 6}, "integer or string id"),
        ({"type": "add_node", "id": "a", "x": [1] * 5}, "list of 6 numbers"),
        ({"type": "add_node", "id": "a", "x": [1] * 5 + [float("nan")]}, "NaN"),
        ({"type": "add_node", "id": "a", "x": [1] * 6, "label": "nope"}, "not a class"),
        ({"type": "add_edge", "src": 1, "dst": 2}, "needs attr"),
        ({"type": "remove_edge", "src": None, "dst": 2}, "src must be"),
        ({"type": "teleport"}, "type is one of"),
        ({"type": "remove_node", "id": 1, "colour": "red"}, "unknown field(s) ['colour']"),
    ],
)  # fmt: skip
def test_a_malformed_operation_is_refused_naming_it(store, operation, words):
    with pytest.raises(UpdateRejected) as refused:
        decode_operations([{"type": "remove_node", "id": 1}, operation], store)
    assert refused.value.kind is Rejection.INVALID and refused.value.index == 1
    assert words in str(refused.value)


def test_log_records_say_their_format_and_older_ones_still_read(store, tmp_path: Path):
    log = UpdateLog.open(tmp_path / "updates.log")
    operations = [{"type": "set_features", "id": 1, "x": [0.5] * 6}]
    with log.exclusive():
        records, end = log.read_from(0, locked=True)
        log.append(operations, 1, at=end)
    payload = json.dumps({"seq": 2, "operations": operations}).encode()  # format 1: no key
    with (tmp_path / "updates.log").open("ab") as f:
        f.write(struct.pack("<4sII", MAGIC, len(payload), zlib.crc32(payload)) + payload)
    records, _ = log.read_from(0)
    assert [r.seq for r in records] == [1, 2]
    data = (tmp_path / "updates.log").read_bytes()
    length = struct.unpack("<4sII", data[:12])[1]
    assert json.loads(data[12 : 12 + length])["format"] == LOG_FORMAT
    assert [decode_operations(r.operations, store)[0].node_id for r in records] == [1, 1]
    newer = json.dumps({"seq": 3, "format": LOG_FORMAT + 1, "operations": operations}).encode()
    with (tmp_path / "updates.log").open("ab") as f:
        f.write(struct.pack("<4sII", MAGIC, len(newer), zlib.crc32(newer)) + newer)
    with pytest.raises(UpdateLogCorrupt, match="newer than this gnnserve reads"):
        log.read_from(0)
    log.close()


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    """Payments carry edge features (amount, hour), device use none."""
    return fraud_store(tmp_path_factory.mktemp("typed_operations") / "store", 10, 3, 4, 20, 0)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("add_edge", "user__uses__device has no edge features: send add_edge without attr"),
        ("set_edge_features",
         "user__uses__device has no edge features, so set_edge_features does not apply"),
    ],
)  # fmt: skip
def test_attr_on_a_relation_without_edge_features_names_those_with(typed_store, kind, expected):
    operation = {"type": kind, "edge_type": "user__uses__device", "src": "u0", "dst": "d0"}
    with pytest.raises(UpdateRejected) as refused:
        decode_operations([{**operation, "attr": [1.0]}], typed_store)
    assert refused.value.kind is Rejection.INVALID and refused.value.index == 0
    assert str(refused.value) == (
        f"operation 0: {expected} (the relations with edge features: user__pays__merchant, "
        "merchant__rev_pays__user)"
    )


def test_an_integer_beyond_float32_is_said_to_overflow_naming_its_position(store):
    x = [0, 1, 10**400, 0, 0, 0]
    with pytest.raises(UpdateRejected) as refused:
        decode_operations(
            [{"type": "remove_node", "id": 1}, {"type": "add_node", "id": "a", "x": x}], store
        )
    assert refused.value.kind is Rejection.INVALID and refused.value.index == 1
    assert str(refused.value) == (
        "operation 1: x[2] is an integer of 401 digits, which overflows float32 "
        "(±3.402823e+38); send numbers within that range"
    )
