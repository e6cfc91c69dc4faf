"""``python -m archive_build.own_model``: packages the user's own model class for an archive.

Checks the class, its arguments and the ``state_dict`` against the graph (or, for ``--task
graph``, the dataset of small graphs, which only sizes the model: there is no training), infers
what serving needs to know from one forward on a small graph (hops, edge-feature input, output
width, the embedding layer), and writes the model directory ``build_mar.sh`` stages:
``model.pt`` (the weights as given), ``model_config.json``
(:class:`model.user_model.UserModelConfig`), ``metrics.json``, ``user_model/<file>.py``, and per
task ``link/`` (every node's embedding, ``model.link_assets``) or ``classes.json``. Every
refusal is one line.

- ``node``: ``forward(x, edge_index[, edge_attr | edge_weight])`` -> one row per node.
- ``link``: PyG's GAE convention, ``encode(x, edge_index[, edge_attr | edge_weight])`` -> one
  embedding per node and ``decode(z, edge_label_index)`` -> one score per pair; on a graph of
  several node types the same on dicts, ``encode(x_dict, edge_index_dict[, edge_attr_dict][,
  n_id_dict]) -> z_dict`` and ``decode(z_dict, edge_label_index)`` of ``--target-edge-type``.
- ``graph``: ``forward(x, edge_index, batch[, edge_attr | edge_weight])`` -> one row per graph.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from archive_build.verify import non_local_module
from graph_assets import StoreError, open_store
from graph_assets.input.graph_dataset import GraphDataset, open_graph_dataset
from graph_assets.schema import GraphSchema
from graph_assets.stored.store import GraphStore
from model.chebconv import check_chebconv, scales_by_largest_degree
from model.config import Task
from model.export import CONFIG_FILE, METRICS_FILE, WEIGHTS_FILE
from model.graph_level import CLASSES_FILE, GraphModel, as_data
from model.link import LinkModel
from model.link_assets import LINK_DIR, write_link_assets
from model.served import Probe, choose_edge_input, probe, trims
from model.served.contract import ServingNeeds, served
from model.served.factory import own_model, served_user_model
from model.served_graph import probe_graph
from model.served_hetero import HeteroProbe, UserHeteroModel, probe_hetero, small_typed_input
from model.served_hetero_link import UserHeteroLinkModel
from model.served_link import check_link_methods, decoded_scores
from model.typed_batch import HeteroInput
from model.typed_graph import hetero_section, target_relation
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


@dataclass(frozen=True)
class Loaded:
    """The user's class, instantiated with its arguments and weights, in eval mode."""

    module: torch.nn.Module
    name: str  # the class's name, for messages
    model_args: dict[str, Any]
    model_file: Path | None
    weights: Path


def load(args: argparse.Namespace) -> Loaded:
    """The class from ``--model-class``/``--model-file`` with ``--model-args`` and
    ``--weights``."""
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
    return Loaded(module, cls.__name__, model_args, model_file, weights)


def package(args: argparse.Namespace, store: GraphStore) -> UserModelConfig:
    """Checks and writes the model directory of a node archive; returns its config."""
    loaded = load(args)
    module, name = loaded.module, loaded.name
    edge_input, seen, hops = _probed_on_store(args, store, loaded, "forward")
    checked_output(args, name, seen.out_dim, store.num_classes, "node", "the graph")
    embedding = embedding_source(args, module, name, seen.last_layer)
    config = _store_config(
        args, store, loaded, edge_input, seen, hops, trim=trims(module), embedding=embedding
    )
    _write(Path(args.out), loaded, config)
    _print_model(args, name, hops, seen.steps)
    _print_output(config, store, f"{seen.out_dim} per node", seen.source_degrees)
    return config


def _probed(name: str, module: torch.nn.Module, *probe_args: Any) -> Probe:
    """``probe(module, ...)``; when it fails on a model holding a module known not to be
    local (LINKX sizes its weights by the graph's node count), the refusal names that module."""
    try:
        return probe(module, *probe_args)
    except ValueError:
        named = non_local_module(module)
        if not named:
            raise
        raise ValueError(f"{name} is not local: {named}, which no ego-graph can serve") from None


def _probed_on_store(
    args: argparse.Namespace, store: GraphStore, loaded: Loaded, method: str
) -> tuple[EdgeInput, Probe, int]:
    """The edge input, probe and hop count of a homogeneous model whose ``method`` (node
    archives: ``forward``; link archives: ``encode``) runs on the store's ego-graphs."""
    module, name = loaded.module, loaded.name
    edge_input = choose_edge_input(module, store.edge_feature_dim, args.edge_input, method)
    seen = _probed(name, module, store.feature_dim, store.edge_feature_dim, edge_input, method)
    return edge_input, seen, _hops(args, seen.steps, f"{name}.{method}")


