"""A typed model's forward captured per bucket of padded typed ego-graphs: with the CPU
stand-in capture (tests' FakeCapture) every capturable model replays with the eager typed
answers, one graph per bucket; a model that reads on the host runs eager with the same log
line as a one-type model; the GPU worker's engine (padding, per-type features from device
memory, live updates) answers as the CPU engine."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from handler.gpu.captured_forward import CapturedForward, TypedBucketKey
from handler.gpu.device_features import TypedDeviceFeatures, typed_capacities
from handler.gpu.padding import PaddedSubgraph, pad_subgraph
from handler.graph.ego import EgoGraphs
from handler.graph.typed_ego import captured_typed_answer, pad_typed, typed_answer
from handler.live.live_graph import LiveGraph
from handler.sampling.sampler import SampledSubgraph
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from model.typed_batch import HeteroInput
from model.typed_rows import gather_typed
from tests.typed_graphs import fraud_store, hetero_conv_model, node_recipe

from .test_captured_forward import FakeCapture
from .test_typed_live_updates import check_exact, take_updates

CPU = torch.device("cpu")
CUDA = torch.device("cuda:0")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CAPTURABLE = ["sage", "gat", "gcn", "gin", "user"]
BATCHES = ([0, 3, 9], [1, 4, 10], [0, 3, 9], list(range(0, 100, 7)), [2, 5, 11])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_captured") / "store", 120, 20, 50, 400, 3)


def typed_model(store: GraphStore, arch: str) -> torch.nn.Module:
    return hetero_conv_model(store) if arch == "user" else node_recipe(store, arch)


def ego_graphs(store, model, fanouts, device=CPU) -> EgoGraphs:
    return EgoGraphs.create(store, model, ServingSettings(fanouts=tuple(fanouts)), device)


def all_features(store: GraphStore, device: torch.device) -> TypedDeviceFeatures:
    return TypedDeviceFeatures(store, device, typed_capacities(store, 1.0, 1 << 40))


def sample(ego: EgoGraphs, seeds) -> SampledSubgraph:
    return ego.sample(np.array(seeds))[1]


def eager(ego: EgoGraphs, seeds) -> torch.Tensor:
    """The seeds' rows of the unpadded typed ego-graph, as a CPU worker answers."""
    with torch.inference_mode():
        return typed_answer(ego.store, ego.view(), ego.model, sample(ego, seeds), ego.device)[0]


def captured(ego: EgoGraphs, forward: CapturedForward, seeds, features=None) -> torch.Tensor:
    view = ego.view()
    padded = pad_typed(ego.store, view, sample(ego, seeds))
    target = ego.served_node_type
    return captured_typed_answer(ego.store, view, forward, target, padded, ego.device, features)


def typed_batch(ego: EgoGraphs, seeds) -> tuple[PaddedSubgraph, HeteroInput]:
    view = ego.view()
    padded = pad_typed(ego.store, view, sample(ego, seeds))
    new = padded.sub
    assert padded.types is not None
    typed = gather_typed(
        ego.store.schema,
        view,
        new.node.numpy(),
        new.edge_index,
        new.edge.numpy(),
        CPU,
        relation=padded.types.edge_relation,
        padding_edges=padded.padding_edges,
    )
    inputs = typed.layout.inputs(
        typed.features, typed.n_id, typed.edge_features, new.level_sizes, new.edge_index
    )
    return padded, inputs


