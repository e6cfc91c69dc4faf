"""A user's own model class through build_mar.sh and TorchServe: the model file travels in the
archive, edge features reach the model, the served answers equal the model's full-graph forward,
describe shows the build-time verification, and bad models are refused at build in one line; PyG's
heterogeneous recipe with lazy layers builds and answers a cold-start node."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from graph_assets import open_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from model.export import load_model
from model.served import answer_rows
from model.served_hetero import small_typed_input
from model.typed_graph import whole_graph_input
from model.user_model import Output, import_model_class, instantiate
from tests.edge_graph import CLASSES, EDGE_DIM, FEATURES, write_edge_feature_csv
from tests.servers.torchserve import Register, TorchServe
from tests.typed_cold_start_reference import with_new_node
from tests.unit.archive_build import pyg_catalogue, pyg_user_models, user_models

from .archives import ROOT, concurrently

pytestmark = pytest.mark.integration
ARGS = {"in_channels": FEATURES, "hidden": 16, "classes": CLASSES, "edge_dim": EDGE_DIM}
BASIC = {"in_channels": FEATURES, "hidden_channels": 16, "num_layers": 2, "out_channels": CLASSES}
# More of the matrix (tests/unit/archive_build/test_own_model.py has all of it in process),
# through build_mar.sh and TorchServe: name -> (class, constructor arguments).
MATRIX: dict[str, tuple[str, dict[str, object]]] = {
    "gcn": ("torch_geometric.nn.models.GCN", {**BASIC, "act": "tanh"}),
    "gatv2e": ("torch_geometric.nn.models.GAT", {**BASIC, "v2": True, "edge_dim": EDGE_DIM}),
    "gin": ("torch_geometric.nn.models.GIN", {**BASIC, "num_layers": 3}),
    "appnp": ("Appnp", {"in_channels": FEATURES, "hidden": 16, "classes": CLASSES, "k": 3}),
    "gated": ("GatedGraphConv", {"in_channels": FEATURES, "hidden": 16, "classes": CLASSES}),
}
# A sample of PyG's catalogue (tests/unit/archive_build/test_pyg_catalogue.py serves all of it
# in process), on the catalogue's graph: archive name -> (the catalogue's case, its hops).
CATALOGUE_SAMPLE = {
    "cat_gine": ("GINEConv", 1),
    "cat_sage_bn": ("GraphSAGE(norm='batch_norm')", 2),
}
CATALOGUE = {case.name: case for case in pyg_catalogue.CATALOGUE}


def build(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "build_mar.sh"), *options],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fraud.mar (EdgeMix from a model file, class scores) and risk.mar (stock GraphSAGE by its
    dotted path, raw outputs), both with full fanouts."""
    root = tmp_path_factory.mktemp("own_model")
    graph = write_edge_feature_csv(root / "graph")
    shutil.copy(user_models.__file__, root / "fraud_model.py")  # the user's file, by itself
    torch.manual_seed(0)
    torch.save(user_models.EdgeMix(**ARGS).state_dict(), root / "fraud.pt")
    sage_args = {"in_channels": FEATURES, "hidden_channels": 8, "num_layers": 2, "out_channels": 1}
    from torch_geometric.nn.models import GraphSAGE

    torch.save(GraphSAGE(**sage_args, aggr="max").state_dict(), root / "risk.pt")
    common = ("--graph", str(graph), "--export-path", str(root / "store"), "--batch-size", "4")
    builds = {
        "fraud": functools.partial(
            build, *common, "--name", "fraud", "--model-file", str(root / "fraud_model.py"),
            "--model-class", "EdgeMix", "--model-args", json.dumps(ARGS),
            "--weights", str(root / "fraud.pt"), "--fanouts", "-1,-1,-1",
        ),
        "risk": functools.partial(
            build, *common, "--name", "risk", "--model-class",
            "torch_geometric.nn.models.GraphSAGE", "--model-args",
            json.dumps({**sage_args, "aggr": "max"}), "--output", "raw",
            "--weights", str(root / "risk.pt"), "--fanouts", "-1,-1",
        ),
    }  # fmt: skip
    for name, (model_class, args) in MATRIX.items():
        torch.manual_seed(1)
        module = instantiate(import_model_class(model_class, model_file(model_class)), args)
        torch.save(module.state_dict(), root / f"{name}.pt")
        where = ("--model-file", str(user_models.__file__)) if "." not in model_class else ()
        if name == "gcn":  # GCN takes edge_weight: trained without the graph's edge features
            where = ("--edge-input", "none")
        builds[name] = functools.partial(
            build, *common, "--name", name, "--model-class", model_class, *where,
            "--model-args", json.dumps(args), "--weights", str(root / f"{name}.pt"),
            "--fanouts", ",".join(["-1"] * (3 if name in ("gin", "appnp") else 2)),
        )  # fmt: skip
    catalogue_graph = pyg_catalogue.write_graph(root / "catalogue", pyg_catalogue.ATTR_DIM)
    for name, (case, hops) in CATALOGUE_SAMPLE.items():
        builds[name] = build_catalogue_case(
            catalogue_graph, root / "store", name, CATALOGUE[case], hops
        )
    results = dict(zip(builds, concurrently(*builds.values()), strict=True))
    for name, result in results.items():
        assert result.returncode == 0, f"{name}: {result.stderr}"
    assert "3 hops (inferred" in results["fraud"].stdout
    assert "edge_attr (2 wide)" in results["fraud"].stdout
    assert "worst |served - full-graph forward|" in results["fraud"].stdout
    return root


