"""``python -m bench.experiments.typed_graph``'s pure parts on a tiny graph: both forms of the
fraud graph hold the same nodes and edges, the request mix, and the report's ratios (the
TorchServe pairs are made up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graph_assets.input.synthetic_typed import write_fraud_graph_csv
from graph_assets.input.typed_input import read_graph

pytest.importorskip("aiohttp", reason="the bench extra is not installed")

from bench.experiments import typed_graph


def _edge_pairs(graph: Any) -> list[tuple[str, str]]:
    """Every edge as (source ID, destination ID), sorted: a multiset comparable across forms."""
    ids = {nodes.name: typed_graph._id_text(nodes.ids) for nodes in graph.node_types}
    pairs: list[tuple[str, str]] = []
    for relation in graph.relations:
        kind = relation.edge_type
        pairs += zip(ids[kind.src][relation.src], ids[kind.dst][relation.dst], strict=True)
    return sorted(pairs)


def test_the_size_holds_the_edges_asked_for_with_the_reverses() -> None:
    size = typed_graph.fraud_size(1_000_000)
    assert (size.users, size.merchants, size.devices, size.payments) == (
        100_000,
        10_000,
        50_000,
        370_000,
    )
    with pytest.raises(ValueError, match="at least 1000"):
        typed_graph.fraud_size(999)


def test_both_forms_read_back_with_the_same_nodes_and_edges(tmp_path: Path) -> None:
    graph = typed_graph.typed_graph(typed_graph.fraud_size(4000))
    flat = typed_graph.homogeneous(graph)
    typed_dir = tmp_path / "typed"
    write_fraud_graph_csv(graph, typed_dir)
    typed_graph.write_homogeneous_csv(flat, tmp_path / "homogeneous")
    typed = read_graph(typed_dir, undirected=True)
    homog = read_graph(tmp_path / "homogeneous")
    (one,) = homog.node_types

    assert len(typed.node_types) == 3 and len(typed.relations) == 4
    assert len(one.ids) == sum(len(nodes.ids) for nodes in typed.node_types) == 400 + 40 + 200
    assert len(homog.relations[0].src) == sum(len(r.src) for r in typed.relations)
    assert 3900 <= len(homog.relations[0].src) <= 4100
    assert _edge_pairs(homog) == _edge_pairs(typed)

    # Widest type's width: users as they are, merchants padded, devices all zeros.
    users = {nodes.name: nodes for nodes in typed.node_types}["user"]
    assert one.features.shape == (640, 8)
    np.testing.assert_array_equal(one.features[:400], users.features)
    assert np.all(one.features[400:440, 4:] == 0) and np.all(one.features[440:] == 0)
    np.testing.assert_array_equal(homog.labels[:400], typed.labels)
    assert np.all(homog.labels[400:] == -1) and homog.class_names == typed.class_names
    assert homog.relations[0].edge_feature_names == ["amount", "hour"]


def test_shared_ids_across_types_are_refused() -> None:
    graph = typed_graph.typed_graph(typed_graph.fraud_size(2000))
    user, merchant, device = graph.node_types
    clash = type(graph)(
        (user, merchant, type(device)("device", merchant.ids[:1], device.features[:1], [])),
        (),
        graph.target,
        graph.labels,
        graph.class_names,
    )
    with pytest.raises(ValueError, match="repeat across types"):
        typed_graph.homogeneous(clash)


def test_the_request_mix_is_the_same_list_of_users() -> None:
    bodies = typed_graph.user_bodies(50, 200, (8, 16))
    assert bodies == typed_graph.user_bodies(50, 200, (8, 16))
    ids = [json.loads(body)["node_ids"] for body in bodies]
    assert {len(request) for request in ids} == set(range(8, 17))
    assert all(0 <= int(node[1:]) < 50 for request in ids for node in request)


def _level(throughput: float, p50: float, p99: float) -> dict[str, Any]:
    return {
        "throughput": throughput,
        "p50_ms": p50,
        "p99_ms": p99,
        "worker_cpu_ms_per_request": 1.0,
    }


def test_the_report_takes_the_medians_of_the_pairs_ratios() -> None:
    levels = [
        {
            "concurrency": 32,
            "pair": 0,
            "typed": _level(70, 40, 60),
            "homogeneous": _level(100, 30, 50),
        },
        {
            "concurrency": 32,
            "pair": 1,
            "typed": _level(90, 40, 60),
            "homogeneous": _level(100, 30, 50),
        },
        {
            "concurrency": 32,
            "pair": 2,
            "typed": _level(50, 40, 60),
            "homogeneous": _level(100, 30, 50),
        },
        {
            "concurrency": 1,
            "pair": 0,
            "typed": _level(9, 14, 30),
            "homogeneous": _level(10, 10, 20),
        },
        {
            "concurrency": 1,
            "pair": 1,
            "typed": _level(9, 12, 24),
            "homogeneous": _level(10, 10, 20),
        },
        {
            "concurrency": 1,
            "pair": 2,
            "typed": _level(9, 15, 40),
            "homogeneous": _level(10, 10, 20),
        },
    ]
    build = {
        "build_s": 40.0,
        "train_s": 30.0,
        "epochs_run": 30,
        "test_accuracy": 0.95,
        "store_bytes": 3 * 2**20,
        "archive_bytes": 20 * 2**20,
    }
    stages = dict.fromkeys((*typed_graph.STAGES, "total", "sampled_nodes"), 2.0)
    results = {
        "config": {"mean_ids_per_request": 12.0},
        "served": {"levels": levels},
        "build": {"typed": build, "homogeneous": build | {"build_s": 20.0, "store_bytes": 2**21}},
        "in_process": {"typed": stages, "homogeneous": stages},
    }
    lines = typed_graph.report_rows(results)
    assert len(lines) == 6 and all(line.startswith("| ") and line.endswith(" |") for line in lines)
    assert (
        "| >= 0.7 | 0.70 | met: 70.00 vs 100.00 req/s (medians); pairs 0.70, 0.90, 0.50;"
        in (lines[0])
    )
    assert "~840 vs 1,200 node predictions/s" in lines[0]
    assert (
        "| <= 1.3 | 1.40 | missed: 14.00 vs 10.00 ms (medians); pairs 1.40, 1.20, 1.50"
        in (lines[1])
    )
    assert "| info | 1.50 | 30.00 vs 20.00 ms" in lines[2]
    assert "| info | 2.00 | 40.0 s vs 20.0 s" in lines[3]
    assert "| info | 1.50 | 3.0 vs 2.0 MiB" in lines[4]


class _Times:
    def __init__(self, batch: int) -> None:
        self.parse, self.sample, self.gather, self.forward, self.format = 0.001, 0.002, 0, 0, 0
        self.sampled_nodes = batch


class _Engine:
    """Records the batches it is given; each batch's times are fixed, its count its size."""

    def __init__(self, ran: list[tuple[str, int]], name: str) -> None:
        self.ran, self.name = ran, name

    def prepare(self, items: list[dict[str, Any]]) -> Any:
        self.ran.append((self.name, len(items)))
        return type("Prepared", (), {"times": _Times(len(items))})()

    def run(self, prepared: Any) -> Any:
        return prepared

    def respond(self, ran: Any) -> None:
        return None


