"""One served-model contract: every preset and every adapter of a user's class, as the one
factory builds them, declares what serving asks of it (``model.served.contract``), and no
module outside ``model/served/`` asks which class a model is or reaches inside one."""

from __future__ import annotations

import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest
import torch

from graph_assets import GraphStore
from model import ModelConfig
from model.config import Task
from model.served import serving_needs
from model.served.contract import Mode, Plan, ServedModel, ServingNeeds, served
from model.served.factory import served_preset, served_user_model
from model.typed_graph import hetero_section
from model.user_model import Output, UserModelConfig, import_model_class, instantiate
from tests.typed_graphs import fraud_store
from tests.unit.archive_build import user_models

ROOT = Path(__file__).resolve().parents[3]
PAYS = ("user", "pays", "merchant")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("contract") / "store", 40, 10, 12, 120, 3)


def declared(model: torch.nn.Module) -> ServedModel:
    """The model's contract, each declaration of the right kind."""
    assert isinstance(model, ServedModel), type(model).__name__
    contract = served(model)
    assert isinstance(contract.task, Task) and isinstance(contract.typed, bool)
    assert isinstance(contract.serving_needs, ServingNeeds)
    assert isinstance(contract.has_embedding, bool) and isinstance(contract.target, str)
    return contract


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
@pytest.mark.parametrize("task", ["node", "link", "graph"])
def test_every_preset_of_a_graph_of_one_type_declares_the_contract(arch: str, task: str) -> None:
    config = ModelConfig.from_dict(
        {"task": task, "arch": arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 8, "num_layers": 3}
    )
    contract = declared(served_preset(config))
    assert contract.task is Task(task) and not contract.typed and contract.edge_type is None
    assert contract.hops == 3 and contract.has_embedding and contract.target == ""
    assert contract.serving_needs == ServingNeeds()
    plan = contract.precompute_plan()
    if task == "graph":
        assert plan is None
    else:
        assert isinstance(plan, Plan) and plan.mode is Mode.LAYERS and plan.hops == 3
        assert plan.degree is (arch == "gcn") and plan.stored_embedding
    with pytest.raises(ValueError, match=r"one node type|not node types"):
        contract.rows_of("node")


@pytest.mark.parametrize("arch", ["sage", "gat", "gcn", "gin", "rgcn", "hgt"])
def test_every_typed_node_preset_declares_the_contract(store: GraphStore, arch: str) -> None:
    config = ModelConfig(
        arch=arch, in_dim=store.feature_dim, out_dim=2, hidden_dim=8, heads=2,
        hetero=hetero_section(store.schema),
    )  # fmt: skip
    contract = declared(served_preset(config))
    assert contract.task is Task.NODE and contract.typed and contract.target == "user"
    assert contract.hops == config.num_layers and contract.edge_type is None
    plan = contract.precompute_plan()
    assert plan is not None and plan.mode is Mode.OUTPUT and plan.types == ("user",)
    assert contract.rows_of("user") is contract
    with pytest.raises(ValueError, match="answers for 'user', not 'merchant'"):
        contract.rows_of("merchant")


@pytest.mark.parametrize("arch", ["sage", "gat"])
def test_every_typed_link_preset_declares_the_contract(store: GraphStore, arch: str) -> None:
    config = ModelConfig(
        arch=arch, task=Task.LINK, in_dim=store.feature_dim, out_dim=8, hidden_dim=8, heads=2,
        hetero=hetero_section(store.schema, "user__pays__merchant"),
    )  # fmt: skip
    contract = declared(served_preset(config))
    assert contract.task is Task.LINK and contract.typed and contract.edge_type == PAYS
    assert not contract.has_embedding and contract.hops == config.num_layers
    plan = contract.precompute_plan()
    assert plan is not None and plan.types == ("user", "merchant")
    merchants = declared(contract.rows_of("merchant"))
    assert merchants.target == "merchant" and merchants.typed and not merchants.has_embedding
    with pytest.raises(ValueError, match="'device' is not an end"):
        contract.rows_of("device")


def user_config(store: GraphStore, **fields: object) -> UserModelConfig:
    return UserModelConfig(**{"in_dim": store.feature_dim, "out_dim": 2, "num_layers": 2, **fields})


def user_module(config: UserModelConfig) -> torch.nn.Module:
    return instantiate(import_model_class(config.model_class, None), config.model_args)


