"""Faults inside the pipeline: out-of-memory, model bugs and device errors, one request at a time.

The integration tests (tests/integration/test_faults.py) drive the same faults through a real
TorchServe; here each is pinned down on the engine alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handler.pipeline.batch import DeviceFailure, is_fatal_device_error
from tests.served_wrapper import Wrapping

from .conftest import make_engine, random_model


class FailsOnNode(Wrapping):
    """Raises ``error`` whenever the feature row of one chosen node is in its input."""

    def __init__(self, inner: torch.nn.Module, marker: torch.Tensor, error: BaseException):
        super().__init__(inner)
        self.marker, self.error = marker, error

    def forward(self, x, edge_index, degree=None, level_sizes=None):
        if bool((x == self.marker).all(dim=1).any()):
            raise self.error
        return self.inner(x, edge_index, degree=degree, level_sizes=level_sizes)


def assert_same_answers(got: list[dict], expected: list[dict]) -> None:
    """Equal answers; probabilities within float32 rounding, since a batch computed in another
    grouping may sum in another order (seen on AMD EPYC: 2.5e-8 apart)."""
    assert len(got) == len(expected)
    for answer, reference in zip(got, expected, strict=True):
        for key in set(answer) | set(reference):
            if key in ("probabilities", "predictions"):
                continue
            assert answer[key] == reference[key], key
        pairs = [(answer, reference)]
        if "predictions" in answer:
            pairs = list(zip(answer["predictions"], reference["predictions"], strict=True))
        for one, other in pairs:
            assert {k: v for k, v in one.items() if k != "probabilities"} == {
                k: v for k, v in other.items() if k != "probabilities"
            }
            np.testing.assert_allclose(one["probabilities"], other["probabilities"], atol=1e-6)


def isolated_ids(store) -> list:
    """IDs of the conftest graph's six edgeless nodes: each one's ego-graph is itself alone."""
    return store.external_ids(np.flatnonzero(np.diff(store.indptr) + store.out_degree == 0))


def engine_failing_on(store, node, error):
    inner = random_model(store, "sage")
    row = torch.from_numpy(np.array(store.features[store.lookup([node])[0]]))
    return make_engine(store, model=FailsOnNode(inner, row, error)), make_engine(store, model=inner)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (MemoryError(), "ran out of memory during model"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "out of memory"),
        (RuntimeError("CUDA error: out of memory"), "out of memory"),
        (ValueError("a bug"), "the model failed on this request"),
    ],
    ids=["host-oom", "cuda-oom", "cuda-oom-runtime", "bug"],
)
def test_a_failing_request_gets_500_and_its_batch_is_answered(int_store, error, message):
    poisoned, *others = isolated_ids(int_store)
    engine, reference = engine_failing_on(int_store, poisoned, error)
    payloads = [{"body": {"node_id": node}} for node in [others[0], poisoned, others[1]]]
    payloads.append({"body": {"node_ids": others[2:]}})
    responses = engine.handle(payloads)
    assert [r.status for r in responses] == [200, 500, 200, 200]
    assert responses[1].body["type"] == "InternalError" and message in responses[1].body["message"]
    expected = reference.handle([payloads[i] for i in (0, 2, 3)])
    assert_same_answers([r.body for r in responses if r.status == 200], [r.body for r in expected])
    # the engine is still fine afterwards
    assert_same_answers([engine.handle(payloads[:1])[0].body], [expected[0].body])


@pytest.mark.parametrize(
    "error",
    [
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: device-side assert triggered"),
    ],
    ids=["accelerator-error", "runtime-error"],
)
def test_a_sticky_device_error_ends_the_worker(int_store, error):
    poisoned, other = isolated_ids(int_store)[:2]
    engine, _ = engine_failing_on(int_store, poisoned, error)
    with pytest.raises(DeviceFailure) as info:
        engine.handle([{"body": {"node_id": other}}, {"body": {"node_id": poisoned}}])
    assert isinstance(info.value, SystemExit) and info.value.code == 1
    assert info.value.error is error


def test_only_non_memory_device_errors_are_fatal():
    assert is_fatal_device_error(torch.AcceleratorError("CUDA error: unspecified launch failure"))
    assert is_fatal_device_error(RuntimeError("CUDA error: misaligned address"))
    assert not is_fatal_device_error(torch.OutOfMemoryError("CUDA out of memory"))
    assert not is_fatal_device_error(RuntimeError("CUDA error: out of memory"))
    assert not is_fatal_device_error(MemoryError())
    assert not is_fatal_device_error(ValueError("CUDA error"))
    assert not is_fatal_device_error(RuntimeError("shape mismatch"))


def test_a_sampling_failure_is_isolated_per_request(int_store, monkeypatch):
    poisoned, *others = isolated_ids(int_store)
    engine = make_engine(int_store)
    reference = make_engine(int_store, model=engine.model)
    bad_index = int(int_store.lookup([poisoned])[0])
    sample = engine.sampler.sample

    def failing(seeds):
        if bad_index in seeds.tolist():
            raise MemoryError
        return sample(seeds)

    monkeypatch.setattr(engine.sampler, "sample", failing)
    payloads = [{"body": {"node_id": node}} for node in [others[0], poisoned, others[1]]]
    responses = engine.handle(payloads)
    assert [r.status for r in responses] == [200, 500, 200]
    assert "ran out of memory during sampling" in responses[1].body["message"]
    expected = reference.handle([payloads[0], payloads[2]])
    assert_same_answers([responses[0].body, responses[2].body], [r.body for r in expected])


def test_a_lookup_failure_is_isolated_per_request(int_store, monkeypatch):
    """The batch's IDs are looked up in one call; when that call fails, each request is looked
    up alone, so only the request that breaks the lookup gets a 500."""
    poisoned, *others = isolated_ids(int_store)
    engine = make_engine(int_store)
    lookup = type(int_store).lookup

    def failing(store, ids, node_type=None):
        if poisoned in list(ids):
            raise RuntimeError("corrupt ID page")
        return lookup(store, ids, node_type)

    monkeypatch.setattr(type(int_store), "lookup", failing)
    payloads = [{"body": {"node_id": node}} for node in [others[0], poisoned, others[1]]]
    responses = engine.handle(payloads)
    assert [r.status for r in responses] == [200, 500, 200]
    assert responses[1].body["type"] == "InternalError"
    assert [responses[0].body["node_id"], responses[2].body["node_id"]] == [others[0], others[1]]
