"""Serving from a graph in Redis (a real 3+3 Redis Cluster and a real single Redis) samples
the very ego-graphs the memory-mapped store gives (same rows, edges, edge IDs and order) for a
one-type graph with edge features and the typed fraud graph, at every fanout (``-1``,
per-relation fanouts, the boundary hop); the node engine's answers and embeddings are the
local ones; a batch costs at most hops + 2 round trips cold and only its ID lookup warm."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.nn import ChebConv
from torch_geometric.nn.models import GAT

from archive_build import own_model
from graph_assets import GraphStore, StoreError
from graph_assets.remote import RemoteStore, RemoteUnavailable, load_store, open_remote_store
from graph_assets.remote.connect import connect
from handler.graph.ego import EgoGraphs
from handler.graph.graph_source import open_graph
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.pipeline.batch import StageTimes
from handler.sampling.sampler import SampledSubgraph, sampler_for
from handler.settings import ServingSettings
from handler.tasks.link.engine import LinkEngine
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.task import node_router
from model import ModelConfig, build_model
from model.export import load_model
from model.link_assets import open_link_assets, write_link_assets
from model.typed_graph import hetero_section
from tests.edge_graph import EDGE_DIM, FEATURES, edge_feature_store
from tests.live_reference import live_ids, random_update
from tests.servers.ports import free_ports
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import RedisServer
from tests.typed_graphs import fraud_store, node_recipe

from .conftest import random_model

BLOCK = 8  # small blocks: the graphs span many of them, on every shard
GAT_ARGS = {
    "in_channels": FEATURES, "hidden_channels": 8, "num_layers": 2, "out_channels": 3,
    "edge_dim": EDGE_DIM, "heads": 2,
}  # fmt: skip

Remote = Callable[[str, str], RemoteStore]


@pytest.fixture(scope="module")
def servers(redis_cluster: LocalCluster, single_redis: RedisServer) -> dict[str, str]:
    """The session's cluster and redis-server (tests/conftest.py), empty for this module."""
    return {"cluster": redis_cluster.url, "single": single_redis.url.rsplit("/", 1)[0]}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GraphStore]:
    return {
        "one_type": edge_feature_store(tmp_path_factory.mktemp("edges")),
        "typed": fraud_store(tmp_path_factory.mktemp("fraud"), 200, 30, 40, 900, seed=2),
    }


@pytest.fixture(scope="module")
def remote(servers: dict[str, str], stores: dict[str, GraphStore]) -> Remote:
    """``(target, graph) -> RemoteStore`` (a fresh one, cold cache), each graph loaded once."""
    loaded: set[tuple[str, str]] = set()

    def open_one(target: str, graph: str) -> RemoteStore:
        url, store = servers[target], stores[graph]
        if (target, graph) not in loaded:
            client = connect(url, 5000)
            try:
                assert load_store(store, client, graph, shown_url=url, block_size=BLOCK).complete
            finally:
                client.close()
            loaded.add((target, graph))
        return open_remote_store(url, graph, store.checksum, cache_mb=64, timeout_ms=5000)

    return open_one


def same(local: SampledSubgraph, far: SampledSubgraph) -> None:
    assert far.level_sizes == local.level_sizes
    assert torch.equal(far.node, local.node)
    assert torch.equal(far.edge_index, local.edge_index)
    assert torch.equal(far.edge, local.edge)


@pytest.mark.parametrize("target", ["cluster", "single"])
@pytest.mark.parametrize("graph", ["one_type", "typed"])
def test_in_lists_equal_the_stores(remote: Remote, stores, target: str, graph: str) -> None:
    store, far = stores[graph], remote(target, graph)
    nodes = np.random.default_rng(0).integers(0, store.num_nodes, 60)
    local, read = store.in_lists(nodes), far.in_lists(nodes)
    for name in ("indptr", "indices", "edge_ids", "relations"):
        assert np.array_equal(getattr(read, name), getattr(local, name)), name


