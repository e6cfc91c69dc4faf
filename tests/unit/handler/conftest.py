"""Small graphs, stores, engines, archives and a MockContext for the handler's unit tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from ts.context import Context, RequestProcessor

from graph_assets import GraphStore, open_store, read_graph_dir, write_store
from graph_assets.input.graph_dataset import generate_graph_dataset
from handler.gnn_handler import GNNHandler
from handler.graph.ego import EgoGraphs
from handler.live.live_graph import LiveGraph, UpdatePolicy, UpdateRequest
from handler.live.updates import UpdateEngine
from handler.protocol.body import as_request
from handler.protocol.error_table import api_error
from handler.protocol.errors import ApiError
from handler.settings import ServingSettings
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.link.engine import LinkEngine
from handler.tasks.node.engine import NodeClassificationEngine
from model import build_model
from model.config import ModelConfig
from model.link_assets import open_link_assets, write_link_assets

NUM_NODES, FEATURES, CLASSES = 80, 6, 3


def write_graph_csv(directory: Path, string_ids: bool, seed: int = 0) -> Path:
    """A random graph with isolated nodes, hubs, named labels and int or string IDs."""
    rng = np.random.default_rng(seed)
    ids = [f"acct_{i}" if string_ids else i * 3 for i in range(NUM_NODES)]
    nodes = pd.DataFrame(
        rng.normal(size=(NUM_NODES, FEATURES)), columns=[f"f{i}" for i in range(FEATURES)]
    )
    nodes.insert(0, "id", ids)
    nodes["label"] = [["fraud", "legit", "review"][i % CLASSES] for i in range(NUM_NODES)]
    connected = NUM_NODES - 6  # the last six nodes have no edges
    src = rng.integers(0, connected, 500)
    dst = np.where(rng.random(500) < 0.3, 0, rng.integers(0, connected, 500))  # node 0: a hub
    edges = pd.DataFrame({"src": [ids[s] for s in src], "dst": [ids[d] for d in dst]})
    directory.mkdir(parents=True, exist_ok=True)
    nodes.to_csv(directory / "nodes.csv", index=False)
    edges.to_csv(directory / "edges.csv", index=False)
    return directory


@pytest.fixture(scope="session")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    root = tmp_path_factory.mktemp("int_graph")
    write_store(read_graph_dir(write_graph_csv(root / "input", string_ids=False)), root / "store")
    return open_store(root / "store")


@pytest.fixture(scope="session")
def str_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    root = tmp_path_factory.mktemp("str_graph")
    write_store(read_graph_dir(write_graph_csv(root / "input", string_ids=True)), root / "store")
    return open_store(root / "store")


def random_model(
    store: GraphStore, arch: str, num_layers: int = 2, seed: int = 0
) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = ModelConfig.from_dict(
        {
            "arch": arch,
            "in_dim": store.feature_dim,
            "out_dim": store.num_classes,
            "hidden_dim": 16,
            "num_layers": num_layers,
        }
    )
    return build_model(config).eval()


def make_engine(
    store: GraphStore,
    arch: str = "sage",
    model: torch.nn.Module | None = None,
    live: LiveGraph | None = None,
    **settings: Any,
) -> NodeClassificationEngine:
    settings.setdefault("fanouts", [-1, -1])
    model = model if model is not None else random_model(store, arch, len(settings["fanouts"]))
    serving = ServingSettings.from_yaml_section(settings)
    return NodeClassificationEngine.create(store, model, serving, torch.device("cpu"), "1.0", live)


class MockMetrics:
    """Records what the handler reports instead of writing TorchServe's metric log lines."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, float]] = []

    def add_time(self, name: str, value: float, *args: Any, **kwargs: Any) -> None:
        self.recorded.append((name, value))

    add_size = add_counter = add_percent = add_metric = add_time


