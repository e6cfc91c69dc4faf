"""``python -m archive_build.verify``: before an archive is written, its own serving path is run
in process and compared with the model's own answer, for every task:

- node: nodes (a seeded random sample plus the highest in-degree ones: hubs are where sampling
  and degree handling go wrong) answered by the node engine with full neighbourhoods, against
  the model's full-graph forward;
- link: pairs (a seeded random sample plus pairs touching the hubs) scored by the link engine
  with full neighbourhoods, and the hubs' top-k over the archive's stored embeddings, against
  ``decode(encode(whole graph), pairs)`` (the preset's ``score``); on a graph of several node
  types, pairs of the predicted relation's ends and the source type's hubs' top-k over the
  destination type, against ``decode(encode(whole typed graph))``;
- graph: dataset graphs answered in TorchServe-sized batches by the graph engine, against each
  graph's own forward alone: the locality that batching inline graphs relies on.

Node and pair answers are served on the loaded model, a sample each alone first, then all in
the archive's batches and again in differently composed ones; the reference comes from a fresh
copy, so that neither a call's batch nor an earlier call can make the two agree. Answers are
compared as served (probabilities for class outputs, sigmoid of link logits, values for raw
outputs); a NaN never passes. Above the tolerance the build stops with one line naming the
worst node, pair or graph, its difference and the likely cause (a module known not to be
local is named with its path, ``NON_LOCAL``); the figures go into
``build_info.json``. The node, pair and graph checks share the reference machinery (the whole
graph's forward, or for a large graph the forward of the checked nodes' in-neighbourhood), the
batch sizes and the retry with boundary degrees.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import yaml
from torch_geometric.nn import MessagePassing

from graph_assets import StoreError, open_store
from graph_assets.input.graph_dataset import GraphDataset, open_graph_dataset
from graph_assets.stored.store import GraphStore
from handler.graph.ego import EgoGraphs
from handler.settings import ServingSettings
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.link.ends import LinkEnds
from handler.tasks.link.engine import LinkEngine
from handler.tasks.node.engine import NodeClassificationEngine
from model.config import Task
from model.export import CONFIG_FILE, WEIGHTS_FILE, load_model
from model.graph_level import GraphModel, as_data
from model.in_closure import in_closure, store_in_edges, typed_closure_forward
from model.link import LinkModel, answer_scores
from model.link_assets import LINK_DIR, LinkAssets, open_link_assets
from model.precompute import Precomputed, open_precomputed, weights_digest
from model.served import answer_rows, edge_kwargs, serving_needs
from model.served.contract import served as contract_of
from model.served.factory import own_model, with_boundary_degrees
from model.served_link import decoded_scores
from model.typed_graph import whole_graph_input
from model.user_model import EdgeInput, Output

# Larger graphs are checked on the nodes' whole in-neighbourhoods (model.in_closure): the whole
# graph's activations would need about E x width x 4 bytes (5 GB at 10M edges and 128 wide).
WHOLE_GRAPH_EDGES = 4_000_000
RANDOM_NODES = 256
RANDOM_PAIRS = 256
HUB_NODES = 16
TOP_K = 10  # top-k answers checked per hub (link archives)
GRAPHS = 64  # dataset graphs checked (graph archives)
IDS_PER_REQUEST = 34
PRECOMPUTED_BUG = "the precomputed rows are not the model's full-graph forward (a bug: report it)"
REQUESTS_PER_BATCH = 8
# Served alone (one ID, one request, one batch each) before any batch of many nodes, and then
# again in batches of this other composition (IDs per request, requests per batch): a model
# whose answer depends on its batch or on an earlier call (a statistic cached on the first
# call, the input's row count) gives a node different answers.
ALONE_NODES = 8
OTHER_COMPOSITION = (7, 3)


@dataclass(frozen=True)
class Comparison:
    """Served answers of some nodes (or pairs) against the full-graph forward."""

    worst: float
    worst_node: Any  # external ID (a pair's: [src, dst])
    classes_agree: int  # node class answers only
    nodes: int  # nodes (pairs) compared
    # Largest difference between one node's answers alone and in differently composed batches
    # (0.0 where only one composition was served): a local model's answer depends on neither.
    between_batches: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Checked:
    """What ``build_info.json`` records of every task's verification."""

    task: str
    passed: bool
    tolerance: float
    worst_abs_diff: float
    seconds: float
    cause: str = ""


@dataclass(frozen=True, kw_only=True)
class Verification(Checked):
    """A node archive's verification."""

    task: str = Task.NODE.value
    nodes: int
    worst_node: Any
    class_agreement: float | None
    sampled_class_agreement: float | None
    boundary_degrees: bool

    def failure(self) -> str:
        return f"node {self.worst_node} differs from the model's full-graph forward"

    def lines(self) -> list[str]:
        lines = [
            f"  verified {self.nodes} nodes ({_which_nodes(self.nodes)}; {ALONE_NODES} also "
            "alone, all in two batch compositions) with full neighbourhoods: worst "
            "|served - full-graph forward| "
            f"{self.worst_abs_diff:.2e} (node {self.worst_node})"
            + (
                f", classes agree {self.class_agreement:.1%}"
                if self.class_agreement is not None
                else ""
            )
            + f"; {self.seconds:.1f} s"
        ]
        if self.sampled_class_agreement is not None:
            lines.append(
                f"  with the archive's sampled fanouts, classes agree with the full-graph answer "
                f"for {self.sampled_class_agreement:.1%} of them (info)"
            )
        return lines


def _which_nodes(checked: int) -> str:
    """How ``checked`` nodes were chosen (``verification_nodes``): every node answered for on
    a graph of fewer than ``RANDOM_NODES``, else the sample and the hubs, counted once."""
    if checked < RANDOM_NODES:
        return "every node answered for"
    both = RANDOM_NODES + HUB_NODES - checked
    shared = f", {both} of them among the random ones" if both else ""
    return f"{RANDOM_NODES} random and the {HUB_NODES} highest in-degree{shared}"


