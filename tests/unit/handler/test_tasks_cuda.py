"""The link, cold-start, graph and explanation engines on a GPU answer as on the CPU."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from handler.explain.ego_explain import ExplainEngine
from handler.graph.ego import EgoGraphs
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.link.engine import LinkEngine
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.explain import NodeExplanation
from handler.tasks.node.extras import NodeExtrasEngine
from model.link_assets import open_link_assets

from .conftest import graph_engine, graph_requests, link_engine, make_engine, random_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda:0")


def bodies(engine, payloads):
    return [r.body for r in engine.handle([{"body": p} for p in payloads])]


def assert_close(gpu, cpu, keys):
    for a, b in zip(gpu, cpu, strict=True):
        for key in keys:
            assert np.allclose(a[key], b[key], atol=1e-5), key


def test_cold_start_and_embeddings_on_the_gpu(int_store):
    model = random_model(int_store, "gcn")
    on_cpu = make_engine(int_store, model=model, fanouts=[3, 3])
    ego = EgoGraphs.create(int_store, copy.deepcopy(model), on_cpu.settings, CUDA)
    on_gpu = NodeClassificationEngine(ego, "1.0")
    payloads = [
        {"node_ids": [0, 3, 9], "return_embedding": True},
        {"new_node": {"x": [0.5] * 6, "neighbors": [0, 3]}, "return_embedding": True},
    ]
    cpu = bodies(NodeExtrasEngine(on_cpu.ego, "1.0"), payloads)
    gpu = bodies(NodeExtrasEngine(on_gpu.ego, "1.0"), payloads)
    assert_close(gpu[0]["predictions"], cpu[0]["predictions"], ["probabilities", "embedding"])
    assert_close(gpu[1:], cpu[1:], ["probabilities", "embedding"])
    explained = bodies(ExplainEngine(NodeExplanation(on_gpu.ego), "1.0"), [{"node_id": 0}])
    assert explained[0]["explanation"]["nodes"]


def test_link_pairs_and_top_k_on_the_gpu(int_store, tmp_path):
    on_cpu = link_engine(int_store, tmp_path, "sage", "mlp")
    ego = EgoGraphs.create(int_store, copy.deepcopy(on_cpu.predictor), on_cpu.settings, CUDA)
    on_gpu = LinkEngine(ego, open_link_assets(tmp_path / "link", int_store), "1.0")
    payloads = [{"pairs": [[0, 3], [6, 9]]}, {"src": 0, "top_k": 5}]
    cpu, gpu = bodies(on_cpu, payloads), bodies(on_gpu, payloads)
    assert_close(gpu[0]["predictions"], cpu[0]["predictions"], ["score"])
    assert [r["dst"] for r in gpu[1]["recommendations"]] == [
        r["dst"] for r in cpu[1]["recommendations"]
    ]


def test_graphs_on_the_gpu():
    on_cpu = graph_engine()
    on_gpu = GraphEngine(
        copy.deepcopy(on_cpu.model), on_cpu.class_names, on_cpu.settings, CUDA, "1.0"
    )
    payloads = graph_requests(4)
    assert_close(bodies(on_gpu, payloads), bodies(on_cpu, payloads), ["probabilities"])
