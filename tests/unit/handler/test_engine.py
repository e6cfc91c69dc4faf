"""The batch pipeline: exactness against PyG's full-graph forward, statuses, isolation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from handler.graph.ego import EgoGraphs
from handler.pipeline.batch import apply_threads
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine

from .conftest import make_engine, random_model


def full_graph_probabilities(store, model) -> torch.Tensor:
    x = torch.from_numpy(np.asarray(store.features))
    edge_index = torch.from_numpy(store.edge_index())
    with torch.no_grad():
        return torch.softmax(model(x, edge_index), dim=-1)


def assert_same_answers(got: list[dict], expected: list[dict]) -> None:
    """Equal up to float32 rounding: BLAS kernels vary with the number of rows in a batch."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert {k: v for k, v in a.items() if k != "probabilities"} == {
            k: v for k, v in b.items() if k != "probabilities"
        }
        assert np.allclose(a["probabilities"], b["probabilities"], rtol=0, atol=1e-6)


def body(payload) -> dict:
    return {"body": payload}


def served(engine: NodeClassificationEngine, payloads: list) -> list:
    return engine.handle([body(p) for p in payloads])


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
@pytest.mark.parametrize("num_layers", [2, 3])
def test_full_fanouts_equal_full_graph_forward(int_store, arch, num_layers):
    model = random_model(int_store, arch, num_layers, seed=num_layers)
    engine = make_engine(int_store, model=model, fanouts=[-1] * num_layers)
    expected = full_graph_probabilities(int_store, model)
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    # one request per node, all in one batch, plus one list request with every node
    responses = served(engine, [{"node_id": i} for i in ids] + [{"node_ids": ids}])
    assert all(r.status == 200 for r in responses)
    singles = torch.tensor([r.body["probabilities"] for r in responses[:-1]])
    listed = torch.tensor([p["probabilities"] for p in responses[-1].body["predictions"]])
    assert (singles - expected).abs().max() <= 1e-5
    assert (listed - expected).abs().max() <= 1e-5
    assert [r.body["predicted_class"] for r in responses[:-1]] == expected.argmax(1).tolist()


def test_gcn_needs_full_graph_degrees(int_store, monkeypatch):
    """The exactness test has teeth: subgraph degrees would give different GCN answers."""
    model = random_model(int_store, "gcn")
    engine = make_engine(int_store, model=model)
    # pretend every node had no edges
    monkeypatch.setattr(
        type(engine.store), "degree_rows", lambda _, nodes: np.zeros(len(nodes), dtype=np.int64)
    )
    expected = full_graph_probabilities(int_store, model)
    responses = served(engine, [{"node_id": 0}])
    assert (torch.tensor(responses[0].body["probabilities"]) - expected[0]).abs().max() > 1e-4


def test_response_shape_single_and_list(int_store):
    engine = make_engine(int_store)
    single, listed = served(engine, [{"node_id": 3}, {"node_ids": [3, 6, 3]}])
    assert set(single.body) == {
        "node_id",
        "predicted_class",
        "predicted_label",
        "probabilities",
        "model_version",
    }
    assert single.body["node_id"] == 3 and single.body["model_version"] == "1.0"
    assert single.body["predicted_label"] in ("fraud", "legit", "review")
    assert abs(sum(single.body["probabilities"]) - 1) < 1e-5
    assert [p["node_id"] for p in listed.body["predictions"]] == [3, 6, 3]
    assert listed.body["model_version"] == "1.0"
    assert listed.body["predictions"][0] == single.body
    json.dumps(listed.body)  # serializable as is


def test_string_ids_are_echoed_with_their_type(str_store):
    engine = make_engine(str_store)
    single, listed = served(engine, [{"node_id": "acct_7"}, {"node_ids": ["acct_1", "acct_2"]}])
    assert single.status == 200 and single.body["node_id"] == "acct_7"
    assert [p["node_id"] for p in listed.body["predictions"]] == ["acct_1", "acct_2"]


