"""Full-batch node-classification training with early stopping on validation accuracy."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from model.config import ModelConfig
from model.early_stopping import Schedule, fit_epochs, step
from model.registry import build_model
from model.typed_batch import HeteroInput


@dataclass
class TrainResult:
    """What training hands to ``export_model``.

    Attributes:
        state_dict: weights of the best epoch (by validation accuracy), on the CPU.
        test_accuracy, val_accuracy, train_accuracy: accuracies of those weights on each split.
        epochs_run: epochs trained before early stopping (or ``epochs``).
        best_epoch: 1-based epoch whose weights were kept.
        seconds: wall time of the training loop.
    """

    state_dict: dict[str, Tensor]
    test_accuracy: float
    val_accuracy: float
    train_accuracy: float
    epochs_run: int
    best_epoch: int
    seconds: float


@dataclass(frozen=True)
class _Split:
    train: Tensor
    val: Tensor
    test: Tensor


def train_node_classifier(
    x: Tensor,
    edge_index: Tensor,
    labels: Tensor,
    config: ModelConfig,
    **options: Any,
) -> TrainResult:
    """Trains ``build_model(config)`` full-batch with Adam on the device of ``x``
    (:func:`fit` says how; ``options`` are its keywords)."""
    _check_inputs(x, edge_index, labels, config)
    return fit((x, edge_index.to(x.device)), labels.to(x.device), config, **options)


def train_typed_node_classifier(
    inputs: HeteroInput, labels: Tensor, config: ModelConfig, **options: Any
) -> TrainResult:
    """Trains the per-relation recipe ``build_model(config)`` on a whole graph of several node
    types or relations; ``labels`` are the target type's (:func:`fit` says how)."""
    _check_labels(labels, labels.numel(), config)
    return fit((inputs,), labels, config, **options)


def fit(
    inputs: tuple[Any, ...],
    labels: Tensor,
    config: ModelConfig,
    *,
    epochs: int = 200,
    patience: int = 20,
    lr: float = 0.01,
    weight_decay: float = 5e-4,
    seed: int = 0,
    split: tuple[float, float, float] = (0.6, 0.2, 0.2),
    progress: bool = True,
) -> TrainResult:
    """Trains ``build_model(config)`` full-batch with Adam: ``model(*inputs)`` gives a row per
    labelled node.

    Labelled nodes (``labels >= 0``; ``-1`` = unlabelled) are shuffled with ``seed`` and cut
    into train/val/test by the fractions in ``split``. Training stops after ``patience``
    epochs without a better validation accuracy and keeps the best epoch's weights. On the CPU
    the same inputs and ``seed`` give the same weights; the global torch RNG is left untouched.
    """
    schedule = Schedule(epochs, patience, lr, f"train {config.arch.value}", weight_decay, progress)
    parts = _split_labelled(labels, split, seed)
    start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build_model(config).to(labels.device)
        early, epochs_run = fit_epochs(
            model,
            lambda optimizer: step(
                optimizer, F.cross_entropy(model(*inputs)[parts.train], labels[parts.train])
            ),
            lambda: _accuracy(model, inputs, labels, parts.val),
            schedule,
            "val_acc",
        )
    seconds = time.perf_counter() - start
    return TrainResult(
        state_dict=early.best_state,
        test_accuracy=_accuracy(model, inputs, labels, parts.test),
        val_accuracy=early.best_score,
        train_accuracy=_accuracy(model, inputs, labels, parts.train),
        epochs_run=epochs_run,
        best_epoch=early.best_epoch,
        seconds=seconds,
    )


def _accuracy(
    model: torch.nn.Module, inputs: tuple[Any, ...], labels: Tensor, rows: Tensor
) -> float:
    model.eval()
    with torch.no_grad():
        predicted = model(*inputs)[rows].argmax(dim=-1)
    return float((predicted == labels[rows]).float().mean().item())


def _check_inputs(x: Tensor, edge_index: Tensor, labels: Tensor, config: ModelConfig) -> None:
    """Public-entry validation: shapes, dtypes and ranges, each error saying what it got."""
    if x.dim() != 2 or x.size(1) != config.in_dim or not x.is_floating_point():
        raise ValueError(
            f"x must be a float tensor [num_nodes, in_dim={config.in_dim}], "
            f"got {x.dtype} {tuple(x.shape)}"
        )
    num_nodes = x.size(0)
    if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.dtype != torch.long:
        raise ValueError(
            f"edge_index must be an int64 tensor [2, num_edges], "
            f"got {edge_index.dtype} {tuple(edge_index.shape)}"
        )
    if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
        raise ValueError(
            f"edge_index holds node indices outside [0, {num_nodes - 1}]: "
            f"min {int(edge_index.min())}, max {int(edge_index.max())}"
        )
    _check_labels(labels, num_nodes, config)


def _check_labels(labels: Tensor, num_nodes: int, config: ModelConfig) -> None:
    if labels.shape != (num_nodes,) or labels.dtype != torch.long:
        raise ValueError(
            f"labels must be an int64 tensor [{num_nodes}] (-1 = unlabelled), "
            f"got {labels.dtype} {tuple(labels.shape)}"
        )
    if labels.numel() and (labels.min() < -1 or labels.max() >= config.out_dim):
        raise ValueError(
            f"labels must lie in [-1, {config.out_dim - 1}] (out_dim={config.out_dim}), "
            f"got min {int(labels.min())}, max {int(labels.max())}"
        )
    classes = torch.unique(labels[labels >= 0])
    if classes.numel() < 2:
        raise ValueError(
            f"training needs labelled nodes of at least 2 classes, got {classes.numel()} "
            f"class(es) among {int((labels >= 0).sum())} labelled nodes; add labels to the "
            "graph or package pre-trained weights instead"
        )


def _split_labelled(labels: Tensor, split: tuple[float, float, float], seed: int) -> _Split:
    """A seeded random cut of the labelled nodes; every part must get at least one node."""
    if len(split) != 3 or any(f <= 0 for f in split) or sum(split) > 1.0 + 1e-9:
        raise ValueError(
            f"split must be three positive fractions (train, val, test) summing to at most 1, "
            f"got {split}; for example (0.6, 0.2, 0.2)"
        )
    labelled = torch.nonzero(labels >= 0).flatten().cpu()
    generator = torch.Generator().manual_seed(seed)
    labelled = labelled[torch.randperm(labelled.numel(), generator=generator)]
    n = labelled.numel()
    cut1 = round(split[0] * n)
    cut2 = round((split[0] + split[1]) * n)
    cut3 = round(sum(split) * n)
    if not 0 < cut1 < cut2 < cut3:
        raise ValueError(
            f"{n} labelled nodes are too few to split {split} into non-empty train, val and "
            "test sets; label more nodes"
        )
    device = labels.device
    return _Split(
        train=labelled[:cut1].to(device),
        val=labelled[cut1:cut2].to(device),
        test=labelled[cut2:cut3].to(device),
    )
