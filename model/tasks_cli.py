"""``python -m model link`` and ``python -m model graph``: train (or package) and export.

    python -m model link --store STORE --out DIR [--decoder dot|mlp] [--weights FILE]
        [--target-edge-type SRC__RELATION__DST] ...
    python -m model graph --dataset DSET --out DIR [--arch gin] [--pooling sum] [--weights FILE]

Both write ``model.pt``, ``model_config.json`` and ``metrics.json``; ``link`` also writes
``link/`` (the candidate embeddings of the whole graph and its out-neighbour lists, see
``model.link_assets``; on a graph of several node types, of ``--target-edge-type``'s ends)
and ``graph`` writes ``classes.json`` (the class names). With
``--weights`` the given state_dict is checked against the architecture (from the file's
sibling ``model_config.json`` if there is one, else the flags), evaluated the same way, and
packaged instead of training.
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from graph_assets.input.graph_dataset import open_graph_dataset
from graph_assets.stored.store import GraphStore, open_store
from model.config import Arch, Decoder, ModelConfig, Pooling, Task
from model.export import CONFIG_FILE, check_state_dict, write_model_files
from model.graph_level import (
    CLASSES_FILE,
    GraphClassifier,
    accuracy,
    as_data,
    train_graph_classifier,
)
from model.hetero_link import HeteroLinkPredictor
from model.link import LinkPredictor
from model.link_assets import LINK_DIR, write_link_assets
from model.link_train import evaluate_link_predictor, split_edges, train_link_predictor
from model.registry import build_model
from model.typed_graph import hetero_section, target_relation, whole_graph_input
from model.typed_link_train import (
    evaluate_typed_link_predictor,
    split_relation,
    train_typed_link_predictor,
)
from model.user_model import read_state_dict

_Module = TypeVar("_Module", bound=torch.nn.Module)

# The flags every training command shares (python -m model train|link|graph).
MODEL_FLAGS = {
    "hidden_dim": (int, "hidden width (for gat: total over heads)"),
    "num_layers": (int, "message-passing layers (node and link: = hops the server samples)"),
    "heads": (int, "gat attention heads"),
    "dropout": (float, "training dropout probability"),
}
TRAIN_FLAGS = {
    "epochs": (int, "most epochs to train"),
    "patience": (int, "stop after this many epochs without a better validation score"),
    "lr": (float, "Adam learning rate"),
    "seed": (int, "seed of the split, the initial weights, dropout and negatives"),
}
DEFAULT_EMBEDDING_DIM = 64
DEFAULT_GRAPH_ARCH = Arch.GIN


def add_task_commands(commands: Any) -> None:
    """Adds ``link`` and ``graph`` to the ``python -m model`` sub-command parser."""
    defaults: dict[str, Any] = {f.name: f.default for f in fields(ModelConfig)}
    link = commands.add_parser(
        "link", help="train (or package) a link predictor on a graph store and export it"
    )
    link.add_argument("--store", required=True, help="graph store directory (graph_assets)")
    add_arch(link, defaults["arch"], "encoder architecture")
    link.add_argument(
        "--decoder",
        default=defaults["decoder"].value,
        choices=[d.value for d in Decoder],
        help="pair decoder: dot product, or an MLP on the element-wise product "
        "(default: %(default)s)",
    )
    link.add_argument(
        "--target-edge-type",
        help="a graph of several node types or relations: the relation to predict, "
        "src__relation__dst (required there; refused on a graph of one)",
    )
    link.add_argument(
        "--embedding-dim",
        type=int,
        default=DEFAULT_EMBEDDING_DIM,
        help="width of the node embeddings (default: %(default)s)",
    )
    graph = commands.add_parser(
        "graph", help="train (or package) a graph classifier on a graph dataset store"
    )
    graph.add_argument("--dataset", required=True, help="graph dataset store (graph_assets graphs)")
    add_arch(graph, DEFAULT_GRAPH_ARCH)
    graph.add_argument(
        "--pooling",
        default=defaults["pooling"].value,
        choices=[p.value for p in Pooling],
        help="global pooling of node representations (default: %(default)s)",
    )
    for command, trainer in ((link, train_link_predictor), (graph, train_graph_classifier)):
        command.add_argument("--out", required=True, help="directory to write the model files to")
        command.add_argument("--weights", help="package this state_dict instead of training")
        command.add_argument("--quiet", action="store_true", help="no progress bar")
        add_flags(command, MODEL_FLAGS, defaults)
        add_flags(command, TRAIN_FLAGS, defaults_of(trainer))


def add_arch(command: argparse.ArgumentParser, default: Arch, text: str = "architecture") -> None:
    """``--arch``, one of :class:`Arch`, ``default`` when not given."""
    command.add_argument(
        "--arch",
        default=default.value,
        choices=[arch.value for arch in Arch],
        help=f"{text} (default: %(default)s)",
    )


def defaults_of(trainer: Callable[..., Any]) -> dict[str, Any]:
    """A training function's keyword defaults: the one place the training flags' defaults
    live."""
    return {name: p.default for name, p in inspect.signature(trainer).parameters.items()}


def add_flags(
    command: argparse.ArgumentParser,
    flags: Mapping[str, tuple[type, str]],
    defaults: Mapping[str, Any],
) -> None:
    """``--name`` for each of ``flags`` (type, help), absent from the parsed arguments when not
    given, its help naming the default in ``defaults``."""
    for name, (kind, text) in flags.items():
        command.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"{text} (default: {defaults[name]})",
        )


def run_task_command(args: dict[str, Any]) -> str:
    """Runs ``link`` or ``graph``; returns the summary line (ValueError on bad input)."""
    command: Callable[[dict[str, Any]], str] = _link if args["command"] == "link" else _graph
    return command(args)


def _config(args: dict[str, Any], base: dict[str, Any], task: Task) -> ModelConfig:
    """The architecture: from the weights' sibling model_config.json if any, else the flags."""
    weights = args.get("weights")
    sibling = Path(weights).parent / CONFIG_FILE if weights else None
    if sibling is not None and sibling.is_file():
        config = ModelConfig.from_dict(json.loads(sibling.read_text()))
    else:
        config = ModelConfig.from_dict(
            {**base, **{name: args[name] for name in MODEL_FLAGS if name in args}}
        )
    if config.task is not task:
        raise ValueError(
            f"the weights' model_config.json is for task {config.task.value!r}, not {task.value!r}"
        )
    return config


