"""Link explanations: ``{"src": a, "dst": b}``, the pair's score before the sigmoid (the
logit; a model's own value when its scores are probabilities or raw) explained on the ego-graph
of both endpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from handler.explain.ego_explain import EgoExplanation
from handler.pipeline.batch import Batch
from handler.protocol.body import NodeId
from handler.protocol.errors import BadRequest
from handler.protocol.kserve_v2 import explanation_refusal
from handler.tasks.link.requests import PairRequest, parse_link_request
from model.link import LinkModel, PairLogit, answer_scores
from model.served import serving_needs


@dataclass(frozen=True, eq=False)
class PairTarget:
    ids: tuple[NodeId, NodeId]
    nodes: np.ndarray


class PairExplanation(EgoExplanation):
    """Explains one pair per request."""

    def parse(self, item: Any) -> PairTarget:
        if not self.ego.store.schema.is_homogeneous:
            raise BadRequest(
                "explanations are not available yet on a graph of several node types or relations"
            )
        settings = self.settings
        request = parse_link_request(item, settings.max_ids_per_request, settings.max_top_k)
        if isinstance(request, PairRequest) and request.protocol == "v2":
            raise explanation_refusal('{"src": 1, "dst": 2}')
        if not isinstance(request, PairRequest) or not request.single:
            raise BadRequest('explain one pair per request: {"src": 1, "dst": 2}')
        ids = request.pairs[0]
        return PairTarget(ids, self.ego.lookup(list(ids)))

    def explain(self, target: PairTarget, payload: Any, batch: Batch[Any]) -> dict[str, Any]:
        inputs = self.ego_input(target.nodes, payload, batch)
        model = cast(LinkModel, inputs.model)  # the link engine checked the task
        output = serving_needs(inputs.model).output
        pair = torch.tensor([[inputs.rows[0]], [inputs.rows[1]]], device=inputs.x.device)
        with torch.no_grad():
            z = inputs.model(inputs.x, inputs.edge_index, **inputs.forward_kwargs())
            score = float(answer_scores(model.score(z[pair[0]], z[pair[1]]), output)[0])
        answer: dict[str, Any] = {"src": target.ids[0], "dst": target.ids[1], "score": score}
        attribution = self.attributions(
            PairLogit(model).eval(), inputs, mode="regression", level="edge", pair=pair
        )
        answer["explanation"] = self.summary(attribution, inputs)
        return answer
