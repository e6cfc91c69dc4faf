"""Graph classification: the served graph-model protocol, and the preset, a node-level GNN,
global pooling and an MLP head.

The protocol (:class:`GraphModel`) is what the graph engine and its explanations ask of a
graph-level model, whoever wrote it: ``forward(x, edge_index, batch=None, edge_attr=None)``
gives one row per graph (``batch`` maps each node row to its graph, PyG's ``Batch.batch``; None
meaning one graph; ``edge_attr`` one row per edge, given exactly when ``edge_dim`` > 0),
``forward_with_embedding`` the rows and the graph embeddings of one pass (None when the model
names no embedding: ``has_embedding`` is False), ``in_dim`` the node feature width,
``edge_dim`` the edge feature width it reads (0: none; the presets read none). What the rows
are follows the model's ``serving_needs.output`` (``model.served``). The user's class gets the
protocol from ``model.served_graph.UserGraphModel``.

``GraphClassifier.forward`` gives per-graph logits. A graph's answer depends only on its own
nodes and edges, so graphs batched together (a disjoint union, as ``torch_geometric.data.Batch``
builds it) get the answers they get alone. Its graph embedding is the pooled vector the head
reads: ReLU of the GNN's last layer (``hidden_dim`` wide), pooled over the graph's nodes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.nn.models import MLP

from model.architectures import NodeClassifier, build_node_classifier
from model.config import ModelConfig, Pooling, Task
from model.early_stopping import Schedule, fit_epochs, step
from model.served.contract import OneNodeType, ServedModel, ServingNeeds

# A graph archive's class names (``{"class_names": [...]}``, null when labels were indices).
CLASSES_FILE = "classes.json"
_POOL = {Pooling.SUM: global_add_pool, Pooling.MEAN: global_mean_pool, Pooling.MAX: global_max_pool}


@runtime_checkable
class GraphModel(Protocol):
    """The served graph-model protocol (see the module docstring)."""

    @property
    def in_dim(self) -> int:
        """Node feature width the model reads."""
        ...

    @property
    def edge_dim(self) -> int:
        """Edge feature width the model reads (0: none, and no ``edge_attr`` is passed)."""
        ...

    @property
    def has_embedding(self) -> bool:
        """``forward_with_embedding`` gives graph embeddings (``return_embedding`` works)."""
        ...

    def __call__(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor: ...

    def forward_with_embedding(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]: ...


class GraphModule(OneNodeType, torch.nn.Module):
    """What every graph-level model declares (the preset and the user's adapter): a graph's
    rows depend on the graph in the request, so there is nothing to precompute."""

    task = Task.GRAPH

    def precompute_plan(self) -> None:
        return None

    def rows_of(self, node_type: str) -> ServedModel:
        raise ValueError("a graph model answers graphs, not node types")


def batch_or_one(x: Tensor, batch: Tensor | None) -> Tensor:
    """``batch``, or every row of ``x`` in one graph when None."""
    if batch is None:
        return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    return batch


class GraphClassifier(GraphModule):
    """Encoder (``encoder.gnn.*``), pooling, head (``head.*``: hidden -> hidden -> classes)."""

    serving_needs = ServingNeeds()
    has_embedding = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.task is not Task.GRAPH:
            raise ValueError(f"GraphClassifier needs a config with task 'graph', got {config.task}")
        self.encoder: NodeClassifier = build_node_classifier(
            dataclasses.replace(config, task=Task.NODE, out_dim=config.hidden_dim)
        )
        self._in_dim = config.in_dim
        self.pool = _POOL[config.pooling]
        self.head = MLP(
            [config.hidden_dim, config.hidden_dim, config.out_dim],
            dropout=config.dropout,
            norm=None,
        )

    @property
    def in_dim(self) -> int:
        return self._in_dim

    @property
    def edge_dim(self) -> int:
        return 0

    @property
    def hops(self) -> int:
        return self.encoder.hops

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """Logits ``[num_graphs, out_dim]``."""
        return self.forward_with_embedding(x, edge_index, batch)[0]

    def forward_with_embedding(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(logits, graph embeddings [num_graphs, hidden_dim])`` of one pass; ``edge_attr``
        is never given (``edge_dim`` is 0): the protocol's parameter, unread."""
        batch = batch_or_one(x, batch)
        nodes = F.relu(self.encoder(x, edge_index))
        embedding = self.pool(nodes, batch)
        return self.head(embedding), embedding


def as_data(
    x: np.ndarray | Tensor,
    edge_index: np.ndarray | Tensor,
    label: int | None = None,
    edge_attr: np.ndarray | Tensor | None = None,
) -> Data:
    """One graph as PyG ``Data`` (float32 features, int64 edges, float32 ``edge_attr`` where
    given: ``Batch`` concatenates it in the order of the edges)."""
    data = Data(
        x=torch.tensor(np.asarray(x), dtype=torch.float32),
        edge_index=torch.tensor(np.asarray(edge_index), dtype=torch.long),
    )
    if edge_attr is not None:
        data.edge_attr = torch.tensor(np.asarray(edge_attr), dtype=torch.float32)
    if label is not None:
        data.y = torch.tensor([label])
    return data


@dataclass
class GraphTrainResult:
    """Weights of the best epoch (by validation accuracy) and the metrics for metrics.json."""

    state_dict: dict[str, Tensor]
    metrics: dict[str, Any]


def split_graphs(labels: Tensor, fractions: Sequence[float], seed: int) -> list[Tensor]:
    """Seeded random train/val/test indices of the labelled graphs (each part non-empty)."""
    labelled = torch.nonzero(labels >= 0).flatten()
    labelled = labelled[
        torch.randperm(labelled.numel(), generator=torch.Generator().manual_seed(seed))
    ]
    n = labelled.numel()
    cut1, cut2 = round(fractions[0] * n), round((fractions[0] + fractions[1]) * n)
    if not 0 < cut1 < cut2 < n:
        raise ValueError(
            f"{n} labelled graphs are too few to split {tuple(fractions)} into non-empty train, "
            "val and test sets"
        )
    return [labelled[:cut1], labelled[cut1:cut2], labelled[cut2:]]


def accuracy(model: torch.nn.Module, graphs: Sequence[Data], batch_size: int = 256) -> float:
    """Share of ``graphs`` whose predicted class equals ``y``."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for batch in DataLoader(list(graphs), batch_size=batch_size):
            correct += int(
                (model(batch.x, batch.edge_index, batch.batch).argmax(-1) == batch.y).sum()
            )
    return correct / max(1, len(graphs))


def train_graph_classifier(
    graphs: Sequence[Data],
    config: ModelConfig,
    *,
    epochs: int = 100,
    patience: int = 20,
    lr: float = 0.005,
    batch_size: int = 64,
    seed: int = 0,
    split: Sequence[float] = (0.8, 0.1, 0.1),
    progress: bool = True,
) -> GraphTrainResult:
    """Mini-batch training (Adam, cross-entropy) with early stopping on validation accuracy.

    Graphs with ``y < 0`` are not used. The split and the batches are drawn with ``seed``; on
    the CPU the same inputs give the same weights.
    """
    schedule = Schedule(epochs, patience, lr, f"train {config.arch.value} graph", progress=progress)
    labels = torch.tensor([int(g.y) for g in graphs])
    classes = torch.unique(labels[labels >= 0])
    if classes.numel() < 2:
        raise ValueError(
            f"training needs labelled graphs of at least 2 classes, got {classes.tolist()}"
        )
    if int(labels.max()) >= config.out_dim:
        raise ValueError(
            f"labels go up to {int(labels.max())} but the model has {config.out_dim} classes"
        )
    train, val, test = (
        [graphs[i] for i in part.tolist()] for part in split_graphs(labels, split, seed)
    )
    start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GraphClassifier(config)
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(train, batch_size=batch_size, shuffle=True, generator=generator)

        def train_epoch(optimizer: torch.optim.Optimizer) -> float:
            total = 0.0
            for batch in loader:
                logits = model(batch.x, batch.edge_index, batch.batch)
                total += step(optimizer, F.cross_entropy(logits, batch.y)) * batch.num_graphs
            return total / len(train)

        val_accuracy = partial(accuracy, model, val)
        early, epochs_run = fit_epochs(model, train_epoch, val_accuracy, schedule, "val_acc")
    seconds = time.perf_counter() - start
    metrics = {
        "arch": config.arch.value,
        "pooling": config.pooling.value,
        "test_accuracy": accuracy(model, test),
        "val_accuracy": early.best_score,
        "train_accuracy": accuracy(model, train),
        "graphs": {"train": len(train), "val": len(val), "test": len(test)},
        "epochs_run": epochs_run,
        "best_epoch": early.best_epoch,
        "seconds": seconds,
    }
    return GraphTrainResult(state_dict=early.best_state, metrics=metrics)


def batch_of(graphs: Sequence[Data]) -> Batch:
    """PyG's disjoint union of ``graphs`` (one forward pass for all of them)."""
    return Batch.from_data_list(list(graphs))
