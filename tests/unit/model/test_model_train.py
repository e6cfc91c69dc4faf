from __future__ import annotations

import pytest
import torch

from model import ModelConfig
from model.config import Task
from model.graph_level import as_data, train_graph_classifier
from model.link_train import train_link_predictor
from model.train import train_node_classifier


def config_for(graph, arch: str = "sage", **changes) -> ModelConfig:
    return ModelConfig(in_dim=graph.x.size(1), out_dim=graph.num_classes, arch=arch, **changes)


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_training_beats_chance_clearly(labelled_graph, arch):
    """Chance is 1/3; features alone give about 0.7 on this graph, neighbours push it higher."""
    g = labelled_graph
    result = train_node_classifier(g.x, g.edge_index, g.labels, config_for(g, arch), progress=False)
    assert result.test_accuracy >= 0.8
    assert result.best_epoch >= 1 and result.best_epoch <= result.epochs_run <= 200
    assert result.epochs_run - result.best_epoch <= 20
    assert result.seconds > 0


def test_same_seed_same_weights_and_global_rng_untouched(labelled_graph):
    g = labelled_graph
    config = config_for(g, "gat")
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = train_node_classifier(g.x, g.edge_index, g.labels, config, epochs=15, progress=False)
    assert torch.equal(torch.rand(1), before)
    second = train_node_classifier(g.x, g.edge_index, g.labels, config, epochs=15, progress=False)
    other = train_node_classifier(
        g.x, g.edge_index, g.labels, config, epochs=15, seed=1, progress=False
    )
    assert first.state_dict.keys() == second.state_dict.keys()
    assert all(torch.equal(first.state_dict[k], second.state_dict[k]) for k in first.state_dict)
    assert (first.test_accuracy, first.best_epoch) == (second.test_accuracy, second.best_epoch)
    assert not all(torch.equal(first.state_dict[k], other.state_dict[k]) for k in first.state_dict)


def test_early_stopping_keeps_the_best_epoch(labelled_graph):
    g = labelled_graph
    result = train_node_classifier(
        g.x, g.edge_index, g.labels, config_for(g), epochs=500, patience=3, progress=False
    )
    assert result.epochs_run == result.best_epoch + 3


def test_unlabelled_nodes_are_never_used(labelled_graph):
    """Changing the features of unlabelled, edge-free nodes cannot change training."""
    g = labelled_graph
    keep = (g.labels >= 0)[g.edge_index[0]] & (g.labels >= 0)[g.edge_index[1]]
    edge_index = g.edge_index[:, keep]
    x = g.x.clone()
    runs = []
    for fill in (0.0, 100.0):
        x[g.labels < 0] = fill
        result = train_node_classifier(x, edge_index, g.labels, config_for(g), progress=False)
        runs.append(result.state_dict)
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_fewer_than_two_classes_is_refused(labelled_graph):
    g = labelled_graph
    labels = torch.where(g.labels >= 0, 0, -1)
    with pytest.raises(ValueError, match="at least 2 classes, got 1"):
        train_node_classifier(g.x, g.edge_index, labels, config_for(g), progress=False)


def test_too_few_labelled_nodes_are_refused(labelled_graph):
    g = labelled_graph
    labels = torch.full_like(g.labels, -1)
    labels[:2] = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="2 labelled nodes are too few"):
        train_node_classifier(g.x, g.edge_index, labels, config_for(g), progress=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"x": torch.zeros(300, 5)}, r"in_dim=16\], got torch.float32 \(300, 5\)"),
        ({"labels": torch.zeros(299, dtype=torch.long)}, r"\[300\].*got torch.int64 \(299,\)"),
        ({"labels": torch.full((300,), 3)}, r"\[-1, 2\].*max 3"),
        ({"edge_index": torch.tensor([[0], [300]])}, r"outside \[0, 299\]"),
        ({"split": (0.8, 0.3, 0.1)}, "summing to at most 1"),
    ],
)
def test_bad_inputs_say_what_they_got(labelled_graph, change, message):
    g = labelled_graph
    inputs = {"x": g.x, "edge_index": g.edge_index, "labels": g.labels, **change}
    split = inputs.pop("split", (0.6, 0.2, 0.2))
    with pytest.raises(ValueError, match=message):
        train_node_classifier(**inputs, config=config_for(g), split=split, progress=False)


@pytest.mark.parametrize(("epochs", "patience"), [(0, 20), (200, 0)])
def test_every_training_refuses_a_schedule_that_trains_nothing(labelled_graph, epochs, patience):
    """The one schedule rule (model.early_stopping.Schedule), checked before any split."""
    g = labelled_graph
    message = rf"epochs and patience must be >= 1, got {epochs} and {patience}$"
    link = ModelConfig(task=Task.LINK, in_dim=g.x.size(1), out_dim=8)
    graphs = [as_data(g.x[:5], torch.tensor([[0, 1], [1, 2]]), 0)]
    runs = [
        lambda: train_node_classifier(g.x, g.edge_index, g.labels, config_for(g), **schedule),
        lambda: train_link_predictor(g.x, g.edge_index, link, **schedule),
        # One labelled graph: the class check would refuse it, the schedule is refused first.
        lambda: train_graph_classifier(graphs, config_for(g), **schedule),
    ]
    schedule = {"epochs": epochs, "patience": patience, "progress": False}
    for run in runs:
        with pytest.raises(ValueError, match=message):
            run()