@dataclass(frozen=True, kw_only=True)
class LinkVerification(Checked):
    """A link archive's verification: ``pairs`` scored on ego-graphs, ``top_k_pairs`` from
    the stored embeddings."""

    task: str = Task.LINK.value
    pairs: int
    top_k_pairs: int
    worst_pair: list[Any]  # [src ID, dst ID]
    boundary_degrees: bool
    target_edge_type: str = ""  # a typed graph's relation predicted

    def failure(self) -> str:
        src, dst = self.worst_pair
        return f"pair ({src}, {dst}) scores differently from decode(encode(whole graph))"

    def lines(self) -> list[str]:
        src, dst = self.worst_pair
        relation = f"{self.target_edge_type} " if self.target_edge_type else ""
        return [
            f"  verified {self.pairs} {relation}pairs ({RANDOM_PAIRS} random and "
            f"{2 * HUB_NODES} touching the {HUB_NODES} highest in-degree nodes; {ALONE_NODES} "
            "also alone, all in two batch compositions) with full neighbourhoods and the hubs' "
            f"top-{TOP_K} ({self.top_k_pairs} pairs): worst |served - decode(encode(whole "
            f"graph))| {self.worst_abs_diff:.2e} (pair {src}, {dst}); {self.seconds:.1f} s"
        ]


@dataclass(frozen=True, kw_only=True)
class GraphVerification(Checked):
    """A graph archive's verification: ``graphs`` answered in batches of ``batch_size``."""

    task: str = Task.GRAPH.value
    graphs: int
    batch_size: int
    worst_graph: int  # its position in the dataset

    def failure(self) -> str:
        return (
            f"graph {self.worst_graph} answered in a batch of {self.batch_size} differs from "
            "its answer alone"
        )

    def lines(self) -> list[str]:
        return [
            f"  verified {self.graphs} dataset graphs answered in batches of {self.batch_size}: "
            f"worst |batched - alone| {self.worst_abs_diff:.2e} (graph {self.worst_graph}); "
            f"{self.seconds:.1f} s"
        ]


def hub_nodes(store: GraphStore, start: int = 0, stop: int | None = None) -> np.ndarray:
    """The ``HUB_NODES`` highest in-degree nodes of the global range ``[start, stop)``
    (default: all), highest first."""
    degree = np.asarray(store.in_degree[start : store.num_nodes if stop is None else stop])
    return start + np.argsort(-degree, kind="stable")[: min(HUB_NODES, len(degree))]


def verification_nodes(store: GraphStore, seed: int = 0) -> np.ndarray:
    """``RANDOM_NODES`` random nodes of the type the archive answers for (the target type,
    the first global indices) and its ``HUB_NODES`` highest in-degree ones, sorted."""
    rng = np.random.default_rng(seed)
    n = store.schema.target_type.num_nodes
    chosen = rng.choice(n, size=min(RANDOM_NODES, n), replace=False)
    return np.unique(np.concatenate([chosen, hub_nodes(store, 0, n)]))


def verification_pairs(store: GraphStore, ends: LinkEnds, seed: int = 0) -> np.ndarray:
    """``[P, 2]``: ``RANDOM_PAIRS`` random pairs, then each source-type hub as source and each
    destination-type hub as destination of a pair with a random node (pairs of ``ends``: any
    two nodes of a graph of one type, a source and a destination node of a typed graph's
    relation)."""
    rng = np.random.default_rng(seed)
    (s0, s1), (d0, d1) = ends.sources, ends.candidates
    sources, targets = hub_nodes(store, s0, s1), hub_nodes(store, d0, d1)
    others = [rng.integers(d0, d1, size=len(sources)), rng.integers(s0, s1, size=len(targets))]
    return np.concatenate(
        [
            rng.integers([s0, d0], [s1, d1], size=(RANDOM_PAIRS, 2)),
            np.stack([sources, others[0]], axis=1),
            np.stack([others[1], targets], axis=1),
        ]
    ).astype(np.int64)


def reference_outputs(
    model: torch.nn.Module, store: GraphStore, nodes: np.ndarray, hops: int
) -> tuple[torch.Tensor, np.ndarray]:
    """``(outputs, rows)``: the model's own full-graph forward (the user's module itself, its
    ``encode`` for a link model), one output row per node of ``rows`` (sorted): the whole
    graph, or for a graph over ``WHOLE_GRAPH_EDGES`` every in-edge of every node within
    ``hops`` of the ``nodes`` (``model.in_closure``, the rule precomputed rows use too: a local
    model's answer and its sources' degrees are the whole graph's)."""
    contract = contract_of(model)
    if contract.typed and store.num_edges <= WHOLE_GRAPH_EDGES:
        with torch.inference_mode():  # the target type's rows, the first indices
            out = own_model(model).forward(whole_graph_input(store))
        return out, np.arange(store.schema.target_type.num_nodes)
    if contract.typed:  # every relation's in-edges, per-type features
        seeds = np.unique(nodes)
        closure = in_closure(store_in_edges(store), seeds, hops + 1)
        rows, _ = typed_closure_forward(contract, closure, store.schema, store)
        return torch.from_numpy(rows), seeds
    order = None
    if store.num_edges <= WHOLE_GRAPH_EDGES:
        rows = np.arange(store.num_nodes)
        edge_index, edge_ids = store.edge_index(), np.arange(store.num_edges)
    else:
        closure = in_closure(store_in_edges(store), np.unique(nodes), hops + 1)
        rows, edge_index, edge_ids = closure.nodes, closure.edge_index.numpy(), closure.edge_ids
        order = np.argsort(rows)
    x = torch.from_numpy(np.array(np.take(store.features, rows, axis=0), dtype=np.float32))
    needs = serving_needs(model)
    edge_attr = None
    if needs.edge_input is not EdgeInput.NONE:
        edge_attr = torch.from_numpy(store.edge_feature_rows(edge_ids))
    with torch.inference_mode():
        out = own_model(model).forward(
            x, torch.from_numpy(edge_index), **edge_kwargs(needs.edge_input, edge_attr)
        )
    if order is not None:  # the closure's rows come seeds first: sort them as promised
        return out[torch.from_numpy(order)], rows[order]
    return out, rows


