"""Link requests: pair scores equal the full-graph forward; top-k is an exact search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_assets import StoreError
from model.link_assets import full_graph_embeddings, open_link_assets

from .conftest import link_engine

ARCHS = ["gcn", "sage", "gat", "gin"]


def answers(engine, payloads):
    return [(r.status, r.body) for r in engine.handle([{"body": p} for p in payloads])]


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
@pytest.mark.parametrize("arch", ARCHS)
def test_pair_scores_equal_the_full_graph_forward(int_store, tmp_path, arch, decoder):
    engine = link_engine(int_store, tmp_path, arch, decoder)
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, int_store.num_nodes, size=(40, 2))
    ids = [[int(a) * 3, int(b) * 3] for a, b in pairs]  # int_store's IDs are 3 * index
    (status, body), (single_status, single) = answers(
        engine, [{"pairs": ids}, {"src": ids[0][0], "dst": ids[0][1]}]
    )
    assert status == single_status == 200
    z = torch.from_numpy(full_graph_embeddings(engine.predictor, int_store))
    with torch.no_grad():
        expected = torch.sigmoid(engine.predictor.score(z[pairs[:, 0]], z[pairs[:, 1]]))
    served = torch.tensor([p["score"] for p in body["predictions"]])
    assert float((served - expected).abs().max()) <= 1e-5
    assert [[p["src"], p["dst"]] for p in body["predictions"]] == ids
    assert single["score"] == pytest.approx(body["predictions"][0]["score"], abs=1e-6)
    assert single["model_version"] == "1.0"


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_top_k_is_the_exact_best_of_all_candidates(str_store, tmp_path, decoder):
    engine = link_engine(str_store, tmp_path, "gcn", decoder)
    src = 0  # a hub with many in-neighbours
    z = torch.from_numpy(full_graph_embeddings(engine.predictor, str_store))
    with torch.no_grad():
        scores = torch.sigmoid(engine.predictor.score(z[src].expand_as(z), z))
    edges = str_store.edge_index()
    neighbours = set(edges[0][edges[1] == src]) | set(edges[1][edges[0] == src]) | {src}
    allowed = [i for i in range(str_store.num_nodes) if i not in neighbours]
    best = sorted(allowed, key=lambda i: -float(scores[i]))[:10]
    [(status, body)] = answers(engine, [{"src": "acct_0", "top_k": 10}])
    assert status == 200 and body["src"] == "acct_0" and body["exclude_neighbors"] is True
    served = body["recommendations"]
    assert [r["dst"] for r in served] == str_store.external_ids(np.array(best))
    assert np.allclose([r["score"] for r in served], scores[best].numpy(), atol=1e-6)


def test_top_k_can_include_neighbours_and_never_returns_the_node_itself(int_store, tmp_path):
    engine = link_engine(int_store, tmp_path)
    n = int_store.num_nodes
    [(_, body)] = answers(engine, [{"src": 0, "top_k": n, "exclude_neighbors": False}])
    assert len(body["recommendations"]) == n - 1
    assert 0 not in [r["dst"] for r in body["recommendations"]]
    [(_, excluded)] = answers(engine, [{"src": 0, "top_k": n}])
    assert len(excluded["recommendations"]) < n - 1


def test_sampled_pair_scores_do_not_depend_on_the_batch(int_store, tmp_path):
    engine = link_engine(int_store, tmp_path, fanouts=[2, 2])
    alone = answers(engine, [{"src": 3, "dst": 6}])
    batched = answers(engine, [{"pairs": [[9, 12], [0, 30]]}, {"src": 3, "dst": 6}])
    assert alone[0] == batched[1]


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        ({"src": 3}, 400, "send one of"),
        ({"src": 3, "dst": 6, "pairs": [[3, 6]]}, 400, "send one of"),
        ({"pairs": []}, 400, "empty"),
        ({"pairs": [[3, 6, 9]]}, 400, "pairs"),
        ({"src": 3, "top_k": 0}, 400, "positive"),
        ({"src": 3, "top_k": 51}, 413, "at most 50"),
        ({"src": 3, "dst": 6, "exclude_neighbors": False}, 400, "goes with top_k"),
        ({"pairs": [[3, 6]] * 9}, 413, "at most 8"),
        ({"src": 3, "dst": 4}, 404, "not in the graph: 4"),
        ({"src": 1.5, "top_k": 3}, 400, "src"),
    ],
)
def test_bad_link_requests_get_their_own_error(int_store, tmp_path, payload, status, words):
    engine = link_engine(int_store, tmp_path, max_ids_per_request=8, max_top_k=50)
    good, (code, body) = answers(engine, [{"src": 3, "dst": 6}, payload])
    assert good[0] == 200
    assert code == status and words in body["message"], body


def test_link_assets_refuse_a_different_graph(int_store, str_store, tmp_path):
    link_engine(int_store, tmp_path)
    with pytest.raises(StoreError, match="rebuild the archive"):
        open_link_assets(tmp_path / "link", str_store)


def test_a_nan_candidate_score_fails_that_top_k_alone(int_store, tmp_path):
    """A model that scores some candidate NaN is refused, never answered with fewer
    recommendations; pair scores in the same batch are answered."""
    engine = link_engine(int_store, tmp_path)
    score_against = engine.predictor.score_against

    def broken(z_src, table):
        scores = score_against(z_src, table)
        scores[7] = float("nan")
        return scores

    engine.predictor.score_against = broken
    (status, body), (pair_status, _) = answers(
        engine, [{"src": 0, "top_k": 5}, {"src": 0, "dst": 3}]
    )
    assert (status, pair_status) == (500, 200)
    assert body["type"] == "NonFiniteOutput"
    assert "non-finite output (NaN/inf) from the model for" in body["message"]