@pytest.mark.parametrize("target", ["cluster", "single"])
@pytest.mark.parametrize(
    ("graph", "gnn"),
    [
        ("one_type", {"fanouts": [2, 3]}),
        ("one_type", {"fanouts": [-1, -1]}),
        ("one_type", {"fanouts": [1, -1, 2]}),
        ("typed", {"fanouts": [2, 2]}),
        ("typed", {"fanouts": [-1, -1]}),
        (
            "typed",
            {
                "fanouts": [3, 1],
                "relation_fanouts": {
                    "user__pays__merchant": [-1, 2],
                    "device__rev_uses__user": [1, 1],
                },
            },
        ),
    ],
)
@pytest.mark.parametrize("boundary", [False, True])
def test_sampled_ego_graphs_are_the_stores(
    remote: Remote, stores, target: str, graph: str, gnn: dict, boundary: bool
) -> None:
    store, far = stores[graph], remote(target, graph)
    settings = ServingSettings.from_yaml_section(gnn)
    cpu = torch.device("cpu")
    local = sampler_for(store, settings, cpu, boundary=boundary)
    read = sampler_for(far, settings, cpu, boundary=boundary)
    rng = np.random.default_rng(1)
    targets = store.schema.target_type.num_nodes
    for size in (1, 5, 40):
        seeds = torch.from_numpy(np.unique(rng.integers(0, targets, size)))
        same(local.sample(seeds), read.sample(seeds))


@pytest.fixture(scope="module")
def gat(tmp_path_factory: pytest.TempPathFactory, stores) -> torch.nn.Module:
    """A GAT reading edge features, packaged for the one-type graph as a build does."""
    root = tmp_path_factory.mktemp("gat")
    torch.manual_seed(0)
    torch.save(GAT(**GAT_ARGS).state_dict(), root / "weights.pt")
    argv = [
        "--store", str(stores["one_type"].path), "--model-class", "torch_geometric.nn.models.GAT",
        "--model-args", json.dumps(GAT_ARGS), "--weights", str(root / "weights.pt"),
        "--out", str(root / "model"),
    ]  # fmt: skip
    assert own_model.main(argv) == 0
    return load_model(root / "model")[0]


def engines(
    store: GraphStore, far: RemoteStore, model: torch.nn.Module, fanouts: list[int]
) -> tuple[NodeClassificationEngine, NodeClassificationEngine]:
    settings = ServingSettings.from_yaml_section({"fanouts": fanouts})
    return tuple(  # type: ignore[return-value]
        NodeClassificationEngine.create(graph, model, settings, torch.device("cpu"), "1.0")
        for graph in (store, far)
    )


def answers(engine: NodeClassificationEngine, bodies: list[dict]) -> list[tuple[int, dict]]:
    router = node_router(engine, "1.0")
    return [(r.status, r.body) for r in router.handle([{"body": b} for b in bodies])]


def check_same_answers(local: list[tuple[int, dict]], far: list[tuple[int, dict]]) -> None:
    assert len(local) == len(far)
    for (status, body), (far_status, far_body) in zip(local, far, strict=True):
        assert status == far_status == 200, (body, far_body)
        rows = body.get("predictions", [body])
        far_rows = far_body.get("predictions", [far_body])
        for row, far_row in zip(rows, far_rows, strict=True):
            assert far_row["predicted_class"] == row["predicted_class"]
            for key in ("probabilities", "embedding"):
                if key in row:
                    gap = np.abs(np.array(far_row[key]) - np.array(row[key])).max()
                    assert gap <= 1e-6, key


def one_type_bodies(store: GraphStore) -> list[dict]:
    ids = store.external_ids(np.arange(store.num_nodes))
    new_node = {"x": [0.5] * FEATURES, "neighbors": ids[:3], "direction": "both"}
    new_node["edge_attr"] = [[0.1 * k] * EDGE_DIM for k in range(3)]
    return [
        {"node_ids": ids[:7]},
        {"node_id": ids[-1]},
        {"node_ids": ids[3:9], "return_embedding": True},
        {"new_node": new_node, "return_embedding": True},
    ]


@pytest.mark.parametrize("fanouts", [[2, 2], [-1, -1]])
def test_one_type_answers_are_the_stores(remote: Remote, stores, gat, fanouts) -> None:
    store = stores["one_type"]
    local, far = engines(store, remote("cluster", "one_type"), gat, fanouts)
    bodies = one_type_bodies(store)
    check_same_answers(answers(local, bodies), answers(far, bodies))