def _store_config(
    args: argparse.Namespace,
    store: GraphStore,
    loaded: Loaded,
    edge_input: EdgeInput,
    seen: Probe,
    hops: int,
    **more: Any,
) -> UserModelConfig:
    """The config of a homogeneous model served from the store, from what its probe saw."""
    return _config(
        args,
        loaded,
        in_dim=store.feature_dim,
        out_dim=seen.out_dim,
        num_layers=hops,
        edge_input=edge_input,
        boundary_degrees=seen.source_degrees,
        max_degree=_graph_degrees(loaded.module, store, edge_input),
        **more,
    )


def _small_input(schema: GraphSchema) -> HeteroInput:
    """A small random graph of the schema's types, for the probe."""
    return small_typed_input(
        {t.name: t.feature_dim for t in schema.node_types},
        {r.edge_type.triple: r.edge_feature_dim for r in schema.relations},
    )


def _typed_config(
    args: argparse.Namespace,
    loaded: Loaded,
    schema: GraphSchema,
    seen: HeteroProbe,
    hops: int,
    needs: ServingNeeds,
    method: str,
    relation: str | None = None,
    **more: Any,
) -> UserModelConfig:
    """The config of a model on a graph of several types (a link model's: scoring pairs of
    ``relation``), from what its probe saw and what it declares it needs; ``--edge-input none``
    is refused where ``method`` reads edge features."""
    if args.edge_input == "none" and needs.edge_input is not EdgeInput.NONE:
        raise ValueError(f"--edge-input none: {loaded.name}.{method} takes edge_attr_dict")
    return _config(
        args,
        loaded,
        in_dim=schema.target_type.feature_dim,
        out_dim=seen.out_dim,
        num_layers=hops,
        edge_input=needs.edge_input,
        boundary_degrees=needs.boundary_degrees,
        hetero=hetero_section(schema, relation),
        **more,
    )


def package_typed(args: argparse.Namespace, store: GraphStore) -> UserModelConfig:
    """Checks and writes the model directory of a node archive on a graph of several node
    types or relations: PyG's ``forward(x_dict, edge_index_dict[, edge_attr_dict])``."""
    loaded = load(args)
    module, name = loaded.module, loaded.name
    schema = store.schema
    if args.edge_input not in ("auto", "edge_attr", "none"):
        raise ValueError(
            "--edge-input on a graph of several types: a model takes edge_attr_dict or nothing"
        )
    inputs = _small_input(schema)
    seen = probe_hetero(module, inputs, UserHeteroModel(module, schema.target))
    hops = _hops(args, seen.steps, f"{name}.forward")
    checked_output(args, name, seen.out_dim, store.num_classes, "node", "the graph")
    embedding = args.embedding_method or ""
    if embedding:
        try:
            module.get_submodule(embedding)
        except AttributeError:
            raise ValueError(
                f"--embedding-method {embedding}: {name} has no submodule of that name; on a "
                "graph of several types it names the submodule whose input is the embedding"
            ) from None
    adapter = UserHeteroModel(module, schema.target, Output(args.output), embedding=embedding)
    needs = adapter.serving_needs
    config = _typed_config(args, loaded, schema, seen, hops, needs, "forward", embedding=embedding)
    _write(Path(args.out), loaded, config)
    _print_typed(args, name, seen, config, f" for {schema.target} nodes, {seen.out_dim} per node")
    return config


def package_link(args: argparse.Namespace, store: GraphStore) -> UserModelConfig:
    """Checks and writes the model directory of a link archive, with ``link/``: every node's
    embedding from one full-graph ``encode``."""
    if args.embedding_method:
        raise ValueError(
            "--embedding-method goes with node and graph archives: a link archive's embeddings "
            "are what encode returns"
        )
    loaded = load(args)
    module, name = loaded.module, loaded.name
    check_link_methods(module)
    edge_input, seen, hops = _probed_on_store(args, store, loaded, "encode")
    config = _store_config(args, store, loaded, edge_input, seen, hops)
    model = served_user_model(module, config).eval()
    scores = _probe_decode(model, seen.out_dim)
    out = Path(args.out)
    _write(out, loaded, config)
    meta = write_link_assets(model, store, out / LINK_DIR)
    _print_model(args, name, hops, seen.steps)
    _print_output(config, store, f"{name}.decode scores pairs of {seen.out_dim}-wide embeddings")
    print(f"  embeddings of {meta['num_nodes']} nodes from one full-graph encode -> {LINK_DIR}/")
    _note_probabilities(config, scores)
    return config


