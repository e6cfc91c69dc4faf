"""Explanations (TorchServe's ``/explanations/{model}``): which nodes, edges and features drove
an answer, computed on the request's ego-graph (or inline graph) with PyG's explain module.
Each task says what one of its explanation requests asks about (``handler.tasks.<task>.explain``);
this module computes and lists the attributions the same way for all of them.

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
``explain_top_k`` largest in absolute value are listed. On a graph of several node types or
relations (``handler.explain.typed_explain``) the listing names each node's type, each edge's
relation and each feature's node type (:class:`Naming`).
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch_geometric.explain import Explainer
from torch_geometric.explain.algorithm import CaptumExplainer

from handler.graph.ego import EgoGraphs, seed_rows
from handler.pipeline.batch import Batch, BatchEngine, Group, timed
from handler.protocol.errors import BadRequest
from handler.sampling.sampler import SampledSubgraph
from handler.settings import ServingSettings
from model.user_model import Output

METHOD = "IntegratedGradients"


class Explanation(Protocol):
    """What a task explains: how one request is parsed into a target, and how that target's
    answer and attributions are computed (``sample`` gives the ego-graph, or None)."""

    settings: ServingSettings
    device: torch.device

    def refresh(self) -> None: ...

    def parse(self, item: Any) -> Any: ...

    def sample(self, target: Any) -> Any: ...

    def explain(self, target: Any, payload: Any, batch: Batch[Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Attribution:
    """Integrated Gradients on one input: ``node_mask [rows, F]``, ``edge_mask [E]``."""

    node_mask: torch.Tensor
    edge_mask: torch.Tensor
    steps: int
    budget_limited: bool
    seconds: float


def explanation_mode(output: Output, width: int) -> str:
    """Captum's mode for a model's rows: class scores are explained as the predicted class's,
    a raw output as a regression of its one value; a raw row of several values has no one
    value to explain (400)."""
    if output is not Output.RAW:
        return "multiclass_classification"
    if width != 1:
        raise BadRequest(
            f"explanations of a raw output explain one value, and this archive's model returns "
            f"{width} per row; build it with --output logits or probabilities for class scores"
        )
    return "regression"


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

    def run(n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        explainer = Explainer(
            model,
            algorithm=CaptumExplainer(METHOD, n_steps=n_steps),
            explanation_type="model",
            node_mask_type="attributes",
            edge_mask_type="object",
            model_config={"mode": mode, "task_level": level, "return_type": "raw"},
        )
        explanation = explainer(x, edge_index, index=0, **kwargs)
        return explanation.node_mask, explanation.edge_mask

    return within_budget(run, steps, budget_s)


def within_budget(
    run: Callable[[int], tuple[torch.Tensor, torch.Tensor]], steps: int, budget_s: float
) -> Attribution:
    """``run(n)`` (IG with ``n`` steps: ``(node_mask, edge_mask)``) with ``steps`` steps, or as
    many as one timed step says fit in ``budget_s`` (at least one)."""
    # Captum is imported by a worker's first explanation, not at its start (0.3 s of every
    # server start here), and before the probe, which must time one step alone.
    importlib.import_module("captum.attr")
    start = time.perf_counter()
    node_mask, edge_mask = run(1)  # the probe: one step, timed on this very input
    probe = time.perf_counter() - start
    affordable = math.floor((budget_s - probe) / max(probe, 1e-6))
    used = max(1, min(steps, affordable))
    if used > 1:
        node_mask, edge_mask = run(used)
    return Attribution(
        node_mask=node_mask.detach().cpu(),
        edge_mask=edge_mask.detach().cpu(),
        steps=used,
        budget_limited=used < steps,
        seconds=time.perf_counter() - start,
    )


@dataclass(frozen=True)
class Naming:
    """What an explanation on a graph of several node types or relations names: each listed
    node's type, each edge's relation and each feature's node type.

    Attributes:
        node_types, relations: the graph's names, in schema order.
        row_type: ``[n]`` each row's node type index.
        edge_relation: ``[E]`` each edge's relation index.
        column_type: ``[C]`` the node type of each column of the node mask (the types'
            features side by side).
        column_feature: ``[C]`` each column's feature index within its type.
    """

    node_types: tuple[str, ...]
    relations: tuple[str, ...]
    row_type: np.ndarray
    edge_relation: np.ndarray
    column_type: np.ndarray
    column_feature: np.ndarray

    def node(self, row: int) -> dict[str, str]:
        return {"node_type": self.node_types[self.row_type[row]]}

    def edge(self, relation: int) -> dict[str, str]:
        return {"edge_type": self.relations[relation]}

    def feature(self, column: int) -> dict[str, Any]:
        return {
            "node_type": self.node_types[self.column_type[column]],
            "feature": int(self.column_feature[column]),
        }


def summarize(
    attribution: Attribution,
    node_ids: list[Any],
    edge_index: torch.Tensor,
    row_node: np.ndarray,
    top_k: int,
    naming: Naming | None = None,
) -> dict[str, Any]:
    """The listed part of an explanation: top nodes, edges and features by |attribution|.

    ``row_node`` maps each row of the input to a node key (its global index, or the local node
    number of an inline graph); ``node_ids`` gives the ID shown for each key ``>= 0``, in key
    order. A row keyed ``-1`` (the zero-feature boundary row an ego-graph carries for a model
    that normalises by its sources' degrees) and its edges feed no answer and are not listed.
    With ``naming`` (a graph of several types) nodes carry their ``node_type``, edges their
    ``edge_type`` (parallel edges of two relations are two entries) and features their
    ``node_type`` and index within it.
    """
    inside = row_node >= 0
    masked = attribution.node_mask[torch.from_numpy(inside)]
    per_row = masked.sum(dim=1).double().numpy()
    keys, first, inverse = np.unique(row_node[inside], return_index=True, return_inverse=True)
    per_node = np.bincount(inverse, weights=per_row, minlength=keys.size)
    shown = dict(zip(keys.tolist(), node_ids, strict=True))
    src = row_node[edge_index[0].cpu().numpy()]
    dst = row_node[edge_index[1].cpu().numpy()]
    relation = np.zeros_like(src) if naming is None else naming.edge_relation
    between = (src >= 0) & (dst >= 0)
    triples, triple_inverse = np.unique(
        np.stack([src, dst, relation], axis=1)[between], axis=0, return_inverse=True
    )
    per_edge = np.bincount(
        triple_inverse.ravel(),
        weights=attribution.edge_mask.double().numpy()[between],
        minlength=len(triples),
    )
    per_feature = masked.sum(dim=0).double().numpy()
    rows = np.flatnonzero(inside)[first]  # a row of each node
    nodes = [
        {
            "node_id": shown[int(keys[i])],
            **(naming.node(int(rows[i])) if naming else {}),
            "attribution": float(per_node[i]),
        }
        for i in _top(per_node, top_k)
    ]
    edges = [
        {
            **(naming.edge(int(triples[i][2])) if naming else {}),
            "src": shown[int(triples[i][0])],
            "dst": shown[int(triples[i][1])],
            "attribution": float(per_edge[i]),
        }
        for i in _top(per_edge, top_k)
    ]
    features = [
        {
            **(naming.feature(i) if naming else {"feature": i}),
            "attribution": float(per_feature[i]),
        }
        for i in _top(per_feature, top_k)
    ]
    return {
        "method": METHOD,
        "steps": attribution.steps,
        "budget_limited": attribution.budget_limited,
        "seconds": round(attribution.seconds, 4),
        "nodes": nodes,
        "edges": edges,
        "features": features,
    }


def _top(values: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` largest absolute values, largest first (ties by index)."""
    order = np.lexsort((np.arange(values.size), -np.abs(values)))
    return order[:k].tolist()


class ExplainEngine(BatchEngine[Any]):
    """Answers a task's explanation requests one at a time (each costs ``steps`` passes)."""

    def __init__(self, explanation: Explanation, model_version: str) -> None:
        self.explanation = explanation
        self.device = explanation.device
        self.model_version = model_version

    def refresh(self) -> None:
        self.explanation.refresh()

    def parse(self, item: Any) -> Any:
        return self.explanation.parse(item)

    def plan(self, positions: list[int], outcomes: list[Any]) -> list[list[int]]:
        return [[position] for position in positions]

    def make_group(self, positions: list[int], outcomes: list[Any]) -> Any:
        return self.explanation.sample(outcomes[positions[0]])

    def run_group(self, group: Group, batch: Batch[Any]) -> None:
        position = group.positions[0]
        stop = timed(batch.times, "forward")
        answer = self.explanation.explain(batch.outcomes[position], group.payload, batch)
        stop()
        answer["model_version"] = self.model_version
        batch.results[position] = answer

    def body(self, request: Any, result: Any) -> dict[str, Any]:
        return dict(result)


@dataclass(frozen=True)
class EgoInput:
    """An ego-graph ready to differentiate through: features, degrees and a structure that is
    not an inference tensor (autograd saves it)."""

    x: torch.Tensor
    degree: torch.Tensor
    edge_index: torch.Tensor
    rows: list[int]
    keys: np.ndarray
    model: torch.nn.Module
    edge_attr: torch.Tensor | None = (
        None  # the sampled edges' features, for a model that reads them
    )

    def forward_kwargs(self) -> dict[str, torch.Tensor | None]:
        """What the model's forward takes besides ``x`` and ``edge_index``, in the order of the
        served-model protocol's ``forward(x, edge_index, degree, level_sizes, edge_attr)``:
        Captum hands them on by position."""
        if self.edge_attr is None:
            return {"degree": self.degree}
        return {"degree": self.degree, "level_sizes": None, "edge_attr": self.edge_attr}


class EgoExplanation:
    """The part node and pair explanations share: the target's ego-graph, gathered and ready
    for Integrated Gradients, and the summary keyed by external node IDs."""

    def __init__(self, ego: EgoGraphs) -> None:
        self.ego = ego
        self.settings = ego.settings
        self.device = ego.device

    def refresh(self) -> None:
        self.ego.sync()

    def sample(self, target: Any) -> tuple[torch.Tensor, SampledSubgraph]:
        return self.ego.sample(target.nodes)

    def ego_input(
        self, nodes: np.ndarray, payload: tuple[torch.Tensor, SampledSubgraph], batch: Batch[Any]
    ) -> EgoInput:
        seeds, sub = payload
        x, degree = self.ego.gather(sub.node)
        batch.times.sampled_nodes += sub.num_nodes
        batch.times.sampled_edges += sub.num_edges
        return EgoInput(
            x=x,
            degree=degree,
            edge_index=sub.edge_index.clone(),
            rows=seed_rows(seeds, nodes),
            keys=sub.node.cpu().numpy(),
            model=self.ego.model,
            edge_attr=self.ego.edge_features(sub.edge),
        )

    def attributions(
        self, model: torch.nn.Module, inputs: EgoInput, mode: str, level: str, **kwargs: Any
    ) -> Attribution:
        """Integrated Gradients on the ego-graph within the archive's steps and time budget.
        ``kwargs`` (a pair) come before ``degree``: Captum hands the extra arguments on to the
        model's forward in the order they are given."""
        return integrated_gradients(
            model,
            inputs.x,
            inputs.edge_index,
            mode=mode,
            level=level,
            steps=self.settings.explain_steps,
            budget_s=self.settings.explain_time_budget_ms / 1000,
            **kwargs,
            **inputs.forward_kwargs(),
        )

    def summary(self, attribution: Attribution, inputs: EgoInput) -> dict[str, Any]:
        node_ids = self.ego.external_ids(np.unique(inputs.keys[inputs.keys >= 0]))
        return summarize(
            attribution, node_ids, inputs.edge_index, inputs.keys, self.settings.explain_top_k
        )