def test_stage_medians_alternate_the_systems_skip_the_warm_up_and_record_the_counts() -> None:
    ran: list[tuple[str, int]] = []
    engines: Any = {name: _Engine(ran, name) for name in ("a", "b")}
    payload = [json.dumps({"node_ids": [i]}).encode() for i in range(typed_graph.BATCH * 3)]
    medians = typed_graph.stage_medians(("a", "b"), engines, payload, 2, 2, ("sampled_nodes",))
    batch = typed_graph.BATCH
    # Round 0 warms up (a then b), round 1 runs b first, round 2 a first; two batches each.
    assert [name for name, _ in ran[::2]] == ["a", "b", "b", "a", "a", "b"]
    assert {size for _, size in ran} == {batch}
    assert medians["rounds"] == 2 and medians["batches_per_round"] == 2
    assert medians["a"]["parse"] == 1.0 and medians["a"]["sample"] == 2.0
    assert medians["a"]["sampled_nodes"] == batch and medians["b"]["sampled_nodes"] == batch
    assert set(medians["a"]) == {*typed_graph.STAGES, "total", "sampled_nodes"}
    assert "sampled_nodes" not in typed_graph.stage_medians(("a", "b"), engines, payload, 1, 1)["a"]


def test_stage_row_gives_the_ratio_of_totals_and_each_stage_side_by_side() -> None:
    first = dict.fromkeys(typed_graph.STAGES, 1.0) | {"total": 3.0}
    second = dict.fromkeys(typed_graph.STAGES, 0.5) | {"total": 2.0}
    stages = "; ".join(f"{stage} 1.00 vs 0.50" for stage in typed_graph.STAGES)
    assert typed_graph.stage_row("a / b", first, second, "; more") == (
        f"| in process, batch of {typed_graph.BATCH} requests, a / b | info | 1.50 "
        f"| 3.00 vs 2.00 ms; {stages} ms; more |"
    )