def _note_probabilities(config: UserModelConfig, scores: torch.Tensor) -> None:
    """Says when logits look like probabilities (they would be served as their sigmoid)."""
    if config.output is Output.LOGITS and bool(((scores >= 0) & (scores <= 1)).all()):
        print(
            "  note: decode's scores on a small test graph all lie in [0, 1]; if decode returns "
            "probabilities (PyG's GAE.decode applies a sigmoid by default), build with "
            "--output probabilities, or the answers are their sigmoid"
        )


def package_typed_link(args: argparse.Namespace, store: GraphStore) -> UserModelConfig:
    """Checks and writes the model directory of a link archive on a graph of several node
    types: ``encode(x_dict, edge_index_dict[, edge_attr_dict][, n_id_dict]) -> z_dict`` and
    ``decode(z_dict, edge_label_index)`` on ``--target-edge-type``, with ``link/``."""
    if args.embedding_method:
        raise ValueError(
            "--embedding-method goes with node and graph archives: a link archive's embeddings "
            "are what encode returns"
        )
    if args.edge_input not in ("auto", "edge_attr", "none"):
        raise ValueError(
            "--edge-input on a graph of several types: encode takes edge_attr_dict or nothing"
        )
    schema = store.schema
    edge_type = target_relation(schema, args.target_edge_type)
    assert edge_type is not None
    loaded = load(args)
    module, name = loaded.module, loaded.name
    check_link_methods(module)
    probing = UserHeteroLinkModel(module, edge_type.triple, Output(args.output))
    inputs = _small_input(schema)
    seen = probe_hetero(module, inputs, lambda i: probing.encode(i)[edge_type.dst], "encode")
    hops = _hops(args, seen.steps, f"{name}.encode")
    needs = probing.serving_needs
    config = _typed_config(args, loaded, schema, seen, hops, needs, "encode", edge_type.name)
    model = served_user_model(module, config).eval()
    scores = _probe_decode(model, seen.out_dim)
    out = Path(args.out)
    _write(out, loaded, config)
    meta = write_link_assets(model, store, out / LINK_DIR)
    scores_of = f"{edge_type.name} pairs of {seen.out_dim}-wide embeddings"
    _print_typed(args, name, seen, config, f": {name}.decode scores {scores_of}")
    print(
        f"  embeddings of the {edge_type.src} and {edge_type.dst} nodes from one full-graph "
        f"encode ({meta['num_nodes']} rows) -> {LINK_DIR}/"
    )
    _note_probabilities(config, scores)
    return config


def package_graph(args: argparse.Namespace, dataset: GraphDataset) -> UserModelConfig:
    """Checks and writes the model directory of a graph archive (``classes.json`` from the
    dataset, which only sizes the model)."""
    if args.num_hops is not None:
        raise ValueError(
            "--num-hops goes with node and link archives: a graph archive answers each inline "
            "graph whole"
        )
    loaded = load(args)
    module, name = loaded.module, loaded.name
    embedding_source(args, module, name, "")  # a named method must exist before the probe
    edge_dim = dataset.edge_feature_dim
    edge_input = choose_edge_input(module, edge_dim, args.edge_input)
    seen = probe_graph(module, dataset.feature_dim, args.embedding_method, edge_dim, edge_input)
    output = checked_output(args, name, seen.out_dim, dataset.num_classes, "graph", "the dataset")
    embedding = embedding_source(args, module, name, seen.last_linear)
    config = _config(
        args,
        loaded,
        in_dim=dataset.feature_dim,
        out_dim=seen.out_dim,
        num_layers=seen.steps,
        edge_input=edge_input,
        edge_dim=0 if edge_input is EdgeInput.NONE else edge_dim,
        embedding=embedding,
    )
    out = Path(args.out)
    metrics = {}
    if output is not Output.RAW:
        graph_model = cast(GraphModel, served_user_model(module, config))
        metrics["labelled_accuracy"] = labelled_accuracy(graph_model, dataset)
    _write(out, loaded, config, metrics)
    (out / CLASSES_FILE).write_text(json.dumps({"class_names": dataset.class_names}) + "\n")
    plural = "" if seen.steps == 1 else "s"
    print(f"  model {name}: {seen.steps} message-passing step{plural} in one forward")
    edges = "none" if not config.edge_dim else f"{edge_input.value} ({config.edge_dim} wide)"
    if edge_dim and not config.edge_dim:
        edges += f" (the dataset's {edge_dim} go unread: {name}.forward takes none)"
    print(
        f"  output {output.value}, {seen.out_dim} per graph; edge features: {edges}; embedding: "
        + (
            f"{args.embedding_method}(x, edge_index, batch)"
            if args.embedding_method
            else f"the input of {embedding}"
            if embedding
            else "none (return_embedding is refused; --embedding-method NAME names one)"
        )
    )
    if "labelled_accuracy" in metrics:
        print(f"  accuracy on the dataset's labelled graphs {metrics['labelled_accuracy']:.3f}")
    return config