@pytest.mark.parametrize(
    ("task", "model_class", "model_args", "hetero", "typed", "has_embedding"),
    [
        (
            "node",
            "torch_geometric.nn.models.GraphSAGE",
            {"in_channels": 4, "hidden_channels": 8, "num_layers": 2, "out_channels": 2},
            None,
            False,
            False,
        ),
        (
            "link",
            "tests.unit.archive_build.user_models.SageLink",
            {"in_channels": 4, "hidden": 8, "out_channels": 8},
            None,
            False,
            True,
        ),
        (
            "graph",
            "tests.unit.archive_build.user_models.GinGraph",
            {"in_channels": 4, "hidden": 8, "classes": 2},
            None,
            False,
            False,
        ),
        (
            "node",
            "tests.unit.archive_build.user_models.FraudHeteroConv",
            {"devices": 12, "hidden": 8, "classes": 2, "edge_dim": 2},
            "node",
            True,
            False,
        ),
        (
            "link",
            "tests.unit.archive_build.user_models.FraudPaysLink",
            {"devices": 12, "hidden": 8, "edge_dim": 2},
            "link",
            True,
            False,
        ),
    ],
)
def test_every_user_model_the_factory_adapts_declares_the_contract(
    store: GraphStore,
    task: str,
    model_class: str,
    model_args: dict,
    hetero: str | None,
    typed: bool,
    has_embedding: bool,
) -> None:
    section = None
    if hetero == "node":
        section = hetero_section(store.schema)
    elif hetero == "link":
        section = hetero_section(store.schema, "user__pays__merchant")
    config = user_config(
        store,
        task=task,
        model_class=model_class,
        model_args=model_args,
        output=Output.RAW,
        hetero=section,
    )
    contract = declared(served_user_model(user_module(config), config))
    assert contract.task is Task(task) and contract.typed is typed
    assert contract.hops == 2 and contract.has_embedding is has_embedding
    assert contract.serving_needs.output is Output.RAW
    assert contract.edge_type == (PAYS if hetero == "link" else None)
    assert contract.target == ("user" if hetero == "node" else "")
    plan = contract.precompute_plan()
    assert (plan is None) is (task == "graph")
    if plan is not None:
        assert plan.hops == 2
        assert plan.mode is (Mode.LAYERS if model_class.endswith("GraphSAGE") else Mode.OUTPUT)


def test_a_module_outside_the_contract_is_refused_by_name() -> None:
    module = user_models.SageLink(4, 8, 8)
    with pytest.raises(TypeError, match="SageLink does not declare the served-model contract"):
        served(module)
    with pytest.raises(TypeError, match="SageLink does not declare"):
        serving_needs(module)


# Every class that declares the contract, and the task protocols beside it.
CONTRACT_CLASSES = sorted(
    {
        cls.__name__
        for path in (ROOT / "model").rglob("*.py")
        for cls in vars(
            importlib.import_module(
                ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            )
        ).values()
        if isinstance(cls, type)
        and issubclass(cls, torch.nn.Module)
        and hasattr(cls, "precompute_plan")
    }
    | {"ServedModel", "LinkModel", "GraphModel"}
)
_ASKS_CLASS = re.compile(
    r"isinstance\s*\([^)]*\b(" + "|".join(CONTRACT_CLASSES) + r")\b", re.MULTILINE
)
_REACHES_IN = re.compile(r"(?<!self)\.gnn\b|\bmodel\.module\b")


def outside_the_factory() -> list[Path]:
    """Every module of handler/, model/ and archive_build/ but model/served/."""
    served_dir = ROOT / "model" / "served"
    return [
        path
        for folder in ("handler", "model", "archive_build")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if served_dir not in path.parents
    ]


def code_of(path: Path) -> str:
    """The module's code with its strings and comments blanked (docstrings name state_dict
    keys such as ``encoder.gnn.*``)."""
    source = path.read_text(encoding="utf-8")
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    code = list(source)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            begin = starts[token.start[0] - 1] + token.start[1]
            end = starts[token.end[0] - 1] + token.end[1]
            code[begin:end] = " " * (end - begin)
    return "".join(code)


def test_the_contract_classes_are_found() -> None:
    expected = {"NodeClassifier", "UserNodeModel", "HeteroNodeModel", "HeteroLinkModel", "GCN"}
    assert expected <= set(CONTRACT_CLASSES)
    assert _ASKS_CLASS.search("if isinstance(model, HeteroNodeModel | HeteroLinkModel):")
    assert _REACHES_IN.search("model.gnn.convs[-1]") and not _REACHES_IN.search("self.gnn(x)")
    blanked = code_of(Path(__file__))
    assert "encoder.gnn" not in blanked and "def code_of" in blanked


@pytest.mark.parametrize("path", outside_the_factory(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_outside_the_factory_asks_a_models_class_or_reaches_inside(path: Path) -> None:
    source = code_of(path)
    asked = [m.group(0) for m in _ASKS_CLASS.finditer(source)]
    reached = [m.group(0) for m in _REACHES_IN.finditer(source)]
    if "_orig_mod" in path.read_text(encoding="utf-8"):  # torch.compile's wrapper, by name too
        reached.append("_orig_mod")
    assert not asked, f"{path.relative_to(ROOT)} asks a model's class: {asked}"
    assert not reached, f"{path.relative_to(ROOT)} reaches inside a model: {reached}"
