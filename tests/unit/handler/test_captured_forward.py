"""CapturedForward's bookkeeping on a CPU, with a capture that stands in for CUDA's: one graph
per bucket, a bounded LRU, input buffers refilled for every batch, and eager for good after a
failed capture. The presets' and a user model's padded forwards read no tensor on the host
(what a CUDA graph needs), checked by HostReads."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import Tensor
from torch_geometric.nn.models import GAT

from handler.gpu.captured_forward import (
    BucketKey,
    CapturedForward,
    HostRead,
    HostReads,
    Replay,
)
from handler.gpu.padding import PaddedSubgraph, pad_subgraph
from handler.graph.ego import EgoGraphs
from handler.settings import ServingSettings
from model.served import UserNodeModel
from model.user_model import UserModelConfig
from tests.edge_graph import CLASSES, EDGE_DIM, FEATURES, edge_feature_store
from tests.served_wrapper import Wrapping

from .conftest import random_model

CPU = torch.device("cpu")
CUDA = torch.device("cuda:0")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class FakeCapture:
    """Stands in for a CUDA capture: runs the forward once under HostReads (as the CUDA
    capture's warm-up does) and replays by running it again on the input buffers into one
    output buffer, which each replay overwrites as a CUDA graph's does."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.captures = 0
        self.fail = fail

    def __call__(self, forward: Callable[[], Tensor]) -> Replay:
        self.captures += 1
        if self.fail is not None:
            raise self.fail
        with HostReads("cpu"):
            out = forward()

        def replay() -> Tensor:
            return out.copy_(forward())

        return replay


def ego_graphs(store, model, fanouts, device=CPU) -> EgoGraphs:
    return EgoGraphs.create(store, model, ServingSettings(fanouts=tuple(fanouts)), device)


def batch(ego: EgoGraphs, seeds) -> tuple[PaddedSubgraph, Tensor, Tensor, Tensor | None]:
    padded = pad_subgraph(ego.sample(np.array(seeds))[1])
    x, degree = ego.gather(padded.sub.node)
    return padded, x, degree, ego.edge_features(padded.sub.edge)


def eager(ego: EgoGraphs, seeds) -> Tensor:
    """The seeds' rows of the unpadded ego-graph."""
    sub = ego.sample(np.array(seeds))[1]
    x, degree = ego.gather(sub.node)
    edge_attr = ego.edge_features(sub.edge)
    with torch.inference_mode():
        rows = ego.model(
            x,
            sub.edge_index.to(x.device),
            degree=degree,
            level_sizes=sub.level_sizes,
            edge_attr=edge_attr,
        )
    return rows[: sub.num_seeds]


def edge_gat(store) -> UserNodeModel:
    """PyG's GAT with edge features as a user's model (the trimmed path)."""
    torch.manual_seed(0)
    module = GAT(FEATURES, 8, 2, CLASSES, edge_dim=EDGE_DIM, heads=2).eval()
    config = UserModelConfig(
        model_class="GAT",
        in_dim=FEATURES,
        out_dim=CLASSES,
        num_layers=2,
        edge_input="edge_attr",
        trim=True,
    )
    return UserNodeModel(module, config).eval()


class ReadsOnHost(Wrapping):
    """A user's forward that branches on a tensor's value: a host read."""

    def forward(self, x: Tensor, edge_index: Tensor, **kwargs) -> Tensor:
        if float(x.abs().sum()) > 0:
            return self.inner(x, edge_index, **kwargs)
        return self.inner(x, edge_index, **kwargs)


class SyncsTheDevice(Wrapping):
    """A user's forward that waits for the device: no op HostReads sees, the capture fails."""

    def forward(self, x: Tensor, edge_index: Tensor, **kwargs) -> Tensor:
        torch.cuda.synchronize()
        return self.inner(x, edge_index, **kwargs)


@pytest.mark.parametrize(
    "read",
    [
        lambda x: x.sum().item(),
        lambda x: int(x[0, 0]),
        lambda x: bool(x[0, 0] > 0),
        lambda x: torch.equal(x, x),
        lambda x: x.nonzero(),
        lambda x: x[x[:, 0] > 0],
        lambda x: torch.bincount(x[:, 0].long().abs()),
        lambda x: torch.unique(x),
        lambda x: torch.repeat_interleave(x[:, 0].long().abs()),
    ],
)
def test_host_reads_are_named(read):
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(HostRead), HostReads("cpu"), torch.inference_mode():
        read(x)


def test_ops_sized_by_the_host_are_not_host_reads():
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with HostReads("cpu"), torch.inference_mode():
        torch.where(x > 0, x, 0).index_select(0, torch.tensor([0, 2]))
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        x.new_zeros(4).index_add_(0, torch.tensor([0, 0, 3]), x[:3, 0])
        x[torch.tensor([1, 3])]
    with HostReads("cuda"), torch.inference_mode():
        x.sum().item()  # a CPU tensor read is no sync of the device


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_every_presets_padded_forward_is_capturable(int_store, arch):
    """No host read in the trimmed forward given hop_edges (HostReads raises at the first),
    and every answer equals the unpadded eager forward's."""
    ego = ego_graphs(int_store, random_model(int_store, arch, 2), [3, 3])
    capture = FakeCapture()
    forward = CapturedForward(ego.model, CPU, capture=capture)
    for seeds in ([0, 3, 9], [1, 4, 10], [5, 6, 7, 8, 30, 31, 40]):
        assert torch.allclose(forward(*batch(ego, seeds)), eager(ego, seeds), atol=1e-6)
    assert forward.eager_reason is None and capture.captures == len(forward.keys) >= 1


def test_a_user_model_with_edge_features_is_capturable(tmp_path):
    store = edge_feature_store(tmp_path)
    ego = ego_graphs(store, edge_gat(store), [-1, -1])
    forward = CapturedForward(ego.model, CPU, capture=FakeCapture())
    for seeds in ([0, 5], [2, 7]):
        assert torch.allclose(forward(*batch(ego, seeds)), eager(ego, seeds), atol=1e-6)
    assert forward.eager_reason is None


def test_a_forward_counted_on_the_host_is_not(int_store):
    """Without hop_edges the forward counts each hop's edges on the host: HostReads says so."""
    ego = ego_graphs(int_store, random_model(int_store, "sage", 2), [3, 3])
    padded, x, degree, _ = batch(ego, [0, 3])
    with (
        pytest.raises(HostRead, match="reads tensor data on the host"),
        HostReads("cpu"),
        torch.inference_mode(),
    ):
        ego.model(x, padded.sub.edge_index, degree=degree, level_sizes=padded.sub.level_sizes)


def test_one_graph_per_bucket_and_buffers_refilled_for_each_batch(int_store):
    """Two batches of one bucket replay one graph, each with its own answer, and the first
    answer is not overwritten by the second replay."""
    ego = ego_graphs(int_store, random_model(int_store, "sage", 2), [2, 2])
    capture = FakeCapture()
    forward = CapturedForward(ego.model, CPU, capture=capture)
    first, second = batch(ego, [0, 3]), batch(ego, [1, 4])
    assert BucketKey.of(*first) == BucketKey.of(*second)  # both pad to one bucket
    a = forward(*first)
    b = forward(*second)
    assert capture.captures == 1 and forward.keys == [BucketKey.of(*first)]
    assert torch.allclose(a, eager(ego, [0, 3]), atol=1e-6)
    assert torch.allclose(b, eager(ego, [1, 4]), atol=1e-6)
    assert not torch.allclose(a, b)


def test_bucket_keys_name_every_input_shape(int_store):
    ego = ego_graphs(int_store, random_model(int_store, "sage", 2), [2, 2])
    padded, x, degree, _ = batch(ego, [0, 3])
    key = BucketKey.of(padded, x, degree, None)
    assert key.level_sizes == padded.sub.level_sizes and key.hop_edges == padded.hop_edges
    assert (key.feature_width, key.edge_width, key.degree) == (x.size(1), -1, True)
    assert BucketKey.of(padded, x, None, None) != key
    assert BucketKey.of(padded, x, degree, torch.zeros(padded.sub.num_edges, 2)) != key
    assert BucketKey.of(padded, x.double(), degree, None) != key
    with pytest.raises(ValueError, match="one row per row of the padded ego-graph"):
        BucketKey.of(padded, x[:-1], degree, None)
    with pytest.raises(ValueError, match="one row per edge"):
        BucketKey.of(padded, x, degree, torch.zeros(3, 2))


def test_the_least_recently_used_graph_is_dropped(int_store):
    ego = ego_graphs(int_store, random_model(int_store, "gin", 2), [2, 2])
    capture = FakeCapture()
    forward = CapturedForward(ego.model, CPU, max_graphs=2, capture=capture)
    batches = [batch(ego, seeds) for seeds in ([0], list(range(12)), list(range(40)))]
    keys = [BucketKey.of(*b) for b in batches]
    assert len(set(keys)) == 3
    forward(*batches[0])
    forward(*batches[1])
    forward(*batches[0])  # used again: the most recent
    forward(*batches[2])
    assert forward.keys == [keys[0], keys[2]] and capture.captures == 3
    forward(*batches[1])
    assert forward.keys == [keys[2], keys[1]] and capture.captures == forward.captures == 4
    with pytest.raises(ValueError, match="max_graphs must be at least 1"):
        CapturedForward(ego.model, CPU, max_graphs=0)


def test_a_failed_capture_runs_eager_for_good_and_warns_once(int_store, caplog):
    ego = ego_graphs(int_store, random_model(int_store, "sage", 2), [2, 2])
    capture = FakeCapture(fail=RuntimeError("operation not permitted when stream is capturing"))
    forward = CapturedForward(ego.model, CPU, capture=capture)
    with caplog.at_level(logging.WARNING, logger="handler.gpu.captured_forward"):
        for seeds in ([0, 3], [1, 4], list(range(30))):
            assert torch.allclose(forward(*batch(ego, seeds)), eager(ego, seeds), atol=1e-6)
    assert capture.captures == 1 and forward.keys == []
    assert "operation not permitted" in (forward.eager_reason or "")
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "runs eager from now on" in caplog.records[0].message


def test_a_model_that_reads_on_the_host_falls_back_with_its_answers(int_store, caplog):
    ego = ego_graphs(int_store, ReadsOnHost(random_model(int_store, "gat", 2)), [2, 2])
    forward = CapturedForward(ego.model, CPU, capture=FakeCapture())
    with caplog.at_level(logging.WARNING, logger="handler.gpu.captured_forward"):
        assert torch.allclose(forward(*batch(ego, [0, 3])), eager(ego, [0, 3]), atol=1e-6)
    assert "HostRead" in (forward.eager_reason or "") and len(caplog.records) == 1


def test_an_input_the_model_refuses_raises_its_error_and_keeps_capturing(int_store):
    """A wrong input is the request's failure, not the capture's."""
    ego = ego_graphs(int_store, random_model(int_store, "gcn", 2), [2, 2])
    forward = CapturedForward(ego.model, CPU, capture=FakeCapture())
    padded, x, degree, _ = batch(ego, [0, 3])
    with pytest.raises(ValueError, match="degree must have one entry per row"):
        forward(padded, x, degree.unsqueeze(1), None)  # a shape GCN refuses
    assert forward.eager_reason is None
    assert torch.allclose(forward(padded, x, degree), eager(ego, [0, 3]), atol=1e-6)


def test_on_a_cpu_or_disabled_it_runs_eager(int_store):
    ego = ego_graphs(int_store, random_model(int_store, "gcn", 2), [2, 2])
    for forward in (
        CapturedForward(ego.model, CPU),
        CapturedForward(ego.model, CPU, enabled=False, capture=FakeCapture()),
    ):
        assert torch.allclose(forward(*batch(ego, [0, 3])), eager(ego, [0, 3]), atol=1e-6)
        assert forward.keys == [] and forward.eager_reason


def full_graph_rows(model: torch.nn.Module, store, seeds: list[int], edge_attr=False) -> Tensor:
    """The model's whole-graph forward on the CPU, rows of ``seeds``."""
    x = torch.from_numpy(np.array(store.features))
    edge_index = torch.from_numpy(store.edge_index())
    kwargs = {"edge_attr": torch.from_numpy(np.array(store.edge_features))} if edge_attr else {}
    with torch.inference_mode():
        return copy.deepcopy(model).cpu()(x, edge_index, **kwargs)[seeds]


def assert_captured_is_exact(ego, forward, reference, batches) -> None:
    for seeds in batches:
        captured = forward(*batch(ego, seeds)).cpu()
        assert torch.allclose(captured, eager(ego, seeds).cpu(), atol=1e-5)
        assert torch.allclose(captured, reference(seeds), atol=1e-5)


BATCHES = ([0, 3, 9], [1, 4, 10], [0, 3, 9], list(range(0, 80, 3)), [2, 5, 11])


@needs_cuda
@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_captured_equals_eager_and_the_full_graph_on_a_gpu(int_store, arch):
    model = random_model(int_store, arch, 2)
    ego = ego_graphs(int_store, copy.deepcopy(model), [-1, -1], CUDA)
    forward = CapturedForward(ego.model, CUDA)
    assert_captured_is_exact(
        ego, forward, lambda seeds: full_graph_rows(model, int_store, seeds), BATCHES
    )
    assert forward.eager_reason is None and forward.keys


@needs_cuda
def test_a_user_model_with_edge_features_is_captured_exactly_on_a_gpu(tmp_path):
    store = edge_feature_store(tmp_path)
    model = edge_gat(store)
    ego = ego_graphs(store, copy.deepcopy(model), [-1, -1], CUDA)
    forward = CapturedForward(ego.model, CUDA)
    assert_captured_is_exact(
        ego,
        forward,
        lambda seeds: full_graph_rows(model, store, seeds, edge_attr=True),
        ([0, 5], [2, 7], list(range(0, 90, 4))),
    )
    assert forward.eager_reason is None


@needs_cuda
def test_graphs_dropped_from_the_lru_leave_the_others_exact_on_a_gpu(int_store):
    """Three buckets through two graphs sharing one pool: captured again and again."""
    model = random_model(int_store, "sage", 2)
    ego = ego_graphs(int_store, copy.deepcopy(model), [-1, -1], CUDA)
    forward = CapturedForward(ego.model, CUDA, max_graphs=2)
    batches = [[0], list(range(12)), list(range(0, 80, 2))] * 3
    assert_captured_is_exact(
        ego, forward, lambda seeds: full_graph_rows(model, int_store, seeds), batches
    )
    assert len(forward.keys) == 2 and forward.eager_reason is None


@needs_cuda
@pytest.mark.parametrize("wrapper", [ReadsOnHost, SyncsTheDevice])
def test_a_model_that_syncs_falls_back_on_a_gpu(int_store, wrapper, caplog):
    model = random_model(int_store, "gat", 2)
    ego = ego_graphs(int_store, wrapper(copy.deepcopy(model)), [-1, -1], CUDA)
    forward = CapturedForward(ego.model, CUDA)
    with caplog.at_level(logging.WARNING, logger="handler.gpu.captured_forward"):
        assert_captured_is_exact(
            ego, forward, lambda seeds: full_graph_rows(model, int_store, seeds), BATCHES
        )
    assert forward.eager_reason and forward.keys == [] and len(caplog.records) == 1
    assert torch.ones(3, device=CUDA).sum().item() == 3  # the device still works