def reference_rows(
    model: torch.nn.Module, store: GraphStore, nodes: np.ndarray, hops: int
) -> torch.Tensor:
    """The model's full-graph answer for ``nodes`` (in that order), as answers carry it."""
    out, rows = reference_outputs(model, store, nodes, hops)
    answer = answer_rows(out, serving_needs(model).output)
    return answer[torch.from_numpy(np.searchsorted(rows, nodes))]


def reference_scores(
    model: torch.nn.Module, store: GraphStore, pairs: np.ndarray, hops: int
) -> torch.Tensor:
    """``decode(encode(whole graph), pairs)`` (the preset's ``score``) of ``pairs`` ``[P, 2]``,
    as answers carry them."""
    if contract_of(model).typed:
        return typed_reference_scores(model, store, pairs)
    z, rows = reference_outputs(model, store, np.unique(pairs), hops)
    index = torch.from_numpy(np.searchsorted(rows, pairs).T.copy())
    own = own_model(model)
    with torch.inference_mode():
        if own.decode is not None:
            scores = own.decode(z, index)
            scores = decoded_scores(type(own.module).__name__, scores, index.size(1))
        else:
            scores = cast(LinkModel, model).score(z[index[0]], z[index[1]])
    return answer_scores(scores, serving_needs(model).output)


def typed_reference_scores(
    model: torch.nn.Module, store: GraphStore, pairs: np.ndarray
) -> torch.Tensor:
    """``decode(encode(whole typed graph), pairs)`` of global ``[P, 2]`` pairs of the
    relation's ends: the user's ``decode`` on the whole ``z_dict``, or the recipe's
    ``score``; as answers carry them."""
    contract = contract_of(model)
    assert contract.edge_type is not None, "a typed graph's link model predicts a relation"
    src, _, dst = contract.edge_type
    schema = store.schema
    index = torch.from_numpy(
        np.stack(
            [pairs[:, 0] - schema.node_type(src).offset, pairs[:, 1] - schema.node_type(dst).offset]
        )
    )
    own = own_model(model)
    with torch.inference_mode():
        inputs = whole_graph_input(store)
        z = {key: contract.rows_of(key)(inputs) for key in dict.fromkeys((src, dst))}
        if own.decode is not None:
            scores = own.decode(z, index)
            scores = decoded_scores(type(own.module).__name__, scores, index.size(1))
        else:
            scores = cast(LinkModel, model).score(z[src][index[0]], z[dst][index[1]])
    return answer_scores(scores, serving_needs(model).output)


def served_rows(
    model: torch.nn.Module,
    store: GraphStore,
    settings: ServingSettings,
    nodes: np.ndarray,
    precomputed: Precomputed | None = None,
    composition: tuple[int, int] = (IDS_PER_REQUEST, REQUESTS_PER_BATCH),
) -> dict[Any, list[float] | None]:
    """Each node's answer row through the archive's node engine, in TorchServe-sized batches
    of ``composition`` (IDs per request, requests per batch; in the order of ``nodes``), from
    its stored rows when ``precomputed`` is given, as a ``--precompute`` archive serves."""
    engine = NodeClassificationEngine.create(
        store, model, settings, torch.device("cpu"), model_version="verify", precomputed=precomputed
    )
    ids = store.external_ids(nodes)
    per_request, per_batch = composition
    requests = [
        {"body": {"node_ids": ids[i : i + per_request]}} for i in range(0, len(ids), per_request)
    ]
    answers: dict[Any, list[float] | None] = {}
    field = "output" if serving_needs(model).output is Output.RAW else "probabilities"
    for start in range(0, len(requests), per_batch):
        batch = requests[start : start + per_batch]
        for request, response in zip(batch, engine.handle(batch), strict=True):
            if _non_finite(response):  # NaN rows, which compare() counts as infinitely off
                answers.update(dict.fromkeys(request["body"]["node_ids"]))
                continue
            if response.status != 200:
                raise ValueError(f"the serving path answered {response.status}: {response.body}")
            for prediction in response.body["predictions"]:
                answers[prediction["node_id"]] = prediction[field]
    return answers


def _non_finite(response: Any) -> bool:
    """The serving path refused its own answer as NaN or infinite (``NonFiniteOutput``): the
    verification counts it as a NaN answer, the cause it then names."""
    return response.status == 500 and response.body.get("type") == "NonFiniteOutput"


def compare(
    expected_rows: torch.Tensor,
    served: dict[Any, list[float] | None],
    store: GraphStore,
    nodes: np.ndarray,
) -> Comparison:
    """``served`` against ``expected_rows`` (one per node of ``nodes``; None: an answer refused
    as NaN); a NaN on either side counts as an infinite difference, so it can never pass."""
    ids = store.external_ids(nodes)
    expected = expected_rows.double()
    nan_row = [math.nan] * expected.shape[1]
    rows = [served[node_id] for node_id in ids]
    got = torch.tensor([nan_row if row is None else row for row in rows], dtype=torch.float64)
    diff = (got - expected).abs().nan_to_num(nan=float("inf")).amax(dim=1)
    worst = int(diff.argmax())
    agree = int((got.argmax(dim=1) == expected.argmax(dim=1)).sum())
    return Comparison(float(diff[worst]), ids[worst], agree, len(ids))


