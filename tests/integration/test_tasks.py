"""Link prediction, graph classification, embeddings, cold start and explanations through one
real TorchServe serving three archives: the node archive of conftest, a link and a graph one."""

from __future__ import annotations

import io
import json
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from graph_assets import open_store
from graph_assets.input.graph_dataset import generate_graph_dataset
from model import build_model
from model.embedding import forward_with_embedding
from tests.servers.torchserve import TorchServe, largest_batches

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(shared_server: TorchServe) -> TorchServe:
    """The session's shared server: it serves the three task archives."""
    return shared_server


def post(server: TorchServe, model: str, payload, explain: bool = False) -> requests.Response:
    path = "explanations" if explain else "predictions"
    return requests.post(
        f"{server.inference_url}/{path}/{model}",
        json=payload,
        headers=server.auth("inference"),
        timeout=60,
    )


def unpack(server: TorchServe, archive: str, directory: Path) -> tuple[torch.nn.Module, Path]:
    """The archive's model (eval mode) and the folder it was extracted to."""
    mar = zipfile.ZipFile(server.model_store / archive)
    mar.extractall(directory)
    model = build_model(json.loads(mar.read("model_config.json")))
    model.load_state_dict(torch.load(io.BytesIO(mar.read("model.pt")), weights_only=True))
    return model.eval(), directory


def full_graph(store):
    return torch.from_numpy(np.array(store.features)), torch.from_numpy(store.edge_index())


def test_link_pair_scores_equal_the_full_graph_forward(served, tmp_path):
    model, directory = unpack(served, "link.mar", tmp_path)
    store = open_store(directory / "graph")
    with torch.no_grad():
        z = model(*full_graph(store))
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, store.num_nodes, size=(48, 2))
    ids = store.external_ids(pairs.ravel())
    id_pairs = [ids[i : i + 2] for i in range(0, len(ids), 2)]
    with ThreadPoolExecutor(max_workers=6) as pool:  # several requests per TorchServe batch
        chunks = [id_pairs[i : i + 8] for i in range(0, len(id_pairs), 8)]
        responses = list(pool.map(lambda c: post(served, "link", {"pairs": c}), chunks))
    served_scores = []
    for response in responses:
        assert response.status_code == 200, response.text
        served_scores += [p["score"] for p in response.json()["predictions"]]
    with torch.no_grad():
        expected = torch.sigmoid(model.score(z[pairs[:, 0]], z[pairs[:, 1]]))
    assert float((torch.tensor(served_scores) - expected).abs().max()) <= 1e-5
    single = post(served, "link", {"src": id_pairs[0][0], "dst": id_pairs[0][1]}).json()
    assert single["src"] == id_pairs[0][0] and single["model_version"] == "1.0"


def test_link_top_k_is_the_exact_search_over_the_build_time_embeddings(served, tmp_path):
    model, directory = unpack(served, "link.mar", tmp_path)
    store = open_store(directory / "graph")
    table = torch.from_numpy(np.load(directory / "link" / "embeddings.npy"))
    src = int(store.lookup(["acct_5"])[0])
    with torch.no_grad():
        assert torch.allclose(table, model(*full_graph(store)), atol=1e-6)  # built from this graph
        scores = torch.sigmoid(model.score(table[src].expand_as(table), table))
    scores[src] = -1  # never the node itself
    response = post(served, "link", {"src": "acct_5", "top_k": 7, "exclude_neighbors": False})
    assert response.status_code == 200, response.text
    best = torch.topk(scores, 7).indices.numpy()
    assert [r["dst"] for r in response.json()["recommendations"]] == store.external_ids(best)
    refused = post(served, "link", {"src": "acct_5", "top_k": 21})
    assert refused.status_code == 413 and refused.json()["type"] == "TooLarge"
    described = requests.get(
        f"{served.management_url}/models/link?customized=true",
        headers=served.auth("management"),
        timeout=30,
    ).json()[0]["customizedMetadata"]
    assert described["task"] == "link" and described["link"]["embeddings_built_at"]


def graph_payloads(count: int, seed: int) -> list[dict]:
    dataset = generate_graph_dataset(count, seed=seed)
    return [
        {"graph": {"x": x.tolist(), "edge_index": edge_index.tolist()}}
        for x, edge_index, _ in dataset.graphs()
    ]


