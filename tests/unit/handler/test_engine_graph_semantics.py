"""A graph with isolated nodes, self-loops, duplicate edges and unicode IDs builds and serves
with the documented semantics (docs/graph-format.md): self-loops and parallel edges are kept (the
graph as given) and counted, an isolated node is answered from its own features, and IDs are echoed
exactly and matched as exact UTF-8."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_assets import open_store, read_graph_dir, write_store

from .conftest import make_engine, random_model

IDS = ["zoë", "東京", "🚀", "e\u0301", "alone", "plain"]
# two self-loops, "東京"->"🚀" three times, "alone" has no edges at all
EDGES = [
    ("zoë", "東京"),
    ("東京", "🚀"),
    ("東京", "🚀"),
    ("東京", "🚀"),
    ("🚀", "🚀"),
    ("e\u0301", "zoë"),
    ("plain", "plain"),
    ("plain", "zoë"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("semantics")
    (root / "input").mkdir()
    rng = np.random.default_rng(3)
    rows = [
        f"{node},{','.join(f'{v:.4f}' for v in rng.normal(size=4))},{'ab'[i % 2]}"
        for i, node in enumerate(IDS)
    ]
    nodes = "id,f0,f1,f2,f3,label\n" + "\n".join(rows) + "\n"
    (root / "input" / "nodes.csv").write_text(nodes, encoding="utf-8")
    edges = "src,dst\n" + "\n".join(f"{s},{d}" for s, d in EDGES) + "\n"
    (root / "input" / "edges.csv").write_text(edges, encoding="utf-8")
    write_store(read_graph_dir(root / "input"), root / "store")
    return open_store(root / "store")


def test_self_loops_and_parallel_edges_are_kept_and_counted(store):
    stats = store.meta["stats"]
    assert stats["self_loops_kept"] == 2 and stats["duplicate_edges_kept"] == 2
    assert store.num_edges == len(EDGES)
    index = dict(zip(store.external_ids(np.arange(store.num_nodes)), range(6), strict=True))
    edges = sorted(tuple(e) for e in store.edge_index().T.tolist())
    assert edges == sorted((index[s], index[d]) for s, d in EDGES)
    assert store.in_degree[index["🚀"]] == 4  # three parallel edges and a self-loop
    assert store.in_degree[index["alone"]] == store.out_degree[index["alone"]] == 0


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_served_answers_are_the_full_graph_forward_of_the_graph_as_given(store, arch):
    model = random_model(store, arch)
    engine = make_engine(store, model=model)
    x = torch.from_numpy(np.asarray(store.features))
    with torch.no_grad():
        expected = torch.softmax(model(x, torch.from_numpy(store.edge_index())), dim=-1)
        alone_index = int(store.lookup(["alone"])[0])
        by_itself = torch.softmax(
            model(x[alone_index : alone_index + 1], torch.zeros(2, 0, dtype=torch.long)), dim=-1
        )
    responses = engine.handle([{"body": {"node_ids": IDS}}, {"body": {"node_id": "alone"}}])
    assert [r.status for r in responses] == [200, 200]
    served = responses[0].body["predictions"]
    assert [p["node_id"] for p in served] == IDS  # echoed exactly, unicode included
    order = store.lookup(IDS)
    got = torch.tensor([p["probabilities"] for p in served])
    assert float((got - expected[order]).abs().max()) <= 1e-5
    # an isolated node's answer is the model on its own features alone
    alone = torch.tensor(responses[1].body["probabilities"])
    assert float((alone - by_itself[0]).abs().max()) <= 1e-5


def test_unicode_ids_match_as_exact_utf8(store):
    engine = make_engine(store)
    nfc_e_acute = "\u00e9"  # the graph has the NFD form "e\u0301"
    responses = engine.handle(
        [{"body": {"node_id": "e\u0301"}}, {"body": {"node_id": nfc_e_acute}}]
    )
    assert [r.status for r in responses] == [200, 404]
    assert responses[0].body["node_id"] == "e\u0301"