def alone_sample(nodes: np.ndarray, seed: int = 0) -> np.ndarray:
    """``ALONE_NODES`` of the checked ``nodes`` (a seeded random choice, sorted), each to be
    served in a batch of its own."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(nodes, size=min(ALONE_NODES, len(nodes)), replace=False))


def served_compositions(
    model: torch.nn.Module,
    store: GraphStore,
    settings: ServingSettings,
    nodes: np.ndarray,
    full: torch.Tensor,
) -> Comparison:
    """The checked ``nodes`` served three ways, against their full-graph rows ``full``: a
    sample each alone first (so no batch of many nodes primes the model), then all of them in
    the archive's batches, then in the reverse order in smaller, differently composed ones. The
    worst of the three, with the largest difference between one node's answers
    (``between_batches``): a local model's answer depends neither on its batch nor on the calls
    before it."""
    alone = alone_sample(nodes)
    answers = {}
    for node in alone:
        answers.update(served_rows(model, store, settings, np.array([node]), composition=(1, 1)))
    compositions = [
        answers,
        served_rows(model, store, settings, nodes),
        served_rows(model, store, settings, nodes[::-1], composition=OTHER_COMPOSITION),
    ]
    checked = [alone, nodes, nodes]
    results = [
        compare(full[np.searchsorted(nodes, subset)], rows, store, subset)
        for subset, rows in zip(checked, compositions, strict=True)
    ]
    ids = store.external_ids(alone)
    nan_row = [math.nan] * full.shape[1]

    def as_array(rows: dict[Any, list[float] | None]) -> np.ndarray:
        return np.array([nan_row if rows[i] is None else rows[i] for i in ids], dtype=np.float64)

    spread = max(spread_of(as_array(rows), as_array(answers)) for rows in compositions[1:])
    worst = max(results, key=lambda result: result.worst)
    return dataclasses.replace(
        results[1], worst=worst.worst, worst_node=worst.worst_node, between_batches=spread
    )


def spread_of(one: np.ndarray, other: np.ndarray) -> float:
    """The largest difference of two servings of the same rows (NaN: infinite)."""
    return float(np.nan_to_num(np.abs(one - other), nan=np.inf).max(initial=0.0))


def _answered(
    engine: Any, requests: list[dict[str, Any]], per_batch: int = REQUESTS_PER_BATCH
) -> list[dict[str, Any] | None]:
    """The engine's answers to ``requests``, ``per_batch`` to a batch (None: an answer the
    serving path refused as NaN, which the caller counts as NaN); any other refusal stops the
    check."""
    bodies: list[dict[str, Any] | None] = []
    for start in range(0, len(requests), per_batch):
        for response in engine.handle(requests[start : start + per_batch]):
            if _non_finite(response):
                bodies.append(None)
                continue
            if response.status != 200:
                raise ValueError(f"the serving path answered {response.status}: {response.body}")
            bodies.append(response.body)
    return bodies


def served_scores(
    model: torch.nn.Module,
    store: GraphStore,
    assets: LinkAssets,
    settings: ServingSettings,
    pairs: np.ndarray,
    composition: tuple[int, int] = (IDS_PER_REQUEST // 2, REQUESTS_PER_BATCH),
    precomputed: Precomputed | None = None,
) -> np.ndarray:
    """Each pair's score through the archive's link engine, in TorchServe-sized batches of
    ``composition`` (pairs per request, requests per batch); from its stored rows when
    ``precomputed`` is given."""
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"), precomputed=precomputed)
    engine = LinkEngine(ego, assets, "verify")
    ids = store.external_ids(pairs.ravel())
    per_request, per_batch = composition
    requests = [
        {"body": {"pairs": [ids[i : i + 2] for i in range(2 * start, 2 * stop, 2)]}}
        for start, stop in (
            (start, min(start + per_request, len(pairs)))
            for start in range(0, len(pairs), per_request)
        )
    ]
    scores: list[float] = []
    for request, body in zip(requests, _answered(engine, requests, per_batch), strict=True):
        if body is None:
            scores += [math.nan] * len(request["body"]["pairs"])
        else:
            scores += [p["score"] for p in body["predictions"]]
    return np.array(scores, dtype=np.float64)


def served_top_k(
    model: torch.nn.Module,
    store: GraphStore,
    assets: LinkAssets,
    settings: ServingSettings,
    precomputed: Precomputed | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(pairs [H * k, 2], scores)``: each hub's ``TOP_K`` answer over the archive's stored
    embeddings (neighbours included), or its precomputed rows when they are given."""
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"), precomputed=precomputed)
    engine = LinkEngine(ego, assets, "verify")
    hubs = hub_nodes(store, *engine.ends.sources)
    requests = [
        {"body": {"src": node_id, "top_k": TOP_K, "exclude_neighbors": False}}
        for node_id in store.external_ids(hubs)
    ]
    pairs, scores = [], []
    for hub, body in zip(hubs, _answered(engine, requests), strict=True):
        if body is None:  # a NaN score: the pair check refuses the model for it
            continue
        found = store.lookup([r["dst"] for r in body["recommendations"]], engine.ends.dst_type)
        pairs.append(np.stack([np.full(len(found), hub), found], axis=1))
        scores += [r["score"] for r in body["recommendations"]]
    return np.concatenate(pairs).astype(np.int64), np.array(scores, dtype=np.float64)


def exact_settings(settings: ServingSettings, hops: int) -> ServingSettings:
    """The archive's settings with every neighbour kept, no limits in the way, no updates."""
    return dataclasses.replace(
        settings,
        fanouts=(-1,) * hops,
        relation_fanouts={},
        max_ids_per_request=max(settings.max_ids_per_request, IDS_PER_REQUEST),
        max_subgraph_nodes=2**62,
        max_subgraph_edges=2**62,
        updates_enabled=False,
        torch_threads=0,
    )


