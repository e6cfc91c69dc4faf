"""Typed graphs: nodes/<type>.csv and edges/<src>__<relation>__<dst>.csv read, validated and
stored in the one store format (a global index space, target type first, in-lists grouped by
relation), with per-type IDs and features and per-relation edge features."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graph_assets import open_store, write_store
from graph_assets.errors import GraphInputError
from graph_assets.input.typed_input import read_graph
from graph_assets.schema import EdgeType, GraphSchema

USERS = "id,age,score,label\nu1,30,0.5,fraud\nu2,41,0.1,legit\nu3,25,0.9,\n"
MERCHANTS = "id,risk\n10,0.2\n20,0.7\n"
DEVICES = "id\nd-a\nd-b\n"  # a featureless type
PAYS = "src,dst,amount\nu1,10,5.0\nu2,10,7.5\nu1,20,1.0\nu1,20,2.0\n"  # a parallel edge
USES = "src,dst\nu1,d-a\nu2,d-a\nu3,d-b\n"
FOLLOWS = "src,dst\nu2,u1\nu3,u1\nu1,u1\n"  # a self-loop


def typed_graph(root: Path, **files: str) -> Path:
    """A typed graph directory; ``files`` maps ``nodes/user`` style names to CSV text."""
    defaults = {
        "nodes/user": USERS,
        "nodes/merchant": MERCHANTS,
        "nodes/device": DEVICES,
        "edges/user__pays__merchant": PAYS,
        "edges/user__uses__device": USES,
        "edges/user__follows__user": FOLLOWS,
    }
    for name, text in {**defaults, **files}.items():
        if text is None:
            continue
        file = root / f"{name}.csv"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    return root


def stored(tmp_path: Path, undirected: bool = False, **files: str):
    graph = read_graph(typed_graph(tmp_path / "graph", **files), undirected)
    write_store(graph, tmp_path / "store")
    return open_store(tmp_path / "store")


def in_edges(store, node: int) -> list[tuple[str, object, list[float]]]:
    """``(relation, source ID, edge features)`` of ``node``'s in-edges in CSC order."""
    schema: GraphSchema = store.schema
    found = []
    for edge in range(int(store.indptr[node]), int(store.indptr[node + 1])):
        relation = 0 if store.edge_type is None else int(store.edge_type[edge])
        source = int(store.indices[edge])
        [source_id] = store.external_ids(np.array([source]))
        features = store.edge_feature_rows(np.array([edge]))[0].tolist()
        found.append((schema.relations[relation].name, source_id, features))
    return found


def test_a_typed_graph_is_stored_target_first_with_its_relations(tmp_path):
    store = stored(tmp_path)
    schema = store.schema
    assert schema.target == "user" and schema.node_type_names[0] == "user"
    assert [(t.name, t.num_nodes, t.feature_dim, t.id_kind) for t in schema.node_types] == [
        ("user", 3, 2, "str"),
        ("device", 2, 0, "str"),
        ("merchant", 2, 1, "int"),
    ]
    assert schema.edge_type_names == [
        "user__follows__user",
        "user__pays__merchant",
        "user__uses__device",
    ]
    assert store.num_nodes == 7 and store.num_edges == 10
    assert store.class_names == ["fraud", "legit"] and store.labels.tolist() == [0, 1, -1]
    merchant = store.lookup([20, "10", 30], node_type="merchant")
    assert merchant.tolist() == [6, 5, -1]
    assert store.external_ids(merchant[:2]) == [20, 10]
    assert store.lookup(["u2"]).tolist() == [1] and store.lookup(["10"]).tolist() == [-1]
    assert np.allclose(store.feature_rows(np.array([6, 5])), [[0.7], [0.2]])
    assert store.feature_rows(np.array([3, 4])).shape == (2, 0)
    with pytest.raises(ValueError, match="several types"):
        store.feature_rows(np.array([0, 5]))
    assert in_edges(store, 6) == [
        ("user__pays__merchant", "u1", [1.0]),
        ("user__pays__merchant", "u1", [2.0]),
    ]
    assert in_edges(store, 0) == [
        ("user__follows__user", "u1", []),
        ("user__follows__user", "u2", []),
        ("user__follows__user", "u3", []),
    ]
    assert store.in_degree.tolist() == [3, 0, 0, 2, 1, 2, 2]