@pytest.mark.parametrize("arch", ["sage", "gcn"])
def test_typed_answers_are_the_stores(remote: Remote, stores, arch: str) -> None:
    store = stores["typed"]
    model = node_recipe(store, arch)
    local, far = engines(store, remote("cluster", "typed"), model, [3, 2])
    ids = store.external_ids(np.arange(store.schema.target_type.num_nodes))
    bodies = [{"node_ids": ids[:9]}, {"node_id": ids[20], "return_embedding": True}]
    check_same_answers(answers(local, bodies), answers(far, bodies))


def batch_reads(engine: NodeClassificationEngine, bodies: list[dict]) -> StageTimes:
    batch = engine.run(engine.prepare([{"body": body} for body in bodies]))
    assert all(r.status == 200 for r in engine.respond(batch))
    return batch.times


@pytest.mark.parametrize(
    ("graph", "fanouts"), [("one_type", [3, 3]), ("one_type", [-1, -1, -1]), ("typed", [4, 2])]
)
def test_a_batch_costs_at_most_hops_plus_two_round_trips(
    remote: Remote, stores, gat, graph: str, fanouts: list[int]
) -> None:
    """Cold: the ID lookup, one round per hop, one for every feature, degree and edge feature
    row; warm (the same batch again): none, the IDs' indices and every block being cached."""
    store = stores[graph]
    model = node_recipe(store, "sage") if graph == "typed" else gat
    if len(fanouts) == 3:
        model = random_model(store, "sage", num_layers=3)
    _, far = engines(store, remote("single", graph), model, fanouts)
    ids = store.external_ids(np.arange(0, store.schema.target_type.num_nodes, 3))
    bodies = [{"node_ids": ids[:12]}, {"node_id": ids[-1]}]
    cold = batch_reads(far, bodies)
    assert 1 + len(fanouts) <= cold.remote_round_trips <= len(fanouts) + 2
    assert cold.remote_bytes > 0 and cold.remote_cache_misses > 0 and cold.remote_read > 0
    warm = batch_reads(far, bodies)
    assert warm.remote_round_trips == 0 and warm.remote_bytes == 0
    assert warm.remote_cache_misses == 0 and warm.remote_cache_hits > 0


def test_the_local_store_reports_no_reads(stores, gat) -> None:
    store = stores["one_type"]
    settings = ServingSettings.from_yaml_section({"fanouts": [2, 2]})
    local = NodeClassificationEngine.create(store, gat, settings, torch.device("cpu"), "1.0")
    times = batch_reads(local, [{"node_id": store.external_ids(np.arange(1))[0]}])
    assert times.remote_round_trips == 0 and times.remote_bytes == 0


def remote_settings(location: str, checksum: str) -> ServingSettings:
    return ServingSettings.from_yaml_section(
        {"graph_location": location, "graph_checksum": checksum, "remote_timeout_ms": 300}
    )


def test_a_worker_opens_the_graph_its_archive_names(remote: Remote, servers, stores) -> None:
    store = stores["typed"]
    remote("cluster", "typed")  # loaded
    location = f"{servers['cluster']}/typed"
    graph = open_graph(Path("unused"), remote_settings(location, store.checksum))
    assert isinstance(graph, RemoteStore) and graph.checksum == store.checksum
    # remote_cache_mb's default: an eighth for IDs, the block arrays (twice what they hold) the rest
    assert graph.ids.capacity_bytes == 32 << 20
    assert graph.cache.capacity_bytes == 112 << 20


def test_a_worker_refuses_another_graph_in_one_line(remote: Remote, servers, stores) -> None:
    remote("cluster", "typed")
    other = stores["one_type"].checksum
    with pytest.raises(StoreError) as refused:
        open_graph(Path("unused"), remote_settings(f"{servers['cluster']}/typed", other))
    message = str(refused.value)
    assert "\n" not in message and "expected" in message and other[:12] in message
    with pytest.raises(StoreError, match="holds no graph"):
        open_graph(Path("unused"), remote_settings(f"{servers['single']}/nothing", other))


def test_a_worker_refuses_an_unreachable_redis_in_one_line(stores) -> None:
    (port,) = free_ports(1)
    location = f"redis://127.0.0.1:{port}/typed"
    with pytest.raises(RemoteUnavailable) as refused:
        open_graph(Path("unused"), remote_settings(location, stores["typed"].checksum))
    assert "\n" not in str(refused.value) and f"127.0.0.1:{port}" in str(refused.value)


