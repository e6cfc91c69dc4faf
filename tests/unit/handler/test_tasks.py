"""The handler picks its engines by the archive's task; explanations are routed per request."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ts.context import RequestProcessor

from graph_assets import StoreError
from model import build_model
from model.graph_level import CLASSES_FILE
from model.link_assets import LINK_DIR, write_link_assets

from .conftest import NAMES, graph_requests, random_model, started


def save_model(directory: Path, config: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(config).eval()
    torch.save(model.state_dict(), directory / "model.pt")
    (directory / "model_config.json").write_text(json.dumps(config))
    return model


def handle(handler, context, payloads, explain=()):
    for index in range(len(payloads)):
        headers = {"explain": "True"} if index in explain else {}
        context.request_processor[index] = RequestProcessor(headers)
    output = handler.handle([{"body": p} for p in payloads], context)
    return [(context.get_response_status(i)[0], json.loads(body)) for i, body in enumerate(output)]


@pytest.fixture()
def link_archive(tmp_path: Path, int_store) -> Path:
    shutil.copytree(int_store.path, tmp_path / "graph")
    config = {"task": "link", "arch": "gcn", "in_dim": int_store.feature_dim, "out_dim": 8}
    model = save_model(tmp_path, {**config, "hidden_dim": 16})
    write_link_assets(model, int_store, tmp_path / LINK_DIR)
    return tmp_path


@pytest.fixture()
def graph_archive(tmp_path: Path) -> Path:
    save_model(tmp_path, {"task": "graph", "arch": "gin", "in_dim": 8, "out_dim": 4})
    (tmp_path / CLASSES_FILE).write_text(json.dumps({"class_names": NAMES}))
    return tmp_path


def test_a_link_archive_answers_pairs_top_k_and_explanations(link_archive):
    handler, context = started(link_archive, 3, task="link", fanouts=[-1, -1])
    answers = handle(
        handler,
        context,
        [{"src": 3, "dst": 6}, {"src": 3, "top_k": 5}, {"src": 3, "dst": 6}],
        explain={0},
    )
    assert [status for status, _ in answers] == [200, 200, 200]
    assert "explanation" in answers[0][1] and "explanation" not in answers[2][1]
    assert answers[0][1]["score"] == pytest.approx(answers[2][1]["score"], abs=1e-6)
    assert len(answers[1][1]["recommendations"]) == 5
    described = json.loads(handler.describe_handle())
    assert described["task"] == "link" and described["graph"]["nodes"] == 80
    assert described["link"]["embedding_dim"] == 8 and described["link"]["embeddings_built_at"]


def test_a_graph_archive_answers_inline_graphs_and_explanations(graph_archive):
    handler, context = started(graph_archive, 2, task="graph")
    payload = graph_requests(1)[0]
    answers = handle(handler, context, [payload, payload], explain={1})
    assert [status for status, _ in answers] == [200, 200]
    assert answers[0][1]["predicted_label"] in NAMES
    assert answers[1][1]["predicted_class"] == answers[0][1]["predicted_class"]
    assert "explanation" in answers[1][1]
    described = json.loads(handler.describe_handle())
    assert described["task"] == "graph" and described["graph"]["class_names"] == NAMES
    recorded = dict(context.metrics.recorded)
    assert recorded["GnnBatchSize"] == 2


def test_a_node_archive_explains_only_the_requests_marked_so(tmp_path, int_store):
    shutil.copytree(int_store.path, tmp_path / "graph")
    model = random_model(int_store, "sage")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    config = {"arch": "sage", "in_dim": 6, "out_dim": 3, "hidden_dim": 16}
    (tmp_path / "model_config.json").write_text(json.dumps(config))
    handler, context = started(tmp_path, 3, fanouts=[-1, -1])
    answers = handle(
        handler,
        context,
        [{"node_id": 0}, {"node_id": 0}, {"new_node": {"x": [0.0] * 6, "neighbors": [0]}}],
        explain={1},
    )
    assert [status for status, _ in answers] == [200, 200, 200]
    assert "explanation" not in answers[0][1] and "explanation" in answers[1][1]
    assert answers[0][1]["probabilities"] == pytest.approx(answers[1][1]["probabilities"])
    assert answers[2][1]["new_node"] == {"neighbors": 1}


def test_weights_of_another_task_are_refused(link_archive):
    with pytest.raises(ValueError, match="task 'link'"):
        started(link_archive, 1, task="node", fanouts=[-1, -1])


def test_a_link_archive_without_its_embeddings_is_refused(link_archive):
    shutil.rmtree(link_archive / LINK_DIR)
    with pytest.raises(StoreError, match="candidate embeddings"):
        started(link_archive, 1, task="link", fanouts=[-1, -1])


def test_every_task_the_settings_accept_is_in_the_registry():
    from handler.settings import TASKS as ACCEPTED
    from handler.tasks.registry import TASKS

    assert set(TASKS) == set(ACCEPTED)
