"""Graph classification requests: inline graphs, one forward pass per TorchServe batch.

Every valid request's graph joins one ``torch_geometric.data.Batch`` (a disjoint union), the
model runs once, and each request gets its graph's row. A graph's answer depends only on its
own nodes and edges, so it is the answer it gets alone (to float rounding: the tests allow
1e-6; the build verifies it for every archive). A batch whose forward pass fails is retried
graph by graph, so only the graph that causes the failure gets a 500. Any graph model serves
(``model.graph_level.GraphModel``: the presets, the user's class); its rows are answered as
node rows are (class answers of logits or probabilities, ``output`` for raw rows).
"""

from __future__ import annotations

from typing import Any, cast

import torch

from handler.pipeline.batch import Batch, BatchEngine, Group, timed
from handler.protocol.class_answer import node_answer
from handler.protocol.errors import BadRequest
from handler.protocol.kserve_v2 import class_outputs, inference_response
from handler.settings import ServingSettings
from handler.tasks.graph.requests import GraphRequest, parse_graph_request
from model.config import Task
from model.device import to_serving_device
from model.graph_level import GraphModel, as_data, batch_of
from model.served import answer_rows, serving_needs
from model.served.contract import served


class GraphEngine(BatchEngine[GraphRequest]):
    """Answers ``{"graph": {"x": ..., "edge_index": ...[, "edge_attr": ...]}}`` requests."""

    store = None  # graph archives carry no stored graph

    def __init__(
        self,
        model: torch.nn.Module,
        class_names: list[str] | None,
        settings: ServingSettings,
        device: torch.device,
        model_version: str,
        model_name: str = "graphs",
    ) -> None:
        contract = served(model)
        if contract.task is not Task.GRAPH:
            raise TypeError(
                f"a graph archive needs a graph model (forward_with_embedding, in_dim), got "
                f"{type(model).__name__}, a {contract.task.value} model"
            )
        self.model = to_serving_device(model, device)
        self.classifier = cast(GraphModel, model)
        self.in_dim = self.classifier.in_dim
        self.edge_dim = self.classifier.edge_dim
        self.output = serving_needs(model).output
        self.class_names = class_names
        self.settings = settings
        self.device = device
        self.model_version = model_version
        self.model_name = model_name

    def parse(self, item: Any) -> GraphRequest:
        settings = self.settings
        request = parse_graph_request(
            item, self.in_dim, settings.max_graph_nodes, settings.max_graph_edges, self.edge_dim
        )
        if request.return_embedding and not self.classifier.has_embedding:
            raise BadRequest(
                "return_embedding: this archive's model names no graph embedding (its forward "
                "calls no Linear layer on one row per graph); rebuild it with "
                "--embedding-method NAME, a method of the model returning one row per graph"
            )
        return request

    def make_group(self, positions: list[int], outcomes: list[Any]) -> Any:
        requests = [outcomes[p] for p in positions]
        return batch_of([as_data(r.x, r.edge_index, edge_attr=r.edge_attr) for r in requests])

    def run_group(self, group: Group, batch: Batch[GraphRequest]) -> None:
        graphs = group.payload
        batch.times.seed_nodes += len(group.positions)
        batch.times.sampled_nodes += int(graphs.num_nodes)
        batch.times.sampled_edges += int(graphs.num_edges)
        stop = timed(batch.times, "gather")
        x, edge_index = graphs.x.to(self.device), graphs.edge_index.to(self.device)
        assignment = graphs.batch.to(self.device)
        edge_attr = graphs.edge_attr.to(self.device) if self.edge_dim else None
        stop()
        stop = timed(batch.times, "forward")
        with torch.inference_mode():
            rows, embedding = self.classifier.forward_with_embedding(
                x, edge_index, assignment, edge_attr
            )
            answers = answer_rows(rows, self.output).cpu()
            embeddings = None if embedding is None else embedding.float().cpu()
        stop()
        for row, position in enumerate(group.positions):
            batch.results[position] = (
                answers[row],
                None if embeddings is None else embeddings[row],
            )

    def body(self, request: GraphRequest, result: Any) -> dict[str, Any]:
        row, embedding = result
        if request.protocol == "v2":  # one graph: predicted_class [1], probabilities [1, C]
            outputs = class_outputs([row.tolist()])
            return inference_response(
                request.request_id, self.model_name, self.model_version, outputs
            )
        answer = node_answer(row.tolist(), self.output, self.class_names)
        if request.return_embedding and embedding is not None:
            answer["embedding"] = embedding.tolist()
        answer["model_version"] = self.model_version
        return answer

    def describe(self) -> dict[str, Any]:
        """The graph part of the management API's description."""
        return {
            "feature_dim": self.in_dim,
            "edge_feature_dim": self.edge_dim,
            "class_names": self.class_names,
            "max_graph_nodes": self.settings.max_graph_nodes,
            "max_graph_edges": self.settings.max_graph_edges,
        }
