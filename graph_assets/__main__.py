"""Command line: build a store from a graph directory, or generate a synthetic graph.

    python -m graph_assets build --graph DIR --out STORE [--undirected] [--drop-self-loops]
        [--drop-duplicate-edges]
    python -m graph_assets synthetic NODES EDGES (--out STORE | --csv DIR) [options]
    python -m graph_assets graphs --dataset DIR --out DSET [--undirected] [--drop-self-loops]
        [--drop-duplicate-edges]
    python -m graph_assets synthetic-graphs COUNT (--out DSET | --csv DIR) [options]
    python -m graph_assets load-redis --store DIR --url redis://host:port [--prefix NAME]

``graphs`` and ``synthetic-graphs`` are datasets of small graphs for graph classification
(``graph_assets.input.graph_dataset``).

Bad input or a bad store exits with status 2 and the message on stderr (no traceback).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from graph_assets.errors import GraphInputError, StoreError
from graph_assets.input.graph_dataset import (
    DEFAULT_SYNTHETIC_CLASSES,
    DEFAULT_SYNTHETIC_FEATURES,
    MOTIFS,
    generate_graph_dataset,
    read_graph_dataset,
    write_graph_dataset,
    write_graph_dataset_csv,
)
from graph_assets.input.synthetic import (
    DEFAULT_FEATURE_DIM,
    DEFAULT_NUM_CLASSES,
    generate_synthetic,
    write_synthetic_csv,
)
from graph_assets.input.typed_input import read_graph
from graph_assets.remote.cli import add_load_redis, load_redis
from graph_assets.stored.store import StoreMeta, schema_of
from graph_assets.stored.writer import write_store

_Written = TypeVar("_Written")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text}")
    return value


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if "" in names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"must be distinct, non-empty names, got {text!r}")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m graph_assets", description="Build or generate a gnnserve graph store."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser(
        "build", help="build a store from nodes/edges files (CSV or Parquet)"
    )
    build.add_argument(
        "--graph",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory holding nodes.csv and edges.csv, or nodes/<type>.csv and "
        "edges/<src>__<relation>__<dst>.csv (docs/graph-format.md)",
    )
    build.add_argument(
        "--target-node-type",
        metavar="TYPE",
        help="the node type the archive serves (default: the one type with labels)",
    )
    build.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="STORE",
        help="store directory to write (a previous store there is replaced)",
    )
    build.add_argument(
        "--undirected",
        action="store_true",
        help="add the reverse of every edge, with its edge features (a self-loop is its own "
        "reverse and is not doubled); a relation between two types gets its reverse as "
        "<dst>__rev_<relation>__<src>",
    )
    _add_drop_flags(build, "(src, dst)")

    synthetic = commands.add_parser(
        "synthetic", help="generate a labelled graph with IDs 0..NODES-1"
    )
    synthetic.add_argument("nodes", type=_count(1), metavar="NODES", help="number of nodes")
    synthetic.add_argument(
        "edges",
        type=_count(0),
        metavar="EDGES",
        help="number of edges to draw (self-loops and repeats drawn by chance are dropped, so "
        "the store may hold slightly fewer)",
    )
    target = synthetic.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, metavar="STORE", help="write a store to this directory")
    target.add_argument(
        "--csv",
        type=Path,
        metavar="DIR",
        help="write nodes.csv and edges.csv input files to this directory",
    )
    synthetic.add_argument(
        "--feature-dim",
        type=_count(1),
        metavar="N",
        default=DEFAULT_FEATURE_DIM,
        help=f"features per node (default {DEFAULT_FEATURE_DIM})",
    )
    synthetic.add_argument(
        "--num-classes",
        type=_count(1),
        metavar="N",
        help=f"number of classes (default {DEFAULT_NUM_CLASSES}, or as many as --class-names)",
    )
    synthetic.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synthetic.add_argument(
        "--homophily",
        type=_fraction,
        metavar="P",
        default=0.8,
        help="probability that an edge's source is drawn from its destination's class, "
        "else from all nodes (default 0.8)",
    )
    synthetic.add_argument(
        "--class-names",
        type=_names,
        metavar="A,B,...",
        help="comma-separated class names, e.g. legit,fraud",
    )
    _add_dataset_commands(commands)
    add_load_redis(commands)
    return parser


def _add_drop_flags(command: argparse.ArgumentParser, edge_key: str) -> None:
    """``--drop-self-loops`` and ``--drop-duplicate-edges``, the same on every build command;
    ``edge_key`` is what makes two edges repeats."""
    command.add_argument(
        "--drop-self-loops",
        action="store_true",
        help="drop edges whose src is their dst (default: keep them, as given)",
    )
    command.add_argument(
        "--drop-duplicate-edges",
        action="store_true",
        help=f"keep only the first edge of each {edge_key} in input order (default: keep "
        "parallel edges, each with its own edge features)",
    )


def _add_dataset_commands(commands: argparse._SubParsersAction) -> None:
    graphs = commands.add_parser(
        "graphs", help="build a graph classification dataset store from graphs/nodes/edges files"
    )
    graphs.add_argument(
        "--dataset",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory holding graphs.csv, nodes.csv and edges.csv (or .parquet)",
    )
    graphs.add_argument("--out", type=Path, required=True, metavar="DSET", help="store to write")
    graphs.add_argument(
        "--undirected",
        action="store_true",
        help="add the reverse of every edge, with its edge features (a self-loop is its own "
        "reverse and is not doubled)",
    )
    _add_drop_flags(graphs, "(graph_id, src, dst)")
    synthetic = commands.add_parser(
        "synthetic-graphs", help="generate small graphs labelled by their structure"
    )
    synthetic.add_argument("count", type=_count(2), metavar="COUNT", help="number of graphs")
    target = synthetic.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, metavar="DSET", help="write a dataset store here")
    target.add_argument(
        "--csv", type=Path, metavar="DIR", help="write graphs.csv, nodes.csv and edges.csv here"
    )
    synthetic.add_argument(
        "--num-classes",
        type=_count(2),
        default=DEFAULT_SYNTHETIC_CLASSES,
        metavar="N",
        help=f"classes, the first N of {', '.join(MOTIFS)} (default {DEFAULT_SYNTHETIC_CLASSES})",
    )
    synthetic.add_argument(
        "--feature-dim",
        type=_count(1),
        default=DEFAULT_SYNTHETIC_FEATURES,
        metavar="N",
        help=f"features per node (default {DEFAULT_SYNTHETIC_FEATURES})",
    )
    synthetic.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _dataset(args: argparse.Namespace) -> str:
    if args.command == "graphs":
        dataset = read_graph_dataset(
            args.dataset,
            undirected=args.undirected,
            drop_self_loops=args.drop_self_loops,
            drop_duplicate_edges=args.drop_duplicate_edges,
        )
    else:
        try:
            dataset = generate_graph_dataset(
                args.count,
                num_classes=args.num_classes,
                feature_dim=args.feature_dim,
                seed=args.seed,
            )
        except ValueError as error:
            raise GraphInputError("synthetic-graphs", None, str(error)) from error
        if args.csv is not None:
            write_graph_dataset_csv(dataset, args.csv)
            return (
                f"wrote graphs.csv, nodes.csv and edges.csv of {dataset.num_graphs} graphs "
                f"to {args.csv}"
            )
    meta = write_graph_dataset(dataset, args.out)
    stats = meta["stats"]
    report = (
        f"wrote dataset {args.out}: {meta['num_graphs']} graphs, {meta['num_nodes']} nodes, "
        f"{meta['num_edges']} edges, features {meta['feature_dim']}, edge features "
        f"{meta['edge_feature_dim']}, classes {meta['num_classes']} "
        f"{meta['class_names'] or ''}\n  checksum {meta['checksum']}\n"
    )
    if args.command == "graphs":
        drops = (args.drop_self_loops, args.drop_duplicate_edges)
        return report + _kept_or_dropped(stats, *drops)
    return report + (
        f"  dropped {stats['self_loops_dropped']} self-loops and "
        f"{stats['duplicate_edges_dropped']} duplicate edges drawn by chance"
    )


def _summary(meta: StoreMeta) -> str:
    stats, schema = meta["stats"], schema_of(meta)
    if schema.is_homogeneous:
        node, edge_width = schema.target_type, schema.relations[0].edge_feature_dim
        counts = (
            f"  nodes {meta['num_nodes']} ({node.id_kind} ids), edges {meta['num_edges']} "
            f"(of {stats['input_edges']}), features {node.feature_dim}, edge features "
            f"{edge_width}, classes {meta['num_classes']}"
        )
    else:
        types = "; ".join(
            f"{t.name} {t.num_nodes} ({t.id_kind} ids, {t.feature_dim} features)"
            for t in schema.node_types
        )
        relations = "; ".join(
            f"{r.name} {r.num_edges} ({r.edge_feature_dim} edge features)" for r in schema.relations
        )
        counts = (
            f"  nodes {meta['num_nodes']}: {types}\n  edges {meta['num_edges']} (of "
            f"{stats['input_edges']}): {relations}\n  target {schema.target}, classes "
            f"{meta['num_classes']}"
        )
    return f"{counts}\n  checksum {meta['checksum']}"


def _kept_or_dropped(
    stats: Mapping[str, Any], drop_self_loops: bool, drop_duplicate_edges: bool
) -> str:
    """One line: what became of self-loops and duplicate edges, and the flags that change it
    (``stats``: a store's or a dataset's ``meta.json`` stats)."""
    loops_kept = f"{stats.get('self_loops_kept', 0)} self-loops"
    repeats_kept = f"{stats.get('duplicate_edges_kept', 0)} parallel edges"
    kinds = (
        (drop_self_loops, f"{stats['self_loops_dropped']} self-loops", loops_kept),
        (drop_duplicate_edges, f"{stats['duplicate_edges_dropped']} duplicate edges", repeats_kept),
    )
    flags = ("--drop-self-loops", "--drop-duplicate-edges")
    kept = [(what, flag) for (drop, _, what), flag in zip(kinds, flags, strict=True) if not drop]
    dropped = [(what, flag) for (drop, what, _), flag in zip(kinds, flags, strict=True) if drop]
    parts = []
    if kept:
        verb = "drops" if len(kept) == 1 else "drop"
        what, named = " and ".join(w for w, _ in kept), " / ".join(f for _, f in kept)
        parts.append(f"kept {what} ({named} {verb} them)")
    if dropped:
        what, named = " and ".join(w for w, _ in dropped), " / ".join(f for _, f in dropped)
        parts.append(f"dropped {what} ({named})")
    return "  " + ", ".join(parts)


def _build(args: argparse.Namespace) -> str:
    meta = write_store(
        read_graph(args.graph, args.undirected, args.target_node_type),
        args.out,
        drop_self_loops=args.drop_self_loops,
        drop_duplicate_edges=args.drop_duplicate_edges,
    )
    kept = _kept_or_dropped(meta["stats"], args.drop_self_loops, args.drop_duplicate_edges)
    return f"built store {args.out} from {args.graph}\n{_summary(meta)}\n{kept}"


def _num_classes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--num-classes, defaulting to the number of --class-names; exits if they disagree."""
    names = args.class_names
    if args.num_classes is None:
        return DEFAULT_NUM_CLASSES if names is None else len(names)
    if names is not None and len(names) != args.num_classes:
        parser.error(
            f"--class-names gives {len(names)} names but --num-classes is {args.num_classes}; "
            "give one name per class"
        )
    return int(args.num_classes)


