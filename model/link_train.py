"""Link prediction training: held-out edge split, negative sampling, AUC and hits@k.

The split works on node pairs regardless of direction: a held-out pair loses both of its
directed edges from the training graph, so a graph stored with both directions of each edge
(``--undirected``) does not leak a test link through its reverse. Training runs full-batch on
the graph without the held-out pairs; evaluation embeds the nodes with that same graph, so the
reported numbers are for links the model never saw.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import negative_sampling

from model.config import ModelConfig
from model.early_stopping import EarlyStopping, Schedule, fit_epochs, step
from model.link import LinkPredictor
from model.metrics import filtered_ranks, pair_keys, ranking_metrics, roc_auc

HITS_AT = (10, 50)


@dataclass(frozen=True)
class EdgeSplit:
    """Edges for training and the held-out pairs to evaluate on.

    Attributes:
        train: ``[2, E_train]`` the stored edges whose pair is not held out (message passing
            and positive examples).
        val_pos, test_pos: ``[2, P]`` held-out node pairs (smaller index first).
        val_neg, test_neg: ``[2, P]`` pairs that are not linked in the whole graph, as many as
            the positives.
    """

    train: Tensor
    val_pos: Tensor
    val_neg: Tensor
    test_pos: Tensor
    test_neg: Tensor


@dataclass
class LinkTrainResult:
    """Weights of the best epoch (by validation AUC) and the metrics written to metrics.json."""

    state_dict: dict[str, Tensor]
    metrics: dict[str, Any]


@contextmanager
def seeded_python_random(seed: int) -> Iterator[None]:
    """PyG's ``negative_sampling`` draws with Python's ``random``: seed it, then restore it."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


@contextmanager
def seeded_training(seed: int) -> Iterator[None]:
    """Initial weights, dropout and negatives drawn from ``seed``; the callers' random
    states are restored after."""
    with torch.random.fork_rng(), seeded_python_random(seed):
        torch.manual_seed(seed)
        yield


def both_directions(edge_index: Tensor) -> Tensor:
    return torch.cat([edge_index, edge_index.flip(0)], dim=1)


