"""Explanations (TorchServe's ``/explanations/{model}``): which nodes, edges and features drove
an answer, computed on the request's ego-graph (or inline graph) with PyG's explain module.

Method: Integrated Gradients through PyG's ``CaptumExplainer`` (``captum``), on node features
(``node_mask_type="attributes"``) and on edges (``edge_mask_type="object"``, an edge weight that
the message passing multiplies in) at once, from the all-zero baseline (no features, no edges).
Chosen over GNNExplainer because a served explanation should be repeatable and its cost known
in advance: IG is deterministic (the same request gets the same explanation) and costs exactly
``steps`` forward and backward passes of the ego-graph, where GNNExplainer optimises random
initial masks for 100-200 epochs per request; IG's attributions are signed (what pushes towards
and against the answer) and add up to the difference between the output and the baseline's
output (completeness), so they can be compared across nodes, edges and features.

Budget: ``explain_steps`` steps (default 32), fewer if one step, timed on this request's own
ego-graph, times the steps would exceed ``explain_time_budget_ms``; the answer says how many
steps ran and whether the budget cut them (``budget_limited``). One explanation per request, so
TorchServe's batches are computed one request after the other.

What is explained: node archives the predicted class's logit of ``{"node_id": a}``; link
archives the pair's logit of ``{"src": a, "dst": b}``; graph archives the predicted class's
logit of ``{"graph": ...}``. Attributions are summed per node over its features (and over its
copies at different hops), per edge over its copies, and per feature over all nodes; the
``explain_top_k`` largest in absolute value are listed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

import captum.attr  # noqa: F401  (CaptumExplainer imports it on first use: pay that at start)
import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch_geometric.explain import Explainer
from torch_geometric.explain.algorithm import CaptumExplainer

from handler.batch_core import Batch, BatchEngine, Group, timed
from handler.class_answer import class_answer
from handler.ego import EgoGraphs, plain_module, seed_rows
from handler.errors import BadRequest
from handler.graph_engine import GraphEngine
from handler.node_requests import NodeId
from handler.task_requests import (
    GraphRequest,
    IdField,
    PairRequest,
    describe_errors,
    parse_link_request,
    request_body,
)
from model.link import LinkPredictor, PairLogit

METHOD = "IntegratedGradients"
Kind = Literal["node", "pair", "graph"]


class _NodeTarget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    node_id: IdField


@dataclass(frozen=True, eq=False)
class Target:
    """What one explanation request asks about: a node, a pair, or an inline graph."""

    kind: Kind
    ids: tuple[NodeId, ...] = ()
    nodes: np.ndarray | None = None
    graph: GraphRequest | None = None


@dataclass(frozen=True)
class Attribution:
    """Integrated Gradients on one input: ``node_mask [rows, F]``, ``edge_mask [E]``."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    steps: int
    budget_limited: bool
    seconds: float


def integrated_gradients(
    model: torch.nn.Module,
    x: torch.Tensor,
    edge_index: torch.Tensor,
    *,
    mode: str,
    level: str,
    steps: int,
    budget_s: float,
    **kwargs: Any,
) -> Attribution:
    """IG attributions of output row 0 (see the module docstring), ``steps`` cut to the budget.

    ``model`` must be in eval mode: the explainer puts it back in the mode it found it in.
    """
    if model.training:
        raise ValueError("explain a model in eval mode (the explainer restores its mode)")
    start = time.perf_counter()

    def run(n_steps: int) -> Any:
        explainer = Explainer(
            model,
            algorithm=CaptumExplainer(METHOD, n_steps=n_steps),
            explanation_type="model",
            node_mask_type="attributes",
            edge_mask_type="object",
            model_config={"mode": mode, "task_level": level, "return_type": "raw"},
        )
        return explainer(x, edge_index, index=0, **kwargs)

    explanation = run(1)  # the probe: one step, timed on this very input
    probe = time.perf_counter() - start
    affordable = math.floor((budget_s - probe) / max(probe, 1e-6))
    used = max(1, min(steps, affordable))
    if used > 1:
        explanation = run(used)
    return Attribution(
        node_mask=explanation.node_mask.detach().cpu(),
        edge_mask=explanation.edge_mask.detach().cpu(),
        steps=used,
        budget_limited=used < steps,
        seconds=time.perf_counter() - start,
    )