def labelled_accuracy(model: GraphModel, dataset: GraphDataset) -> float:
    """Share of the dataset's labelled graphs whose predicted class is their label (each graph
    alone: the build's figure, not a test score)."""
    correct = labelled = 0
    with torch.no_grad():
        for g, (x, edge_index, label) in enumerate(dataset.graphs()):
            if label < 0:
                continue
            edge_attr = dataset.graph_edge_attr(g) if model.edge_dim else None
            graph = as_data(x, edge_index, edge_attr=edge_attr)
            rows = model(graph.x, graph.edge_index, None, graph.edge_attr)
            correct += int(int(rows[0].argmax()) == label)
            labelled += 1
    return correct / max(1, labelled)


def _probe_decode(model: torch.nn.Module, width: int) -> torch.Tensor:
    """``decode`` of a user's link model on three pairs of random embeddings: one score per
    pair, or a one-line refusal naming what it returned."""
    z = torch.randn(4, width, generator=torch.Generator().manual_seed(0))
    own = own_model(model)
    assert own.decode is not None, "a user's link model decodes"
    name = type(own.module).__name__
    called = "decode(z, edge_label_index)"
    try:
        with torch.no_grad():
            if served(model).typed:  # the adapter hands decode a z_dict of the ends' rows
                called = "decode(z_dict, edge_label_index)"
                return cast(LinkModel, model).score(z[:3], z[1:])
            scores = own.decode(z, torch.tensor([[0, 1, 2], [1, 2, 3]]))
    except Exception as error:
        raise ValueError(
            f"{name}.{called} failed on 3 pairs of {width}-wide embeddings: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    return decoded_scores(name, scores, 3)


def _hops(args: argparse.Namespace, steps: int, called: str) -> int:
    """``--num-hops``, else the message-passing steps counted; a count of 0 is not taken on
    trust (the model may read neighbours without PyG's MessagePassing)."""
    if args.num_hops is not None:
        return int(args.num_hops)
    if steps < 1:
        raise ValueError(
            f"{called} called no message-passing layer (torch_geometric MessagePassing), so its "
            "hop count is uncertain: give --num-hops K, the number of hops its answer depends "
            "on (--num-hops 0 for a model without message passing, such as an MLP)"
        )
    return steps


def _graph_degrees(module: torch.nn.Module, store: GraphStore, edge_input: EdgeInput) -> int:
    """ChebConv is served with the graph's out-degrees (``model.chebconv``): refused with edge
    weights; the largest out-degree where it scales by it (the served graph then says its
    own), else 0."""
    check_chebconv(module, edge_input is EdgeInput.EDGE_WEIGHT)
    return store.largest_out_degree() if scales_by_largest_degree(module) else 0


def _config(args: argparse.Namespace, loaded: Loaded, **inferred: Any) -> UserModelConfig:
    return UserModelConfig(
        task=Task.parse(args.task),
        model_class=args.model_class,
        model_file=loaded.model_file.name if loaded.model_file else None,
        model_args=loaded.model_args,
        output=Output(args.output),
        **inferred,
    )


def _write(
    out: Path, loaded: Loaded, config: UserModelConfig, metrics: dict[str, Any] | None = None
) -> None:
    """``model.pt`` (the weights as given), the model file, ``model_config.json`` and
    ``metrics.json``."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(loaded.weights, out / WEIGHTS_FILE)
    if loaded.model_file is not None:
        (out / MODEL_FILE_DIR).mkdir(exist_ok=True)
        shutil.copyfile(loaded.model_file, out / MODEL_FILE_DIR / loaded.model_file.name)
    (out / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    recorded = {"model_class": config.model_class, "weights": loaded.weights.name}
    (out / METRICS_FILE).write_text(json.dumps({**recorded, **(metrics or {})}, indent=2) + "\n")


def _print_model(args: argparse.Namespace, name: str, hops: int, steps: int) -> None:
    how = (
        "given by --num-hops"
        if args.num_hops is not None
        else f"inferred: {steps} message-passing steps in one forward; --num-hops sets it"
    )
    print(f"  model {name}: {hops} hops ({how})")


def _print_typed(
    args: argparse.Namespace, name: str, seen: HeteroProbe, config: UserModelConfig, rows: str
) -> None:
    """A typed archive's summary: its hops and how they were found, then its output
    (``rows`` says what it is) and the edge features it reads."""
    how = "given by --num-hops" if args.num_hops is not None else f"inferred: {seen.how}"
    print(f"  model {name}: {config.num_layers} hops ({how}; --num-hops sets it)")
    reads = "edge_attr_dict" if config.edge_input is EdgeInput.EDGE_ATTR else "none"
    degrees = "; the deepest hop carries full-graph degrees" if config.boundary_degrees else ""
    print(f"  output {config.output.value}{rows}; edge features: {reads}{degrees}")


def _print_output(
    config: UserModelConfig, store: GraphStore, rows: str, source_degrees: bool = False
) -> None:
    edges = "none"
    if config.edge_input is not EdgeInput.NONE:
        edges = f"{config.edge_input.value} ({store.edge_feature_dim} wide)"
    print(
        f"  output {config.output.value}, {rows}; edge features: {edges}"
        + (
            "; the deepest hop carries full-graph degrees (degree-normalising layers)"
            if source_degrees or config.boundary_degrees
            else ""
        )
    )


def checked_output(
    args: argparse.Namespace, name: str, width: int, classes: int, per: str, source: str
) -> Output:
    """``--output``, refused when class scores would not be one per class of ``source``."""
    output = Output(args.output)
    if output is not Output.RAW and width != classes:
        raise ValueError(
            f"{name} returns {width} values per {per} but {source} has {classes} classes: "
            "build with --output raw for values that are not class scores, or check the "
            "class count in --model-args"
        )
    return output


def embedding_source(
    args: argparse.Namespace, module: torch.nn.Module, name: str, default: str
) -> str:
    """``method:<name>`` for ``--embedding-method`` (which must be a method of the class),
    else ``default`` (the layer whose input is the embedding)."""
    method = args.embedding_method
    if not method:
        return default
    if not callable(getattr(module, method, None)):
        raise ValueError(f"--embedding-method {method}: {name} has no such method")
    return f"method:{method}"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m archive_build.own_model", description=__doc__)
    parser.add_argument(
        "--task",
        choices=[task.value for task in Task],
        default=Task.NODE.value,
        help="node (forward), link (encode and decode) or graph (forward with batch)",
    )
    parser.add_argument("--store", help="the graph store the model serves (node and link)")
    parser.add_argument(
        "--dataset", help="--task graph: the dataset store of small graphs that sizes the model"
    )
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
    parser.add_argument("--embedding-method", help="a method returning node (or graph) embeddings")
    parser.add_argument(
        "--target-edge-type",
        help="--task link on a graph of several node types: the relation predicted, "
        "src__relation__dst",
    )
    parser.add_argument("--out", required=True, help="model directory to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.model_args_file and args.model_args != "{}":
        print("error: give --model-args or --model-args-file, not both", file=sys.stderr)
        return 1
    if args.num_hops is not None and args.num_hops < 0:
        print(
            f"error: --num-hops must be >= 0 (0: a model without message passing), got "
            f"{args.num_hops}",
            file=sys.stderr,
        )
        return 1
    graph_task = args.task == Task.GRAPH.value
    if graph_task != bool(args.dataset) or graph_task == bool(args.store):
        print(
            "error: give --store STORE (node and link) or --dataset DSET (--task graph)",
            file=sys.stderr,
        )
        return 1
    try:
        with torch.no_grad():
            if graph_task:
                package_graph(args, open_graph_dataset(Path(args.dataset)))
            else:
                store = open_store(Path(args.store))
                if args.task == Task.NODE.value and args.target_edge_type:
                    raise ValueError("--target-edge-type goes with --task link")
                if not store.schema.is_homogeneous and args.task == Task.LINK.value:
                    package_typed_link(args, store)
                elif not store.schema.is_homogeneous:
                    package_typed(args, store)
                elif args.task == Task.LINK.value:
                    target_relation(store.schema, args.target_edge_type)  # refused if given
                    package_link(args, store)
                else:
                    package(args, store)
    except (ValueError, StoreError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