def test_relation_bounds_split_an_in_list_by_relation(tmp_path):
    """Two relations into users: follows and rev_follows... here pays back into users."""
    store = stored(tmp_path, **{"edges/merchant__refunds__user": "src,dst\n10,u1\n20,u1\n"})
    schema = store.schema
    into = schema.relations_into("user")
    assert [schema.relations[r].name for r in into] == [
        "merchant__refunds__user",
        "user__follows__user",
    ]
    bounds = store.relation_bounds[0]
    assert bounds.tolist()[0] == [0, 2, 5]  # u1: 2 refunds, then 3 follows
    assert [kind for kind, _, _ in in_edges(store, 0)] == ["merchant__refunds__user"] * 2 + [
        "user__follows__user"
    ] * 3
    reopened = open_store(store.path)
    assert reopened.checksum == store.checksum


def test_undirected_adds_reverse_relations_and_same_type_reverses(tmp_path):
    store = stored(tmp_path, undirected=True)
    names = store.schema.edge_type_names
    assert "merchant__rev_pays__user" in names and "device__rev_uses__user" in names
    assert "user__rev_follows__user" not in names
    follows = store.schema.relations[names.index("user__follows__user")]
    assert follows.num_edges == 5  # 3 given, 2 reverses (the self-loop once)
    rev_pays = in_edges(store, 0)
    assert ("merchant__rev_pays__user", 20, [2.0]) in rev_pays
    assert store.meta["stats"]["undirected"] is True


@pytest.mark.parametrize(
    ("files", "where", "words"),
    [
        ({"edges/user__pays__shop": "src,dst\nu1,1\n"}, "user__pays__shop.csv", "'shop'"),
        ({"edges/user_pays_merchant": "src,dst\nu1,10\n"}, "user_pays_merchant", "src_type"),
        ({"edges/user__pays__merchant": "src,dst\nu1,99\n"}, "row 1", "99"),
        ({"edges/user__pays__merchant": "src,dst,amount\nu1,10,x\n"}, "row 1", "amount"),
        ({"nodes/user": "id,age\nu1,1\nu1,2\n"}, "row 2", "duplicate node id"),
        ({"nodes/merchant": "id,risk,label\n10,0.2,a\n20,0.7,b\n"}, "nodes/", "merchant, user"),
        ({"nodes/user": "id,age\n"}, "nodes/user.csv", "no rows"),
    ],
)
def test_bad_typed_input_names_the_file_and_the_problem(tmp_path, files, where, words):
    with pytest.raises(GraphInputError) as error:
        read_graph(typed_graph(tmp_path, **files))
    assert where in str(error.value) and words in str(error.value)


def test_the_target_type_is_chosen_or_given(tmp_path):
    root = typed_graph(tmp_path)
    assert read_graph(root, target_node_type="merchant").target == "merchant"
    with pytest.raises(GraphInputError, match="the node types are device, merchant, user"):
        read_graph(root, target_node_type="card")


def test_edge_type_names_round_trip_and_refuse_separators():
    edge_type = EdgeType.parse("user__part-of__group")
    assert edge_type.triple == ("user", "part-of", "group")
    assert edge_type.reverse().name == "group__rev_part-of__user"
    with pytest.raises(ValueError, match="may not contain"):
        EdgeType("a/b", "r", "c")
    with pytest.raises(ValueError, match="<src_type>__<relation>__<dst_type>"):
        EdgeType.parse("a__b")


def test_dot_names_are_refused_at_input_in_one_line(tmp_path):
    """`.` and `..` name folders; `a.b`, `items` and `user name` are names like any other."""
    with pytest.raises(GraphInputError) as error:
        read_graph(typed_graph(tmp_path / "dot", **{"nodes/.": "id,f\n1,0\n"}))
    assert str(error.value) == (
        "nodes/..csv: a node type name may not be '.' or '..', which name folders (this one "
        "and its parent), got '.' (the file name names the type)"
    )
    with pytest.raises(ValueError) as refused:
        EdgeType("user", "..", "merchant")
    assert str(refused.value) == (
        "a relation name may not be '.' or '..', which name folders (this one and its parent), "
        "got '..'"
    )
    graph = read_graph(
        typed_graph(
            tmp_path / "names",
            **{"nodes/a.b": DEVICES, "edges/user__uses.daily__a.b": USES},
        )
    )
    assert {"a.b", "user"} <= {t.name for t in graph.node_types}