def summarize(
    attribution: Attribution,
    node_ids: list[Any],
    edge_index: torch.Tensor,
    row_node: np.ndarray,
    top_k: int,
) -> dict[str, Any]:
    """The listed part of an explanation: top nodes, edges and features by |attribution|.

    ``row_node`` maps each row of the input to a node key (its global index, or the local node
    number of an inline graph); ``node_ids`` gives the ID shown for each key in ``keys``.
    """
    per_row = attribution.node_mask.sum(dim=1).double().numpy()
    keys, inverse = np.unique(row_node, return_inverse=True)
    per_node = np.bincount(inverse, weights=per_row, minlength=keys.size)
    shown = dict(zip(keys.tolist(), node_ids, strict=True))
    src = row_node[edge_index[0].cpu().numpy()]
    dst = row_node[edge_index[1].cpu().numpy()]
    pairs, pair_inverse = np.unique(np.stack([src, dst], axis=1), axis=0, return_inverse=True)
    per_edge = np.bincount(
        pair_inverse.ravel(), weights=attribution.edge_mask.double().numpy(), minlength=len(pairs)
    )
    per_feature = attribution.node_mask.sum(dim=0).double().numpy()
    return {
        "method": METHOD,
        "steps": attribution.steps,
        "budget_limited": attribution.budget_limited,
        "seconds": round(attribution.seconds, 4),
        "nodes": [
            {"node_id": shown[int(keys[i])], "attribution": float(per_node[i])}
            for i in _top(per_node, top_k)
        ],
        "edges": [
            {
                "src": shown[int(pairs[i][0])],
                "dst": shown[int(pairs[i][1])],
                "attribution": float(per_edge[i]),
            }
            for i in _top(per_edge, top_k)
        ],
        "features": [
            {"feature": int(i), "attribution": float(per_feature[i])}
            for i in _top(per_feature, top_k)
        ],
    }


