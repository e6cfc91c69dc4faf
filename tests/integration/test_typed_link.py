"""Recommendation on a relation of a graph of several node types through build_mar.sh and
TorchServe: a gcn recipe (boundary degrees on a typed graph) and a user's HeteroConv link model
(``decode(z_dict, edge_label_index)``) trained on user__pays__merchant serve pair scores and
top-k over merchants equal to decode(encode(whole graph)) (full neighbourhoods, <= 1e-5),
top-k leaves out the merchants a user paid, and an ID of the wrong type is a 404 naming it."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from graph_assets import GraphStore, open_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from model.export import load_model
from model.hetero_link import HeteroLinkModel
from model.served_hetero_link import UserHeteroLinkModel
from model.typed_graph import whole_graph_input
from tests.servers.torchserve import Register, TorchServe
from tests.unit.archive_build import user_models

from .archives import build_archive

pytestmark = pytest.mark.integration
PAYS = "user__pays__merchant"
OWN = {"devices": 60, "hidden": 8, "edge_dim": 2}
ARCHIVES = ("gcn_link", "own_link")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("typed_link")
    graph = write_fraud_graph_csv(fraud_graph(150, 25, 60, 500, seed=4), root / "graph")
    store = root / "store"
    common = ["--undirected", "--task", "link", "--target-edge-type", PAYS, "--fanouts", "-1,-1"]
    build_archive(
        store, graph, *common, "--arch", "gcn", "--name", "gcn_link", "--epochs", "2",
        "--hidden-dim", "16", "--embedding-dim", "16",
    )  # fmt: skip
    torch.manual_seed(0)
    module = user_models.FraudPaysLink(**OWN)
    with torch.no_grad():  # payments' amounts are ~100: keep the attention from saturating
        for sub in module.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    torch.save(module.state_dict(), root / "own.pt")
    build_archive(
        store, graph, *common, "--name", "own_link", "--model-class", "FraudPaysLink",
        "--model-file", user_models.__file__, "--model-args", json.dumps(OWN),
        "--weights", str(root / "own.pt"),
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def server(register: Register, built: Path) -> Iterator[TorchServe]:
    with register(built / "store", list(ARCHIVES)) as started:
        yield started


def unpacked(built: Path, name: str) -> tuple[GraphStore, HeteroLinkModel]:
    work = built / f"unpacked_{name}"
    if not work.exists():
        zipfile.ZipFile(built / "store" / f"{name}.mar").extractall(work)
    model, _ = load_model(work)
    assert isinstance(model, HeteroLinkModel)
    return open_store(work / "graph"), model


def full_scores(store: GraphStore, model: HeteroLinkModel, pairs: np.ndarray) -> torch.Tensor:
    """sigmoid(decode(encode(whole graph))) of global [P, 2] user-merchant pairs."""
    index = torch.from_numpy(
        np.stack([pairs[:, 0], pairs[:, 1] - store.schema.node_type("merchant").offset])
    )
    with torch.no_grad():
        z = model.encode(whole_graph_input(store))
        if isinstance(model, UserHeteroLinkModel):
            logits = model.module.decode(z, index)
        else:
            logits = model.score(z["user"][index[0]], z["merchant"][index[1]])
    return torch.sigmoid(logits)


def post(server: TorchServe, name: str, body: object) -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/{name}",
        json=body,
        headers=server.auth("inference"),
        timeout=60,
    )


@pytest.mark.parametrize("name", ARCHIVES)
def test_pairs_and_top_k_equal_the_full_graph_decode(server, built, name):
    store, model = unpacked(built, name)
    merchants = store.schema.node_type("merchant")
    rng = np.random.default_rng(0)
    pairs = np.stack(
        [rng.integers(0, 150, 60), rng.integers(merchants.offset, merchants.stop, 60)], 1
    )
    ids = store.external_ids(pairs.ravel())
    response = post(server, name, {"pairs": [ids[i : i + 2] for i in range(0, len(ids), 2)]})
    assert response.status_code == 200, response.text
    served = torch.tensor([p["score"] for p in response.json()["predictions"]])
    assert float((served - full_scores(store, model, pairs)).abs().max()) <= 1e-5

    [user] = store.lookup(["u7"], node_type="user")
    paid = set(store.lookup(_paid(store, user), node_type="merchant").tolist())
    response = post(server, name, {"src": "u7", "top_k": 25})
    assert response.status_code == 200, response.text
    found = response.json()["recommendations"]
    rows = store.lookup([r["dst"] for r in found], node_type="merchant")
    assert paid and set(rows.tolist()) == set(range(merchants.offset, merchants.stop)) - paid
    expected = full_scores(store, model, np.stack([np.full(len(rows), user), rows], 1))
    assert float((torch.tensor([r["score"] for r in found]) - expected).abs().max()) <= 1e-5


def _paid(store: GraphStore, user: int) -> list:
    relation = store.schema.relation_index(PAYS)
    dst = np.repeat(np.arange(store.num_nodes), np.diff(store.indptr))
    mine = (np.asarray(store.indices) == user) & (np.asarray(store.edge_type) == relation)
    return store.external_ids(np.unique(dst[mine]))


def test_an_id_of_the_wrong_type_is_a_404_naming_it(server):
    response = post(server, "gcn_link", {"src": 1003, "dst": "u1"})
    assert response.status_code == 404
    message = response.json()["message"]
    assert "user node(s) not in the graph: 1003" in message and PAYS in message
    described = requests.get(
        f"{server.management_url}/models/own_link?customized=true",
        headers=server.auth("management"),
        timeout=30,
    ).json()[0]["customizedMetadata"]
    details = described if isinstance(described, dict) else json.loads(described)
    assert details["link"]["target_edge_type"] == PAYS and details["verification"]["passed"]
