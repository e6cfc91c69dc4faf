"""A graph of several node types and relations through build_mar.sh and TorchServe: every
recipe and a user's HeteroConv model reading edge features answer each user node as their
full-graph forward on the whole graph does (full
neighbourhoods, <= 1e-5), per-relation fanouts reach the archive, requests name their type and
a type the archive does not answer is a 400 naming the types."""

from __future__ import annotations

import functools
import json
import random
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from graph_assets import open_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from handler.live.live_graph import LiveGraph, UpdateRequest
from model.export import load_model
from model.typed_graph import whole_graph_input
from tests.servers.torchserve import Register, TorchServe
from tests.typed_cold_start_reference import with_new_node
from tests.typed_live_reference import materialized_typed, random_typed_update
from tests.unit.archive_build import user_models

from .archives import SHARED_UPDATE_SECRET, build_archive, concurrently

pytestmark = pytest.mark.integration
ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]
# The user's HeteroConv stack reading the payments' edge features (tests' model file).
HETERO_CONV = {"devices": 60, "hidden": 8, "classes": 2, "edge_dim": 2}
SECRET = SHARED_UPDATE_SECRET  # the shared server's workers hold it


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One archive per recipe on the generated fraud graph (its reverses added), full
    neighbourhoods; ``sage_sampled`` samples rev_pays with a per-relation fanout."""
    root = tmp_path_factory.mktemp("typed")
    graph = write_fraud_graph_csv(fraud_graph(150, 25, 60, 500, seed=4), root / "graph")
    store = root / "store"
    torch.manual_seed(0)
    module = user_models.FraudHeteroConv(**HETERO_CONV)
    torch.save(module.state_dict(), root / "own.pt")
    fanouts = root / "fanouts.json"
    fanouts.write_text(json.dumps({"merchant__rev_pays__user": [1, 1]}))
    recipe = ("--undirected", "--epochs", "2", "--hidden-dim", "16", "--fanouts", "-1,-1")
    builds = [
        *(
            (store, graph, *recipe, "--arch", arch, "--name", arch, "--heads", "2",
             "--batch-size", "4")
            for arch in ARCHS
        ),
        (
            store, graph, "--undirected", "--name", "own", "--model-class", "FraudHeteroConv",
            "--model-file", user_models.__file__, "--model-args", json.dumps(HETERO_CONV),
            "--weights", str(root / "own.pt"), "--fanouts", "-1,-1", "--embedding-method", "head",
        ),
        (
            store, graph, *recipe, "--arch", "gat", "--name", "live", "--heads", "2",
            "--enable-updates", "--update-state-dir", str(root / "state"),
            "--min-workers", "2", "--max-workers", "2",
        ),
        (
            store, graph, *recipe, "--arch", "sage", "--name", "sage_sampled",
            "--fanouts-file", str(fanouts),
        ),
    ]  # fmt: skip
    concurrently(*(functools.partial(build_archive, *args) for args in builds))
    return root


@pytest.fixture(scope="module")
def server(register: Register, built: Path) -> Iterator[TorchServe]:
    with register(built / "store", [*ARCHS, "own", "sage_sampled", "live"]) as started:
        yield started


def full_graph_answers(built: Path, name: str) -> tuple[list, torch.Tensor]:
    """The archive's user IDs and its model's softmax on the whole graph."""
    work = built / f"unpacked_{name}"
    if not work.exists():
        zipfile.ZipFile(built / "store" / f"{name}.mar").extractall(work)
    store = open_store(work / "graph")
    model, _ = load_model(work)
    with torch.no_grad():
        rows = torch.softmax(model(whole_graph_input(store)), dim=-1)
    users = store.schema.target_type.num_nodes
    return store.external_ids(np.arange(users)), rows


def post(server: TorchServe, name: str, body: object) -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/{name}",
        json=body,
        headers=server.auth("inference"),
        timeout=60,
    )


@pytest.mark.parametrize("arch", [*ARCHS, "own"])
def test_every_recipe_answers_as_its_full_graph_forward(server, built, arch):
    ids, expected = full_graph_answers(built, arch)
    served = []
    for start in range(0, len(ids), 25):
        response = post(server, arch, {"node_ids": ids[start : start + 25], "node_type": "user"})
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        assert {p["node_type"] for p in predictions} == {"user"}
        served += [p["probabilities"] for p in predictions]
    assert float((torch.tensor(served) - expected).abs().max()) <= 1e-5


def test_per_relation_fanouts_change_the_sampled_answers(server, built):
    ids, expected = full_graph_answers(built, "sage_sampled")
    response = post(server, "sage_sampled", {"node_ids": ids})
    assert response.status_code == 200, response.text
    served = torch.tensor([p["probabilities"] for p in response.json()["predictions"]])
    assert float((served - expected).abs().max()) > 1e-4  # rev_pays is sampled, one a hop
    described = requests.get(
        f"{server.management_url}/models/sage_sampled?customized=true",
        headers=server.auth("management"),
        timeout=30,
    ).json()[0]["customizedMetadata"]
    details = described if isinstance(described, dict) else json.loads(described)
    assert details["verification"]["passed"]


def test_a_type_the_archive_does_not_answer_is_a_400(server):
    response = post(server, "rgcn", {"node_id": 1000, "node_type": "merchant"})
    assert response.status_code == 400
    message = response.json()["message"]
    assert "answers for 'user' nodes" in message and "merchant" in message
    missing = post(server, "rgcn", {"node_id": "nobody", "node_type": "user"})
    assert missing.status_code == 404


@pytest.mark.parametrize("name", ["hgt", "own"])
def test_explanations_name_types_and_relations_and_explain_the_prediction(server, name):
    body = {"node_id": "u3", "node_type": "user"}
    explained = requests.post(
        f"{server.inference_url}/explanations/{name}",
        json=body,
        headers=server.auth("inference"),
        timeout=60,
    )
    assert explained.status_code == 200, explained.text
    answer, predicted = explained.json(), post(server, name, body).json()
    assert answer["probabilities"] == predicted["probabilities"]
    explanation = answer["explanation"]
    assert {n["node_type"] for n in explanation["nodes"]} <= {"user", "merchant", "device"}
    assert all(e["edge_type"].count("__") == 2 for e in explanation["edges"])


def test_the_user_models_embedding_is_the_input_of_the_submodule_it_names(server, built):
    ids, _ = full_graph_answers(built, "own")
    response = post(server, "own", {"node_ids": ids[:3], "return_embedding": True})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [len(p["embedding"]) for p in predictions] == [8, 8, 8]
    assert {p["node_type"] for p in predictions} == {"user"}


def test_a_new_user_is_answered_as_the_forward_with_it_added(server, built):
    """Cold start on the user's HeteroConv archive (payments' amounts read): a new user paying
    two merchants and using a device, each edge with its reverse (the archive is undirected)."""
    full_graph_answers(built, "own")  # unpacks it
    store = open_store(built / "unpacked_own" / "graph")
    model, _ = load_model(built / "unpacked_own")
    x = [0.4, -0.3, 0.2, 0.0, 1.1, -0.6, 0.3, 0.5]
    amounts = [[75.0, 14.0], [12.5, 2.0]]
    body = {
        "new_node": {
            "node_type": "user",
            "x": x,
            "neighbors": {"user__pays__merchant": [1000, 1003], "user__uses__device": ["d1"]},
            "edge_attr": {"user__pays__merchant": amounts},
        }
    }
    response = post(server, "own", body)
    assert response.status_code == 200, response.text
    assert response.json()["new_node"] == {"neighbors": 3}
    position = {
        (t, i): int(store.lookup([i], node_type=t)[0]) - store.schema.node_type(t).offset
        for t, i in [("merchant", 1000), ("merchant", 1003), ("device", "d1")]
    }
    edges = [
        (triple, position[(end, node_id)], into, attr)
        for (end, node_id), attr in zip(position, [*amounts, None], strict=True)
        for triple, into in (
            [(("user", "pays", "merchant"), False), (("merchant", "rev_pays", "user"), True)]
            if end == "merchant"
            else [(("user", "uses", "device"), False), (("device", "rev_uses", "user"), True)]
        )
    ]
    augmented, new = with_new_node(whole_graph_input(store), store.schema, x, edges)
    with torch.no_grad():
        expected = torch.softmax(model(augmented)[new], dim=-1)
    served = torch.tensor(response.json()["probabilities"])
    assert float((served - expected).abs().max()) <= 1e-5


def test_typed_updates_through_the_server_are_exact_on_both_workers(server, built, tmp_path):
    """A random stream of typed updates through TorchServe and into a reference live graph,
    then every user's answer equals the model's forward on the updated graph."""
    work = built / "unpacked_live"
    if not work.exists():
        zipfile.ZipFile(built / "store" / "live.mar").extractall(work)
    model, _ = load_model(work)
    live = LiveGraph(open_store(work / "graph"), tmp_path / "reference.log")
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    rng, counter = random.Random(21), [0]
    try:
        for _ in range(40):
            operations = random_typed_update(rng, live, counter)
            answer = requests.post(
                f"{server.inference_url}/predictions/live",
                json={"op": "update", "operations": operations},
                headers=headers,
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            live.update(UpdateRequest(operations))
        ids, inputs = materialized_typed(live)
    finally:
        live.close()
    with torch.no_grad():
        expected = torch.softmax(model(inputs), dim=-1)
    for _ in range(2):  # batches land on either worker
        served = []
        for start in range(0, len(ids), 25):
            response = post(server, "live", {"node_ids": ids[start : start + 25]})
            assert response.status_code == 200, response.text
            assert response.json()["graph_version"].endswith("+40")
            served += [p["probabilities"] for p in response.json()["predictions"]]
        assert float((torch.tensor(served) - expected).abs().max()) <= 1e-5
