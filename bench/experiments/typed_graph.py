"""A graph of several node types against the same nodes and edges as one type, side by side in
one run: what serving the typed graph costs.

``python -m bench.experiments.typed_graph [--edges N] [--pairs 5] [--seconds 10] [--out FILE]``

The typed graph is ``graph_assets.input.synthetic_typed.fraud_graph`` (users with 8 features and a
fraud/legit label, merchants with 4, featureless devices; ``user__pays__merchant`` with two
edge features and ``user__uses__device``), sized so that it holds ``--edges`` edges (default
1M) once ``--undirected`` has added each relation's reverse: users = edges / 10, merchants =
users / 10, devices = users / 2, 1.3 device uses per user and payments for the rest. Two
archives are built with ``build_mar.sh`` from CSV, each timed:

1. typed: the typed directory, ``--undirected`` (3 node types, 4 relations);
2. homogeneous: the same nodes as one type (every type's features zero-padded to the widest
   type's 8, devices all zeros; users keep their labels, the others are unlabelled) and the
   same edges, both directions, in one ``edges.csv`` (the payments' two edge features kept, the
   device uses' zero), built without ``--undirected``.

Both: ``--arch sage``, fanouts [10,5], ``--epochs`` (default 30, so that both builds fit the
run; early stopping may end sooner), batch 16 / 5 ms, one worker, one intra-op thread, CPU.

Measured, in this order:

- build: each ``build_mar.sh`` run (unpacking the archive included), its training seconds,
  the size of its graph store and of its archive;
- in process (info): the two engines answer the same batches of 16 requests alternately, round
  by round; the median of each stage (the typed path times its per-type gathers and its
  per-relation split inside ``forward``);
- served: one TorchServe holds both archives; after a warm-up of each, the two are measured
  back to back in pairs, the order alternating from pair to pair, at 32 connections (throughput)
  and then at one (p50, p99). The figures are the medians of the pairs' ratios, typed over
  homogeneous. Every request asks for ``--ids`` (default 8-16) uniformly random users, the same
  sequence of requests for both archives.

Results go to ``--out`` (JSON) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import torch

from bench.experiments.suite import finish_run, machine
from bench.harness.artifacts import ROOT, Artifacts
from bench.harness.paired import CONNECTIONS, alternate, paired_levels, warmed_targets
from bench.harness.watch import host_steal
from bench.systems import servers
from graph_assets import open_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from graph_assets.tables import RawGraph, TypedGraph
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model.export import load_model

SYSTEMS = ("homogeneous", "typed")
FANOUTS = (10, 5)
BATCH, DELAY = 16, 5
DEFAULT_EDGES = 1_000_000
USES_PER_USER = 1.3  # fraud_graph gives each user one device, and a second with p = 0.3
THROUGHPUT_TARGET, LATENCY_TARGET = 0.7, 1.3


# -- the two graphs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FraudSize:
    """``fraud_graph``'s arguments for a graph of about ``edges`` edges after ``--undirected``."""

    edges: int
    users: int
    merchants: int
    devices: int
    payments: int