def test_int_graph_accepts_canonical_numeric_strings_and_echoes_them(int_store):
    engine = make_engine(int_store)
    as_int, as_str = served(engine, [{"node_id": 9}, {"node_id": "9"}])
    assert as_str.status == 200 and as_str.body["node_id"] == "9"
    assert as_str.body["probabilities"] == as_int.body["probabilities"]


BAD_REQUESTS = [
    (b"{not json", 400, "BadRequest"),
    (b"\xff\xfe", 400, "BadRequest"),
    ("[1, 2]", 400, "BadRequest"),
    ({"node_id": 3, "node_ids": [3]}, 400, "BadRequest"),
    ({"node_ids": []}, 400, "BadRequest"),
    ({"node_id": True}, 400, "BadRequest"),
    ({"node_id": 1.5}, 400, "BadRequest"),
    ({"node_ids": [1, None]}, 400, "BadRequest"),
    ({"nodes": [1]}, 400, "BadRequest"),
    ({}, 400, "BadRequest"),
    (b'{"node_id": NaN}', 400, "BadRequest"),
    ({"node_id": 1}, 404, "NotFound"),  # int IDs are multiples of 3
    ({"node_ids": [0, "acct_0", 2**70]}, 404, "NotFound"),
    ({"node_ids": list(range(0, 3 * 40, 3))}, 413, "TooLarge"),
]


@pytest.mark.parametrize(("payload", "status", "kind"), BAD_REQUESTS)
def test_bad_requests_get_their_status_and_json_body(int_store, payload, status, kind):
    engine = make_engine(int_store, max_ids_per_request=32)
    (response,) = served(engine, [payload])
    assert response.status == status
    assert response.body["code"] == status and response.body["type"] == kind
    assert isinstance(response.body["message"], str) and response.body["message"]


def test_not_found_lists_the_missing_ids(int_store):
    engine = make_engine(int_store)
    (response,) = served(engine, [{"node_ids": [0, 1, "nope", 3]}])
    assert "1" in response.body["message"] and "'nope'" in response.body["message"]


def test_bad_requests_never_fail_their_batch(int_store):
    engine = make_engine(int_store, fanouts=[4, 2], max_ids_per_request=4)
    good = [{"node_id": 0}, {"node_ids": [3, 6]}, {"node_id": 9}]
    alone = [served(engine, [p])[0].body for p in good]
    mixed = [good[0], b"oops", {"node_id": 1}, good[1], {"node_ids": [0] * 9}, good[2], "null"]
    responses = served(engine, mixed)
    assert [r.status for r in responses] == [200, 400, 404, 200, 413, 200, 400]
    singles = [responses[i].body for i in (0, 5)]
    assert_same_answers(singles, [alone[0], alone[2]])
    assert_same_answers(responses[3].body["predictions"], alone[1]["predictions"])


def test_sampled_answers_do_not_depend_on_the_batch(int_store):
    engine = make_engine(int_store, fanouts=[3, 2])
    alone = served(engine, [{"node_id": 0}])[0].body
    others = [{"node_id": i} for i in range(3, 150, 3)]
    together = served(engine, [*others[:20], {"node_id": 0}, *others[20:]])
    assert_same_answers([together[20].body], [alone])
    fresh_worker = make_engine(int_store, model=engine.model, fanouts=[3, 2])
    assert_same_answers([served(fresh_worker, [{"node_id": 0}])[0].body], [alone])


def test_union_over_the_limit_is_served_request_by_request(int_store):
    engine = make_engine(int_store, max_subgraph_nodes=60)
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    isolated = ids[-6:]  # ego-graph of one node each
    responses = served(engine, [{"node_id": i} for i in isolated] + [{"node_ids": ids}])
    assert [r.status for r in responses] == [200] * 6 + [413]
    assert responses[-1].body["type"] == "TooLarge"
    roomy = make_engine(int_store, model=engine.model)
    expected = served(roomy, [{"node_id": i} for i in isolated])
    assert_same_answers([r.body for r in responses[:6]], [r.body for r in expected])


