"""A GPU worker's node engine pads each batch's ego-graph and runs its forward as a captured
graph per bucket; here the capture is the CPU stand-in, so the engine's own path (padding,
gathering padding rows, the seeds' rows) is checked against the plain engine."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from handler.gpu.captured_forward import CapturedForward
from handler.gpu.padding import PaddedSubgraph

from .conftest import NUM_NODES, make_engine, random_model
from .test_captured_forward import FakeCapture


def requests(seed: int, count: int = 12) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"body": {"node_ids": (rng.integers(0, NUM_NODES, rng.integers(1, 6)) * 3).tolist()}}
        for _ in range(count)
    ]


@pytest.mark.parametrize("arch", ["sage", "gcn", "gat", "gin"])
@pytest.mark.parametrize("fanouts", [[3, 3], [-1, -1]])
def test_captured_engine_answers_as_the_plain_engine(int_store, arch, fanouts):
    model = random_model(int_store, arch)
    plain = make_engine(int_store, model=model, fanouts=fanouts)
    engine = make_engine(int_store, model=copy.deepcopy(model), fanouts=fanouts)
    capture = FakeCapture()
    engine.captured = CapturedForward(engine.model, torch.device("cpu"), capture=capture)
    for seed in range(3):
        items = requests(seed)
        prepared = engine.prepare(items)
        assert all(isinstance(group.payload[1], PaddedSubgraph) for group in prepared.groups)
        answers = engine.respond(engine.run(prepared))
        for mine, theirs in zip(answers, plain.handle(items), strict=True):
            assert mine.status == theirs.status == 200
            for a, b in zip(mine.body["predictions"], theirs.body["predictions"], strict=True):
                assert a["node_id"] == b["node_id"]
                assert np.allclose(a["probabilities"], b["probabilities"], atol=1e-6)
    assert capture.captures >= 1 and engine.captured.eager_reason is None


def test_cpu_workers_run_the_forward_uncaptured(int_store):
    engine = make_engine(int_store, model=random_model(int_store, "sage"), fanouts=[3, 3])
    assert engine.captured is None
