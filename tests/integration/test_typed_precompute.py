"""Precomputed archives of the typed demo graph through build_mar.sh and TorchServe (2 workers,
batching on, sampled fanouts): a node archive and a link archive of user__pays__merchant on
the same graph (so one update log), both verified at build from their stored rows. After a
random stream of typed updates (nodes and edges of several relations, features and edge
features) every live user's answer equals the model's forward on the whole updated graph, and
pair scores and top-k over the live merchants equal decode(encode(the updated graph)), on both
workers."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

import pytest
import requests
import torch

from graph_assets import open_store
from handler.live.live_graph import LiveGraph, UpdateRequest
from model.export import load_model
from model.link import answer_scores
from model.served import serving_needs
from tests.servers.torchserve import TorchServe
from tests.typed_live_reference import live_nodes, materialized_typed, random_typed_update

from .archives import ROOT, SHARED_UPDATE_SECRET, build_archive

pytestmark = pytest.mark.integration
SECRET = SHARED_UPDATE_SECRET  # the shared server's workers hold it
UPDATES = 40
SERVING = ("--fanouts", "3,2", "--precompute", "--enable-updates", "--batch-size", "4")
WORKERS = ("--min-workers", "2", "--max-workers", "2")


def unpacked(model_store: Path, name: str, work: Path) -> tuple[torch.nn.Module, dict]:
    """The archive's model as a worker loads it, and its build record."""
    with zipfile.ZipFile(model_store / f"{name}.mar") as archive:
        archive.extractall(work / name)
    model, _ = load_model(work / name)
    return model, json.loads((work / name / "build_info.json").read_text())


def post(server: TorchServe, name: str, body: dict, **headers: str) -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/{name}",
        json=body,
        headers={**server.auth("inference"), **headers},
        timeout=60,
    )


def test_typed_precomputed_archives_are_exact_after_typed_updates(register, tmp_path):
    graph, state = ROOT / "graph_assets" / "demo_typed", str(tmp_path / "state")
    model_store = tmp_path / "model_store"
    common = ("--undirected", "--epochs", "3", "--hidden-dim", "16", "--update-state-dir", state)
    build_archive(
        model_store, graph, *common, "--arch", "gat", "--name", "fraud", *SERVING, *WORKERS
    )
    build_archive(
        model_store, graph, *common, "--task", "link", "--target-edge-type",
        "user__pays__merchant", "--arch", "sage", "--name", "pays", *SERVING, *WORKERS,
    )  # fmt: skip
    node_model, node_info = unpacked(model_store, "fraud", tmp_path / "work")
    link_model, link_info = unpacked(model_store, "pays", tmp_path / "work")
    for info in (node_info, link_info):
        assert info["verification"]["passed"] and info["verification"]["worst_abs_diff"] <= 1e-5
    live = LiveGraph(open_store(tmp_path / "work" / "fraud" / "graph"), tmp_path / "ref.log")
    with register(model_store, ["fraud", "pays"]) as server:
        try:
            rng, counter = random.Random(31), [0]
            for _ in range(UPDATES):
                operations = random_typed_update(rng, live, counter)
                body = {"op": "update", "operations": operations}
                answer = post(server, "fraud", body, **{"X-Gnnserve-Update-Key": SECRET})
                assert answer.status_code == 200, answer.text
                live.update(UpdateRequest(operations))
            ids, inputs = materialized_typed(live)
            merchants = live_nodes(live, live.store.schema.type_index("merchant"))
            merchant_ids = live.overlay.external_ids(merchants)
        finally:
            live.close()
        with torch.no_grad():
            expected = torch.softmax(node_model(inputs), dim=-1)
            z = link_model.encode(inputs)
        link_output = serving_needs(link_model).output
        for _ in range(2):  # batches land on either worker: both are held to the reference
            served = []
            for start in range(0, len(ids), 50):
                body = {"node_type": "user", "node_ids": ids[start : start + 50]}
                response = post(server, "fraud", body)
                assert response.status_code == 200, response.text
                assert response.json()["graph_version"].endswith(f"+{UPDATES}")
                served += [p["probabilities"] for p in response.json()["predictions"]]
            assert float((torch.tensor(served) - expected).abs().max()) <= 1e-5
            users = list(range(0, len(ids), 97))
            pairs = [[ids[u], merchant_ids[u % len(merchant_ids)]] for u in users]
            response = post(server, "pays", {"pairs": pairs})
            assert response.status_code == 200, response.text
            assert response.json()["graph_version"].endswith(f"+{UPDATES}")  # the same log
            with torch.no_grad():
                want = answer_scores(
                    link_model.score(
                        z["user"][users], z["merchant"][[u % len(merchant_ids) for u in users]]
                    ),
                    link_output,
                )
            got = torch.tensor([p["score"] for p in response.json()["predictions"]])
            assert float((got - want).abs().max()) <= 1e-5
            body = {"src": ids[5], "top_k": len(merchant_ids), "exclude_neighbors": False}
            response = post(server, "pays", body)
            assert response.status_code == 200, response.text
            found = response.json()["recommendations"]
            assert sorted(r["dst"] for r in found) == sorted(merchant_ids)  # the live merchants
            with torch.no_grad():
                every = answer_scores(
                    link_model.score(z["user"][[5] * len(merchants)], z["merchant"]), link_output
                )
            by_id = dict(zip(merchant_ids, every.tolist(), strict=True))
            ranked = torch.tensor([r["score"] for r in found])
            reference = torch.tensor([by_id[r["dst"]] for r in found])
            assert float((ranked - reference).abs().max()) <= 1e-5
        described = requests.get(
            f"{server.management_url}/models/fraud?customized=true",
            headers=server.auth("management"),
            timeout=30,
        ).json()[0]["customizedMetadata"]
        details = described if isinstance(described, dict) else json.loads(described)
        assert details["precomputed"]["mode"] == "output"
        assert details["precomputed"]["refreshed_updates"] >= UPDATES
