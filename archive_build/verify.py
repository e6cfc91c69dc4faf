"""``python -m archive_build.verify``: before an archive is written, its own serving path is run
in process with full neighbourhoods and compared with the model's full-graph forward.

Nodes: a seeded random sample plus the highest in-degree ones (hubs are where sampling and
degree handling go wrong). Answers are compared as served (probabilities for class outputs,
values for raw outputs). Above the tolerance the build stops with one line naming the worst
node, its difference and the likely cause; the figures go into ``build_info.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from graph_assets import StoreError, open_store
from graph_assets.store import GraphStore
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model.export import CONFIG_FILE, load_model
from model.served import UserNodeModel, answer_rows, edge_kwargs, serving_needs
from model.user_model import EdgeInput, Output

# Larger graphs are checked on the induced subgraph of the nodes' in-neighbourhoods: the whole
# graph's activations would need about E x width x 4 bytes (5 GB at 10M edges and 128 wide).
WHOLE_GRAPH_EDGES = 4_000_000
RANDOM_NODES = 256
HUB_NODES = 16
IDS_PER_REQUEST = 34
REQUESTS_PER_BATCH = 8


@dataclass(frozen=True)
class Comparison:
    """Served answers of some nodes against the full-graph forward."""

    worst: float
    worst_node: Any  # external ID
    classes_agree: int
    nodes: int


@dataclass(frozen=True)
class Verification:
    """What ``build_info.json`` records."""

    passed: bool
    tolerance: float
    nodes: int
    worst_abs_diff: float
    worst_node: Any
    class_agreement: float | None
    sampled_class_agreement: float | None
    boundary_degrees: bool
    seconds: float
    cause: str = ""


def verification_nodes(store: GraphStore, seed: int = 0) -> np.ndarray:
    """``RANDOM_NODES`` random nodes and the ``HUB_NODES`` highest in-degree ones, sorted."""
    rng = np.random.default_rng(seed)
    n = store.num_nodes
    chosen = rng.choice(n, size=min(RANDOM_NODES, n), replace=False)
    degree = np.asarray(store.in_degree)
    hubs = np.argsort(-degree, kind="stable")[: min(HUB_NODES, n)]
    return np.unique(np.concatenate([chosen, hubs]))


def reference_rows(
    model: torch.nn.Module, store: GraphStore, nodes: np.ndarray, hops: int
) -> torch.Tensor:
    """The model's full-graph answer for ``nodes`` (in that order), as answers carry it: the
    whole graph's forward, or for a graph over ``WHOLE_GRAPH_EDGES`` the forward of the
    subgraph the nodes' ``hops + 1``-hop in-neighbourhood induces (every node within ``hops``
    has all its in-edges there, so a local model's answer and its sources' degrees are the
    whole graph's)."""
    if store.num_edges <= WHOLE_GRAPH_EDGES:
        rows = np.arange(store.num_nodes)
        edge_index, edge_ids = store.edge_index(), np.arange(store.num_edges)
    else:
        rows = in_closure(store, nodes, hops + 1)
        edge_index, edge_ids = induced_in_edges(store, rows)
    x = torch.from_numpy(np.array(np.take(store.features, rows, axis=0), dtype=np.float32))
    needs = serving_needs(model)
    edge_attr = None
    if needs.edge_input is not EdgeInput.NONE:
        edge_attr = torch.from_numpy(store.edge_feature_rows(edge_ids))
    with torch.inference_mode():
        if isinstance(model, UserNodeModel):
            out = model.module(
                x, torch.from_numpy(edge_index), **edge_kwargs(needs.edge_input, edge_attr)
            )
        else:
            out = model(x, torch.from_numpy(edge_index))
        answer = answer_rows(out, needs.output)
    return answer[torch.from_numpy(np.searchsorted(rows, nodes))]


def in_closure(store: GraphStore, nodes: np.ndarray, hops: int) -> np.ndarray:
    """Sorted nodes within ``hops`` in-edges of ``nodes`` (``nodes`` included)."""
    reached = np.unique(nodes)
    frontier = reached
    for _ in range(hops):
        sources = np.unique(np.asarray(store.indices)[_in_edge_positions(store, frontier)])
        frontier = np.setdiff1d(sources, reached, assume_unique=True)
        if frontier.size == 0:
            break
        reached = np.union1d(reached, frontier)
    return reached