def build_catalogue_case(
    graph: Path, export: Path, name: str, case: pyg_catalogue.Case, hops: int
) -> Callable[[], subprocess.CompletedProcess[str]]:
    """The build of ``case`` as a user's model with its catalogue norm statistics, full
    fanouts (its weights written now, the build run when called)."""
    torch.manual_seed(0)
    module = instantiate(
        import_model_class(case.model_class, model_file(case.model_class)), case.args
    )
    weights = export.parent / f"{name}.pt"
    torch.save(pyg_catalogue.with_statistics(module).state_dict(), weights)
    where = () if "." in case.model_class else ("--model-file", str(pyg_catalogue.__file__))
    return functools.partial(
        build,
        "--graph", str(graph), "--export-path", str(export), "--batch-size", "4",
        "--name", name, "--model-class", case.model_class, *where,
        "--model-args", json.dumps(case.args), "--weights", str(weights),
        "--edge-input", case.edge, "--output", "raw", "--fanouts", ",".join(["-1"] * hops),
    )  # fmt: skip


def model_file(model_class: str) -> Path | None:
    if model_class == "Catalogued":
        return Path(pyg_catalogue.__file__)
    return None if "." in model_class else Path(user_models.__file__)


@pytest.fixture(scope="module")
def server(register: Register, built: Path) -> Iterator[TorchServe]:
    with register(built / "store", ["fraud", "risk", *MATRIX, *CATALOGUE_SAMPLE]) as started:
        yield started


def full_graph(built: Path, name: str, output: Output) -> tuple[list[str], torch.Tensor]:
    """The archive's own graph and the user's module with the archive's weights, whole-graph."""
    work = built / f"unpacked_{name}"
    if not work.exists():
        zipfile.ZipFile(built / "store" / f"{name}.mar").extractall(work)
    store = open_store(work / "graph")
    config = json.loads((work / "model_config.json").read_text())
    cls = import_model_class(config["model_class"], model_file(config["model_class"]))
    module = instantiate(cls, config["model_args"])
    module.load_state_dict(torch.load(work / "model.pt", weights_only=True))
    x = torch.from_numpy(np.array(store.features))
    edge_index = torch.from_numpy(store.edge_index())
    extra = {}
    if config["edge_input"] == "edge_attr":
        extra["edge_attr"] = torch.from_numpy(np.array(store.edge_features))
    with torch.no_grad():
        rows = answer_rows(module.eval()(x, edge_index, **extra), output)
    return store.external_ids(np.arange(store.num_nodes)), rows


def post(server: TorchServe, model: str, body: object) -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/{model}",
        json=body,
        headers=server.auth("inference"),
        timeout=60,
    )


