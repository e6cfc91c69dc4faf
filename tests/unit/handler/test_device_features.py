"""Stored features kept in device memory give the rows the memory map gives: whole or cached,
under live updates, with boundary rows; on a GPU the engine answers as the CPU one."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from handler.gpu.device_features import (
    DeviceFeatures,
    device_features_for,
    feature_capacity,
    gather_features,
)
from handler.graph.ego import EgoGraphs
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine

from .conftest import NUM_NODES, make_engine, random_model

CPU = torch.device("cpu")


def batches(seed: int, count: int, largest: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, NUM_NODES, rng.integers(1, largest + 1)) for _ in range(count)]


def test_all_rows_in_device_memory_are_the_stored_rows(int_store):
    features = DeviceFeatures(int_store, CPU, capacity_rows=NUM_NODES)
    assert features.resident and features.table.shape == (NUM_NODES, int_store.feature_dim)
    for nodes in batches(0, 20, 40):
        assert torch.equal(features.rows(nodes), torch.from_numpy(int_store.feature_rows(nodes)))


@pytest.mark.parametrize("capacity", [1, 7, 30])
def test_a_cache_of_rows_gives_the_stored_rows_and_keeps_to_its_size(int_store, capacity):
    features = DeviceFeatures(int_store, CPU, capacity_rows=capacity)
    assert not features.resident and features.table.shape[0] == capacity
    for nodes in batches(capacity, 60, 12):  # some batches fit the cache, some do not
        assert torch.equal(features.rows(nodes), torch.from_numpy(int_store.feature_rows(nodes)))
        held = features.node_in[features.node_in >= 0]
        assert len(held) == len(np.unique(held)) <= capacity
        assert np.array_equal(features.slot_of[held], np.flatnonzero(features.node_in >= 0))


def test_popular_rows_stay_in_the_cache(int_store):
    features = DeviceFeatures(int_store, CPU, capacity_rows=16)
    hot = np.arange(8)
    features.rows(hot)
    rng = np.random.default_rng(1)
    for _ in range(40):  # the hot rows every batch, beside a few cold ones
        features.rows(np.concatenate([hot, rng.integers(8, NUM_NODES, 4)]))
    before = features.misses
    features.rows(hot)
    assert features.misses == before and features.hits > 8 * 40


def test_overlay_rows_and_boundary_rows_are_written_over_the_stored_ones(int_store):
    overlay = GraphOverlay(int_store)
    operations = [
        {"type": "set_features", "id": 3, "x": [9.0] * int_store.feature_dim},
        {"type": "add_node", "id": 10_000, "x": [-2.0] * int_store.feature_dim},
    ]
    overlay.apply(decode_operations(operations, int_store), 1)
    added = int(overlay.lookup([10_000])[0])
    nodes = np.array([1, 3, added, -1, 3, 0])
    expected = overlay.feature_rows(np.where(nodes < 0, 0, nodes))
    expected[nodes < 0] = 0
    for capacity in (NUM_NODES, 3):
        features = DeviceFeatures(int_store, CPU, capacity_rows=capacity)
        x = gather_features(features, overlay, nodes, CPU)
        assert torch.equal(x, torch.from_numpy(expected))


def test_capacity_is_the_share_of_free_memory_in_rows(int_store):
    row = 4 * int_store.feature_dim
    assert feature_capacity(int_store, 0.5, free_bytes=row * 100) == 50
    assert feature_capacity(int_store, 0.5, free_bytes=row * 10_000) == NUM_NODES
    assert feature_capacity(int_store, 0.5, free_bytes=row) == 0


def test_cpu_workers_and_a_zero_share_keep_features_in_host_memory(int_store):
    assert device_features_for(int_store, CPU, 0.5, lambda: 1 << 30) is None
    cuda = torch.device("cuda:0")
    assert device_features_for(int_store, cuda, 0.0, lambda: 1 << 30) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fraction_of_rows", [1.0, 0.25])
def test_gpu_engine_with_features_in_gpu_memory_answers_as_the_cpu(int_store, fraction_of_rows):
    model = random_model(int_store, "sage")
    on_cpu = make_engine(int_store, model=model, fanouts=[3, 3])
    settings = ServingSettings(fanouts=(3, 3))
    ego = EgoGraphs.create(int_store, copy.deepcopy(model), settings, torch.device("cuda:0"))
    rows = max(1, int(NUM_NODES * fraction_of_rows))
    ego.device_features = DeviceFeatures(int_store, torch.device("cuda:0"), rows)
    on_gpu = NodeClassificationEngine(ego, "1.0")
    payloads = [{"body": {"node_ids": (nodes * 3).tolist()}} for nodes in batches(3, 10, 8)]
    for gpu, cpu in zip(on_gpu.handle(payloads), on_cpu.handle(payloads), strict=True):
        for a, b in zip(gpu.body["predictions"], cpu.body["predictions"], strict=True):
            assert np.allclose(a["probabilities"], b["probabilities"], atol=1e-5)