def _load_weights(args: dict[str, Any], model: _Module) -> _Module:
    """``model`` (the preset the config names, untrained) with ``--weights`` loaded."""
    state_dict = read_state_dict(Path(args["weights"]))
    check_state_dict(model, state_dict, source=str(args["weights"]))
    model.load_state_dict(state_dict)
    return model.eval()


def _train_options(args: dict[str, Any]) -> dict[str, Any]:
    return {name: args[name] for name in TRAIN_FLAGS if name in args}


def _link(args: dict[str, Any]) -> str:
    store = open_store(Path(args["store"]))
    edge_type = target_relation(store.schema, args.get("target_edge_type"))
    typed = {} if edge_type is None else {"hetero": hetero_section(store.schema, edge_type.name)}
    base = {
        "task": "link",
        "arch": args["arch"],
        "decoder": args["decoder"],
        "in_dim": store.feature_dim,
        "out_dim": args["embedding_dim"],
        **typed,
    }
    config = _config(args, base, Task.LINK)
    if config.in_dim != store.feature_dim:
        raise ValueError(
            f"the weights' config expects {config.in_dim} features, the graph has "
            f"{store.feature_dim}"
        )
    recorded = (config.hetero or {}).get("target_edge_type")
    wanted = edge_type.name if edge_type else None
    if recorded != wanted:
        raise ValueError(
            f"the weights' model_config.json predicts {recorded or 'a graph of one type'}, "
            f"not {wanted or 'this graph of one type'}"
        )
    if args.get("weights"):
        seed = args.get("seed", 0)
        model: torch.nn.Module
        if config.hetero is not None:
            model = _load_weights(args, HeteroLinkPredictor(config))
            held = _held_out_typed(model, store, seed)
        else:
            model = _load_weights(args, LinkPredictor(config))
            held = _held_out(model, store, seed)
        metrics: dict[str, Any] = {
            "arch": config.arch.value,
            "decoder": config.decoder.value,
            **{f"test_{name}": value for name, value in held.items()},
            "weights": Path(args["weights"]).name,
            "note": "weights trained elsewhere: their training may have seen the test pairs",
        }
        state_dict = model.state_dict()
    else:
        options = {"progress": not args["quiet"], **_train_options(args)}
        if config.hetero is not None:
            result = train_typed_link_predictor(whole_graph_input(store), config, **options)
        else:
            x = torch.from_numpy(np.array(store.features, dtype=np.float32))
            result = train_link_predictor(
                x, torch.from_numpy(store.edge_index()), config, **options
            )
        metrics, state_dict = result.metrics, result.state_dict
        model = build_model(config)
        model.load_state_dict(state_dict)
    write_model_files(state_dict, config, metrics, args["out"])
    link_meta = write_link_assets(model, store, Path(args["out"]) / LINK_DIR)
    return (
        f"test AUC {metrics['test_auc']:.3f}, hits@10 {metrics['test_hits@10']:.3f}, "
        f"hits@50 {metrics['test_hits@50']:.3f}, MRR {metrics['test_mrr']:.3f} "
        f"({metrics['test_ranked_pairs']} held-out links ranked among "
        f"{metrics['test_ranking_candidates']} candidates); embeddings of "
        f"{link_meta['num_nodes']} nodes -> {args['out']}"
    )


