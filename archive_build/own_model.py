"""``python -m archive_build.own_model``: packages the user's own model class for an archive.

Checks the class, its arguments and the ``state_dict`` against the graph, infers what serving
needs to know (hops, edge-feature input, output width, the embedding layer) from one forward on
a small graph, and writes the model directory ``build_mar.sh`` stages: ``model.pt`` (the
weights as given), ``model_config.json`` (:class:`model.user_model.UserModelConfig`),
``metrics.json`` and ``user_model/<file>.py``. Every refusal is one line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from graph_assets import StoreError, open_store
from graph_assets.store import GraphStore
from model.export import CONFIG_FILE, METRICS_FILE, WEIGHTS_FILE
from model.served import choose_edge_input, probe, trims
from model.user_model import (
    MODEL_FILE_DIR,
    EdgeInput,
    Output,
    UserModelConfig,
    import_model_class,
    instantiate,
    load_weights,
    parse_model_args,
    read_state_dict,
)


def package(args: argparse.Namespace, store: GraphStore) -> UserModelConfig:
    """Checks and writes the model directory; returns its config."""
    model_file = Path(args.model_file) if args.model_file else None
    if args.model_args_file:
        path = Path(args.model_args_file)
        if not path.is_file():
            raise ValueError(f"--model-args-file {path}: no such file")
        model_args = parse_model_args(path.read_text(), f"--model-args-file {path}")
    else:
        model_args = parse_model_args(args.model_args, "--model-args")
    cls = import_model_class(args.model_class, model_file)
    module = instantiate(cls, model_args)
    weights = Path(args.weights)
    load_weights(module, read_state_dict(weights), f"--weights {weights}")
    module.eval()
    edge_input = choose_edge_input(module, store.edge_feature_dim, args.edge_input)
    seen = probe(module, store.feature_dim, store.edge_feature_dim, edge_input)
    hops = args.num_hops if args.num_hops is not None else seen.steps
    if hops < 1:
        raise ValueError(
            f"{cls.__name__}.forward called no message-passing layer (torch_geometric "
            "MessagePassing): give --num-hops K, the number of hops its answer depends on"
        )
    output = Output(args.output)
    if output is not Output.RAW and seen.out_dim != store.num_classes:
        raise ValueError(
            f"{cls.__name__} returns {seen.out_dim} values per node but the graph has "
            f"{store.num_classes} classes: build with --output raw for values that are not "
            "class scores, or check out_channels in --model-args"
        )
    embedding = f"method:{args.embedding_method}" if args.embedding_method else seen.last_layer
    if args.embedding_method and not callable(getattr(module, args.embedding_method, None)):
        raise ValueError(
            f"--embedding-method {args.embedding_method}: {cls.__name__} has no such method"
        )
    config = UserModelConfig(
        model_class=args.model_class,
        model_file=model_file.name if model_file else None,
        model_args=model_args,
        in_dim=store.feature_dim,
        out_dim=seen.out_dim,
        num_layers=hops,
        output=output,
        edge_input=edge_input,
        boundary_degrees=seen.source_degrees,
        trim=trims(module),
        embedding=embedding,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(weights, out / WEIGHTS_FILE)
    if model_file is not None:
        (out / MODEL_FILE_DIR).mkdir(exist_ok=True)
        shutil.copyfile(model_file, out / MODEL_FILE_DIR / model_file.name)
    (out / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    metrics = {"model_class": args.model_class, "weights": weights.name}
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    how = (
        "given by --num-hops"
        if args.num_hops is not None
        else (f"inferred: {seen.steps} message-passing steps in one forward; --num-hops sets it")
    )
    print(f"  model {cls.__name__}: {hops} hops ({how})")
    edges = "none"
    if edge_input is not EdgeInput.NONE:
        edges = f"{edge_input.value} ({store.edge_feature_dim} wide)"
    print(
        f"  output {output.value}, {seen.out_dim} per node; edge features: {edges}"
        + (
            "; the deepest hop carries full-graph degrees (degree-normalising layers)"
            if seen.source_degrees
            else ""
        )
    )
    return config


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m archive_build.own_model", description=__doc__)
    parser.add_argument("--store", required=True, help="the graph store the model serves")
    parser.add_argument(
        "--model-class", required=True, help="class name in --model-file, or a dotted path"
    )
    parser.add_argument(
        "--model-file", help="Python file defining the class (goes into the archive)"
    )
    parser.add_argument("--model-args", default="{}", help="constructor arguments, a JSON object")
    parser.add_argument("--model-args-file", help="a JSON file of constructor arguments")
    parser.add_argument("--weights", required=True, help="torch.save(model.state_dict(), F)")
    parser.add_argument(
        "--output", choices=[o.value for o in Output], default="logits", help="what the rows are"
    )
    parser.add_argument(
        "--num-hops", type=int, help="the model's receptive field (default: inferred)"
    )
    parser.add_argument(
        "--edge-input",
        choices=("auto", "edge_attr", "edge_weight", "none"),
        default="auto",
        help="how edge features reach forward (default: what forward takes)",
    )
    parser.add_argument("--embedding-method", help="a method returning node embeddings")
    parser.add_argument("--out", required=True, help="model directory to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.model_args_file and args.model_args != "{}":
        print("error: give --model-args or --model-args-file, not both", file=sys.stderr)
        return 1
    if args.num_hops is not None and args.num_hops < 1:
        print(f"error: --num-hops must be >= 1, got {args.num_hops}", file=sys.stderr)
        return 1
    try:
        with torch.no_grad():
            package(args, open_store(Path(args.store)))
    except (ValueError, StoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