def fraud_size(edges: int) -> FraudSize:
    """Users = edges / 10, merchants = users / 10, devices = users / 2, and payments for half
    the edges less the ~1.3 device uses per user (the other half are the reverses)."""
    if edges < 1000:
        raise ValueError(f"--edges must be at least 1000 (a graph with ~100 users); got {edges}")
    users = edges // 10
    payments = edges // 2 - round(USES_PER_USER * users)
    return FraudSize(edges, users, max(1, users // 10), max(1, users // 2), payments)


def typed_graph(size: FraudSize, seed: int = 0) -> TypedGraph:
    """The fraud graph of ``size`` (its relations without their reverses)."""
    return fraud_graph(size.users, size.merchants, size.devices, size.payments, seed)


def homogeneous(graph: TypedGraph) -> RawGraph:
    """``graph`` as one node type with the same nodes and edges: each type's nodes in turn,
    features zero-padded to the widest type's width (a featureless type all zeros), the target
    type's labels kept and every other node unlabelled; each relation's edges followed by their
    reverses (those ``--undirected`` adds: a self-loop within one type is not added twice),
    with edge features zero-padded to the widest relation's (a reverse edge has its edge's).

    Raises ValueError when two types share an ID (one type needs unique IDs)."""
    widest = max(graph.node_types, key=lambda nodes: nodes.feature_dim)
    width = widest.feature_dim
    offsets, start = {}, 0
    for nodes in graph.node_types:
        offsets[nodes.name] = start
        start += len(nodes.ids)
    ids = np.concatenate([_id_text(nodes.ids) for nodes in graph.node_types])
    if len(np.unique(ids)) != len(ids):
        raise ValueError(
            "node IDs repeat across types; one node type needs unique IDs: give each type "
            "its own prefix"
        )
    features = np.zeros((len(ids), width), dtype=np.float32)
    labels = np.full(len(ids), -1, dtype=np.int64)
    for nodes in graph.node_types:
        rows = slice(offsets[nodes.name], offsets[nodes.name] + len(nodes.ids))
        features[rows, : nodes.feature_dim] = nodes.features
        if nodes.name == graph.target:
            labels[rows] = graph.labels
    edge_widest = max(graph.relations, key=lambda relation: relation.edge_features.shape[1])
    edge_width = edge_widest.edge_features.shape[1]
    src, dst, edge_features = [], [], []
    for relation in graph.relations:
        kind = relation.edge_type
        s = relation.src + offsets[kind.src]
        d = relation.dst + offsets[kind.dst]
        padded = np.zeros((len(s), edge_width), dtype=np.float32)
        padded[:, : relation.edge_features.shape[1]] = relation.edge_features
        src.append(s)
        dst.append(d)
        edge_features.append(padded)
        if not graph.undirected:
            back = np.flatnonzero((s != d) | (kind.src != kind.dst))
            src.append(d[back])
            dst.append(s[back])
            edge_features.append(padded[back])
    return RawGraph(
        ids=np.char.encode(ids, "utf-8"),
        src=np.concatenate(src),
        dst=np.concatenate(dst),
        features=features,
        labels=labels,
        class_names=graph.class_names,
        feature_names=[f"f{i}" for i in range(width)],
        edge_features=np.concatenate(edge_features),
        edge_feature_names=list(edge_widest.edge_feature_names),
        undirected=True,
    )


def write_homogeneous_csv(graph: RawGraph, out: Path) -> Path:
    """``graph`` as ``out/nodes.csv`` (``id``, features, ``label``: a class name, empty when
    unlabelled) and ``out/edges.csv`` (``src``, ``dst``, edge features), the one-type layout
    ``--graph`` reads."""
    out.mkdir(parents=True, exist_ok=True)
    ids = _id_text(graph.ids)
    names = graph.class_names or [str(k) for k in range(graph.num_classes)]
    label_text = np.array([*names, ""], dtype=object)[graph.labels]  # -1 picks ""
    nodes = {"id": ids, **_columns(graph.feature_names, graph.features), "label": label_text}
    edges = {
        "src": ids[graph.src],
        "dst": ids[graph.dst],
        **_columns(graph.edge_feature_names, graph.edge_features),
    }
    for name, columns in (("nodes", nodes), ("edges", edges)):
        pacsv.write_csv(pa.table(columns), out / f"{name}.csv")
    return out


def _id_text(ids: np.ndarray) -> np.ndarray:
    return ids.astype(str) if ids.dtype.kind == "i" else np.char.decode(ids, "utf-8")


def _columns(names: list[str], values: np.ndarray) -> dict[str, np.ndarray]:
    return {name: values[:, j] for j, name in enumerate(names)}


def user_bodies(
    users: int, count: int, ids: tuple[int, int], seed: int = 3, prefix: str = "u"
) -> list[bytes]:
    """``count`` requests, each for ``ids[0]..ids[1]`` uniformly random users (fraud_graph
    names them ``u<i>``); the same list for both archives."""
    rng = np.random.default_rng(seed)
    return [
        json.dumps(
            {
                "node_ids": [
                    f"{prefix}{i}"
                    for i in rng.integers(0, users, rng.integers(*ids, endpoint=True))
                ]
            }
        ).encode()
        for _ in range(count)
    ]


# -- build ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """One archive, built anew: its unpacked folder and what its build cost."""

    folder: Path
    build_s: float
    train_s: float
    epochs_run: int
    test_accuracy: float
    store_bytes: int
    archive_bytes: int

    def summary(self) -> dict[str, Any]:
        return {
            "build_s": round(self.build_s, 1),
            "train_s": round(self.train_s, 1),
            "epochs_run": self.epochs_run,
            "test_accuracy": round(self.test_accuracy, 4),
            "store_bytes": self.store_bytes,
            "archive_bytes": self.archive_bytes,
        }


def folder_bytes(folder: Path) -> int:
    return sum(file.stat().st_size for file in folder.rglob("*") if file.is_file())


def build(artifacts: Artifacts, name: str, graph_dir: Path, extra: list[str], epochs: int) -> Built:
    """``build_mar.sh --graph graph_dir`` with the settings both archives share, timed."""
    shutil.rmtree(artifacts.archives / name, ignore_errors=True)
    started = time.perf_counter()
    folder = artifacts.built(
        name,
        [
            *("--graph", str(graph_dir), *extra, "--arch", "sage", "--epochs", str(epochs)),
            *("--fanouts", ",".join(map(str, FANOUTS)), "--torch-threads", "1"),
            *("--batch-size", str(BATCH), "--max-batch-delay", str(DELAY)),
            *("--min-workers", "1", "--max-workers", "1", "--device", "cpu"),
        ],
    )
    seconds = time.perf_counter() - started
    metrics = json.loads((folder / "build_info.json").read_text())["metrics"]
    return Built(
        folder=folder,
        build_s=seconds,
        train_s=float(metrics["seconds"]),
        epochs_run=int(metrics["epochs_run"]),
        test_accuracy=float(metrics["test_accuracy"]),
        store_bytes=folder_bytes(folder / "graph"),
        archive_bytes=folder_bytes(folder),
    )


# -- in process -------------------------------------------------------------------------------

STAGES = ("parse", "sample", "gather", "forward", "format")


def in_process(folders: dict[str, Path], payload: Sequence[bytes], rounds: int) -> dict[str, Any]:
    """Median stage times (ms) of a batch of ``BATCH`` requests per engine, the engines
    alternating round by round on the same batches; the typed path's gathers fall in
    ``forward``."""
    engines = {}
    for name, folder in folders.items():
        store = open_store(folder / "graph", verify_checksum=False)
        model, _ = load_model(folder)
        settings = ServingSettings(fanouts=FANOUTS, torch_threads=1)
        engines[name] = NodeClassificationEngine.create(
            store, model, settings, torch.device("cpu"), "1.0"
        )
    return stage_medians(SYSTEMS, engines, payload, 20, rounds, counts=("sampled_nodes",))


def stage_medians(
    systems: tuple[str, str],
    engines: dict[str, NodeClassificationEngine],
    payload: Sequence[bytes],
    batches: int,
    rounds: int,
    counts: Sequence[str] = (),
) -> dict[str, Any]:
    """Median stage and total times (ms) of ``batches`` batches of ``BATCH`` requests per
    engine, and of the ``counts`` each batch records; the two systems alternate round by round
    on the same batches, and the first round only warms up."""
    items_of = [
        [{"body": json.loads(body)} for body in payload[i : i + BATCH]]
        for i in range(0, batches * BATCH, BATCH)
    ]
    times: dict[str, dict[str, list[float]]] = {
        name: {stage: [] for stage in (*STAGES, "total", *counts)} for name in engines
    }
    for index in range(rounds + 1):
        for name in alternate(systems, index):
            engine = engines[name]
            for items in items_of:
                started = time.perf_counter()
                prepared = engine.prepare(items)
                engine.respond(engine.run(prepared))
                total = time.perf_counter() - started
                if index == 0:
                    continue
                for stage in STAGES:
                    times[name][stage].append(getattr(prepared.times, stage) * 1e3)
                times[name]["total"].append(total * 1e3)
                for count in counts:
                    times[name][count].append(getattr(prepared.times, count))
    return {
        name: {key: round(float(np.median(values)), 3) for key, values in stages.items()}
        for name, stages in times.items()
    } | {"rounds": rounds, "batches_per_round": len(items_of)}


# -- served -----------------------------------------------------------------------------------


def served(
    artifacts: Artifacts, folders: dict[str, Path], payload: list[bytes], pairs: int, seconds: float
) -> dict[str, Any]:
    """Pairs at 32 connections, then at one, the order alternating from pair to pair."""
    models = [f"{name}={folder.name}" for name, folder in folders.items()]
    home = artifacts.work / "run" / "typed_graph"
    with servers.torchserve(home, artifacts.archives, models) as server:
        targets, cpu = warmed_targets(server, SYSTEMS, payload)
        return {"levels": paired_levels(targets, cpu, SYSTEMS, pairs, seconds)}


# -- report -----------------------------------------------------------------------------------


def _pairs(results: dict[str, Any], concurrency: int) -> list[dict[str, Any]]:
    return [p for p in results["served"]["levels"] if p["concurrency"] == concurrency]


def _median(pairs: list[dict[str, Any]], name: str, key: str) -> float:
    return statistics.median(pair[name][key] for pair in pairs)


def ratio_row(
    results: dict[str, Any], concurrency: int, key: str, target: str, unit: str
) -> tuple[float, str]:
    """The median over pairs of typed / homogeneous ``key``, and its detail."""
    pairs = _pairs(results, concurrency)
    ratios = [pair["typed"][key] / pair["homogeneous"][key] for pair in pairs]
    value = statistics.median(ratios)
    typed, homog = _median(pairs, "typed", key), _median(pairs, "homogeneous", key)
    detail = f"{typed:,.2f} vs {homog:,.2f} {unit} (medians); pairs " + ", ".join(
        f"{r:.2f}" for r in ratios
    )
    if target:
        op, bound = target.split()
        met = value >= float(bound) if op == ">=" else value <= float(bound)
        detail = ("met: " if met else "missed: ") + detail
    return value, detail


def report_rows(results: dict[str, Any]) -> list[str]:
    """The markdown rows: the two targets, p99, build time, store size, the in-process stages."""
    ids = results["config"]["mean_ids_per_request"]
    rows = []
    value, detail = ratio_row(
        results, CONNECTIONS, "throughput", f">= {THROUGHPUT_TARGET}", "req/s"
    )
    pairs = _pairs(results, CONNECTIONS)
    nodes = {name: _median(pairs, name, "throughput") * ids for name in SYSTEMS}
    cpu = {name: _median(pairs, name, "worker_cpu_ms_per_request") for name in SYSTEMS}
    detail += (
        f"; ~{nodes['typed']:,.0f} vs {nodes['homogeneous']:,.0f} node predictions/s; "
        f"worker CPU {cpu['typed']:.2f} vs {cpu['homogeneous']:.2f} ms a request"
    )
    rows.append(
        f"| throughput typed / homogeneous, {CONNECTIONS} conns | >= {THROUGHPUT_TARGET} "
        f"| {value:.2f} | {detail} |"
    )
    value, detail = ratio_row(results, 1, "p50_ms", f"<= {LATENCY_TARGET}", "ms")
    rows.append(
        f"| p50 typed / homogeneous, 1 conn | <= {LATENCY_TARGET} | {value:.2f} | {detail} |"
    )
    value, detail = ratio_row(results, 1, "p99_ms", "", "ms")
    rows.append(f"| (p99 typed / homogeneous, 1 conn) | info | {value:.2f} | {detail} |")
    builds = results["build"]
    typed, homog = builds["typed"], builds["homogeneous"]
    rows.append(
        f"| build time typed / homogeneous | info | {typed['build_s'] / homog['build_s']:.2f} "
        f"| {typed['build_s']:.1f} s vs {homog['build_s']:.1f} s (training "
        f"{typed['train_s']:.1f} vs {homog['train_s']:.1f} s, {typed['epochs_run']} vs "
        f"{homog['epochs_run']} epochs; test accuracy {typed['test_accuracy']:.3f} vs "
        f"{homog['test_accuracy']:.3f}) |"
    )
    mib = 2**20
    rows.append(
        f"| store size typed / homogeneous | info "
        f"| {typed['store_bytes'] / homog['store_bytes']:.2f} "
        f"| {typed['store_bytes'] / mib:.1f} vs {homog['store_bytes'] / mib:.1f} MiB (unpacked "
        f"archive {typed['archive_bytes'] / mib:.1f} vs {homog['archive_bytes'] / mib:.1f} MiB) |"
    )
    stages = results["in_process"]
    t, h = stages["typed"], stages["homogeneous"]
    sampled = f"{t['sampled_nodes']:,.0f} vs {h['sampled_nodes']:,.0f} sampled nodes"
    more = f"; {sampled} (the typed path's gathers are in its forward)"
    rows.append(stage_row("total typed / homogeneous", t, h, more))
    return rows


def stage_row(what: str, first: dict[str, float], second: dict[str, float], more: str = "") -> str:
    """The report's row of two engines' median stage times (``stage_medians``), first / second."""
    return (
        f"| in process, batch of {BATCH} requests, {what} | info "
        f"| {first['total'] / second['total']:.2f} | {first['total']:.2f} vs "
        f"{second['total']:.2f} ms; "
        + "; ".join(f"{stage} {first[stage]:.2f} vs {second[stage]:.2f}" for stage in STAGES)
        + f" ms{more} |"
    )


def table(results: dict[str, Any]) -> str:
    header = "| figure | target | measured |  |\n|---|---|---|---|\n"
    return header + "\n".join(report_rows(results))


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench", help="build dir")
    parser.add_argument(
        "--edges", type=int, default=DEFAULT_EDGES, help="edges after the reverses (default 1M)"
    )
    parser.add_argument("--epochs", type=int, default=30, help="training epochs of both builds")
    parser.add_argument("--ids", type=int, nargs=2, default=(8, 16), help="user IDs per request")
    parser.add_argument("--pairs", type=int, default=5, help="pairs per connection count")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per level")
    parser.add_argument("--rounds", type=int, default=5, help="in-process rounds per engine")
    parser.add_argument("--out", type=Path, help="JSON results file")
    args = parser.parse_args()
    started, steal, measured_on = time.perf_counter(), host_steal(), machine()
    artifacts = Artifacts(args.work)
    size = fraud_size(args.edges)
    graph = typed_graph(size)
    flat = homogeneous(graph)
    inputs = args.work / "typed_graph" / str(args.edges)
    shutil.rmtree(inputs, ignore_errors=True)
    write_fraud_graph_csv(graph, inputs / "typed")
    write_homogeneous_csv(flat, inputs / "homogeneous")
    print(
        f"== graph: {len(flat.ids):,} nodes ({size.users:,} users, {size.merchants:,} merchants, "
        f"{size.devices:,} devices), {len(flat.src):,} edges with the reverses",
        flush=True,
    )
    builds = {
        "typed": build(
            artifacts, "typed_graph_typed", inputs / "typed", ["--undirected"], args.epochs
        ),
        "homogeneous": build(
            artifacts, "typed_graph_homogeneous", inputs / "homogeneous", [], args.epochs
        ),
    }
    for name, built in builds.items():
        print(f"== build {name}: {built.summary()}", flush=True)
    folders = {name: builds[name].folder for name in SYSTEMS}
    payload = user_bodies(size.users, 20_000, tuple(args.ids))
    mean_ids = float(np.mean([len(json.loads(body)["node_ids"]) for body in payload]))
    process = in_process(folders, payload, args.rounds)
    print(f"== in process: {process}", flush=True)
    print(f"== served, {CONNECTIONS} connections then 1, batch {BATCH} / {DELAY} ms", flush=True)
    results: dict[str, Any] = {
        "machine": measured_on,
        "config": {
            "edges": len(flat.src),
            "nodes": len(flat.ids),
            "size": vars(size),
            "arch": "sage",
            "fanouts": list(FANOUTS),
            "epochs": args.epochs,
            "batch": [BATCH, DELAY],
            "ids_per_request": list(args.ids),
            "mean_ids_per_request": round(mean_ids, 3),
            "pairs": args.pairs,
            "seconds": args.seconds,
        },
        "build": {name: built.summary() for name, built in builds.items()},
        "in_process": process,
        "served": served(artifacts, folders, payload, args.pairs, args.seconds),
    }
    finish_run(results, started, steal, table, args.out)


if __name__ == "__main__":
    main()