def verify(
    model_dir: Path,
    store: GraphStore,
    settings: ServingSettings,
    tolerance: float,
    precomputed_dir: Path | None = None,
) -> Verification | LinkVerification:
    """Runs a node or link archive's comparison (and, on a failure, finds the likely cause);
    the ``precomputed_dir`` rows are compared too, as the archive's answers read them."""
    started = time.perf_counter()
    model, config = load_model(model_dir)
    rows = None
    if precomputed_dir is not None:
        rows = open_precomputed(precomputed_dir, store, weights_digest(model_dir / WEIGHTS_FILE))
    if config.task is Task.LINK:
        return verify_link(model_dir, model, store, settings, config.num_layers, tolerance, rows)
    hops = config.num_layers
    nodes = verification_nodes(store)
    # The reference is a fresh copy's, the served answers the loaded model's: a model that
    # keeps something from one call to the next cannot make the two agree by priming both.
    pristine = copy.deepcopy(model)
    full = reference_rows(copy.deepcopy(pristine), store, nodes, hops)

    def served(candidate: torch.nn.Module, hops: int = hops) -> Comparison:
        exact = exact_settings(settings, hops)
        return served_compositions(candidate, store, exact, nodes, full)

    model, result, boundary = served_with_boundary_retry(model_dir, model, served, tolerance)
    cause = ""
    if result.worst > tolerance:
        evidence = Evidence.gathered(
            result,
            f"node {result.worst_node}",
            full,
            pristine,
            model,
            lambda m: reference_rows(m, store, nodes, hops),
        )
        cause = likely_cause(
            evidence, model, store, lambda: served(model, hops + 1), hops, tolerance
        )
    elif rows is not None:
        stored = compare(
            full,
            served_rows(model, store, exact_settings(settings, hops), nodes, precomputed=rows),
            store,
            nodes,
        )
        if stored.worst > result.worst:
            result = stored
        if stored.worst > tolerance:
            cause = PRECOMPUTED_BUG
    sampled = None
    sampling = [settings.fanouts, *settings.relation_fanouts.values()]
    if any(f != -1 for fanouts in sampling for f in fanouts) and result.worst <= tolerance:
        sampled_settings = dataclasses.replace(
            exact_settings(settings, hops),
            fanouts=settings.fanouts,
            relation_fanouts=settings.relation_fanouts,
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


def verify_link(
    model_dir: Path,
    model: torch.nn.Module,
    store: GraphStore,
    settings: ServingSettings,
    hops: int,
    tolerance: float,
    rows: Precomputed | None = None,
) -> LinkVerification:
    """Pair scores on ego-graphs and the hubs' top-k over the stored embeddings, against
    ``decode(encode(whole graph))``; with precomputed ``rows``, pair scores and top-k from
    them too, as the archive answers."""
    started = time.perf_counter()
    pristine = copy.deepcopy(model)  # the reference's fresh copies (see verify)
    assets = open_link_assets(model_dir / LINK_DIR, store)
    exact = exact_settings(settings, hops)
    ends = LinkEnds.of(store, contract_of(model).edge_type)
    pairs = verification_pairs(store, ends)
    alone = alone_sample(np.arange(len(pairs)))
    top_pairs, top_scores = served_top_k(model, store, assets, exact)
    checked = np.concatenate([pairs, top_pairs])
    full = reference_scores(copy.deepcopy(pristine), store, checked, hops).double().numpy()

    def against_full(scores: np.ndarray, at: np.ndarray, spread: float = 0.0) -> Comparison:
        diff = np.nan_to_num(np.abs(scores - full[at]), nan=np.inf)
        worst = int(diff.argmax())
        ids = store.external_ids(checked[at[worst]])
        return Comparison(float(diff[worst]), ids, 0, len(pairs), between_batches=spread)

    def served(candidate: torch.nn.Module, hops: int = hops) -> Comparison:
        """Pairs alone, then all in the archive's batches, then reversed in other ones."""
        exact = exact_settings(settings, hops)
        one = np.array(
            [served_scores(candidate, store, assets, exact, pairs[[p]], (1, 1))[0] for p in alone]
        )
        scores = served_scores(candidate, store, assets, exact, pairs)
        other = served_scores(candidate, store, assets, exact, pairs[::-1], OTHER_COMPOSITION)
        spread = max(spread_of(scores[alone], one), spread_of(scores, other[::-1]))
        everything = np.arange(len(checked))
        results = [
            against_full(one, alone, spread),
            against_full(np.concatenate([scores, top_scores]), everything, spread),
            against_full(np.concatenate([other[::-1], top_scores]), everything, spread),
        ]
        return max(results, key=lambda result: result.worst)

    model, result, boundary = served_with_boundary_retry(model_dir, model, served, tolerance)
    cause = ""
    if result.worst > tolerance:
        src, dst = result.worst_node
        evidence = Evidence.gathered(
            result,
            f"pair ({src}, {dst})",
            torch.from_numpy(full),
            pristine,
            model,
            lambda m: reference_scores(m, store, checked, hops).double(),
        )
        cause = likely_cause(
            evidence, model, store, lambda: served(model, hops + 1), hops, tolerance
        )
        if cause.startswith("the model is not local") and not decodes_per_pair(
            model, store, checked, hops
        ):
            cause = (
                "decode is not per pair: a pair's score depends on the other pairs decoded with "
                "it (e.g. a normalisation over edge_label_index), which no request can serve"
            )
    elif rows is not None:
        stored_pairs, stored_top = served_top_k(model, store, assets, exact, rows)
        if not np.array_equal(stored_pairs, top_pairs):  # a near tie ordered the other way
            full[len(pairs) :] = reference_scores(model, store, stored_pairs, hops).double().numpy()
            checked[len(pairs) :] = stored_pairs
        stored_scores = served_scores(model, store, assets, exact, pairs, precomputed=rows)
        stored = against_full(np.concatenate([stored_scores, stored_top]), np.arange(len(checked)))
        if stored.worst > result.worst:
            result = stored
        if stored.worst > tolerance:
            cause = PRECOMPUTED_BUG
    return LinkVerification(
        passed=result.worst <= tolerance,
        tolerance=tolerance,
        pairs=len(pairs),
        top_k_pairs=len(top_pairs),
        worst_abs_diff=result.worst,
        worst_pair=list(result.worst_node),
        boundary_degrees=boundary,
        target_edge_type=ends.relation if ends.typed else "",
        seconds=round(time.perf_counter() - started, 2),
        cause=cause,
    )


def decodes_per_pair(
    model: torch.nn.Module, store: GraphStore, pairs: np.ndarray, hops: int
) -> bool:
    """Scores of ``pairs`` decoded all at once equal those decoded in two halves."""
    half = len(pairs) // 2
    whole = reference_scores(model, store, pairs, hops)
    parts = torch.cat(
        [
            reference_scores(model, store, pairs[:half], hops),
            reference_scores(model, store, pairs[half:], hops),
        ]
    )
    return bool(torch.allclose(whole, parts, atol=1e-6))


def served_with_boundary_retry(
    model_dir: Path, model: torch.nn.Module, served: Any, tolerance: float
) -> tuple[torch.nn.Module, Comparison, bool]:
    """``served(model)``; a user's model that fails it without boundary degrees is tried with
    them (a layer that normalises by its sources' degrees which the build did not recognise)
    and, if that passes, ``model_config.json`` records them. Returns ``(model, result,
    boundary_degrees)``."""
    result = served(model)
    if result.worst <= tolerance:
        return model, result, serving_needs(model).boundary_degrees
    with_boundary = with_boundary_degrees(model)
    if with_boundary is None:
        return model, result, serving_needs(model).boundary_degrees
    retried = served(with_boundary)
    if retried.worst > tolerance:
        return model, result, False
    config_path = model_dir / CONFIG_FILE
    data = json.loads(config_path.read_text())
    data["boundary_degrees"] = True
    config_path.write_text(json.dumps(data, indent=2) + "\n")
    return with_boundary, retried, True


@dataclass(frozen=True)
class Evidence:
    """What a failed comparison leaves to tell its cause: the full-graph answers of a fresh
    copy (``full``), of another fresh copy (``again``) and of the copy that served
    (``after_serving``); the largest difference between one answer's servings alone and in
    batches; the worst node or pair, as a message names it, and its difference."""

    full: torch.Tensor
    again: torch.Tensor
    after_serving: torch.Tensor
    between_batches: float
    worst: str
    worst_diff: float

    @classmethod
    def gathered(
        cls,
        result: Comparison,
        worst: str,
        full: torch.Tensor,
        pristine: torch.nn.Module,
        served: torch.nn.Module,
        reference: Callable[[torch.nn.Module], torch.Tensor],
    ) -> Evidence:
        """The evidence of a failed ``result``: ``reference`` answers the full graph with a
        fresh copy of ``pristine`` and with the model that ``served``."""
        return cls(
            full=full,
            again=reference(copy.deepcopy(pristine)),
            after_serving=reference(served),
            between_batches=result.between_batches,
            worst=worst,
            worst_diff=result.worst,
        )


def likely_cause(
    evidence: Evidence,
    model: torch.nn.Module,
    store: GraphStore,
    deeper: Callable[[], Comparison],
    hops: int,
    tolerance: float,
) -> str:
    """Why the served answer is not the full-graph one, the most specific cause first: NaN,
    randomness (two fresh copies differ), state kept between calls (the copy that served
    answers differently afterwards), a module known not to be local (named with its path), a
    layer that reads out-neighbours, a deeper receptive field than the archive samples (one
    more hop, ``deeper``, passes), an answer that depends on its batch, or a model that is not
    local."""
    full = evidence.full
    if not bool(torch.isfinite(full).all()):
        return (
            f"the model gives NaN or inf in its full-graph forward ({nonfinite(full)} of the "
            "checked answers): check the weights and the forward for a division by zero or "
            "the log of a non-positive value"
        )
    if math.isinf(evidence.worst_diff):
        return (
            f"the served answer for {evidence.worst} is NaN or inf while the full-graph "
            "forward's is finite: a layer divides by a count or a norm that can be zero on an "
            "ego-graph"
        )
    if not torch.equal(evidence.again, full):
        return (
            "the model is not deterministic in eval mode (randomness in forward, e.g. dropout "
            "with training=True)"
        )
    if not torch.equal(evidence.after_serving, full):
        return (
            "the model keeps state between calls: after serving, its full-graph forward "
            "differs from a fresh copy's (e.g. a statistic cached on the first call), so an "
            "answer depends on the requests before it"
        )
    named = non_local_module(own_model(model).module) or out_neighbour_reader(model, store)
    if named:
        return f"the model is not local: {named}, which no ego-graph of in-edges can serve"
    if deeper().worst <= tolerance:
        return f"the model reads more than {hops} hops: build with --num-hops {hops + 1} or more"
    if evidence.between_batches > tolerance:
        return (
            "the model is not local: an answer depends on the other nodes served with it (the "
            f"same answer alone and in batches differs by {evidence.between_batches:.3g}), "
            "e.g. through the input's row count or a statistic over all its rows"
        )
    return (
        "the model is not local: an answer depends on more than the node's k-hop neighbourhood "
        "(whole-graph pooling or normalisation, batch statistics such as BatchNorm in training "
        "mode or GraphNorm), which no ego-graph can serve"
    )


def nonfinite(rows: torch.Tensor) -> int:
    """How many answer rows hold a NaN or an infinity."""
    bad = ~torch.isfinite(rows)
    return int(bad.reshape(len(rows), -1).any(dim=1).sum())


@dataclass(frozen=True)
class NonLocal:
    """A module kind whose output for a node reads more than the node's in-neighbourhood."""

    kind: str  # the class name
    shown: str  # how a message names it
    why: str  # what it reads
    applies: Callable[[torch.nn.Module], bool] = lambda _module: True


# The module kinds known not to be local (in eval mode), looked up by class name so that a
# layer PyG moves between modules is still found. Norms with running statistics (BatchNorm,
# DiffGroupNorm, InstanceNorm with track_running_stats=True) use them in eval mode: local.
NON_LOCAL = (
    NonLocal(
        "LayerNorm",
        "LayerNorm(mode='graph')",
        "normalises over the whole graph",
        lambda module: getattr(module, "mode", "node") == "graph",
    ),
    NonLocal("GraphNorm", "GraphNorm", "normalises over the whole graph"),
    NonLocal(
        "InstanceNorm",
        "InstanceNorm(track_running_stats=False)",
        "normalises over the whole graph",
        lambda module: not getattr(module, "track_running_stats", False),
    ),
    NonLocal("PairNorm", "PairNorm", "centres and scales over the whole graph"),
    NonLocal("MeanSubtractionNorm", "MeanSubtractionNorm", "subtracts the whole graph's mean"),
    NonLocal("GraphSizeNorm", "GraphSizeNorm", "divides by the whole graph's node count"),
    NonLocal(
        "BatchNorm1d",
        "BatchNorm1d(track_running_stats=False)",
        "normalises over every row of its input in eval mode too",
        lambda module: not getattr(module, "track_running_stats", True),
    ),
    NonLocal("GPSConv", "GPSConv", "attends over every node of the graph (global attention)"),
    NonLocal(
        "HANConv",
        "HANConv",
        "weighs its metapaths by a semantic attention averaged over all nodes",
    ),
    NonLocal("LINKX", "LINKX", "indexes its weights by node ID (a column per node)"),
    NonLocal("TopKPooling", "TopKPooling", "keeps the top-scoring nodes of the whole graph"),
    NonLocal("SAGPooling", "SAGPooling", "keeps the top-scoring nodes of the whole graph"),
    NonLocal(
        "DirGNNConv",
        "DirGNNConv",
        "reads out-neighbours too (its conv_out runs on the reversed edges)",
    ),
)


def non_local_module(top: torch.nn.Module) -> str:
    """``LayerNorm(mode='graph') at norms.0 normalises over the whole graph``: the first
    module of ``top`` (in ``named_modules`` order) of a kind in ``NON_LOCAL``, or ``""``."""
    for path, module in top.named_modules():
        for known in NON_LOCAL:
            if type(module).__name__ == known.kind and known.applies(module):
                return f"{known.shown} at {path or 'the top'} {known.why}"
    return ""


def out_neighbour_reader(model: torch.nn.Module, store: GraphStore) -> str:
    """``SAGEConv at conv2 reads out-neighbours (...)``: the first message-passing layer that
    gets a reversed edge in one forward on a small directed ring (``forward``, a link model's
    ``encode``), or ``""`` (also for a model that cannot be probed so: a typed one, a
    preset)."""
    own = own_model(model)
    if not own.ring_probe:
        return ""
    module = own.module
    nodes = 8
    ring = torch.tensor([list(range(nodes)), [(i + 1) % nodes for i in range(nodes)]])
    forward_edges = set(map(tuple, ring.t().tolist()))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, store.feature_dim, generator=generator)
    edge_attr = torch.rand(nodes, max(store.edge_feature_dim, 1), generator=generator)
    needs = serving_needs(model)
    kwargs = edge_kwargs(needs.edge_input, edge_attr[:, : store.edge_feature_dim])
    found: list[str] = []

    def check(path: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
            edge_index = kw.get("edge_index", args[1] if len(args) > 1 else None)
            if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2:
                return  # a SparseTensor or an adjacency of another shape: nothing to read
            edges = set(map(tuple, edge_index.t().tolist()))
            if any(
                (dst, src) in edges and (dst, src) not in forward_edges
                for src, dst in forward_edges
            ):
                found.append(path)

        return hook

    handles = [
        sub.register_forward_pre_hook(check(path), with_kwargs=True)
        for path, sub in module.named_modules()
        if isinstance(sub, MessagePassing)
    ]
    try:
        with torch.inference_mode():
            own.forward(x, ring, **kwargs)
    except Exception:  # a probe of the cause only: the comparison has already failed
        return ""
    finally:
        for handle in handles:
            handle.remove()
    if not found:
        return ""
    kind = type(module.get_submodule(found[0])).__name__
    return (
        f"{kind} at {found[0]} reads out-neighbours (its edge_index holds the graph's edges "
        "reversed)"
    )


def verification_graphs(dataset: GraphDataset, seed: int = 0) -> np.ndarray:
    """``GRAPHS`` random dataset graphs (all of a smaller dataset), sorted."""
    rng = np.random.default_rng(seed)
    count = dataset.num_graphs
    return np.sort(rng.choice(count, size=min(GRAPHS, count), replace=False))


def verify_graphs(
    model_dir: Path, dataset: GraphDataset, settings: ServingSettings, tolerance: float
) -> GraphVerification:
    """Dataset graphs answered by the graph engine in batches of ``REQUESTS_PER_BATCH``,
    against each graph's own forward alone (and its embedding alone, where the model has
    one)."""
    started = time.perf_counter()
    model, _ = load_model(model_dir)
    graph_model = cast(GraphModel, model)  # a graph archive's
    chosen = verification_graphs(dataset)
    graphs = [
        (*dataset.graph(int(g)), dataset.graph_edge_attr(int(g)) if graph_model.edge_dim else None)
        for g in chosen
    ]
    requests = [
        {
            "body": {
                "graph": {
                    "x": x.tolist(),
                    "edge_index": edge_index.tolist(),
                    **({} if edge_attr is None else {"edge_attr": edge_attr.tolist()}),
                },
                "return_embedding": graph_model.has_embedding,
            }
        }
        for x, edge_index, edge_attr in graphs
    ]
    engine = GraphEngine(model, None, settings, torch.device("cpu"), "verify")
    field = "output" if serving_needs(model).output is Output.RAW else "probabilities"
    alone = [graph_alone(model, *graph) for graph in graphs]
    batched: list[tuple[np.ndarray, np.ndarray]] = [
        (np.full(np.shape(expected[0]), np.nan), np.full(np.shape(expected[1]), np.nan))
        if body is None
        else (np.array(body[field]), np.array(body.get("embedding", [])))
        for body, expected in zip(_answered(engine, requests), alone, strict=True)
    ]
    diff = [graph_difference(got, expected) for got, expected in zip(batched, alone, strict=True)]
    worst = int(np.argmax(diff))
    cause = ""
    if not all(np.isfinite(part).all() for part in alone[worst]):
        cause = (
            f"the model gives NaN or inf for graph {int(chosen[worst])} alone: check the "
            "weights and the forward for a division by zero or the log of a non-positive value"
        )
    elif diff[worst] > tolerance:
        again = graph_alone(model, *graphs[worst])
        cause = (
            "the model is not deterministic in eval mode (randomness in forward, e.g. dropout "
            "with training=True)"
            if graph_difference(again, alone[worst]) > 0
            else "a graph's answer depends on the other graphs of its batch (batch statistics "
            "such as BatchNorm in training mode or with track_running_stats=False, or "
            "normalisation over the whole batch), which inline graphs batched together cannot "
            "serve"
        )
    return GraphVerification(
        passed=diff[worst] <= tolerance,
        tolerance=tolerance,
        graphs=len(graphs),
        batch_size=REQUESTS_PER_BATCH,
        worst_abs_diff=diff[worst],
        worst_graph=int(chosen[worst]),
        seconds=round(time.perf_counter() - started, 2),
        cause=cause,
    )


Answer = tuple[np.ndarray, np.ndarray]  # a graph's answer row and its embedding (or empty)


def graph_alone(
    model: torch.nn.Module,
    x: np.ndarray,
    edge_index: np.ndarray,
    edge_attr: np.ndarray | None = None,
) -> Answer:
    """One graph's answer row alone, as served, and its embedding (empty when the model has
    none): the model's own forward (the user's module itself, with ``edge_attr`` as its
    forward takes it) on the graph as a request gives it."""
    graph = as_data(x, np.asarray(edge_index, dtype=np.int64), edge_attr=edge_attr)
    batch = torch.zeros(graph.num_nodes, dtype=torch.long)
    edge_attr_t = graph.edge_attr if edge_attr is not None else None
    kwargs = edge_kwargs(serving_needs(model).edge_input, edge_attr_t)
    with torch.inference_mode():
        rows = own_model(model).forward(graph.x, graph.edge_index, batch, **kwargs)
        answer = answer_rows(rows, serving_needs(model).output)[0].double().numpy()
        _, embedding = contract_of(model).forward_with_embedding(
            graph.x, graph.edge_index, batch, edge_attr_t
        )
    return answer, np.zeros(0) if embedding is None else embedding[0].double().numpy()


def graph_difference(got: Answer, expected: Answer) -> float:
    """The largest difference of the answer rows, and of the embeddings relative to their
    size where it exceeds 1 (an unnormalised sum pooling's rounding grows with it); a NaN
    counts as an infinite difference."""
    rows = spread_of(got[0], expected[0])
    if not expected[1].size:
        return rows
    scale = np.maximum(1.0, np.abs(expected[1]))
    return max(rows, spread_of(got[1] / scale, expected[1] / scale))


def summary(result: Checked) -> list[str]:
    """The lines the build prints."""
    assert isinstance(result, Verification | LinkVerification | GraphVerification)
    return result.lines()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m archive_build.verify", description=__doc__)
    parser.add_argument("--store", help="the graph store the archive serves (node and link)")
    parser.add_argument("--dataset", help="graph archives: the dataset store of small graphs")
    parser.add_argument("--model-dir", required=True, help="model.pt and model_config.json")
    parser.add_argument("--model-config-yaml", required=True, help="the archive's YAML")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest difference")
    parser.add_argument("--precomputed", help="a --precompute archive's precomputed/ rows")
    parser.add_argument("--out", required=True, help="verification JSON to write")
    args = parser.parse_args(argv)
    if bool(args.store) == bool(args.dataset):
        parser.error("give --store (node and link archives) or --dataset (graph archives)")
    result: Verification | LinkVerification | GraphVerification
    try:
        section = yaml.safe_load(Path(args.model_config_yaml).read_text())["gnn"]
        settings = ServingSettings.from_yaml_section(section)
        if args.dataset:
            result = verify_graphs(
                Path(args.model_dir),
                open_graph_dataset(Path(args.dataset)),
                settings,
                args.tolerance,
            )
        else:
            result = verify(
                Path(args.model_dir),
                open_store(Path(args.store)),
                settings,
                args.tolerance,
                Path(args.precomputed) if args.precomputed else None,
            )
    except (ValueError, StoreError) as error:
        print(f"error: verification could not run: {error}", file=sys.stderr)
        return 1
    Path(args.out).write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
    if not result.passed:
        print(
            f"error: verification failed: {result.failure()} by {result.worst_abs_diff:.3g} "
            f"(> --verify-tolerance {result.tolerance:g}); likely cause: {result.cause}",
            file=sys.stderr,
        )
        return 1
    print("\n".join(summary(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
