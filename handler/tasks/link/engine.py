"""Link prediction requests: pair scores from ego-graphs, top-k from the archive's embeddings.

- ``{"src": a, "dst": b}`` and ``{"pairs": [[a, b], ...]}``: the batch's pairs share one
  sampled ego-graph of all their endpoints (as node requests do); each node's embedding comes
  from it and the decoder scores the pair. With fanout ``-1`` at every hop this equals the
  full-graph forward. Any link model serves (``model.link.LinkModel``: the presets, the user's
  GAE-style class); a score is ``sigmoid`` of a logit, or the model's value as it is when its
  scores are probabilities or raw (``model.link.answer_scores``).
- ``{"src": a, "top_k": k, "exclude_neighbors": true}``: an exact search: ``a``'s embedding is
  scored against every node's embedding in ``link/embeddings.npy`` (one full-graph forward at
  build time, so exactly as fresh as the archive's graph; ``model.link_assets``), ``a`` itself
  and, unless ``exclude_neighbors`` is false, its in- and out-neighbours are left out, and the
  ``k`` best are returned with their scores.

On a graph of several node types the archive predicts one relation (``model.hetero_link``): a
pair is ``[source-type ID, destination-type ID]`` (an ID of the wrong type is a 404 naming
it), each end type's seeds get their own ego-graph through ``handler.graph.typed_ego``, and
top-k searches the destination type, leaving out the source's neighbours on that relation
(``handler.tasks.link.ends``).

A precomputed archive (``--precompute``) answers both from its stored output rows instead, which
its live updates keep equal to the full-graph forward of the version served: pair scores without
sampling, and top-k over the current nodes (added ones included, removed ones left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from handler.graph.ego import EgoGraphs, OnEgoGraphs, seed_rows
from handler.graph.typed_ego import typed_answer
from handler.pipeline.batch import Batch, BatchEngine, Group, timed
from handler.protocol.body import NodeId
from handler.protocol.errors import ApiError, NotFound
from handler.protocol.kserve_v2 import ids_datatype, inference_response, output
from handler.sampling.arrays import readonly_tensor
from handler.sampling.sampler import SampledSubgraph
from handler.tasks.link.ends import LinkEnds
from handler.tasks.link.requests import PairRequest, TopKRequest, parse_link_request
from model.config import Task
from model.link import LinkModel, answer_scores
from model.link_assets import LinkAssets
from model.served import serving_needs
from model.served.contract import served


@dataclass(frozen=True)
class ResolvedLink:
    """A parsed link request; ``nodes`` is ``[P, 2]`` for pairs, ``[1]`` for top-k."""

    request: PairRequest | TopKRequest
    nodes: np.ndarray


class LinkEngine(OnEgoGraphs, BatchEngine[ResolvedLink]):
    """Answers the three link request forms of a link prediction archive."""

    def __init__(
        self, ego: EgoGraphs, assets: LinkAssets, model_version: str, model_name: str = "link"
    ) -> None:
        model = served(ego.model)
        if model.task is not Task.LINK:
            raise TypeError(
                f"a link archive needs a link model (forward, score, score_against), got "
                f"{type(ego.model).__name__}, a {model.task.value} model"
            )
        self.ego = ego
        # Both protocols score alike: score(z_src, z_dst) and score_against(z_src, table).
        self.predictor = cast(LinkModel, ego.model)
        self.ends = LinkEnds.of(ego.store, model.edge_type)
        self._candidate_type = ego.store.schema.type_index(self.ends.dst_type)
        recorded = assets.meta.get("target_edge_type")
        if self.ends.typed and recorded != self.ends.relation:
            raise ValueError(
                f"link/ holds embeddings for {recorded!r}, the model predicts "
                f"{self.ends.relation!r}; rebuild the archive"
            )
        # One type's rows of a typed model: what each end's ego-graph is run through.
        self.type_rows = (
            {key: model.rows_of(key) for key in (self.ends.src_type, self.ends.dst_type)}
            if model.typed
            else {}
        )
        self.output = serving_needs(ego.model).output
        self.assets = assets
        self.device = ego.device
        self.model_version = model_version
        self.model_name = model_name
        # Every node's embedding at build time: the precomputed output rows where there are
        # (which live updates refresh: see _scores_against_every_node), else link/'s.
        rows = ego.precomputed
        stored = rows.precomputed.every_row(rows.num_layers - 1) if rows else assets.embeddings
        self.table = readonly_tensor(stored)
        if self.device.type != "cpu":
            self.table = self.table.to(self.device)

    def parse(self, item: Any) -> ResolvedLink:
        settings = self.ego.settings
        request = parse_link_request(item, settings.max_ids_per_request, settings.max_top_k)
        if isinstance(request, TopKRequest):
            return ResolvedLink(request, self._lookup([request.src], self.ends.src_type))
        sources = self._lookup([src for src, _ in request.pairs], self.ends.src_type)
        targets = self._lookup([dst for _, dst in request.pairs], self.ends.dst_type)
        return ResolvedLink(request, np.stack([sources, targets], axis=1))

    def _lookup(self, ids: list[NodeId], node_type: str) -> np.ndarray:
        """Internal indices of ``ids`` of ``node_type`` (any ID on a graph of one type); a
        404 lists the missing ones, and on a typed graph what a pair is."""
        if not self.ends.typed:
            return self.ego.lookup(ids)
        try:
            return self.ego.lookup(ids, node_type)
        except NotFound as error:
            raise NotFound(f"{error.message} ({self.ends.hint})") from None

    def plan(
        self, positions: list[int], outcomes: list[ResolvedLink | ApiError]
    ) -> list[list[int]]:
        """Pairs share one ego-graph; each top-k search is its own group."""
        pairs = [p for p in positions if isinstance(_link(outcomes[p]).request, PairRequest)]
        return ([pairs] if pairs else []) + [[p] for p in positions if p not in pairs]

    def make_group(self, positions: list[int], outcomes: list[ResolvedLink | ApiError]) -> Any:
        """Top-k: nothing to sample. Pairs: ``{node type: (seeds, ego-graph)}``, one ego-graph
        per end type (one on a graph of one type)."""
        if isinstance(_link(outcomes[positions[0]]).request, TopKRequest):
            return None
        pairs = np.concatenate([_link(outcomes[p]).nodes for p in positions])
        by_type: dict[str, list[np.ndarray]] = {}
        for end, node_type in enumerate((self.ends.src_type, self.ends.dst_type)):
            by_type.setdefault(node_type, []).append(pairs[:, end])
        groups: dict[str, tuple[torch.Tensor, SampledSubgraph | None]] = {}
        for node_type, parts in by_type.items():
            nodes = np.concatenate(parts)
            if self.ego.precomputed is not None:  # the stored embeddings: nothing to sample
                groups[node_type] = (torch.from_numpy(np.unique(nodes)), None)
            else:
                groups[node_type] = self.ego.sample(nodes)
        return groups

    def run_group(self, group: Group, batch: Batch[ResolvedLink]) -> None:
        if group.payload is None:
            resolved = _link(batch.outcomes[group.positions[0]])
            assert isinstance(resolved.request, TopKRequest)
            stop = timed(batch.times, "forward")
            batch.results[group.positions[0]] = self.top_k(
                int(resolved.nodes[0]), resolved.request.k, resolved.request.exclude_neighbors
            )
            stop()
            return
        embedded = {}
        for node_type, (seeds, sub) in group.payload.items():
            batch.times.seed_nodes += int(seeds.numel())
            embedded[node_type] = (seeds, self._embeddings(node_type, seeds, sub, batch))
        (src_seeds, z_src), (dst_seeds, z_dst) = (
            embedded[self.ends.src_type],
            embedded[self.ends.dst_type],
        )
        stop = timed(batch.times, "forward")
        with torch.inference_mode():
            for position in group.positions:
                nodes = _link(batch.outcomes[position]).nodes
                src, dst = seed_rows(src_seeds, nodes[:, 0]), seed_rows(dst_seeds, nodes[:, 1])
                scores = answer_scores(self.predictor.score(z_src[src], z_dst[dst]), self.output)
                batch.results[position] = scores.cpu().tolist()
        stop()

    def _embeddings(
        self,
        node_type: str,
        seeds: torch.Tensor,
        sub: SampledSubgraph | None,
        batch: Batch[ResolvedLink],
    ) -> torch.Tensor:
        """The seeds' embeddings: stored rows (precomputed), or one encoder pass over their
        ego-graph (a typed model's rows of ``node_type``, the seeds' type)."""
        rows = self.ego.precomputed
        if sub is None:
            stop = timed(batch.times, "gather")
            assert rows is not None
            z = torch.from_numpy(rows.rows(rows.num_layers, seeds.numpy())).to(self.device)
            stop()
            return z
        if self.type_rows:  # per-type features and per-relation edges, gathered there
            batch.times.sampled_nodes += sub.num_nodes
            batch.times.sampled_edges += sub.num_edges
            stop = timed(batch.times, "forward")
            with torch.inference_mode():
                view = self.ego.view()
                model = self.type_rows[node_type]
                z, _ = typed_answer(self.store, view, model, sub, self.device)
            stop()
            return z
        stop = timed(batch.times, "gather")
        with torch.inference_mode():
            x, degree = self.ego.gather(sub.node)
            edge_attr = self.ego.edge_features(sub.edge)
        stop()
        batch.times.sampled_nodes += sub.num_nodes
        batch.times.sampled_edges += sub.num_edges
        stop = timed(batch.times, "forward")
        with torch.inference_mode():
            z = self.predictor(x, sub.edge_index, degree=degree, edge_attr=edge_attr)
            z = z[: sub.num_seeds]
        stop()
        return z

    def refresh(self) -> None:
        # Updates acknowledged by any worker are visible from here on.
        self.ego.sync()

    def top_k(self, node: int, k: int, exclude_neighbors: bool) -> list[tuple[int, float]]:
        """The ``k`` best ``(node index, score)`` for ``node`` over the candidates (the whole
        graph, or a typed graph's destination type; the version served: a precomputed
        archive's rows follow its live updates)."""
        with torch.inference_mode():
            start, logits = self._scores_against_every_node(node)
            excluded = [np.array([node])]
            if exclude_neighbors:
                excluded += self._neighbours(node)
            drop = np.concatenate(excluded).astype(np.int64) - start
            drop = drop[(drop >= 0) & (drop < len(logits))]
            # -inf marks a removed node or another type's; a NaN is the model's and stays in,
            # so that topk ranks it first and the answer check refuses the answer.
            allowed = logits != float("-inf")
            allowed[torch.from_numpy(drop).to(logits.device)] = False
            logits = logits.masked_fill(~allowed, float("-inf"))
            count = min(k, int(allowed.sum()))
            best = torch.topk(logits, count)
            scores = answer_scores(best.values, self.output).cpu().tolist()
            return list(zip((best.indices + start).cpu().tolist(), scores, strict=True))

    def _scores_against_every_node(self, node: int) -> tuple[int, torch.Tensor]:
        """``(first, scores)``: the scores (before :func:`answer_scores`) of ``node`` against
        every candidate from node ``first``: the stored candidates (``ends.candidates``), or,
        once a precomputed archive's updates changed rows, every node of the version served
        from 0, ``-inf`` for removed nodes and nodes of other types than the candidates'."""
        start, stop = self.ends.candidates
        rows = self.ego.precomputed
        if rows is None:
            z_src = self.table[node].to(self.device)
            return start, self.predictor.score_against(z_src, self.table[start:stop]).float()
        z_src = torch.from_numpy(rows.rows(rows.num_layers, np.array([node]))[0]).to(self.device)
        logits = self.predictor.score_against(z_src, self.table[start:stop]).float()
        changed = rows.current(rows.num_layers)
        total = rows.view.num_nodes
        if not changed and total == stop:
            return start, logits
        every = torch.full((total,), float("-inf"), device=logits.device)
        every[start:stop] = logits
        nodes = np.fromiter(changed, dtype=np.int64, count=len(changed))
        nodes = nodes[rows.view.types_of(nodes) == self._candidate_type]
        if nodes.size:
            table = torch.from_numpy(np.stack([changed[n] for n in nodes.tolist()]))
            every[torch.from_numpy(nodes).to(logits.device)] = self.predictor.score_against(
                z_src, table.to(self.device)
            ).float()
        if self.ego.live is not None and self.ego.live.overlay.removed:
            removed = list(self.ego.live.overlay.removed)
            every[torch.tensor(removed, dtype=torch.int64, device=logits.device)] = float("-inf")
        return 0, every

    def _neighbours(self, node: int) -> list[np.ndarray]:
        """``node``'s in- and out-neighbours on the graph version served (on a typed graph,
        on the relation predicted)."""
        rows = self.ego.precomputed
        if rows is not None and self.ego.live is not None:
            relation = self.store.schema.relation_index(self.ends.relation)
            return rows.neighbours_on(node, self.ends.in_relations, relation)
        return self.ends.neighbours(self.ego.view(), self.assets, node)

    def body(self, request: ResolvedLink, result: Any) -> dict[str, Any]:
        inner = request.request
        version = {} if self.live is None else {"graph_version": self.live.version}
        if isinstance(inner, TopKRequest):
            ids = self.ego.external_ids(np.array([index for index, _ in result], dtype=np.int64))
            return {
                "src": inner.src,
                "recommendations": [
                    {"dst": node_id, "score": score}
                    for node_id, (_, score) in zip(ids, result, strict=True)
                ],
                "exclude_neighbors": inner.exclude_neighbors,
                "model_version": self.model_version,
                **version,
            }
        if inner.protocol == "v2":
            return self._v2_body(inner, result)
        predictions = [
            {"src": src, "dst": dst, "score": score}
            for (src, dst), score in zip(inner.pairs, result, strict=True)
        ]
        if inner.single:
            return {**predictions[0], "model_version": self.model_version, **version}
        return {"predictions": predictions, "model_version": self.model_version, **version}

    def _v2_body(self, request: PairRequest, scores: list[float]) -> dict[str, Any]:
        """``src`` and ``dst`` ``[n]`` (the IDs as sent) and ``score`` ``[n]`` FP32."""
        sources = [src for src, _ in request.pairs]
        targets = [dst for _, dst in request.pairs]
        outputs = [
            output("src", ids_datatype(sources), [len(sources)], sources),
            output("dst", ids_datatype(targets), [len(targets)], targets),
            output("score", "FP32", [len(scores)], scores),
        ]
        return inference_response(request.request_id, self.model_name, self.model_version, outputs)

    def describe(self) -> dict[str, Any]:
        """The link part of the management API's description."""
        return {
            "decoder": self.predictor.decoder_name,
            "output": self.output.value,
            "embedding_dim": int(self.table.shape[1]),
            "embeddings_built_at": self.assets.built_at,
            "max_top_k": self.ego.settings.max_top_k,
            **({"target_edge_type": self.ends.relation} if self.ends.typed else {}),
        }


def _link(outcome: ResolvedLink | ApiError) -> ResolvedLink:
    assert isinstance(outcome, ResolvedLink)
    return outcome