def check_same_link_answers(
    model: torch.nn.Module,
    settings: ServingSettings,
    store: GraphStore,
    far: RemoteStore,
    bodies: list[dict],
    tmp_path: Path,
) -> None:
    """Link archives of ``model`` on ``store`` and on the same graph in Redis answer
    ``bodies`` alike: the same statuses (all 200), destinations and scores (<= 1e-6)."""
    write_link_assets(model, store, tmp_path / "link")
    served = []
    for graph in (store, far):
        ego = EgoGraphs.create(graph, model, settings, torch.device("cpu"))
        served.append(LinkEngine(ego, open_link_assets(tmp_path / "link", graph), "1.0"))
    local, remote_answers = (
        [(r.status, r.body) for r in e.handle([{"body": b} for b in bodies])] for e in served
    )
    assert [s for s, _ in remote_answers] == [s for s, _ in local] == [200, 200, 200]
    for (_, mine), (_, theirs) in zip(local, remote_answers, strict=True):
        rows = mine.get("recommendations", mine.get("predictions"))
        far_rows = theirs.get("recommendations", theirs.get("predictions"))
        assert [r.get("dst") for r in far_rows] == [r.get("dst") for r in rows]
        gap = np.abs(np.array([r["score"] for r in far_rows]) - [r["score"] for r in rows]).max()
        assert gap <= 1e-6


@pytest.mark.parametrize("fanouts", [[2, 2], [-1, -1]])
def test_link_scores_and_top_k_are_the_stores(
    remote: Remote, stores, tmp_path: Path, fanouts: list[int]
) -> None:
    store = stores["one_type"]
    torch.manual_seed(0)
    config = {"task": "link", "arch": "sage", "in_dim": FEATURES, "out_dim": 8, "hidden_dim": 16}
    model = build_model(config).eval()
    settings = ServingSettings.from_yaml_section({"task": "link", "fanouts": fanouts})
    ids = store.external_ids(np.arange(store.num_nodes))
    bodies = [
        {"pairs": [[ids[i], ids[-1 - i]] for i in range(8)]},
        {"src": ids[0], "top_k": 5},
        {"src": ids[3], "top_k": 5, "exclude_neighbors": False},
    ]
    check_same_link_answers(model, settings, store, remote("cluster", "one_type"), bodies, tmp_path)


@pytest.mark.parametrize("arch", ["sage", "rgcn"])
def test_typed_link_scores_and_top_k_are_the_stores(
    remote: Remote, stores, tmp_path: Path, arch: str
) -> None:
    store = stores["typed"]
    torch.manual_seed(0)
    config = ModelConfig(
        task="link",
        arch=arch,
        decoder="dot",
        in_dim=store.feature_dim,
        out_dim=8,
        hidden_dim=16,
        hetero=hetero_section(store.schema, "user__pays__merchant"),
    )
    model = build_model(config).eval()
    settings = ServingSettings.from_yaml_section({"task": "link", "fanouts": [3, 3]})
    users = store.schema.node_type("user")
    merchants = store.schema.node_type("merchant")
    user_ids = store.external_ids(np.arange(users.offset, users.offset + 8))
    merchant_ids = store.external_ids(np.arange(merchants.offset, merchants.offset + 8))
    bodies = [
        {"pairs": [list(pair) for pair in zip(user_ids, merchant_ids, strict=True)]},
        {"src": user_ids[0], "top_k": 5},
        {"src": user_ids[3], "top_k": 5, "exclude_neighbors": False},
    ]
    check_same_link_answers(model, settings, store, remote("cluster", "typed"), bodies, tmp_path)


@pytest.mark.parametrize("fanouts", [[2, 3], [-1, -1]])
def test_answers_after_live_updates_are_the_stores(
    remote: Remote, stores, gat, tmp_path: Path, fanouts: list[int]
) -> None:
    """The overlay over the graph in Redis: the sampler reads changed and unchanged in-lists
    through it in one read per hop, as over the mapped store."""
    store = stores["one_type"]
    lives = [
        LiveGraph(graph, tmp_path / f"{name}.log")
        for name, graph in (("local", store), ("remote", remote("single", "one_type")))
    ]
    rng, counter = random.Random(5), [0]
    for _ in range(30):
        (operation,) = random_update(rng, lives[0], counter)
        for live in lives:
            live.update(UpdateRequest([operation]))
    settings = ServingSettings.from_yaml_section({"fanouts": fanouts})
    local, far = (
        NodeClassificationEngine.create(live.store, gat, settings, torch.device("cpu"), "1.0", live)
        for live in lives
    )
    ids = live_ids(lives[0])
    bodies = [{"node_ids": ids[start : start + 16]} for start in range(0, len(ids), 16)]
    check_same_answers(answers(local, bodies), answers(far, bodies))


