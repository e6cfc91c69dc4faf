"""Node explanations: ``{"node_id": a}``, the predicted class's logit of that node explained on
its ego-graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError

from handler.core.batch import Batch
from handler.core.explain import EgoExplanation, explanation_mode
from handler.protocol.body import NodeId, as_request
from handler.protocol.class_answer import node_answer
from handler.protocol.errors import BadRequest
from handler.protocol.validation import IdField, Strict, describe_errors
from model.served import answer_rows, serving_needs

_EXAMPLE = '{"node_id": 42}'


class _NodeTarget(Strict):
    node_id: IdField


@dataclass(frozen=True, eq=False)
class NodeTarget:
    node_id: NodeId
    nodes: np.ndarray


class NodeExplanation(EgoExplanation):
    """Explains one node per request."""

    def parse(self, item: Any) -> NodeTarget:
        body = as_request(item).json_object(_EXAMPLE)
        if not self.ego.store.schema.is_homogeneous:
            raise BadRequest(
                "explanations are not available yet on a graph of several node types or relations"
            )
        try:
            node = _NodeTarget.model_validate(body).node_id
        except ValidationError as error:
            raise BadRequest(
                f"explain one node per request, as {_EXAMPLE} ({describe_errors(error)})"
            ) from None
        return NodeTarget(node, self.ego.lookup([node]))

    def explain(self, target: NodeTarget, payload: Any, batch: Batch[Any]) -> dict[str, Any]:
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