def _top(values: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` largest absolute values, largest first (ties by index)."""
    order = np.lexsort((np.arange(values.size), -np.abs(values)))
    return order[:k].tolist()


class ExplainEngine(BatchEngine[Target]):
    """Answers explanation requests of a node, link or graph archive, one at a time."""

    def __init__(
        self,
        task: str,
        model_version: str,
        ego: EgoGraphs | None = None,
        graphs: GraphEngine | None = None,
    ) -> None:
        if (task == "graph") != (graphs is not None) or (task != "graph") != (ego is not None):
            raise ValueError("node and link explanations need the graph, graph ones the engine")
        self.task = task
        self.ego = ego
        self.graphs = graphs
        self.model_version = model_version
        if ego is not None:
            self.settings, self.device = ego.settings, ego.device
        else:
            assert graphs is not None
            self.settings, self.device = graphs.settings, graphs.device

    def refresh(self) -> None:
        if self.ego is not None:
            self.ego.sync()

    def parse(self, item: Any) -> Target:
        settings = self.settings
        if self.graphs is not None:
            return Target("graph", graph=self.graphs.parse(item))
        assert self.ego is not None
        if self.task == "link":
            request = parse_link_request(item, settings.max_ids_per_request, settings.max_top_k)
            if not isinstance(request, PairRequest) or not request.single:
                raise BadRequest('explain one pair per request: {"src": 1, "dst": 2}')
            ids = request.pairs[0]
            return Target("pair", ids=ids, nodes=self.ego.lookup(list(ids)))
        body = request_body(item, '{"node_id": 42}')
        try:
            node = _NodeTarget.model_validate(body).node_id
        except ValidationError as error:
            raise BadRequest(
                f'explain one node per request, as {{"node_id": 42}} ({describe_errors(error)})'
            ) from None
        return Target("node", ids=(node,), nodes=self.ego.lookup([node]))

    def plan(self, positions: list[int], outcomes: list[Any]) -> list[list[int]]:
        return [[position] for position in positions]

    def make_group(self, positions: list[int], outcomes: list[Any]) -> Any:
        target: Target = outcomes[positions[0]]
        if target.kind == "graph":
            return None
        assert self.ego is not None and target.nodes is not None
        return self.ego.sample(target.nodes)

    def run_group(self, group: Group, batch: Batch[Target]) -> None:
        target = batch.outcomes[group.positions[0]]
        assert isinstance(target, Target)
        stop = timed(batch.times, "forward")
        if target.kind == "graph":
            result = self._explain_graph(target)
        else:
            result = self._explain_ego(target, group.payload, batch)
        stop()
        batch.results[group.positions[0]] = result

    def _explain_ego(self, target: Target, payload: Any, batch: Batch[Target]) -> dict[str, Any]:
        assert self.ego is not None and target.nodes is not None
        seeds, sub = payload
        x, degree = self.ego.gather(sub.node)
        batch.times.sampled_nodes += sub.num_nodes
        batch.times.sampled_edges += sub.num_edges
        model = plain_module(self.ego.model)
        rows = seed_rows(seeds, target.nodes)
        budget = self.settings.explain_time_budget_ms / 1000
        if target.kind == "pair":
            assert isinstance(model, LinkPredictor)
            pair = torch.tensor([[rows[0]], [rows[1]]], device=self.device)
            with torch.no_grad():
                z = model(x, sub.edge_index, degree=degree)
                score = float(torch.sigmoid(model.score(z[pair[0]], z[pair[1]]))[0])
            answer: dict[str, Any] = {"src": target.ids[0], "dst": target.ids[1], "score": score}
            attribution = integrated_gradients(
                PairLogit(model).eval(),
                x,
                sub.edge_index,
                mode="regression",
                level="edge",
                steps=self.settings.explain_steps,
                budget_s=budget,
                pair=pair,
                degree=degree,
            )
        else:
            with torch.no_grad():
                logits = model(x, sub.edge_index, degree=degree)[rows[0]]
            answer = {"node_id": target.ids[0], **_classes(logits, self.ego.store.class_names)}
            attribution = integrated_gradients(
                model,
                x,
                sub.edge_index,
                mode="multiclass_classification",
                level="node",
                steps=self.settings.explain_steps,
                budget_s=budget,
                degree=degree,
            )
        keys = sub.node.cpu().numpy()
        node_ids = self.ego.external_ids(np.unique(keys))
        answer["explanation"] = summarize(
            attribution, node_ids, sub.edge_index, keys, self.settings.explain_top_k
        )
        answer["model_version"] = self.model_version
        return answer

    def _explain_graph(self, target: Target) -> dict[str, Any]:
        assert self.graphs is not None and target.graph is not None
        request = target.graph
        model = plain_module(self.graphs.model)
        x = torch.from_numpy(request.x).to(self.device)
        edge_index = torch.from_numpy(request.edge_index).to(self.device)
        batch = torch.zeros(x.shape[0], dtype=torch.long, device=self.device)
        with torch.no_grad():
            logits = model(x, edge_index, batch)[0]
        answer = _classes(logits, self.graphs.class_names)
        attribution = integrated_gradients(
            model,
            x,
            edge_index,
            mode="multiclass_classification",
            level="graph",
            steps=self.settings.explain_steps,
            budget_s=self.settings.explain_time_budget_ms / 1000,
            batch=batch,
        )
        keys = np.arange(x.shape[0])
        answer["explanation"] = summarize(
            attribution, keys.tolist(), edge_index, keys, self.settings.explain_top_k
        )
        answer["model_version"] = self.model_version
        return answer

    def body(self, request: Target, result: Any) -> dict[str, Any]:
        return dict(result)


def _classes(logits: torch.Tensor, class_names: list[str] | None) -> dict[str, Any]:
    return class_answer(torch.softmax(logits.float(), dim=-1).cpu().tolist(), class_names)