def induced_in_edges(store: GraphStore, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(edge_index over positions in rows, edge IDs)`` of the edges between ``rows``."""
    positions = _in_edge_positions(store, rows)
    counts = np.diff(np.asarray(store.indptr))[rows]
    dst = np.repeat(np.arange(len(rows)), counts)
    src_nodes = np.asarray(store.indices)[positions].astype(np.int64)
    local = np.searchsorted(rows, src_nodes)
    inside = (local < len(rows)) & (rows[np.minimum(local, len(rows) - 1)] == src_nodes)
    return np.stack([local[inside], dst[inside]]), positions[inside]


def _in_edge_positions(store: GraphStore, nodes: np.ndarray) -> np.ndarray:
    """CSC positions of every in-edge of ``nodes``, node by node."""
    indptr = np.asarray(store.indptr)
    starts = indptr[nodes].astype(np.int64)
    counts = indptr[nodes + 1].astype(np.int64) - starts
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(
        int(ends[-1]) if len(ends) else 0
    )


def served_rows(
    model: torch.nn.Module, store: GraphStore, settings: ServingSettings, nodes: np.ndarray
) -> dict[Any, list[float]]:
    """Each node's answer row through the archive's node engine, in TorchServe-sized batches."""
    engine = NodeClassificationEngine.create(
        store, model, settings, torch.device("cpu"), model_version="verify"
    )
    ids = store.external_ids(nodes)
    requests = [
        {"body": {"node_ids": ids[i : i + IDS_PER_REQUEST]}}
        for i in range(0, len(ids), IDS_PER_REQUEST)
    ]
    answers: dict[Any, list[float]] = {}
    field = "output" if serving_needs(model).output is Output.RAW else "probabilities"
    for start in range(0, len(requests), REQUESTS_PER_BATCH):
        for response in engine.handle(requests[start : start + REQUESTS_PER_BATCH]):
            if response.status != 200:
                raise ValueError(f"the serving path answered {response.status}: {response.body}")
            for prediction in response.body["predictions"]:
                answers[prediction["node_id"]] = prediction[field]
    return answers


def compare(
    expected_rows: torch.Tensor,
    served: dict[Any, list[float]],
    store: GraphStore,
    nodes: np.ndarray,
) -> Comparison:
    ids = store.external_ids(nodes)
    expected = expected_rows.double()
    got = torch.tensor([served[node_id] for node_id in ids], dtype=torch.float64)
    diff = (got - expected).abs().amax(dim=1)
    worst = int(diff.argmax())
    agree = int((got.argmax(dim=1) == expected.argmax(dim=1)).sum())
    return Comparison(float(diff[worst]), ids[worst], agree, len(ids))


def exact_settings(settings: ServingSettings, hops: int) -> ServingSettings:
    """The archive's settings with every neighbour kept, no limits in the way, no updates."""
    return dataclasses.replace(
        settings,
        fanouts=(-1,) * hops,
        max_ids_per_request=max(settings.max_ids_per_request, IDS_PER_REQUEST),
        max_subgraph_nodes=2**62,
        max_subgraph_edges=2**62,
        updates_enabled=False,
        torch_threads=0,
    )


def verify(
    model_dir: Path, store: GraphStore, settings: ServingSettings, tolerance: float
) -> Verification:
    """Runs the comparison (and, on a failure, finds the likely cause)."""
    started = time.perf_counter()
    model, config = load_model(model_dir)
    hops = config.num_layers
    nodes = verification_nodes(store)
    full = reference_rows(model, store, nodes, hops)
    result = compare(
        full, served_rows(model, store, exact_settings(settings, hops), nodes), store, nodes
    )
    boundary = serving_needs(model).boundary_degrees
    cause = ""
    if result.worst > tolerance and isinstance(model, UserNodeModel) and not boundary:
        # A layer that normalises by its sources' degrees which the build did not recognise.
        with_boundary = UserNodeModel(
            model.module, dataclasses.replace(model.config, boundary_degrees=True)
        ).eval()
        retried = compare(
            full,
            served_rows(with_boundary, store, exact_settings(settings, hops), nodes),
            store,
            nodes,
        )
        if retried.worst <= tolerance:
            model, result, boundary = with_boundary, retried, True
            config_path = model_dir / CONFIG_FILE
            data = json.loads(config_path.read_text())
            data["boundary_degrees"] = True
            config_path.write_text(json.dumps(data, indent=2) + "\n")
    if result.worst > tolerance:
        cause = likely_cause(model, store, settings, full, nodes, hops, tolerance)
    sampled = None
    if any(fanout != -1 for fanout in settings.fanouts) and result.worst <= tolerance:
        sampled_settings = dataclasses.replace(
            exact_settings(settings, hops), fanouts=settings.fanouts
        )
        guess = compare(full, served_rows(model, store, sampled_settings, nodes), store, nodes)
        sampled = guess.classes_agree / guess.nodes
    classes = serving_needs(model).output is not Output.RAW
    return Verification(
        passed=result.worst <= tolerance,
        tolerance=tolerance,
        nodes=result.nodes,
        worst_abs_diff=result.worst,
        worst_node=result.worst_node,
        class_agreement=result.classes_agree / result.nodes if classes else None,
        sampled_class_agreement=sampled if classes else None,
        boundary_degrees=boundary,
        seconds=round(time.perf_counter() - started, 2),
        cause=cause,
    )


def likely_cause(
    model: torch.nn.Module,
    store: GraphStore,
    settings: ServingSettings,
    full: torch.Tensor,
    nodes: np.ndarray,
    hops: int,
    tolerance: float,
) -> str:
    """Why the served answer is not the full-graph one: randomness, a deeper receptive field
    than the archive samples, or a model that is not local."""
    again = reference_rows(model, store, nodes, hops)
    if not torch.equal(again, full):
        return (
            "the model is not deterministic in eval mode (randomness in forward, e.g. dropout "
            "with training=True)"
        )
    deeper = compare(
        full, served_rows(model, store, exact_settings(settings, hops + 1), nodes), store, nodes
    )
    if deeper.worst <= tolerance:
        return f"the model reads more than {hops} hops: build with --num-hops {hops + 1} or more"
    return (
        "the model is not local: an answer depends on more than the node's k-hop neighbourhood "
        "(whole-graph pooling or normalisation, batch statistics such as BatchNorm in training "
        "mode or GraphNorm), which no ego-graph can serve"
    )


def summary(result: Verification) -> list[str]:
    """The lines the build prints."""
    lines = [
        f"  verified {result.nodes} nodes ({RANDOM_NODES} random and the {HUB_NODES} highest "
        f"in-degree) with full neighbourhoods: worst |served - full-graph forward| "
        f"{result.worst_abs_diff:.2e} (node {result.worst_node})"
        + (
            f", classes agree {result.class_agreement:.1%}"
            if result.class_agreement is not None
            else ""
        )
        + f"; {result.seconds:.1f} s"
    ]
    if result.sampled_class_agreement is not None:
        lines.append(
            f"  with the archive's sampled fanouts, classes agree with the full-graph answer "
            f"for {result.sampled_class_agreement:.1%} of them (info)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m archive_build.verify", description=__doc__)
    parser.add_argument("--store", required=True, help="the graph store the archive serves")
    parser.add_argument("--model-dir", required=True, help="model.pt and model_config.json")
    parser.add_argument("--model-config-yaml", required=True, help="the archive's YAML")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest difference")
    parser.add_argument("--out", required=True, help="verification JSON to write")
    args = parser.parse_args(argv)
    try:
        section = yaml.safe_load(Path(args.model_config_yaml).read_text())["gnn"]
        settings = ServingSettings.from_yaml_section(section)
        result = verify(
            Path(args.model_dir), open_store(Path(args.store)), settings, args.tolerance
        )
    except (ValueError, StoreError) as error:
        print(f"error: verification could not run: {error}", file=sys.stderr)
        return 1
    Path(args.out).write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    if not result.passed:
        print(
            f"error: verification failed: node {result.worst_node} differs from the model's "
            f"full-graph forward by {result.worst_abs_diff:.3g} (> --verify-tolerance "
            f"{result.tolerance:g}); likely cause: {result.cause}",
            file=sys.stderr,
        )
        return 1
    print("\n".join(summary(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