def assert_same_answers(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert float((got.cpu() - expected.cpu()).abs().max()) <= 1e-5
    assert torch.equal(got.cpu().argmax(dim=1), expected.cpu().argmax(dim=1))


@pytest.mark.parametrize("arch", CAPTURABLE)
def test_every_capturable_typed_forward_replays_the_eager_answers(store, arch):
    """No host read in the padded typed forward (FakeCapture runs it under HostReads), and
    every replay equals the unpadded eager answer, features from device memory or not."""
    ego = ego_graphs(store, typed_model(store, arch), [3, 3])
    capture = FakeCapture()
    forward = CapturedForward(ego.model, CPU, capture=capture)
    for features in (None, all_features(store, CPU)):
        for seeds in BATCHES:
            assert_same_answers(captured(ego, forward, seeds, features), eager(ego, seeds))
    assert forward.eager_reason is None
    assert capture.captures == len(forward.keys) >= 2  # a bucket replayed, not recaptured
    assert all(isinstance(key, TypedBucketKey) for key in forward.keys)


@pytest.mark.parametrize("arch", ["rgcn", "hgt"])
def test_a_typed_model_that_reads_on_the_host_falls_back_with_its_answers(store, arch, caplog):
    """PyG's RGCNConv and HGTConv read sizes on the host: eager from then on, said once with
    the one-type path's log line, the same answers."""
    ego = ego_graphs(store, typed_model(store, arch), [3, 3])
    capture = FakeCapture()
    forward = CapturedForward(ego.model, CPU, capture=capture)
    with caplog.at_level(logging.WARNING, logger="handler.gpu.captured_forward"):
        for seeds in BATCHES:
            assert_same_answers(captured(ego, forward, seeds), eager(ego, seeds))
    assert "HostRead" in (forward.eager_reason or "") and forward.keys == []
    assert capture.captures == 1 and len(caplog.records) == 1
    assert "runs eager from now on" in caplog.records[0].message


def test_one_typed_graph_per_bucket_and_buffers_refilled_for_each_batch(store):
    ego = ego_graphs(store, typed_model(store, "sage"), [2, 2])
    capture = FakeCapture()
    forward = CapturedForward(ego.model, CPU, capture=capture)
    first, second = typed_batch(ego, [0]), typed_batch(ego, [1])
    assert TypedBucketKey.of(*first) == TypedBucketKey.of(*second)  # one bucket
    a, b = forward.typed(*first), forward.typed(*second)
    assert capture.captures == 1 and forward.keys == [TypedBucketKey.of(*first)]
    assert_same_answers(a, eager(ego, [0]))
    assert_same_answers(b, eager(ego, [1]))
    assert not torch.allclose(a, b)


def test_typed_bucket_keys_name_every_input_shape(store):
    ego = ego_graphs(store, typed_model(store, "user"), [2, 2])
    padded, inputs = typed_batch(ego, [0, 3])
    key = TypedBucketKey.of(padded, inputs)
    assert key.type_rows == padded.type_rows and key.relation_edges == padded.relation_edges
    names = [name for name, _, _ in key.shapes]
    assert "x[user]" in names and "n_id[device]" in names and len(names) == len(set(names))
    wider = dict(inputs.x_dict, user=torch.zeros(inputs.x_dict["user"].size(0), 9))
    doubled = {k: v.double() for k, v in inputs.x_dict.items()}
    for changed in (wider, doubled):
        other = HeteroInput(
            changed,
            inputs.edge_index_dict,
            inputs.n_id_dict,
            inputs.edge_attr_dict,
            inputs.num_sampled_nodes_dict,
            inputs.num_sampled_edges_dict,
        )
        assert TypedBucketKey.of(padded, other) != key
    one_type = pad_subgraph(sample(ego, [0, 3]))
    with pytest.raises(ValueError, match="padded with its row types"):
        TypedBucketKey.of(one_type, inputs)


def test_on_a_cpu_or_disabled_the_typed_forward_runs_eager(store):
    ego = ego_graphs(store, typed_model(store, "gat"), [3, 3])
    for forward in (
        CapturedForward(ego.model, CPU),
        CapturedForward(ego.model, CPU, enabled=False, capture=FakeCapture()),
    ):
        assert_same_answers(captured(ego, forward, [0, 3, 9]), eager(ego, [0, 3, 9]))
        assert forward.keys == [] and forward.eager_reason


def gpu_worker_on_cpu(
    store: GraphStore,
    model: torch.nn.Module,
    fanouts,
    live: LiveGraph | None = None,
    cuda_graphs: bool = True,
) -> tuple[NodeClassificationEngine, FakeCapture]:
    """The node engine as a GPU worker sets it up (per-type features in device memory and,
    with ``cuda_graphs``, a captured forward), on the CPU with the stand-in capture."""
    settings = ServingSettings.from_yaml_section({"fanouts": fanouts})
    engine = NodeClassificationEngine.create(store, model, settings, CPU, "1.0", live)
    capture = FakeCapture()
    if cuda_graphs:
        engine.captured = CapturedForward(engine.model, CPU, capture=capture)
    engine.ego.device_features = all_features(store, CPU)
    return engine, capture


def requests(store: GraphStore, seed: int, count: int = 10) -> list[dict]:
    rng = np.random.default_rng(seed)
    users = store.schema.target_type.num_nodes
    ids = store.external_ids(np.arange(users))
    return [
        {"body": {"node_ids": [ids[i] for i in rng.integers(0, users, rng.integers(1, 6))]}}
        for _ in range(count)
    ]


@pytest.mark.parametrize("fanouts", [[3, 3], [-1, -1]])
@pytest.mark.parametrize("arch", ["sage", "gcn", "rgcn", "user"])
def test_the_gpu_workers_typed_engine_answers_as_the_cpu_engine(store, arch, fanouts):
    model = typed_model(store, arch)
    plain = NodeClassificationEngine.create(
        store, model, ServingSettings.from_yaml_section({"fanouts": fanouts}), CPU, "1.0"
    )
    engine, capture = gpu_worker_on_cpu(store, copy.deepcopy(model), fanouts)
    assert_same_engine_answers(engine, plain)
    assert capture.captures >= 1
    assert (engine.captured.eager_reason is None) is (arch != "rgcn")


def test_an_eager_gpu_worker_reads_typed_features_from_device_memory(store):
    """Without CUDA graphs the typed forward runs eager, its features still gathered from
    the per-type tables (every table read is counted)."""
    model = typed_model(store, "user")
    plain = NodeClassificationEngine.create(
        store, model, ServingSettings.from_yaml_section({"fanouts": [3, 3]}), CPU, "1.0"
    )
    engine, capture = gpu_worker_on_cpu(store, copy.deepcopy(model), [3, 3], cuda_graphs=False)
    features = engine.ego.device_features
    assert isinstance(features, TypedDeviceFeatures)
    read: list[int] = []
    gather = features.gather
    features.gather = lambda view, t, nodes: read.append(t) or gather(view, t, nodes)  # type: ignore[method-assign]
    assert_same_engine_answers(engine, plain)
    assert engine.captured is None and capture.captures == 0
    assert sorted(set(read)) == sorted(features.by_type)


def assert_same_engine_answers(
    engine: NodeClassificationEngine, plain: NodeClassificationEngine
) -> None:
    for seed in range(3):
        items = requests(engine.store, seed)
        for mine, theirs in zip(engine.handle(items), plain.handle(items), strict=True):
            assert mine.status == theirs.status == 200, mine.body
            for a, b in zip(mine.body["predictions"], theirs.body["predictions"], strict=True):
                assert (a["node_id"], a["node_type"]) == (b["node_id"], b["node_type"])
                assert np.abs(np.subtract(a["probabilities"], b["probabilities"])).max() <= 1e-5
                assert a["predicted_class"] == b["predicted_class"]


def test_the_gpu_workers_typed_engine_is_exact_after_live_updates(store, tmp_path):
    """Rows live updates changed or added come from the overlay, over the device tables."""
    model = node_recipe(store, "sage", hidden=8)
    live = LiveGraph(store, tmp_path / "updates.log")
    engine, capture = gpu_worker_on_cpu(store, model, [-1, -1], live)
    steps = take_updates([live, live], seed=11)
    check_exact([engine], [live], model, steps)
    assert capture.captures >= 1 and engine.captured.eager_reason is None


@needs_cuda
@pytest.mark.parametrize("arch", ["sage", "gat", "gcn", "gin", "user", "rgcn"])
def test_captured_typed_forward_equals_eager_and_the_cpu_on_a_gpu(store, arch):
    model = typed_model(store, arch)
    cpu = ego_graphs(store, model, [-1, -1])
    gpu = ego_graphs(store, copy.deepcopy(model), [-1, -1], CUDA)
    forward = CapturedForward(gpu.model, CUDA)
    features = all_features(store, CUDA)
    for seeds in BATCHES:
        answer = captured(gpu, forward, seeds, features)
        assert_same_answers(answer, eager(gpu, seeds))
        assert_same_answers(answer, eager(cpu, seeds))
    assert (forward.eager_reason is None) is (arch != "rgcn")
    assert torch.ones(3, device=CUDA).sum().item() == 3  # the device still works


@needs_cuda
def test_a_gpu_workers_typed_engine_answers_as_the_cpu_engine(store):
    model = typed_model(store, "user")
    settings = ServingSettings.from_yaml_section({"fanouts": [3, 3]})
    plain = NodeClassificationEngine.create(store, model, settings, CPU, "1.0")
    engine = NodeClassificationEngine.create(store, copy.deepcopy(model), settings, CUDA, "1.0")
    assert engine.captured is not None
    assert isinstance(engine.ego.device_features, TypedDeviceFeatures)
    items = requests(store, 0)
    for mine, theirs in zip(engine.handle(items), plain.handle(items), strict=True):
        assert mine.status == theirs.status == 200, mine.body
        for a, b in zip(mine.body["predictions"], theirs.body["predictions"], strict=True):
            assert np.abs(np.subtract(a["probabilities"], b["probabilities"])).max() <= 1e-5
    assert engine.captured.eager_reason is None and engine.captured.keys