def test_graphs_batched_get_their_answer_alone_and_the_pyg_forward(served, tmp_path):
    model, _ = unpack(served, "graphs.mar", tmp_path)
    payloads = graph_payloads(16, seed=7)
    log = served.home / "logs" / "model_log.log"
    seen = len(log.read_text())
    with ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(lambda p: post(served, "graphs", p), payloads))
    assert max(largest_batches(log.read_text()[seen:])) > 1  # TorchServe did batch them
    for payload, response in zip(payloads[:4], together[:4], strict=False):
        alone = post(served, "graphs", payload)
        assert response.status_code == alone.status_code == 200, response.text
        assert np.allclose(
            response.json()["probabilities"], alone.json()["probabilities"], atol=1e-6
        )
        x = torch.tensor(payload["graph"]["x"])
        with torch.no_grad():
            logits = model(x, torch.tensor(payload["graph"]["edge_index"]))
        expected = torch.softmax(logits, -1)[0].numpy()
        assert np.allclose(response.json()["probabilities"], expected, atol=1e-5)
        assert response.json()["predicted_label"] in ("cycle", "star", "wheel", "ladder")
    dataset = generate_graph_dataset(16, seed=7)
    truth = [dataset.class_names[label] for label in dataset.labels]
    predicted = [r.json()["predicted_label"] for r in together]
    assert np.mean(np.array(predicted) == np.array(truth)) >= 0.5  # chance: 0.25


@pytest.mark.parametrize(
    ("graph", "status"),
    [
        ({"x": [[1.0] * 8] * 41, "edge_index": [[], []]}, 413),
        ({"x": [[1.0] * 8], "edge_index": [[0], [3]]}, 400),
        ({"x": [[1.0] * 5], "edge_index": [[], []]}, 400),
    ],
)
def test_bad_graphs_are_refused_with_their_status(served, graph, status):
    response = post(served, "graphs", {"graph": graph})
    assert response.status_code == status, response.text
    assert response.json()["code"] == status


def test_node_embeddings_and_a_cold_start_node_equal_the_full_graph_forward(served, tmp_path):
    model, directory = unpack(served, "gnn.mar", tmp_path)
    store = open_store(directory / "graph")
    x, edge_index = full_graph(store)
    with torch.no_grad():
        _, hidden = forward_with_embedding(model, x, edge_index)
    answer = post(served, "gnn", {"node_id": "acct_5", "return_embedding": True}).json()
    assert np.allclose(answer["embedding"], hidden[store.lookup(["acct_5"])[0]], atol=1e-5)
    new_x = [0.3] * store.feature_dim
    neighbours = ["acct_1", "acct_2", "acct_50"]
    response = post(served, "gnn", {"new_node": {"x": new_x, "neighbors": neighbours}})
    assert response.status_code == 200, response.text
    v, rows = store.num_nodes, torch.from_numpy(store.lookup(neighbours))
    added = torch.cat(
        [
            edge_index,
            torch.stack([rows, torch.full_like(rows, v)]),
            torch.stack([torch.full_like(rows, v), rows]),
        ],
        dim=1,
    )
    with torch.no_grad():
        expected = torch.softmax(model(torch.cat([x, torch.tensor([new_x])]), added)[-1], -1)
    assert np.allclose(response.json()["probabilities"], expected.numpy(), atol=1e-5)
    missing = post(served, "gnn", {"new_node": {"x": new_x, "neighbors": ["nobody"]}})
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("model", "payload", "key"),
    [
        ("gnn", {"node_id": "acct_5"}, "predicted_class"),
        ("link", {"src": "acct_5", "dst": "acct_9"}, "score"),
        ("graphs", None, "predicted_class"),
    ],
)
def test_the_explanations_endpoint_explains_each_task(served, model, payload, key):
    payload = payload or graph_payloads(4, seed=3)[0]
    response = post(served, model, payload, explain=True)
    assert response.status_code == 200, response.text
    body = response.json()
    assert key in body and body["model_version"] == "1.0"
    explanation = body["explanation"]
    assert explanation["method"] == "IntegratedGradients" and explanation["steps"] >= 1
    assert explanation["nodes"] and explanation["edges"] and explanation["features"]
    prediction = post(served, model, payload).json()
    assert "explanation" not in prediction and prediction[key] == pytest.approx(body[key])
