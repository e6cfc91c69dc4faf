"""The sampler on a graph of several node types and relations: each relation's segment of an
in-list sampled with its own fanout, deterministic per (node, hop, relation), every in-edge with
-1, and a boundary row per source type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from handler.sampling.sampler import SampledSubgraph, boundary_node, sampler_for
from handler.settings import ServingSettings
from tests.typed_graphs import fraud_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed") / "store", 200, 30, 80, 700, seed=2)


def relation_of(store: GraphStore, sub: SampledSubgraph) -> np.ndarray:
    assert store.edge_type is not None
    return np.asarray(store.edge_type)[sub.edge.numpy()]


def sample(store: GraphStore, seeds: list[int], boundary: bool = False, **settings):
    config = ServingSettings.from_yaml_section({"fanouts": [-1, -1], **settings})
    sampler = sampler_for(store, config, torch.device("cpu"), boundary=boundary)
    return sampler.sample(torch.tensor(seeds))


def in_edges(store: GraphStore, node: int) -> list[tuple[int, int]]:
    """``(source, relation)`` of every in-edge of ``node``, sorted."""
    start, stop = int(store.indptr[node]), int(store.indptr[node + 1])
    assert store.edge_type is not None
    return sorted(
        zip(
            np.asarray(store.indices[start:stop]).tolist(),
            np.asarray(store.edge_type[start:stop]).tolist(),
            strict=True,
        )
    )


def test_full_fanouts_take_every_in_edge_of_every_relation(store):
    sub = sample(store, [0, 5, 17])
    relations = relation_of(store, sub)
    node = sub.node.numpy()
    inner = sub.level_sizes[0] + sub.level_sizes[1]
    for row in range(inner):
        mine = np.flatnonzero(sub.edge_index[1].numpy() == row)
        sources = node[sub.edge_index[0].numpy()[mine]]
        got = sorted(zip(sources.tolist(), relations[mine].tolist(), strict=True))
        assert got == in_edges(store, int(node[row]))
    assert store.indices[sub.edge.numpy()].tolist() == node[sub.edge_index[0]].tolist()


def test_each_relation_samples_its_own_fanout(store):
    schema = store.schema
    rev_pays = schema.relation_index("merchant__rev_pays__user")
    rev_uses = schema.relation_index("device__rev_uses__user")
    sub = sample(
        store,
        list(range(40)),
        fanouts=[3, 3],
        relation_fanouts={"merchant__rev_pays__user": [1, 2]},
    )
    relations = relation_of(store, sub)
    hop0 = sub.edge_index[1].numpy() < sub.num_seeds
    for row in range(sub.num_seeds):
        mine = (sub.edge_index[1].numpy() == row) & hop0
        pays = int((relations[mine] == rev_pays).sum())
        uses = int((relations[mine] == rev_uses).sum())
        available = dict.fromkeys((rev_pays, rev_uses), 0)
        for _, relation in in_edges(store, row):
            available[relation] = available.get(relation, 0) + 1
        assert pays == min(1, available[rev_pays])
        assert uses == min(3, available[rev_uses])


def test_sampling_is_deterministic_and_batch_independent(store):
    settings = {"fanouts": [2, 2]}
    alone = sample(store, [7], **settings)
    together = sample(store, [3, 7, 11], **settings)
    again = sample(store, [3, 7, 11], **settings)
    assert torch.equal(together.edge, again.edge) and torch.equal(together.node, again.node)
    first_hop = alone.edge_index[1] == 0
    row = int((together.node[: together.num_seeds] == 7).nonzero()[0])
    mine = (together.edge_index[1] == row) & (together.edge_index[1] < together.num_seeds)
    assert sorted(alone.edge[first_hop].tolist()) == sorted(together.edge[mine].tolist())


def test_a_boundary_has_one_zero_row_per_source_type(store):
    sub = sample(store, [0, 1], boundary=True, fanouts=[2, 2])
    boundary = sub.node[-sub.level_sizes[-1] :].tolist()
    schema = store.schema
    sources = {schema.type_index(r.edge_type.src) for r in schema.relations}
    assert set(boundary) <= {boundary_node(t) for t in sources} and boundary == sorted(
        boundary, reverse=True
    )
    deepest_start = sum(sub.level_sizes[:-2])
    deepest = range(deepest_start, deepest_start + sub.level_sizes[-2])
    node = sub.node.numpy()
    for row in deepest:
        mine = np.flatnonzero(sub.edge_index[1].numpy() == row)
        assert len(mine) == int(store.in_degree[node[row]])
        pairs = zip(sub.edge_index[0][mine].tolist(), sub.edge[mine].tolist(), strict=True)
        for source_row, edge in pairs:
            source = int(store.indices[edge])
            if source == node[row]:
                continue  # a self-loop stays on its own row
            assert node[source_row] == boundary_node(int(schema.types_of(np.array([source]))[0]))


def test_unknown_relations_in_the_fanouts_are_refused(store, tmp_path: Path):
    with pytest.raises(ValueError, match="its edge types are user__pays__merchant"):
        sample(store, [0], relation_fanouts={"user__buys__item": [1, 1]})
