"""Node explanations: ``{"node_id": a}`` (and ``node_type`` on a graph of several), the
predicted class's logit of that node explained on its ego-graph; a typed model's through PyG's
heterogeneous Captum path (``handler.explain.typed_explain``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from handler.explain.ego_explain import EgoExplanation, explanation_mode, summarize
from handler.explain.typed_explain import typed_integrated_gradients, typed_naming
from handler.pipeline.batch import Batch
from handler.protocol.body import NodeId, as_request
from handler.protocol.class_answer import node_answer
from handler.protocol.errors import BadRequest
from handler.protocol.validation import IdField, Strict, describe_errors
from handler.sampling.sampler import SampledSubgraph
from model.served import answer_rows, serving_needs
from model.served.contract import served
from model.served_hetero import answer_seeds
from model.typed_rows import gather_typed

_EXAMPLE = '{"node_id": 42}'


class _NodeTarget(Strict):
    node_id: IdField
    node_type: str | None = None


@dataclass(frozen=True, eq=False)
class NodeTarget:
    node_id: NodeId
    nodes: np.ndarray


class NodeExplanation(EgoExplanation):
    """Explains one node per request."""

    def parse(self, item: Any) -> NodeTarget:
        body = as_request(item).json_object(_EXAMPLE)
        try:
            parsed = _NodeTarget.model_validate(body)
        except ValidationError as error:
            raise BadRequest(
                f"explain one node per request, as {_EXAMPLE} ({describe_errors(error)})"
            ) from None
        self.ego.check_node_type(parsed.node_type)
        return NodeTarget(parsed.node_id, self.ego.lookup([parsed.node_id], parsed.node_type))

    def explain(self, target: NodeTarget, payload: Any, batch: Batch[Any]) -> dict[str, Any]:
        if served(self.ego.model).typed:
            return self._explain_typed(target, payload, batch)
        inputs = self.ego_input(target.nodes, payload, batch)
        output = serving_needs(inputs.model).output
        with torch.no_grad():
            rows = inputs.model(inputs.x, inputs.edge_index, **inputs.forward_kwargs())
        row = answer_rows(rows[inputs.rows[0]], output).cpu().tolist()
        answer = {"node_id": target.node_id, **node_answer(row, output, self.ego.store.class_names)}
        mode = explanation_mode(output, len(row))
        attribution = self.attributions(inputs.model, inputs, mode=mode, level="node")
        answer["explanation"] = self.summary(attribution, inputs)
        return answer

    def _explain_typed(
        self,
        target: NodeTarget,
        payload: tuple[torch.Tensor, SampledSubgraph],
        batch: Batch[Any],
    ) -> dict[str, Any]:
        """The seed's served answer (the node engine's trimmed forward) and the attributions
        of its predicted class, listed with their node types and relations."""
        _, sub = payload
        batch.times.sampled_nodes += sub.num_nodes
        batch.times.sampled_edges += sub.num_edges
        schema, view = self.ego.store.schema, self.ego.view()
        keys = sub.node.cpu().numpy()
        # Autograd saves the structure it differentiates through: not the sampler's inference
        # tensor.
        edge_index = sub.edge_index.to(self.device).clone()
        typed = gather_typed(schema, view, keys, edge_index, sub.edge.cpu().numpy(), self.device)
        model = served(self.ego.model)
        output = model.serving_needs.output
        with torch.no_grad():  # the node engine's answer: its trimmed forward
            rows, _ = answer_seeds(
                model,
                typed.layout,
                typed.features,
                typed.n_id,
                typed.edge_features,
                sub.num_seeds,
                hops=(sub.level_sizes, edge_index),
            )
        row = answer_rows(rows[0], output).cpu().tolist()
        answer: dict[str, Any] = {"node_id": target.node_id}
        if not schema.is_homogeneous:
            answer["node_type"] = self.ego.served_node_type
        answer.update(node_answer(row, output, self.ego.store.class_names))
        mode = explanation_mode(output, len(row))
        attribution = typed_integrated_gradients(
            self.ego.model,
            typed,
            mode=mode,
            target=None if mode == "regression" else int(np.argmax(row)),
            steps=self.settings.explain_steps,
            budget_s=self.settings.explain_time_budget_ms / 1000,
        )
        answer["explanation"] = summarize(
            attribution,
            view.external_ids(np.unique(keys[keys >= 0])),
            edge_index,
            keys,
            self.settings.explain_top_k,
            None if schema.is_homogeneous else typed_naming(typed),
        )
        return answer
