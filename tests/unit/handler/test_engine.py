"""The node engine's batch pipeline, on a graph of one node type and of several: exactness
against the full-graph forward, statuses, isolation; on several types, answers carry the node
type and a request for a type the archive does not answer is a 400 naming the types."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from handler.graph.ego import EgoGraphs
from handler.pipeline.batch import apply_threads
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.task import node_router
from model.typed_graph import whole_graph_input
from tests.served_wrapper import Wrapping
from tests.typed_graphs import fraud_store, node_recipe

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


def answers(engine: NodeClassificationEngine, payloads: list) -> list[tuple[int, dict]]:
    return [(r.status, r.body) for r in served(engine, payloads)]


ONE_TYPE, TYPED = "one-type", "typed"
TYPED_ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_engine") / "store", 120, 20, 50, 400, 3)


@dataclass(frozen=True)
class Schema:
    """A graph of one node type or of several as the node engine answers on it: the nodes it
    answers (every node; the target type's), their type in an answer (None: not named), and
    how many ids a list request of the exactness test carries."""

    name: str
    store: GraphStore
    node_type: str | None
    list_size: int

    @property
    def ids(self) -> list:
        typed = self.node_type is not None
        count = self.store.schema.target_type.num_nodes if typed else self.store.num_nodes
        return self.store.external_ids(np.arange(count))

    def model(self, arch: str, num_layers: int = 2, seed: int = 0) -> torch.nn.Module:
        """A seeded random model (one type) or recipe (several types, two layers)."""
        if self.node_type is None:
            return random_model(self.store, arch, num_layers, seed=seed)
        assert num_layers == 2, "the typed recipes of these tests have two layers"
        return node_recipe(self.store, arch)

    def expected(self, model: torch.nn.Module) -> torch.Tensor:
        """The full-graph probabilities of the answered nodes, in order."""
        if self.node_type is None:
            return full_graph_probabilities(self.store, model)
        with torch.no_grad():
            return torch.softmax(model(whole_graph_input(self.store)), dim=-1)


@pytest.fixture
def schema(request: pytest.FixtureRequest, int_store: GraphStore, typed_store: GraphStore):
    if request.param == ONE_TYPE:
        return Schema(ONE_TYPE, int_store, None, int_store.num_nodes)
    return Schema(TYPED, typed_store, "user", 16)


FULL = [(ONE_TYPE, arch, layers) for arch in ["gcn", "sage", "gat", "gin"] for layers in (2, 3)]
FULL += [(TYPED, arch, 2) for arch in TYPED_ARCHS]


@pytest.mark.parametrize(("schema", "arch", "num_layers"), FULL, indirect=["schema"])
def test_full_fanouts_equal_full_graph_forward(schema: Schema, arch: str, num_layers: int):
    """Every answered node asked alone, all in one batch, and again in list requests (one
    type: one list of every node; several: lists of 16): gcn through full-graph degrees (one
    type) or its boundary rows (several)."""
    model = schema.model(arch, num_layers, seed=num_layers)
    engine = make_engine(schema.store, model=model, fanouts=[-1] * num_layers)
    expected = schema.expected(model)
    ids, size = schema.ids, schema.list_size
    lists = [{"node_ids": ids[start : start + size]} for start in range(0, len(ids), size)]
    responses = served(engine, [{"node_id": i} for i in ids] + lists)
    assert all(r.status == 200 for r in responses), [r.body for r in responses if r.status != 200]
    singles = [r.body for r in responses[: len(ids)]]
    listed = [p for r in responses[len(ids) :] for p in r.body["predictions"]]
    for given in (singles, listed):
        assert all(a.get("node_type") == schema.node_type for a in given)
        got = torch.tensor([a["probabilities"] for a in given])
        assert (got - expected).abs().max() <= 1e-5
        assert [a["predicted_class"] for a in given] == expected.argmax(1).tolist()


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


# fanouts, and the answered node (its index) asked alone and in batches
SAMPLED = {ONE_TYPE: ([3, 2], 0), TYPED: ([2, 2], 3)}


@pytest.mark.parametrize("schema", [ONE_TYPE, TYPED], indirect=True)
def test_sampled_answers_do_not_depend_on_the_batch(schema: Schema):
    """The same ego-graph whatever the batch, the request or the worker; the sums over it may
    round in another order (<= 1e-6)."""
    fanouts, index = SAMPLED[schema.name]
    model = schema.model("sage")
    engine = make_engine(schema.store, model=model, fanouts=fanouts)
    ids = schema.ids
    probe = ids[index]
    alone, again = (served(engine, [{"node_id": probe}])[0] for _ in range(2))
    assert alone.status == 200 and alone.body == again.body
    others = [{"node_id": i} for i in ids[1:50] if i != probe]
    named = [] if schema.node_type is None else [{"node_id": probe, "node_type": schema.node_type}]
    batch = [*others[:20], {"node_id": probe}, *others[20:], {"node_ids": ids[:10]}, *named]
    together = served(engine, batch)
    assert all(r.status == 200 for r in together), [r.body for r in together]
    asked = [together[20], *together[len(others) + 2 :]]  # the probe alone, and by its type
    assert_same_answers([r.body for r in asked], [alone.body] * len(asked))
    listed = together[len(others) + 1].body["predictions"][index]
    assert listed["predicted_class"] == alone.body["predicted_class"]
    gap = torch.tensor(listed["probabilities"]) - torch.tensor(alone.body["probabilities"])
    assert float(gap.abs().max()) <= 1e-6
    fresh_worker = make_engine(schema.store, model=model, fanouts=fanouts)
    assert_same_answers([served(fresh_worker, [{"node_id": probe}])[0].body], [alone.body])


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


class FailsOnBatches(Wrapping):
    """A model that breaks whenever it sees more than one seed's subgraph."""

    def __init__(self, inner: torch.nn.Module, max_rows: int) -> None:
        super().__init__(inner)
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


# Several node types only: the type a request names, per-relation fanouts, extras, KServe v2.


def test_a_type_the_archive_does_not_answer_is_refused(typed_store: GraphStore) -> None:
    engine = make_engine(typed_store, model=node_recipe(typed_store, "rgcn"), fanouts=[2, 2])
    [(status, body), (fine, _)] = answers(
        engine, [{"node_id": 1000, "node_type": "merchant"}, {"node_id": "u1"}]
    )
    assert status == 400 and "answers for 'user' nodes" in body["message"]
    assert "merchant" in body["message"] and "device" in body["message"] and fine == 200
    [(status, body)] = answers(engine, [{"node_id": "u1", "node_type": "card"}])
    assert status == 400 and "'card'" in body["message"]


def test_per_relation_fanouts_reach_the_model(typed_store: GraphStore, tmp_path: Path) -> None:
    """Full fanouts on every relation but one: answers differ from full neighbourhoods only
    through that relation."""
    model = node_recipe(typed_store, "sage")
    settings = ServingSettings.from_yaml_section(
        {"fanouts": [-1, -1], "relation_fanouts": {"merchant__rev_pays__user": [1, 1]}}
    )
    limited = NodeClassificationEngine.create(
        typed_store, model, settings, torch.device("cpu"), "1.0"
    )
    full = make_engine(typed_store, model=model, fanouts=[-1, -1])
    ids = typed_store.external_ids(torch.arange(typed_store.schema.target_type.num_nodes).numpy())
    [(_, some)] = answers(limited, [{"node_ids": ids}])
    [(_, every)] = answers(full, [{"node_ids": ids}])
    differ = [
        a["node_id"]
        for a, b in zip(some["predictions"], every["predictions"], strict=True)
        if a["probabilities"] != b["probabilities"]
    ]
    assert differ, "a fanout of 1 on rev_pays changed no answer"


def test_embeddings_come_from_the_typed_forward_and_the_rest_is_refused(
    typed_store: GraphStore,
) -> None:
    model = node_recipe(typed_store, "hgt")
    engine = make_engine(typed_store, model=model, fanouts=[-1, -1])
    router = node_router(engine, "1.0")
    with torch.no_grad():
        expected, embedding = model.forward_with_embedding(whole_graph_input(typed_store))
    body = {"node_ids": ["u3", "u7"], "node_type": "user", "return_embedding": True}
    [answer] = router.handle([{"body": body}])
    assert answer.status == 200, answer.body
    got = answer.body["predictions"]
    rows = typed_store.lookup(["u3", "u7"])
    assert got[0]["node_type"] == "user"
    assert torch.allclose(torch.tensor([p["embedding"] for p in got]), embedding[rows], atol=1e-5)
    probabilities = torch.softmax(expected[rows], dim=-1)
    assert torch.allclose(torch.tensor([p["probabilities"] for p in got]), probabilities, atol=1e-5)
    new_node = {"new_node": {"x": [0.0] * typed_store.feature_dim, "neighbors": ["u1"]}}
    [cold] = router.handle([{"body": new_node}])
    assert cold.status == 400 and "several relations" in cold.body["message"]  # by relation
    [explained] = router.handle([{"body": {"node_id": "u1"}}], explain=[True])
    assert explained.status == 200 and explained.body["node_type"] == "user"


def test_kserve_v2_requests_name_the_type_as_a_parameter_and_answers_name_it_as_an_output(
    typed_store: GraphStore,
) -> None:
    engine = make_engine(typed_store, model=node_recipe(typed_store, "sage"), fanouts=[2, 2])

    def v2(request_parameters: dict, tensor_parameters: dict) -> dict:
        tensor = {"name": "node_ids", "shape": [2], "datatype": "BYTES", "data": ["u1", "u2"]}
        return {
            "inputs": [{**tensor, "parameters": tensor_parameters}],
            "parameters": request_parameters,
        }

    [(status, body), (tensor_level, _), (grpc, _)] = answers(
        engine,
        [
            v2({"node_type": "user"}, {}),
            v2({}, {"node_type": "user"}),
            v2({"node_type": {"string_param": "user"}}, {}),
        ],
    )
    assert (status, tensor_level, grpc) == (200, 200, 200), body
    outputs = {tensor["name"]: tensor for tensor in body["outputs"]}
    assert outputs["node_id"]["data"] == ["u1", "u2"]
    assert outputs["node_type"] == {
        "name": "node_type",
        "datatype": "BYTES",
        "shape": [2],
        "data": ["user", "user"],
    }
    [(wrong, message), (twice, conflict)] = answers(
        engine, [v2({"node_type": "merchant"}, {}), v2({"node_type": "user"}, {"node_type": "x"})]
    )
    assert wrong == 400 and "answers for 'user' nodes" in message["message"]
    assert twice == 400 and "different values" in conflict["message"]
