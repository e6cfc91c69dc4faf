"""Graph classification datasets: input tables, validation, store, synthetic motifs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graph_assets import GraphInputError
from graph_assets.__main__ import main
from graph_assets.graph_dataset import (
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
    assert edge_index.tolist() == [[1, 0], [0, 1]]  # y->x, x->y; self-loop and duplicate gone
    x, edge_index = dataset.graph(1)  # molB: c1, c2
    assert x.tolist() == [[1, 0], [2, 2]] and edge_index.tolist() == [[1], [0]]
    assert dataset.stats == {
        "input_edges": 5,
        "self_loops_dropped": 1,
        "duplicate_edges_dropped": 1,
    }


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
