"""Graph explanations: ``{"graph": ...}``, the predicted class's logit of the inline graph
(a raw output's value) explained on the graph itself (node keys are its local node numbers).
A model that reads edge features gets the request's ``edge_attr`` as its fourth argument, after
``batch`` (Captum hands the extra arguments on by position); attributions are the nodes'."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from handler.explain.ego_explain import explanation_mode, integrated_gradients, summarize
from handler.pipeline.batch import Batch
from handler.protocol.class_answer import node_answer
from handler.protocol.kserve_v2 import explanation_refusal
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.graph.requests import GRAPH_EXAMPLE, GraphRequest
from model.served import answer_rows


class GraphExplanation:
    """Explains one inline graph per request, with the graph engine's parser and model."""

    def __init__(self, graphs: GraphEngine) -> None:
        self.graphs = graphs
        self.settings = graphs.settings
        self.device = graphs.device

    def refresh(self) -> None:
        """Inline graphs: nothing to catch up with."""

    def parse(self, item: Any) -> GraphRequest:
        request = self.graphs.parse(item)
        if request.protocol == "v2":
            raise explanation_refusal(GRAPH_EXAMPLE)
        return request

    def sample(self, target: GraphRequest) -> None:
        """The request carries its whole graph: nothing to sample."""

    def explain(self, target: GraphRequest, payload: Any, batch: Batch[Any]) -> dict[str, Any]:
        device, settings = self.graphs.device, self.settings
        model = self.graphs.model
        x = torch.from_numpy(target.x).to(device)
        edge_index = torch.from_numpy(target.edge_index).to(device)
        assignment = torch.zeros(x.shape[0], dtype=torch.long, device=device)
        extra: dict[str, torch.Tensor] = {"batch": assignment}
        if target.edge_attr is not None:
            extra["edge_attr"] = torch.from_numpy(target.edge_attr).to(device)
        output = self.graphs.output
        with torch.no_grad():
            row = answer_rows(model(x, edge_index, **extra)[0], output)
        answer = node_answer(row.cpu().tolist(), output, self.graphs.class_names)
        attribution = integrated_gradients(
            model,
            x,
            edge_index,
            mode=explanation_mode(output, int(row.numel())),
            level="graph",
            steps=settings.explain_steps,
            budget_s=settings.explain_time_budget_ms / 1000,
            **extra,
        )
        keys = np.arange(x.shape[0])
        answer["explanation"] = summarize(
            attribution, keys.tolist(), edge_index, keys, settings.explain_top_k
        )
        return answer
