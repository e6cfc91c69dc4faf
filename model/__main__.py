"""``python -m model train --store STORE --arch sage --out DIR``: train on a graph store, export.

``python -m model link ...`` and ``python -m model graph ...`` do the same for link prediction
and graph classification (``model.tasks_cli``).

``python -m model package --store STORE --weights FILE --out DIR`` packages weights trained
elsewhere instead: the architecture comes from FILE's sibling ``model_config.json`` when there is
one, else from the flags; the weights are checked against it and scored on the labelled nodes.

Model options default to ``ModelConfig``'s defaults and training options to
``train_node_classifier``'s, so each default lives in one place; flags left out are not passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graph_assets.errors import StoreError
from graph_assets.stored.store import GraphStore, open_store
from model.config import ModelConfig
from model.export import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_state_dict,
    export_model,
    load_model,
    write_model_files,
)
from model.precompute import Mode, load_to_redis, plan_for, precompute, weights_digest
from model.registry import build_model
from model.served import serving_needs
from model.served.factory import preset_keys
from model.tasks_cli import (
    MODEL_FLAGS,
    TRAIN_FLAGS,
    add_arch,
    add_flags,
    add_task_commands,
    defaults_of,
    run_task_command,
)
from model.train import fit, train_node_classifier, train_typed_node_classifier
from model.typed_graph import hetero_section, whole_graph_input
from model.user_model import EdgeInput, read_state_dict


def _parser() -> argparse.ArgumentParser:
    model_defaults = {f.name: f.default for f in fields(ModelConfig)}
    parser = argparse.ArgumentParser(prog="python -m model", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train", help="train a node classifier on a graph store and export it"
    )
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    package = commands.add_parser(
        "package", help="check pre-trained weights against a graph store and export them"
    )
    package.add_argument("--weights", required=True, help="a state_dict saved with torch.save")
    precompute = commands.add_parser(
        "precompute",
        help="every node's rows (per layer, or its output) for a --precompute archive "
        "(model.precompute)",
    )
    precompute.add_argument("--store", required=True, help="the graph store the model serves")
    precompute.add_argument(
        "--model-dir", required=True, help="directory with model.pt and model_config.json"
    )
    precompute.add_argument("--out", required=True, help="directory to write (precomputed/)")
    precompute.add_argument("--quiet", action="store_true", help="no progress bar")
    precompute.add_argument(
        "--load-to",
        metavar="redis://HOST:PORT/NAME",
        help="then load the rows into Redis beside the graph loaded there (an archive served "
        "from a graph in Redis)",
    )
    add_task_commands(commands)
    for command in (train, package):
        _add_model_flags(command, model_defaults)
    add_flags(train, TRAIN_FLAGS, defaults_of(fit))
    return parser


def _add_model_flags(command: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    command.add_argument("--store", required=True, help="graph store directory (graph_assets)")
    add_arch(command, defaults["arch"])
    command.add_argument(
        "--out", required=True, help="directory for model.pt, model_config.json, metrics.json"
    )
    add_flags(command, MODEL_FLAGS, defaults)


def _precompute(args: dict[str, Any], store: GraphStore) -> str:
    """Writes ``--out``; returns the summary line."""
    model_dir = Path(args["model_dir"])
    model, _ = load_model(model_dir)
    print(f"  {plan_for(model).reason}", flush=True)
    started = time.perf_counter()
    meta = precompute(
        model,
        store,
        Path(args["out"]),
        weights_digest(model_dir / WEIGHTS_FILE),
        progress=not args["quiet"],
    )
    types = meta["node_types"]
    kind = "" if store.schema.is_homogeneous else f"{' and '.join(types)} "
    count = sum(store.schema.node_type(name).num_nodes for name in types)
    what = (
        f"{meta['num_layers']} layers (widths {meta['dims']})"
        if meta["mode"] == Mode.LAYERS.value
        else f"the output (width {meta['dims'][0]})"
    )
    seconds = time.perf_counter() - started
    summary = f"  precomputed {what} of {count} {kind}nodes in {seconds:.1f} s"
    if args.get("load_to"):
        summary += "\n" + load_to_redis(Path(args["out"]), args["load_to"], store.checksum)
    return summary


def _package(args: dict[str, Any], store: GraphStore) -> str:
    """Exports ``--weights`` with its config; returns the summary line."""
    weights = Path(args["weights"])
    sibling = weights.parent / CONFIG_FILE
    if sibling.is_file():
        config = ModelConfig.from_dict(json.loads(sibling.read_text()))
    else:
        config = _config_from_flags(args, store)
    if (config.in_dim, config.out_dim) != (store.feature_dim, store.num_classes):
        raise ValueError(
            f"the weights' config expects {config.in_dim} features and {config.out_dim} classes; "
            f"the graph has {store.feature_dim} features and {store.num_classes} classes"
        )
    state_dict = read_state_dict(weights)
    model = build_model(config)
    state_dict = preset_keys(model, state_dict)
    check_state_dict(model, state_dict, source=str(weights))
    model.load_state_dict(state_dict)
    accuracy = labelled_accuracy(model.eval(), store)
    metrics = {"arch": config.arch.value, "labelled_accuracy": accuracy, "weights": weights.name}
    write_model_files(state_dict, config, metrics, args["out"])
    return f"accuracy on the labelled nodes {accuracy:.3f} (packaged {weights}) -> {args['out']}"


def labelled_accuracy(model: torch.nn.Module, store: GraphStore) -> float:
    """Full-graph accuracy over every labelled node (no split is known for outside weights)."""
    labels = torch.from_numpy(np.array(store.labels, dtype=np.int64))
    with torch.no_grad():
        predicted = model(*_graph_inputs(store)).argmax(dim=-1)
    labelled = labels >= 0
    if not labelled.any():
        return 0.0
    return float((predicted[labelled] == labels[labelled]).float().mean())


def _graph_inputs(store: GraphStore) -> tuple[Any, ...]:
    """What the model's full-graph forward takes: ``(x, edge_index)``, or one
    ``HeteroInput`` on a graph of several node types or relations."""
    if not store.schema.is_homogeneous:
        return (whole_graph_input(store),)
    return (
        torch.from_numpy(np.array(store.features, dtype=np.float32)),
        torch.from_numpy(np.array(store.edge_index(), dtype=np.int64)),
    )


def _config_from_flags(args: dict[str, Any], store: GraphStore) -> ModelConfig:
    typed = {} if store.schema.is_homogeneous else {"hetero": hetero_section(store.schema)}
    return ModelConfig.from_dict(
        {
            "arch": args["arch"],
            "in_dim": store.feature_dim,
            "out_dim": store.num_classes,
            **typed,
            **{name: args[name] for name in MODEL_FLAGS if name in args},
        }
    )


def _train(args: dict[str, Any], store: GraphStore) -> str:
    """Trains and exports; returns the summary line."""
    if store.num_classes < 2:
        raise ValueError(
            f"the graph in {args['store']} has {store.num_classes} label classes; training "
            "needs at least 2 (a label column in nodes.csv), or package pre-trained weights"
        )
    config = _config_from_flags(args, store)
    labels = torch.from_numpy(np.array(store.labels, dtype=np.int64))
    options = {name: args[name] for name in TRAIN_FLAGS if name in args}
    inputs = _graph_inputs(store)
    if config.hetero is not None:
        result = train_typed_node_classifier(
            inputs[0], labels, config, progress=not args["quiet"], **options
        )
    else:
        x, edge_index = inputs
        result = train_node_classifier(
            x, edge_index, labels, config, progress=not args["quiet"], **options
        )
    export_model(result, config, args["out"])
    return (
        f"test accuracy {result.test_accuracy:.3f} (val {result.val_accuracy:.3f}, "
        f"{result.epochs_run} epochs, {result.seconds:.1f} s) -> {args['out']}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message on bad input)."""
    args = vars(_parser().parse_args(argv))
    try:
        if args["command"] in ("link", "graph"):
            print(run_task_command(args))
            return 0
        store = open_store(Path(args["store"]))
        if args["command"] == "precompute":
            print(_precompute(args, store))
            return 0
        command = _train if args["command"] == "train" else _package
        summary = command(args, store)
    except (ValueError, StoreError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary)
    unread = unread_edge_features(store, load_model(Path(args["out"]))[0])
    if unread:
        print(unread)
    return 0


def unread_edge_features(store: GraphStore, model: torch.nn.Module) -> str | None:
    """Says which of the graph's edge features the model does not read (they stay in the
    store), or None when it reads them or the graph has none: never silently dropped."""
    if serving_needs(model).edge_input is not EdgeInput.NONE:
        return None
    featured = [r for r in store.schema.relations if r.edge_feature_dim]
    if not featured:
        return None
    if store.schema.is_homogeneous:
        names = ", ".join(store.edge_feature_names)
        return (
            f"note: the presets read no edge features; the graph's {store.edge_feature_dim} "
            f"({names}) are stored but not used by this model (--model-class serves a model "
            "that reads them)"
        )
    listed = "; ".join(f"{r.name} ({', '.join(r.edge_feature_names)})" for r in featured)
    return (
        f"note: this model reads no edge features; those of {listed} are stored but not used "
        "(--arch gat or gin, or --model-class, serve a model that reads them)"
    )


if __name__ == "__main__":
    sys.exit(main())
