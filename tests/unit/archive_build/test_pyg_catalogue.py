"""PyG's catalogue through the build: every node layer and model that takes ``(x, edge_index[,
edge_weight | edge_attr])`` is packaged as a user's model, served in process with full
neighbourhoods and compared with its own full-graph forward (tests/unit/archive_build/
pyg_catalogue.py holds the table), or refused in one line naming the module."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn.parameter import is_lazy
from torch_geometric.utils import degree

from archive_build import own_model
from archive_build.verify import Verification, verify
from graph_assets import GraphStore, open_store, read_graph_dir, write_store
from handler.settings import ServingSettings
from model.user_model import import_model_class, instantiate
from tests.unit.archive_build import pyg_catalogue
from tests.unit.archive_build.pyg_catalogue import (
    ATTR_DIM,
    CATALOGUE,
    DEG,
    EXACT,
    NOT_APPLICABLE,
    SOURCE_DEGREES,
    WEIGHT_DIM,
    Case,
)

ROOT = Path(__file__).resolve().parents[3]
MODEL_FILE = Path(pyg_catalogue.__file__)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GraphStore]:
    """The same graph with one edge feature (edge weights) and with three (edge features)."""
    root = tmp_path_factory.mktemp("catalogue")
    opened = {}
    for kind, dim in (("edge_weight", WEIGHT_DIM), ("edge_attr", ATTR_DIM)):
        graph = pyg_catalogue.write_graph(root / kind / "input", dim)
        write_store(read_graph_dir(graph), root / kind / "store")
        opened[kind] = open_store(root / kind / "store")
    return opened


def args_for(case: Case, store: GraphStore) -> dict[str, object]:
    """The case's ``--model-args``, the graph's in-degree histogram in place of ``DEG``."""
    in_degree = degree(torch.from_numpy(store.edge_index()[1]), store.num_nodes, dtype=torch.long)
    histogram = {"tensor": torch.bincount(in_degree).tolist()}
    return {key: histogram if value == DEG else value for key, value in case.args.items()}


def package_and_verify(
    case: Case, store: GraphStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Verification | str:
    """The case packaged as a user's model and verified, or the build's one-line refusal."""
    args = args_for(case, store)
    torch.manual_seed(0)
    file = MODEL_FILE if case.model_class == "Catalogued" else None
    module = instantiate(import_model_class(case.model_class, file), args)
    if any(is_lazy(parameter) for parameter in module.parameters()):
        # A trained lazy model has its sizes: one forward on the graph, as training's first.
        x = torch.from_numpy(np.asarray(store.features))
        with torch.no_grad():
            module(x, torch.from_numpy(store.edge_index()))
    torch.save(pyg_catalogue.with_statistics(module).state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", case.model_class,
        "--model-args", json.dumps(args), "--weights", str(tmp_path / "weights.pt"),
        "--edge-input", case.edge, "--output", "raw", "--out", str(tmp_path / "model"),
    ]  # fmt: skip
    if file is not None:
        argv += ["--model-file", str(file)]
    if own_model.main(argv) != 0:
        return capsys.readouterr().err
    config = json.loads((tmp_path / "model" / "model_config.json").read_text())
    settings = ServingSettings(fanouts=(-1,) * config["num_layers"])
    result = verify(tmp_path / "model", store, settings, tolerance=1e-5)
    assert isinstance(result, Verification)
    return result


@pytest.mark.parametrize("case", CATALOGUE, ids=[case.name for case in CATALOGUE])
def test_each_layer_is_served_exactly_or_refused_naming_why(
    case: Case, stores: dict[str, GraphStore], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = stores["edge_weight" if case.edge == "edge_weight" else "edge_attr"]
    result = package_and_verify(case, store, tmp_path, capsys)
    if case.verdict == EXACT:
        assert isinstance(result, Verification), result
        assert result.passed, result
        assert result.worst_abs_diff <= 1e-5
        assert result.nodes == store.num_nodes
        assert result.boundary_degrees == (case.why == SOURCE_DEGREES)  # the table says so
        return
    if isinstance(result, str):  # refused while packaging, before any forward on the graph
        line = result.strip()
    else:
        assert not result.passed
        line = f"{result.failure()} by {result.worst_abs_diff:.3g}; likely cause: {result.cause}"
    assert "\n" not in line and "Traceback" not in line
    assert case.why in line, line


def test_the_catalogue_covers_every_layer_pyg_ships() -> None:
    """A layer PyG adds shows up here: served exactly, refused naming why, or not applicable."""
    listed = {case.name.split("(")[0] for case in CATALOGUE}
    assert pyg_catalogue.applicable_classes() <= (listed | set(NOT_APPLICABLE))
    assert not listed & set(NOT_APPLICABLE)


def test_the_docs_table_is_the_catalogue() -> None:
    """docs/models.md carries the table this test's parameters produce, as it is."""
    doc = (ROOT / "docs" / "models.md").read_text()
    found = re.search(r"<!-- catalogue -->\n(.*?)\n<!-- /catalogue -->", doc, re.DOTALL)
    assert found, "docs/models.md has no <!-- catalogue --> table"
    assert found.group(1) == pyg_catalogue.markdown_table(), (
        "regenerate it: python -m tests.unit.archive_build.pyg_catalogue"
    )