def test_a_model_file_with_edge_features_serves_its_full_graph_answer(server, built):
    ids, expected = full_graph(built, "fraud", Output.LOGITS)
    response = post(server, "fraud", {"node_ids": ids})
    assert response.status_code == 200, response.text
    got = torch.tensor([p["probabilities"] for p in response.json()["predictions"]])
    assert float((got - expected).abs().max()) <= 1e-5
    assert {p["predicted_label"] for p in response.json()["predictions"]} <= {
        "fraud",
        "legit",
        "review",
    }


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_the_matrix_serves_each_models_full_graph_answer(server, built, name):
    ids, expected = full_graph(built, name, Output.LOGITS)
    got = []
    for start in range(0, len(ids), 30):
        response = post(server, name, {"node_ids": ids[start : start + 30]})
        assert response.status_code == 200, response.text
        got += [p["probabilities"] for p in response.json()["predictions"]]
    assert float((torch.tensor(got) - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("name", sorted(CATALOGUE_SAMPLE))
def test_a_sample_of_pyg_catalogue_serves_its_full_graph_answer(server, built, name):
    ids, expected = full_graph(built, name, Output.RAW)
    got = []
    for start in range(0, len(ids), 10):
        response = post(server, name, {"node_ids": ids[start : start + 10]})
        assert response.status_code == 200, response.text
        got += [p["output"] for p in response.json()["predictions"]]
    assert float((torch.tensor(got) - expected).abs().max()) <= 1e-5


def test_a_non_local_catalogue_model_is_refused_naming_its_module(built, tmp_path):
    case = CATALOGUE["GraphSAGE(norm='layer_norm')"]
    result = build_catalogue_case(built / "catalogue", tmp_path / "out", "cat_ln", case, 2)()
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and case.why in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.mar"))


def test_raw_outputs_are_returned_as_they_are(server, built):
    ids, expected = full_graph(built, "risk", Output.RAW)
    response = post(server, "risk", {"node_ids": ids[:40]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert "probabilities" not in predictions[0] and "predicted_class" not in predictions[0]
    got = torch.tensor([p["output"] for p in predictions])
    assert float((got - expected[:40]).abs().max()) <= 1e-5


def test_embeddings_and_explanations_work_on_a_user_model(server):
    embedded = post(server, "fraud", {"node_id": "acct_3", "return_embedding": True})
    assert embedded.status_code == 200 and len(embedded.json()["embedding"]) == 16
    explained = requests.post(
        f"{server.inference_url}/explanations/fraud",
        json={"node_id": "acct_0"},
        headers=server.auth("inference"),
        timeout=60,
    )
    assert explained.status_code == 200, explained.text
    assert explained.json()["explanation"]["edges"]


def test_describe_shows_the_model_and_its_verification(server):
    described = requests.get(
        f"{server.management_url}/models/fraud?customized=true",
        headers=server.auth("management"),
        timeout=30,
    ).json()[0]["customizedMetadata"]
    details = described if isinstance(described, dict) else json.loads(described)
    assert details["model"]["model_class"] == "EdgeMix"
    assert details["model"]["edge_input"] == "edge_attr"
    verification = details["verification"]
    assert verification["passed"] and verification["worst_abs_diff"] <= 1e-5
    assert verification["nodes"] >= 80


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--model-class", "torch_geometric.nn.models.GraphSAGE"), "--model-class needs --weights"),
        (("--model-args", "{}"), "goes with --model-class"),
        (("--model-class", "GlobalCentre", "--model-file", "MODEL_FILE", "--weights", "CENTRE"),
         "likely cause: the model is not local"),
        (("--model-class", "EdgeMix", "--model-file", "MODEL_FILE", "--weights", "MODULE",
          "--model-args", json.dumps(ARGS)), "holds pickled objects"),
        (("--model-class", "EdgeMix", "--model-file", "MODEL_FILE", "--weights", "CENTRE",
          "--model-args", json.dumps(ARGS)), "do not fit EdgeMix"),
    ],
)  # fmt: skip
def test_bad_models_are_refused_in_one_line(built, tmp_path, options, says):
    torch.manual_seed(0)
    torch.save(user_models.GlobalCentre(FEATURES, CLASSES).state_dict(), tmp_path / "centre.pt")
    torch.save(user_models.EdgeMix(**ARGS), tmp_path / "module.pt")
    paths = {
        "MODEL_FILE": user_models.__file__,
        "CENTRE": str(tmp_path / "centre.pt"),
        "MODULE": str(tmp_path / "module.pt"),
    }
    if "GlobalCentre" in options:
        options = (
            *options,
            "--model-args",
            json.dumps({"in_channels": FEATURES, "classes": CLASSES}),
        )
    result = build(
        "--graph", str(built / "graph"), "--export-path", str(tmp_path / "out"),
        *(paths.get(option, option) for option in options),
    )  # fmt: skip
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and says in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.mar"))


# PyG's heterogeneous recipe, to_hetero over SAGEConv((-1, -1)) and Linear(-1, ...), on the
# fraud graph with its reverses; built without --embedding-method.
LAZY = {"devices": 60, "hidden": 8, "classes": 2}
PAYS, REV_PAYS = ("user", "pays", "merchant"), ("merchant", "rev_pays", "user")
USES, REV_USES = ("user", "uses", "device"), ("device", "rev_uses", "user")
FRAUD_METADATA = [
    ["user", "merchant", "device"],
    [list(t) for t in (PAYS, REV_PAYS, USES, REV_USES)],
]


@pytest.fixture(scope="module")
def lazy_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lazy.mar from the user's model file by itself, its lazy layers initialised by one
    forward on a small sample as PyG's docs do."""
    root = tmp_path_factory.mktemp("own_lazy")
    graph = write_fraud_graph_csv(fraud_graph(150, 25, 60, 500, seed=4), root / "graph")
    shutil.copy(pyg_user_models.__file__, root / "lazy_model.py")
    args = {**LAZY, "metadata": FRAUD_METADATA}
    torch.manual_seed(0)
    module = pyg_user_models.FraudLazyToHetero(**args)
    widths = {"user": 8, "merchant": 4, "device": 0}
    sample = small_typed_input(widths, {(*e,): 0 for e in FRAUD_METADATA[1]})
    with torch.no_grad():
        module(sample.x_dict, sample.edge_index_dict, sample.n_id_dict)
    torch.save(module.state_dict(), root / "lazy.pt")
    result = build(
        "--graph", str(graph), "--undirected", "--export-path", str(root / "store"),
        "--name", "lazy", "--model-file", str(root / "lazy_model.py"),
        "--model-class", "FraudLazyToHetero", "--model-args", json.dumps(args),
        "--weights", str(root / "lazy.pt"), "--fanouts", "-1,-1", "--batch-size", "4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "2 hops (inferred: 2 calls of one relation's layers" in result.stdout
    assert "worst |served - full-graph forward|" in result.stdout
    return root


def test_a_lazy_to_hetero_model_builds_and_scores_a_new_node(register, lazy_built):
    """Served by TorchServe: a new user (no --embedding-method) is answered as the model's
    forward on the graph with it added; return_embedding is a 400 naming the option."""
    work = lazy_built / "unpacked"
    zipfile.ZipFile(lazy_built / "store" / "lazy.mar").extractall(work)
    store = open_store(work / "graph")
    model, _ = load_model(work)
    x = [0.4, -0.3, 0.2, 0.0, 1.1, -0.6, 0.3, 0.5]
    neighbors = {"user__pays__merchant": [1000, 1003], "user__uses__device": ["d1"]}
    amounts = {"user__pays__merchant": [[75.0, 14.0], [12.5, 2.0]]}
    body = {"new_node": {"node_type": "user", "x": x, "neighbors": neighbors, "edge_attr": amounts}}
    with register(lazy_built / "store", ["lazy"]) as server:
        response = post(server, "lazy", body)
        refused = post(server, "lazy", {**body, "return_embedding": True})
    assert response.status_code == 200, response.text
    assert response.json()["new_node"] == {"neighbors": 3}
    assert refused.status_code == 400 and "--embedding-method" in refused.json()["message"]
    edges = []
    for (end, node_id), attr in zip(
        [("merchant", 1000), ("merchant", 1003), ("device", "d1")],
        [*amounts["user__pays__merchant"], None],
        strict=True,
    ):
        at = int(store.lookup([node_id], node_type=end)[0]) - store.schema.node_type(end).offset
        pair = (PAYS, REV_PAYS) if end == "merchant" else (USES, REV_USES)
        edges += [(pair[0], at, False, attr), (pair[1], at, True, attr)]
    augmented, new = with_new_node(whole_graph_input(store), store.schema, x, edges)
    with torch.no_grad():
        expected = torch.softmax(model(augmented)[new], dim=-1)
    served = torch.tensor(response.json()["probabilities"])
    assert float((served - expected).abs().max()) <= 1e-5