class FailsOnBatches(torch.nn.Module):
    """A model that breaks whenever it sees more than one seed's subgraph."""

    def __init__(self, inner: torch.nn.Module, max_rows: int) -> None:
        super().__init__()
        self.inner = inner
        self.max_rows = max_rows

    def forward(self, x, edge_index, degree=None, level_sizes=None):
        if x.shape[0] > self.max_rows:
            raise RuntimeError("simulated failure")
        return self.inner(x, edge_index, degree=degree, level_sizes=level_sizes)


def test_unexpected_failure_is_isolated_per_request(int_store):
    inner = random_model(int_store, "sage")
    reference = make_engine(int_store, model=inner)
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    payloads = [{"node_id": ids[-1]}, {"node_id": ids[-2]}, {"node_id": ids[0]}]
    expected = served(reference, payloads)
    # isolated nodes have 1-row subgraphs; node 0 (a hub) has many rows and keeps failing
    engine = make_engine(int_store, model=FailsOnBatches(inner, max_rows=1))
    responses = served(engine, payloads)
    assert [r.status for r in responses] == [200, 200, 500]
    assert responses[2].body["type"] == "InternalError"
    assert_same_answers([r.body for r in responses[:2]], [r.body for r in expected[:2]])


def test_form_encoded_body_gets_a_content_type_hint(int_store):
    engine = make_engine(int_store)
    (response,) = engine.handle([{'{"node_id": 3}': b""}])
    assert response.status == 400 and "Content-Type: application/json" in response.body["message"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_answers_like_the_cpu_engine(int_store):
    model = random_model(int_store, "gat")
    on_cpu = make_engine(int_store, model=model, fanouts=[4, 3])
    gpu = torch.device("cuda:0")
    ego = EgoGraphs.create(int_store, random_model(int_store, "gat"), on_cpu.settings, gpu)
    on_gpu = NodeClassificationEngine(ego, "1.0")
    on_gpu.model.load_state_dict(model.state_dict())
    payloads = [{"node_id": i} for i in range(0, 90, 3)]
    assert_same_answers(
        [r.body for r in served(on_gpu, payloads)], [r.body for r in served(on_cpu, payloads)]
    )


def test_a_task_sets_the_workers_torch_threads():
    before = torch.get_num_threads()
    try:
        apply_threads(ServingSettings.from_yaml_section({"torch_threads": 1}))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        apply_threads(ServingSettings.from_yaml_section({"torch_threads": 0}))  # 0: torch's own
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_cuda_full_fanouts_equal_full_graph_forward(int_store, arch):
    """Exactness on a GPU worker: sampled on the GPU, features gathered from the host."""
    model = random_model(int_store, arch)
    expected = full_graph_probabilities(int_store, model)
    settings = make_engine(int_store, model=model).settings
    ego = EgoGraphs.create(
        int_store, random_model(int_store, arch), settings, torch.device("cuda:0")
    )
    engine = NodeClassificationEngine(ego, "1.0")
    engine.model.load_state_dict(model.state_dict())
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    responses = served(engine, [{"node_id": i} for i in ids])
    served_probabilities = torch.tensor([r.body["probabilities"] for r in responses])
    assert (served_probabilities - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_trimming_layers_to_needed_rows_keeps_the_seed_answers(int_store, arch):
    model = random_model(int_store, arch, num_layers=3)
    engine = make_engine(int_store, model=model, fanouts=[4, 3, 2])
    sub = engine.sampler.sample(torch.arange(0, 30))
    x, degree = engine.ego.gather(sub.node)
    with torch.no_grad():
        full = model(x, sub.edge_index, degree=degree)
        trimmed = model(x, sub.edge_index, degree=degree, level_sizes=sub.level_sizes)
    assert trimmed.shape[0] < full.shape[0]  # the last layer ran on fewer rows
    assert torch.allclose(trimmed[: sub.num_seeds], full[: sub.num_seeds], atol=1e-5)
