"""Graph classification datasets: input tables, validation, store, synthetic motifs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graph_assets import GraphInputError
from graph_assets.__main__ import main
from graph_assets.input.graph_dataset import (
    MOTIFS,
    generate_graph_dataset,
    open_graph_dataset,
    read_graph_dataset,
    write_graph_dataset,
    write_graph_dataset_csv,
)


def write(directory: Path, graphs: str, nodes: str, edges: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "graphs.csv").write_text(graphs)
    (directory / "nodes.csv").write_text(nodes)
    (directory / "edges.csv").write_text(edges)
    return directory


GRAPHS = "graph_id,label\nmolA,toxic\nmolB,safe\n"
NODES = "graph_id,node_id,f0,f1\nmolB,c1,1,0\nmolA,x,0,1\nmolA,y,1,1\nmolB,c2,2,2\nmolA,z,3,3\n"
EDGES = "graph_id,src,dst\nmolA,x,y\nmolA,y,x\nmolA,z,z\nmolA,x,y\nmolB,c2,c1\n"


def test_tables_become_graphs_in_file_order(tmp_path):
    dataset = read_graph_dataset(write(tmp_path, GRAPHS, NODES, EDGES))
    assert dataset.num_graphs == 2 and dataset.class_names == ["safe", "toxic"]
    assert dataset.labels.tolist() == [1, 0]
    x, edge_index = dataset.graph(0)  # molA: nodes x, y, z in file order
    assert x.tolist() == [[0, 1], [1, 1], [3, 3]]
    # As given, sorted by (dst, src): y->x, x->y twice (parallel), the self-loop z->z.
    assert edge_index.tolist() == [[1, 0, 0, 2], [0, 1, 1, 2]]
    x, edge_index = dataset.graph(1)  # molB: c1, c2
    assert x.tolist() == [[1, 0], [2, 2]] and edge_index.tolist() == [[1], [0]]
    assert dataset.edge_feature_dim == 0 and dataset.edge_features.shape == (5, 0)
    assert dataset.stats == {
        "input_edges": 5,
        "self_loops_dropped": 0,
        "duplicate_edges_dropped": 0,
        "self_loops_kept": 1,
        "duplicate_edges_kept": 1,
    }


def test_drop_flags_drop_self_loops_and_repeats(tmp_path):
    dataset = read_graph_dataset(
        write(tmp_path, GRAPHS, NODES, EDGES), drop_self_loops=True, drop_duplicate_edges=True
    )
    assert dataset.graph(0)[1].tolist() == [[1, 0], [0, 1]]
    assert dataset.stats is not None
    assert dataset.stats["self_loops_dropped"] == 1
    assert dataset.stats["duplicate_edges_dropped"] == 1


EDGES_WITH_FEATURES = (
    "graph_id,src,dst,bond,length\nmolA,x,y,1,0.5\nmolA,y,x,2,0.25\nmolA,z,z,3,1\n"
    "molA,x,y,4,2\nmolB,c2,c1,5,3\n"
)


def test_edge_features_follow_their_edges_and_round_trip_through_the_store(tmp_path):
    dataset = read_graph_dataset(write(tmp_path / "in", GRAPHS, NODES, EDGES_WITH_FEATURES))
    assert dataset.edge_feature_names == ["bond", "length"]
    # molA sorted by (dst, src): y->x (bond 2), x->y (bonds 1 then 4, input order), z->z (3)
    assert dataset.graph_edge_attr(0).tolist() == [[2, 0.25], [1, 0.5], [4, 2], [3, 1]]
    assert dataset.graph_edge_attr(1).tolist() == [[5, 3]]
    dropped = read_graph_dataset(tmp_path / "in", drop_self_loops=True, drop_duplicate_edges=True)
    assert dropped.graph_edge_attr(0).tolist() == [[2, 0.25], [1, 0.5]]  # the first x->y kept
    undirected = read_graph_dataset(tmp_path / "in", undirected=True)
    assert undirected.graph(1)[1].tolist() == [[1, 0], [0, 1]]  # c2->c1, then c1->c2
    assert undirected.graph_edge_attr(1).tolist() == [[5, 3], [5, 3]]  # the reverse's copy
    assert undirected.num_graphs == 2 and undirected.edge_index.shape[1] == 9  # no loop twice
    meta = write_graph_dataset(dataset, tmp_path / "store")
    assert meta["edge_feature_dim"] == 2 and meta["edge_feature_names"] == ["bond", "length"]
    stored = open_graph_dataset(tmp_path / "store")
    assert stored.edge_feature_names == ["bond", "length"]
    assert np.array_equal(stored.edge_features, dataset.edge_features)
    write_graph_dataset_csv(stored, tmp_path / "csv")
    again = read_graph_dataset(tmp_path / "csv")
    assert np.array_equal(again.edge_features, dataset.edge_features)


def test_bad_edge_feature_names_its_column_and_row(tmp_path):
    edges = EDGES_WITH_FEATURES.replace("molA,z,z,3,1", "molA,z,z,3,inf")
    with pytest.raises(GraphInputError) as error:
        read_graph_dataset(write(tmp_path, GRAPHS, NODES, edges))
    assert "edges.csv row 3: edge feature 'length' is inf" in str(error.value)


def test_a_store_from_before_edge_features_opens_without_them(tmp_path):
    meta = write_graph_dataset(generate_graph_dataset(8, seed=1), tmp_path / "store")
    (tmp_path / "store" / "edge_attr.npy").unlink()
    del meta["files"]["edge_attr.npy"], meta["edge_feature_dim"], meta["edge_feature_names"]
    (tmp_path / "store" / "meta.json").write_text(json.dumps(meta))
    stored = open_graph_dataset(tmp_path / "store")
    assert stored.edge_feature_dim == 0
    assert stored.edge_features.shape == (stored.edge_index.shape[1], 0)


def test_undirected_adds_reverse_edges(tmp_path):
    dataset = read_graph_dataset(write(tmp_path, GRAPHS, NODES, EDGES), undirected=True)
    assert sorted(map(tuple, dataset.graph(1)[1].T.tolist())) == [(0, 1), (1, 0)]


@pytest.mark.parametrize(
    ("graphs", "nodes", "edges", "words"),
    [
        (GRAPHS, NODES + "molC,q,0,0\n", EDGES, "nodes.csv row 6: graph_id 'molC'"),
        (GRAPHS, NODES, EDGES + "molB,c1,x\n", "edges.csv row 6: dst 'x' is not a node of graph"),
        (GRAPHS, NODES + "molA,x,5,5\n", EDGES, "node_id 'x' appears twice"),
        (GRAPHS + "molA,safe\n", NODES, EDGES, "graphs.csv row 3: graph_id 'molA' appears"),
        (GRAPHS, NODES.replace("3,3", "nan,3"), EDGES, "nodes.csv row 5: feature 'f0' is NaN"),
        (GRAPHS + "molD,safe\n", NODES, EDGES, "graph 'molD' has no rows"),
        ("graph_id\nmolA\n", NODES, EDGES, "no 'label' column"),
    ],
)
def test_bad_input_names_file_row_and_problem(tmp_path, graphs, nodes, edges, words):
    with pytest.raises(GraphInputError) as error:
        read_graph_dataset(write(tmp_path, graphs, nodes, edges))
    assert words in str(error.value)


def test_synthetic_set_round_trips_through_csv_and_the_store(tmp_path):
    dataset = generate_graph_dataset(40, num_classes=6, feature_dim=3, seed=2)
    assert sorted(set(dataset.labels.tolist())) == list(range(6))
    assert dataset.class_names == list(MOTIFS)
    assert (dataset.x[:, 0] == 1).all()
    write_graph_dataset_csv(dataset, tmp_path / "csv")
    again = read_graph_dataset(tmp_path / "csv")
    for name in ("x", "node_ptr", "edge_index", "edge_ptr"):
        assert np.array_equal(getattr(again, name), getattr(dataset, name)), name
    assert [again.class_names[i] for i in again.labels] == [
        dataset.class_names[i] for i in dataset.labels
    ]
    meta = write_graph_dataset(dataset, tmp_path / "store")
    stored = open_graph_dataset(tmp_path / "store")
    assert meta["num_graphs"] == 40 and stored.class_names == list(MOTIFS)
    assert np.array_equal(stored.edge_index, dataset.edge_index)


def test_cli_builds_and_generates(tmp_path, capsys):
    assert main(["synthetic-graphs", "12", "--csv", str(tmp_path / "csv")]) == 0
    assert main(["graphs", "--dataset", str(tmp_path / "csv"), "--out", str(tmp_path / "s")]) == 0
    assert "12 graphs" in capsys.readouterr().out
    assert (
        main(["graphs", "--dataset", str(tmp_path / "missing"), "--out", str(tmp_path / "t")]) == 2
    )
