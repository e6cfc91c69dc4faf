"""Stored features of a graph of several node types kept in device memory, one table per
featured type: each gives its type's stored rows (whole or cached), padding and boundary rows
zero, and rows live updates changed or added from the overlay."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from handler.gpu.device_features import (
    TypedDeviceFeatures,
    device_features_for,
    typed_capacities,
)
from tests.typed_graphs import fraud_store

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_features") / "store", 60, 12, 20, 150, 4)


def all_rows(store: GraphStore) -> list[int]:
    return [t.num_nodes for t in store.schema.node_types]


@pytest.mark.parametrize("share", [1.0, 0.3])
def test_each_types_rows_are_its_stored_rows(store, share):
    capacities = [
        int(n * share) if t.feature_dim else 0
        for n, t in zip(all_rows(store), store.schema.node_types, strict=True)
    ]
    features = TypedDeviceFeatures(store, CPU, capacities)
    featured = [i for i, t in enumerate(store.schema.node_types) if t.feature_dim]
    assert sorted(features.by_type) == featured and len(featured) < len(capacities)
    rng = np.random.default_rng(0)
    for index in featured:
        meta = store.schema.node_types[index]
        assert features.by_type[index].resident is (share == 1.0)
        for _ in range(10):
            nodes = rng.integers(meta.offset, meta.stop, rng.integers(1, 8))
            x = features.gather(store, index, nodes)
            assert torch.equal(x, torch.from_numpy(store.feature_rows(nodes)))


def test_a_type_of_which_no_row_fits_is_read_from_host_memory(store):
    """A share too small for one row of a type keeps none of it: its rows come from the
    view, padding rows zero, as a CPU worker's."""
    user = store.schema.node_type_names.index("user")
    merchant = store.schema.node_type_names.index("merchant")
    capacities = [0] * len(store.schema.node_types)
    capacities[user] = 5
    features = TypedDeviceFeatures(store, CPU, capacities)
    assert list(features.by_type) == [user]
    meta = store.schema.node_types[merchant]
    nodes = np.array([meta.offset + 2, -1 - merchant, meta.offset])
    expected = np.zeros((3, meta.feature_dim), dtype=np.float32)
    expected[[0, 2]] = store.feature_rows(nodes[[0, 2]])
    assert torch.equal(features.gather(store, merchant, nodes), torch.from_numpy(expected))


def test_padding_boundary_and_overlay_rows_are_written_over_the_stored_ones(store):
    merchant = store.schema.node_type_names.index("merchant")
    meta = store.schema.node_types[merchant]
    overlay = GraphOverlay(store)
    [first_id] = store.external_ids(np.array([meta.offset]))
    operations = [
        {"type": "set_features", "id": first_id, "x": [9.0] * meta.feature_dim,
         "node_type": "merchant"},
        {"type": "add_node", "id": 90_000, "x": [-2.0] * meta.feature_dim,
         "node_type": "merchant"},
    ]  # fmt: skip
    overlay.apply(decode_operations(operations, store), 1)
    added = int(overlay.lookup([90_000], node_type="merchant")[0])
    assert added >= store.num_nodes
    nodes = np.array(
        [meta.offset + 1, meta.offset, added, -1 - merchant, meta.offset, meta.stop - 1]
    )
    real = nodes >= 0
    expected = np.zeros((len(nodes), meta.feature_dim), dtype=np.float32)
    expected[real] = overlay.feature_rows(nodes[real])
    assert expected[1, 0] == 9.0 and expected[2, 0] == -2.0
    for capacity in (meta.num_nodes, 3):
        capacities = [capacity if i == merchant else 0 for i in range(len(all_rows(store)))]
        features = TypedDeviceFeatures(store, CPU, capacities)
        assert torch.equal(features.gather(overlay, merchant, nodes), torch.from_numpy(expected))


def test_capacities_share_free_memory_by_type(store):
    types = store.schema.node_types
    total = sum(4 * t.feature_dim * t.num_nodes for t in types)
    whole = [t.num_nodes if t.feature_dim else 0 for t in types]
    assert typed_capacities(store, 1.0, free_bytes=total) == whole
    assert typed_capacities(store, 0.5, free_bytes=100 * total) == whole
    half = typed_capacities(store, 0.5, free_bytes=total)
    assert half == [int(t.num_nodes * 0.5) if t.feature_dim else 0 for t in types]
    assert typed_capacities(store, 0.5, free_bytes=0) == [0] * len(types)


def test_cpu_workers_and_a_zero_share_keep_typed_features_in_host_memory(store):
    assert device_features_for(store, CPU, 0.5, lambda: 1 << 30) is None
    assert device_features_for(store, torch.device("cuda:0"), 0.0, lambda: 1 << 30) is None
    assert device_features_for(store, torch.device("cuda:0"), 0.5, lambda: 0) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_worker_keeps_every_featured_type_on_the_gpu(store):
    cuda = torch.device("cuda:0")
    features = device_features_for(store, cuda, 0.5, lambda: 1 << 30)
    assert isinstance(features, TypedDeviceFeatures)
    for index, held in features.by_type.items():
        meta = store.schema.node_types[index]
        assert held.resident and held.table.device.type == "cuda"
        nodes = np.arange(meta.offset, meta.stop)
        x = features.gather(store, index, nodes).cpu()
        assert torch.equal(x, torch.from_numpy(store.feature_rows(nodes)))