def _held_out_typed(model: HeteroLinkPredictor, store: GraphStore, seed: int) -> dict[str, float]:
    """Test metrics of given weights of a typed graph's relation on the split training would
    make (``--seed``)."""
    inputs = whole_graph_input(store)
    held = split_relation(inputs, model.edge_type, seed=seed)
    known = inputs.edge_index_dict[model.edge_type]
    return evaluate_typed_link_predictor(
        model, held.message, held.test_pos, held.test_neg, known, seed=seed
    )


def _held_out(model: LinkPredictor, store: GraphStore, seed: int) -> dict[str, float]:
    """Test metrics of given weights on the split training would make (``--seed``)."""
    x = torch.from_numpy(np.array(store.features, dtype=np.float32))
    edge_index = torch.from_numpy(store.edge_index())
    split = split_edges(edge_index, store.num_nodes, seed=seed)
    return evaluate_link_predictor(
        model, x, split.train, split.test_pos, split.test_neg, edge_index, seed=seed
    )


def _graph(args: dict[str, Any]) -> str:
    dataset = open_graph_dataset(Path(args["dataset"]))
    base = {
        "task": "graph",
        "arch": args["arch"],
        "pooling": args["pooling"],
        "in_dim": dataset.feature_dim,
        "out_dim": dataset.num_classes,
    }
    config = _config(args, base, Task.GRAPH)
    if (config.in_dim, config.out_dim) != (dataset.feature_dim, dataset.num_classes):
        raise ValueError(
            f"the weights' config expects {config.in_dim} features and {config.out_dim} classes; "
            f"the dataset has {dataset.feature_dim} features and {dataset.num_classes} classes"
        )
    graphs = [as_data(x, edge_index, label) for x, edge_index, label in dataset.graphs()]
    if args.get("weights"):
        model = _load_weights(args, GraphClassifier(config))
        labelled = [g for g in graphs if int(g.y) >= 0]
        metrics: dict[str, Any] = {
            "arch": config.arch.value,
            "pooling": config.pooling.value,
            "labelled_accuracy": accuracy(model, labelled),
            "weights": Path(args["weights"]).name,
        }
        state_dict = model.state_dict()
        summary = f"accuracy on the labelled graphs {metrics['labelled_accuracy']:.3f}"
    else:
        result = train_graph_classifier(
            graphs, config, progress=not args["quiet"], **_train_options(args)
        )
        metrics, state_dict = result.metrics, result.state_dict
        summary = (
            f"test accuracy {metrics['test_accuracy']:.3f} (val {metrics['val_accuracy']:.3f}, "
            f"{metrics['graphs']['test']} test graphs, {metrics['epochs_run']} epochs, "
            f"{metrics['seconds']:.1f} s)"
        )
    write_model_files(state_dict, config, metrics, args["out"])
    (Path(args["out"]) / CLASSES_FILE).write_text(
        json.dumps({"class_names": dataset.class_names}) + "\n"
    )
    return f"{summary} -> {args['out']}"