def split_edges(
    edge_index: Tensor,
    num_nodes: int,
    val_fraction: float = 0.05,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> EdgeSplit:
    """Holds out ``val_fraction`` and ``test_fraction`` of the node pairs (seeded).

    Negatives are drawn from pairs with no edge in either direction (no self-pairs).
    """
    low, high = edge_index.min(dim=0).values, edge_index.max(dim=0).values
    held = hold_out(
        torch.unique(pair_keys(low, high, num_nodes)),
        both_directions(edge_index),
        num_nodes,
        val_fraction,
        test_fraction,
        seed,
        what="the graph",
    )
    keep = ~torch.isin(pair_keys(low, high, num_nodes), torch.cat([held.val, held.test]))

    def as_pairs(keys: Tensor) -> Tensor:
        return torch.stack([keys // num_nodes, keys % num_nodes])

    return EdgeSplit(
        train=edge_index[:, keep],
        val_pos=as_pairs(held.val),
        val_neg=held.val_neg,
        test_pos=as_pairs(held.test),
        test_neg=held.test_neg,
    )


@dataclass(frozen=True)
class HeldOut:
    """Held-out pair keys (``val``, ``test``) and as many unlinked pairs each (``[2, P]``)."""

    val: Tensor
    test: Tensor
    val_neg: Tensor
    test_neg: Tensor


def hold_out(
    pairs: Tensor,
    linked: Tensor,
    num_nodes: int | tuple[int, int],
    val_fraction: float,
    test_fraction: float,
    seed: int,
    *,
    what: str,
) -> HeldOut:
    """The held-out split of both link trainings (one node type or one relation): shuffles the
    unique pair keys ``pairs`` (seeded) and draws negatives that ``linked`` does not link
    (``negative_sampling``'s ``num_nodes``); ``what`` names the graph in a refusal."""
    if not (val_fraction > 0 and test_fraction > 0 and val_fraction + test_fraction < 1):
        raise ValueError(
            "val_fraction and test_fraction must be positive and sum to less than 1, got "
            f"{val_fraction} and {test_fraction}"
        )
    n_val = round(val_fraction * pairs.numel())
    n_test = round(test_fraction * pairs.numel())
    if n_val < 1 or n_test < 1 or n_val + n_test >= pairs.numel():
        raise ValueError(
            f"{what} links {pairs.numel()} node pairs: too few to hold out "
            f"{val_fraction:.0%} for validation and {test_fraction:.0%} for test with at least "
            "one pair each and some left to train on; link prediction needs a graph with edges"
        )
    generator = torch.Generator().manual_seed(seed)
    pairs = pairs[torch.randperm(pairs.numel(), generator=generator)]
    with seeded_python_random(seed):
        negatives = negative_sampling(linked, num_nodes=num_nodes, num_neg_samples=n_val + n_test)
    if negatives.shape[1] < n_val + n_test:
        raise ValueError(
            f"{what} is too dense to draw {n_val + n_test} unlinked pairs for evaluation"
        )
    return HeldOut(
        val=pairs[:n_val],
        test=pairs[n_val : n_val + n_test],
        val_neg=negatives[:, :n_val],
        test_neg=negatives[:, n_val : n_val + n_test],
    )


def evaluate_link_predictor(
    model: LinkPredictor,
    x: Tensor,
    message_edges: Tensor,
    positive: Tensor,
    negative: Tensor,
    known_edges: Tensor,
    *,
    hits_at: Sequence[int] = HITS_AT,
    max_queries: int = 1000,
    max_candidates: int = 10_000,
    seed: int = 0,
) -> dict[str, float]:
    """AUC of ``positive`` against ``negative`` pairs and filtered ranking metrics.

    Nodes are embedded with ``message_edges``. For ranking, each positive pair ``(a, b)`` ranks
    ``b`` among all nodes (or ``max_candidates`` drawn with ``seed`` on a larger graph) as
    candidates for ``a``, other known links of ``a`` (``known_edges``) filtered out: the rank a
    top-k request that excludes neighbours would give it. At most ``max_queries`` positives
    (drawn with ``seed``) are ranked.
    """
    num_nodes = x.shape[0]
    model.eval()
    with torch.no_grad():
        z = model(x, message_edges)

        def score(a: Tensor, b: Tensor) -> Tensor:
            za, zb = torch.broadcast_tensors(z[a], z[b])
            return model.score(za, zb)

        auc = roc_auc(score(*positive), score(*negative))
        queries, candidates = ranking_sample(positive, num_nodes, max_queries, max_candidates, seed)
        both = both_directions(known_edges)
        known = pair_keys(both[0], both[1], num_nodes)
        ranks = filtered_ranks(score, queries[0], queries[1], candidates, known, num_nodes)
    return ranked_metrics(auc, ranks, queries, candidates, hits_at)


def ranking_sample(
    positive: Tensor, num_candidates: int, max_queries: int, max_candidates: int, seed: int
) -> tuple[Tensor, Tensor]:
    """The queries (at most ``max_queries`` positives) and candidates (at most
    ``max_candidates`` of ``num_candidates``) that link evaluation ranks, drawn with ``seed``
    when there are more."""
    generator = torch.Generator().manual_seed(seed)
    queries = positive
    if queries.shape[1] > max_queries:
        chosen = torch.randperm(queries.shape[1], generator=generator)[:max_queries]
        queries = queries[:, chosen]
    if num_candidates > max_candidates:
        candidates = torch.randperm(num_candidates, generator=generator)[:max_candidates]
    else:
        candidates = torch.arange(num_candidates)
    return queries, candidates


def ranked_metrics(
    auc: float, ranks: Tensor, queries: Tensor, candidates: Tensor, hits_at: Sequence[int]
) -> dict[str, float]:
    """The metrics link evaluation reports, in the order metrics.json lists them."""
    metrics = {"auc": auc, **ranking_metrics(ranks, hits_at)}
    metrics["ranked_pairs"] = int(queries.shape[1])
    metrics["ranking_candidates"] = int(candidates.numel())
    return metrics


def train_link_predictor(
    x: Tensor,
    edge_index: Tensor,
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
    """Trains a :class:`LinkPredictor` of ``config`` full-batch with Adam.

    Each epoch scores every training edge against as many negatives drawn afresh (PyG's
    ``negative_sampling``, seeded) with a binary cross-entropy loss; training stops after
    ``patience`` epochs without a better validation AUC and keeps the best epoch's weights.
    Metrics: test AUC, test hits@10/@50 and MRR (:func:`evaluate_link_predictor`).
    """
    schedule = Schedule(epochs, patience, lr, f"train {config.arch.value} link", progress=progress)
    num_nodes = x.shape[0]
    split = split_edges(edge_index, num_nodes, val_fraction, test_fraction, seed)
    start = time.perf_counter()
    with seeded_training(seed):
        model = LinkPredictor(config)

        def loss() -> Tensor:
            z = model(x, split.train)
            negatives = negative_sampling(
                both_directions(split.train),
                num_nodes=num_nodes,
                num_neg_samples=split.train.shape[1],
            )
            return pair_loss(
                model.score(z[split.train[0]], z[split.train[1]]),
                model.score(z[negatives[0]], z[negatives[1]]),
            )

        early, epochs_run = fit_epochs(
            model,
            lambda optimizer: step(optimizer, loss()),
            lambda: _auc(model, x, split.train, split.val_pos, split.val_neg),
            schedule,
            "val_auc",
        )
    seconds = time.perf_counter() - start
    test = evaluate_link_predictor(
        model, x, split.train, split.test_pos, split.test_neg, edge_index, seed=seed
    )
    return link_result(config, test, early, split, epochs_run, seconds)


def pair_loss(positive: Tensor, negative: Tensor) -> Tensor:
    """Binary cross-entropy of edges' logits (label 1) and unlinked pairs' (label 0)."""
    logits = torch.cat([positive, negative])
    labels = torch.cat([torch.ones(positive.shape[0]), torch.zeros(negative.shape[0])])
    return F.binary_cross_entropy_with_logits(logits, labels)


def link_result(
    config: ModelConfig,
    test: dict[str, Any],
    early: EarlyStopping,
    split: Any,
    epochs_run: int,
    seconds: float,
    **extra: Any,
) -> LinkTrainResult:
    """The best epoch's weights and the metrics link training reports (``split``: its
    ``train``, ``val_pos`` and ``test_pos`` edges)."""
    metrics: dict[str, Any] = {
        "arch": config.arch.value,
        "decoder": config.decoder.value,
        **extra,
        **{f"test_{name}": value for name, value in test.items()},
        "val_auc": early.best_score,
        "train_edges": int(split.train.shape[1]),
        "val_pairs": int(split.val_pos.shape[1]),
        "test_pairs": int(split.test_pos.shape[1]),
        "epochs_run": epochs_run,
        "best_epoch": early.best_epoch,
        "seconds": seconds,
    }
    return LinkTrainResult(state_dict=early.best_state, metrics=metrics)


def _auc(
    model: LinkPredictor, x: Tensor, edges: Tensor, positive: Tensor, negative: Tensor
) -> float:
    model.eval()
    with torch.no_grad():
        z = model(x, edges)
        return roc_auc(
            model.score(z[positive[0]], z[positive[1]]), model.score(z[negative[0]], z[negative[1]])
        )