def _draw(
    write: Callable[..., _Written], out: Path, args: argparse.Namespace, num_classes: int
) -> _Written:
    """``write`` (a store or input files at ``out``) of the graph ``synthetic`` asks for: both
    forms draw the same graph from the same arguments."""
    return write(
        args.nodes,
        args.edges,
        out,
        feature_dim=args.feature_dim,
        num_classes=num_classes,
        seed=args.seed,
        homophily=args.homophily,
        class_names=args.class_names,
    )


def _synthetic(args: argparse.Namespace, num_classes: int) -> str:
    if args.out is not None:
        meta = _draw(generate_synthetic, args.out, args, num_classes)
        stats = meta["stats"]
        return (
            f"generated store {args.out} ({args.edges} edges requested)\n{_summary(meta)}\n"
            f"  dropped {stats['self_loops_dropped']} self-loops and "
            f"{stats['duplicate_edges_dropped']} duplicate edges drawn by chance"
        )
    _draw(write_synthetic_csv, args.csv, args, num_classes)
    return (
        f"wrote {args.csv / 'nodes.csv'} and {args.csv / 'edges.csv'}: {args.nodes} nodes, "
        f"{args.edges} edges (self-loops and repeats drawn by chance included: build with "
        "--drop-self-loops --drop-duplicate-edges to get the store --out writes)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status (2 for bad input or a bad store)."""
    parser = _parser()
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        if args.command == "build":
            report = _build(args)
        elif args.command == "load-redis":
            report = load_redis(args)
        elif args.command in ("graphs", "synthetic-graphs"):
            report = _dataset(args)
        else:
            report = _synthetic(args, _num_classes(parser, args))
    except (GraphInputError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    print(f"  took {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
