"""Link prediction training on one relation of a graph of several node types: held-out pairs
of that relation, negatives drawn between its two end types, AUC and filtered ranking over the
destination type.

As ``model.link_train`` on a graph of one type: a held-out pair loses its edges of the relation
and of the relation's reverse (``rev_<relation>``, which ``--undirected`` adds) from the
message-passing graph, so no test link leaks through its reverse (on a relation within one
type, pairs count in either direction); training is full-batch, seeded (initial weights,
dropout, the split and every epoch's negatives) and keeps the best epoch by validation AUC.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.typing import EdgeType
from torch_geometric.utils import negative_sampling

from graph_assets.schema import REVERSE_PREFIX
from model.config import ModelConfig
from model.early_stopping import Schedule, fit_epochs, step
from model.hetero_link import HeteroLinkModel, HeteroLinkPredictor
from model.link_train import (
    HITS_AT,
    LinkTrainResult,
    hold_out,
    link_result,
    pair_loss,
    ranked_metrics,
    ranking_sample,
    seeded_training,
)
from model.metrics import filtered_ranks, pair_keys, roc_auc
from model.typed_batch import HeteroInput


@dataclass(frozen=True)
class Ends:
    """The relation predicted and its ends' node counts."""

    edge_type: EdgeType
    num_src: int
    num_dst: int

    @classmethod
    def of(cls, inputs: HeteroInput, edge_type: EdgeType) -> Ends:
        src, _, dst = edge_type
        return cls(edge_type, inputs.n_id_dict[src].numel(), inputs.n_id_dict[dst].numel())

    @property
    def one_type(self) -> bool:
        return self.edge_type[0] == self.edge_type[2]

    @property
    def sizes(self) -> int | tuple[int, int]:
        """``negative_sampling``'s ``num_nodes``: bipartite between two types."""
        return self.num_src if self.one_type else (self.num_src, self.num_dst)

    def keys(self, src: Tensor, dst: Tensor) -> Tensor:
        """One int64 per pair (either direction on a relation within one type)."""
        if self.one_type:
            src, dst = torch.minimum(src, dst), torch.maximum(src, dst)
        return pair_keys(src, dst, self.num_dst)

    def pairs(self, keys: Tensor) -> Tensor:
        return torch.stack([keys // self.num_dst, keys % self.num_dst])


@dataclass(frozen=True)
class RelationSplit:
    """The message-passing graph without the held-out pairs, its positives, and held-out
    pairs with as many unlinked pairs each (``[2, P]``, source then destination index)."""

    message: HeteroInput
    train: Tensor
    val_pos: Tensor
    val_neg: Tensor
    test_pos: Tensor
    test_neg: Tensor


def split_relation(
    inputs: HeteroInput,
    edge_type: EdgeType,
    val_fraction: float = 0.05,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> RelationSplit:
    """Holds out ``val_fraction`` and ``test_fraction`` of the relation's linked pairs
    (seeded); negatives are pairs the relation does not link."""
    ends = Ends.of(inputs, edge_type)
    edge_index = inputs.edge_index_dict[edge_type]
    held = hold_out(
        torch.unique(ends.keys(edge_index[0], edge_index[1])),
        edge_index,
        ends.sizes,
        val_fraction,
        test_fraction,
        seed,
        what=f"relation {'__'.join(edge_type)}",
    )
    message = _without(inputs, ends, torch.cat([held.val, held.test]))
    return RelationSplit(
        message=message,
        train=message.edge_index_dict[edge_type],
        val_pos=ends.pairs(held.val),
        val_neg=held.val_neg,
        test_pos=ends.pairs(held.test),
        test_neg=held.test_neg,
    )


def _without(inputs: HeteroInput, ends: Ends, held_out: Tensor) -> HeteroInput:
    """``inputs`` without the edges of the held-out pairs in the relation and its reverse."""
    src, relation, dst = ends.edge_type
    reverse = (dst, REVERSE_PREFIX + relation, src)
    edge_index_dict, edge_attr_dict = dict(inputs.edge_index_dict), dict(inputs.edge_attr_dict)
    for key, (a, b) in ((ends.edge_type, (0, 1)), (reverse, (1, 0))):
        if key not in edge_index_dict:
            continue
        edges = edge_index_dict[key]
        keep = ~torch.isin(ends.keys(edges[a], edges[b]), held_out)
        edge_index_dict[key] = edges[:, keep]
        if key in edge_attr_dict:
            edge_attr_dict[key] = edge_attr_dict[key][keep]
    return dataclasses.replace(
        inputs, edge_index_dict=edge_index_dict, edge_attr_dict=edge_attr_dict
    )


def evaluate_typed_link_predictor(
    model: HeteroLinkModel,
    message: HeteroInput,
    positive: Tensor,
    negative: Tensor,
    known_edges: Tensor,
    *,
    max_queries: int = 1000,
    max_candidates: int = 10_000,
    seed: int = 0,
) -> dict[str, float]:
    """AUC of ``positive`` against ``negative`` pairs and filtered hits@k and MRR: each
    positive ``(a, b)`` ranks ``b`` among the destination type's nodes (``max_candidates``
    drawn with ``seed`` when there are more) as candidates for ``a``, ``a``'s other links of
    the relation (``known_edges``) filtered out, as a top-k request that excludes neighbours
    ranks it; nodes are embedded with ``message``."""
    ends = Ends.of(message, model.edge_type)
    # One index space for filtered_ranks: the destinations after the sources.
    shift = 0 if ends.one_type else ends.num_src
    total = ends.num_src + (0 if ends.one_type else ends.num_dst)
    model.eval()
    with torch.no_grad():
        z = model.encode(message)
        z_src, z_dst = z[model.edge_type[0]], z[model.edge_type[2]]

        def score(a: Tensor, b: Tensor) -> Tensor:
            za, zb = torch.broadcast_tensors(z_src[a], z_dst[b - shift])
            return model.score(za, zb)

        auc = roc_auc(_scores(model, z, positive), _scores(model, z, negative))
        queries, candidates = ranking_sample(
            positive, ends.num_dst, max_queries, max_candidates, seed
        )
        known = [pair_keys(known_edges[0], known_edges[1] + shift, total)]
        if ends.one_type:
            known.append(pair_keys(known_edges[1], known_edges[0], total))
        ranks = filtered_ranks(
            score, queries[0], queries[1] + shift, candidates + shift, torch.cat(known), total
        )
    return ranked_metrics(auc, ranks, queries, candidates, HITS_AT)


def train_typed_link_predictor(
    inputs: HeteroInput,
    config: ModelConfig,
    *,
    epochs: int = 200,
    patience: int = 20,
    lr: float = 0.01,
    seed: int = 0,
    val_fraction: float = 0.05,
    test_fraction: float = 0.1,
    progress: bool = True,
) -> LinkTrainResult:
    """Trains a ``HeteroLinkPredictor`` (of the config's ``target_edge_type``) full-batch
    with Adam on the whole graph ``inputs``: each epoch scores every training edge of the
    relation against as many unlinked pairs drawn afresh with a binary cross-entropy loss;
    metrics as :func:`model.link_train.train_link_predictor`'s."""
    schedule = Schedule(epochs, patience, lr, f"train {config.arch.value} link", progress=progress)
    start = time.perf_counter()
    with seeded_training(seed):
        model = HeteroLinkPredictor(config)
        split = split_relation(inputs, model.edge_type, val_fraction, test_fraction, seed)
        ends = Ends.of(inputs, model.edge_type)

        def loss() -> Tensor:
            z = model.encode(split.message)
            negatives = negative_sampling(
                split.train, num_nodes=ends.sizes, num_neg_samples=split.train.shape[1]
            )
            return pair_loss(_scores(model, z, split.train), _scores(model, z, negatives))

        early, epochs_run = fit_epochs(
            model,
            lambda optimizer: step(optimizer, loss()),
            lambda: _auc(model, split.message, split.val_pos, split.val_neg),
            schedule,
            "val_auc",
        )
    seconds = time.perf_counter() - start
    test = evaluate_typed_link_predictor(
        model,
        split.message,
        split.test_pos,
        split.test_neg,
        inputs.edge_index_dict[model.edge_type],
        seed=seed,
    )
    relation = {"target_edge_type": "__".join(model.edge_type)}
    return link_result(config, test, early, split, epochs_run, seconds, **relation)


def _scores(model: HeteroLinkModel, z: dict[str, Tensor], pairs: Tensor) -> Tensor:
    """Logits of ``pairs`` ``[2, P]`` (source, destination indices within their types)."""
    return model.score(z[model.edge_type[0]][pairs[0]], z[model.edge_type[2]][pairs[1]])


def _auc(model: HeteroLinkModel, message: HeteroInput, positive: Tensor, negative: Tensor) -> float:
    model.eval()
    with torch.no_grad():
        z = model.encode(message)
        return roc_auc(_scores(model, z, positive), _scores(model, z, negative))