def test_embedding_and_cold_start_batches_report_their_reads(remote: Remote, stores, gat) -> None:
    store = stores["one_type"]
    settings = ServingSettings.from_yaml_section({"fanouts": [2, 2]})
    far = remote("cluster", "one_type")
    engine = NodeClassificationEngine.create(far, gat, settings, torch.device("cpu"), "1.0")
    router = node_router(engine, "1.0")
    bodies = one_type_bodies(store)[2:]  # an embedding request, a new node
    for body in bodies:
        batch = router.run(router.prepare([{"body": body}]))
        assert [r.status for r in router.respond(batch)] == [200]
        assert batch.batch.times.remote_round_trips > 0


def explained(engine: NodeClassificationEngine, bodies: list[dict]) -> list[tuple[int, dict]]:
    router = node_router(engine, "1.0")
    items = [{"body": b} for b in bodies]
    return [(r.status, r.body) for r in router.handle(items, explain=[True] * len(items))]


@pytest.mark.parametrize("graph", ["one_type", "typed"])
def test_explanations_are_the_stores(remote: Remote, stores, gat, graph: str) -> None:
    """The same prediction, nodes, edges and attributions from the cluster as from the store:
    the explanation reads the same ego-graph and the same rows through the view."""
    store = stores[graph]
    model = gat if graph == "one_type" else node_recipe(store, "rgcn")
    local, far = engines(store, remote("cluster", graph), model, [3, 2])
    [first, other] = store.external_ids(np.array([0, 5]))
    bodies = [{"node_id": first}, {"node_id": other}]
    for (status, body), (far_status, far_body) in zip(
        explained(local, bodies), explained(far, bodies), strict=True
    ):
        assert status == far_status == 200, (body, far_body)
        assert far_body["predicted_class"] == body["predicted_class"]
        gap = np.abs(np.array(far_body["probabilities"]) - np.array(body["probabilities"]))
        assert gap.max() <= 1e-6
        mine, theirs = body["explanation"], far_body["explanation"]
        for part in ("nodes", "edges", "features"):
            assert [_named(e) for e in theirs[part]] == [_named(e) for e in mine[part]], part
            pairs = zip(theirs[part], mine[part], strict=True)
            gaps = [abs(a["attribution"] - b["attribution"]) for a, b in pairs]
            assert max(gaps, default=0.0) <= 1e-5, part


def _named(entry: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in entry.items() if k != "attribution"))


def test_chebconv_answers_from_redis_are_the_stores(remote: Remote, stores, tmp_path) -> None:
    """ChebConv without normalisation nor lambda_max on the directed graph reads each row's
    out-degree and the largest from the degree rows in Redis: answers (a batch, a node alone,
    a cold-start node) are the mapped store's, which are the full-graph forward's."""
    store = stores["one_type"]
    args = {"in_channels": FEATURES, "out_channels": 3, "K": 3, "normalization": None}
    torch.manual_seed(0)
    torch.save(ChebConv(**args).state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", "torch_geometric.nn.ChebConv",
        "--model-args", json.dumps(args), "--weights", str(tmp_path / "weights.pt"),
        "--out", str(tmp_path / "model"), "--edge-input", "none", "--output", "logits",
    ]  # fmt: skip
    assert own_model.main(argv) == 0
    model = load_model(tmp_path / "model")[0]
    far = remote("single", "one_type")
    local, served = engines(store, far, model, [-1, -1])
    ids = store.external_ids(np.arange(store.num_nodes))
    bodies = [
        {"node_ids": ids[:20]},
        {"node_id": ids[-1]},
        {"new_node": {"x": [0.5] * FEATURES, "neighbors": ids[:25], "direction": "out"}},
    ]
    check_same_answers(answers(local, bodies), answers(served, bodies))
    assert far.largest_out_degree() == store.largest_out_degree()
