"""A precomputed archive of the typed demo graph through build_mar.sh and TorchServe (2 workers,
batching on, sampled fanouts): the build verifies the stored user rows, and after a random
stream of typed updates (nodes and edges of several relations, features and edge features)
every live user's answer equals the model's forward on the whole updated graph, on both
workers."""

from __future__ import annotations

import json
import random
import zipfile

import pytest
import requests
import torch

from graph_assets import open_store
from handler.live.live_graph import LiveGraph, UpdateRequest
from model.export import load_model
from tests.typed_live_reference import materialized_typed, random_typed_update

from .archives import ROOT, build_archive

pytestmark = pytest.mark.integration
SECRET = "typed-precompute-secret-42"
UPDATES = 40


def test_a_typed_precomputed_archive_is_exact_after_typed_updates(serve, tmp_path):
    model_store = build_archive(
        tmp_path / "model_store", ROOT / "graph_assets" / "demo_typed", "--undirected",
        "--arch", "gat", "--name", "fraud", "--epochs", "3", "--hidden-dim", "16",
        "--fanouts", "3,2", "--precompute", "--enable-updates", "--update-state-dir",
        str(tmp_path / "state"), "--batch-size", "4", "--min-workers", "2", "--max-workers", "2",
    )  # fmt: skip
    work = tmp_path / "unpacked"
    with zipfile.ZipFile(model_store / "fraud.mar") as archive:
        archive.extractall(work)
    info = json.loads((work / "build_info.json").read_text())
    assert info["verification"]["passed"] and info["verification"]["worst_abs_diff"] <= 1e-5
    model, _ = load_model(work)
    live = LiveGraph(open_store(work / "graph"), tmp_path / "reference.log")
    env = {"GNNSERVE_UPDATE_SECRET": SECRET}
    with serve(model_store, "fraud=fraud.mar", name="typed-precompute", env=env) as server:
        url = f"{server.inference_url}/predictions/fraud"
        try:
            rng, counter = random.Random(31), [0]
            for _ in range(UPDATES):
                operations = random_typed_update(rng, live, counter)
                answer = requests.post(
                    url,
                    json={"op": "update", "operations": operations},
                    headers={**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET},
                    timeout=60,
                )
                assert answer.status_code == 200, answer.text
                live.update(UpdateRequest(operations))
            ids, inputs = materialized_typed(live)
        finally:
            live.close()
        with torch.no_grad():
            expected = torch.softmax(model(inputs), dim=-1)
        for _ in range(2):  # batches land on either worker: both are held to the reference
            served = []
            for start in range(0, len(ids), 50):
                response = requests.post(
                    url,
                    json={"node_type": "user", "node_ids": ids[start : start + 50]},
                    headers=server.auth("inference"),
                    timeout=60,
                )
                assert response.status_code == 200, response.text
                assert response.json()["graph_version"].endswith(f"+{UPDATES}")
                served += [p["probabilities"] for p in response.json()["predictions"]]
            assert float((torch.tensor(served) - expected).abs().max()) <= 1e-5
        described = requests.get(
            f"{server.management_url}/models/fraud?customized=true",
            headers=server.auth("management"),
            timeout=30,
        ).json()[0]["customizedMetadata"]
        details = described if isinstance(described, dict) else json.loads(described)
        assert details["precomputed"]["mode"] == "output"
        assert details["precomputed"]["refreshed_updates"] >= UPDATES