class MockContext(Context):
    """What TorchServe hands a handler: properties, manifest, model YAML, per-batch headers."""

    def __init__(self, model_dir: Path, model_yaml_config: dict[str, Any], batch_size: int) -> None:
        super().__init__(
            model_name="gnn",
            model_dir=str(model_dir),
            manifest={"model": {"modelName": "gnn", "modelVersion": "1.0"}},
            batch_size=batch_size,
            gpu=None,
            mms_version="0.12.0",
            metrics=MockMetrics(),
            model_yaml_config=model_yaml_config,
        )
        self.request_processor = [RequestProcessor({}) for _ in range(batch_size)]


# Engines, requests and archives that several test modules build.

NAMES = ["cycle", "star", "wheel", "ladder"]


def graph_engine(arch="gin", pooling="sum", **settings) -> GraphEngine:
    torch.manual_seed(0)
    config = {"task": "graph", "arch": arch, "pooling": pooling, "in_dim": 8, "out_dim": 4}
    model = build_model({**config, "hidden_dim": 16})
    serving = ServingSettings.from_yaml_section({"task": "graph", **settings})
    return GraphEngine(model, NAMES, serving, torch.device("cpu"), "1.0")


def graph_requests(count: int, seed: int = 0) -> list[dict]:
    dataset = generate_graph_dataset(max(count, len(NAMES)), seed=seed)
    return [
        {"graph": {"x": x.tolist(), "edge_index": edge_index.tolist()}}
        for x, edge_index, _ in dataset.graphs()
    ][:count]


def link_engine(store, tmp_path, arch="sage", decoder="dot", **settings) -> LinkEngine:
    torch.manual_seed(0)
    config = {
        "task": "link",
        "arch": arch,
        "decoder": decoder,
        "in_dim": store.feature_dim,
        "out_dim": 8,
        "hidden_dim": 16,
    }
    model = build_model(config).eval()
    write_link_assets(model, store, tmp_path / "link")
    settings.setdefault("fanouts", [-1, -1])
    serving = ServingSettings.from_yaml_section({"task": "link", **settings})
    ego = EgoGraphs.create(store, model, serving, torch.device("cpu"))
    return LinkEngine(ego, open_link_assets(tmp_path / "link", store), "1.0")


def refused_update(live: LiveGraph, operations: list[Any]) -> ApiError:
    """What a client gets for an update the live graph refuses: its domain error, through the
    error table (``handler.protocol.error_table``)."""
    with pytest.raises(Exception) as raised:
        live.update(UpdateRequest(operations))
    answer = api_error(raised.value)
    assert answer is not None, f"not a refusal: {raised.value!r}"
    return answer


def answer_update(
    body: dict[str, Any], key: str | None, live: LiveGraph | None, policy: UpdatePolicy
) -> tuple[int, dict[str, Any]]:
    """One update through the update route, as a router hands it over: status and JSON body."""
    engine = UpdateEngine(live, policy)
    request = as_request({"body": body}, update_key=key)
    (answer,) = engine.respond(engine.run(engine.prepare([request])))
    return answer.status, answer.body


def live_engine(store, log, model, fanouts=(-1, -1)):
    live = LiveGraph(store, log)
    return make_engine(store, model=model, live=live, fanouts=list(fanouts)), live


@pytest.fixture()
def model_dir(tmp_path: Path, int_store) -> Path:
    """An unpacked archive: graph/, model.pt, model_config.json."""
    shutil.copytree(int_store.path, tmp_path / "graph")
    model = random_model(int_store, "gcn")
    torch.save(model.state_dict(), tmp_path / "model.pt")
    config = {
        "task": "node",
        "arch": "gcn",
        "in_dim": int_store.feature_dim,
        "out_dim": int_store.num_classes,
        "hidden_dim": 16,
        "num_layers": 2,
    }
    (tmp_path / "model_config.json").write_text(json.dumps(config))
    return tmp_path


def started(model_dir: Path, batch_size: int, **gnn) -> tuple[GNNHandler, MockContext]:
    gnn.setdefault("graph_cache_dir", str(model_dir.parent / f"{model_dir.name}-cache"))
    context = MockContext(model_dir, {"batchSize": batch_size, "gnn": gnn}, batch_size)
    handler = GNNHandler()
    handler.initialize(context)
    return handler, context
