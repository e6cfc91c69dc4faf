"""The user's own model: a class (from a model file or an importable dotted path), its
constructor arguments and a ``state_dict``, recorded in ``model_config.json`` so that a worker
rebuilds exactly the module the user trained.

A model file is code: it runs in the worker as the handler does (docs/security.md). The weights
are read with ``weights_only=True``, so the ``.pt`` file itself runs nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import types
import typing
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from model.config import Task, check_hetero_task
from model.weights import key_mismatch

# The archive's copy of a model file lives here, beside model_config.json.
MODEL_FILE_DIR = "user_model"
_MODULE_PREFIX = "gnnserve_user_model_"


class Output(str, Enum):
    """What the model's rows are: ``logits`` (answers carry softmax probabilities, the class and
    its label), ``probabilities`` (the same, taken as they are) or ``raw`` (values as they are:
    regression, risk scores)."""

    LOGITS = "logits"
    PROBABILITIES = "probabilities"
    RAW = "raw"


class EdgeInput(str, Enum):
    """How the graph's edge features reach the model's forward: as ``edge_attr`` ``[E, D]``, as
    ``edge_weight`` ``[E]`` (one edge feature), or not at all."""

    NONE = "none"
    EDGE_ATTR = "edge_attr"
    EDGE_WEIGHT = "edge_weight"


@dataclass(kw_only=True)
class UserModelConfig:
    """``model_config.json`` of an archive that serves the user's class.

    Attributes:
        task: ``node`` (``forward`` -> one row per node), ``link`` (``encode`` -> one
            embedding per node, ``decode`` -> one score per pair) or ``graph`` (``forward(x,
            edge_index, batch)`` -> one row per graph).
        model_class: the class name in ``model_file``, or a dotted path such as
            ``torch_geometric.nn.models.GraphSAGE`` when there is no model file.
        model_file: the model file's name inside the archive's ``user_model/``, or None.
        model_args: keyword arguments of the class's constructor (JSON values).
        in_dim, out_dim: node feature width and the width of one output row (link: of one
            embedding).
        num_layers: hops of the ego-graph = the model's receptive field (graph: the
            message-passing steps of one forward, for information: inline graphs are whole).
        output: see :class:`Output` (link: what ``decode`` returns; ``logits`` are served as
            their sigmoid).
        edge_input: see :class:`EdgeInput`.
        edge_dim: graph: the edge feature width the forward reads (each inline graph's
            ``edge_attr`` has that many columns); 0 when it reads none. Node and link archives
            take it from their graph store.
        boundary_degrees: the ego-graph carries the deepest hop's full in-degrees (models that
            normalise by the degree of a message's source, such as GCNConv).
        trim: PyG ``BasicGNN`` trim-to-layer with the sampler's per-hop counts.
        max_degree: the built graph's largest out-degree (self-loops not counted), the scale
            of a ChebConv without normalisation and without ``lambda_max``
            (``model.chebconv``) until the served graph version gives its own; 0 when no layer
            reads it.
        embedding: node: the module whose input is a node's embedding (the last
            message-passing layer the forward calls); graph: the last Linear layer, whose
            input is the graph's embedding, or ``""`` for none; either: ``method:<name>`` for a
            method the user named. Link embeddings are ``encode``'s output.
        hetero: a node model of a graph of several node types or relations (PyG's
            ``forward(x_dict, edge_index_dict[, edge_attr_dict])``): the graph's schema as
            ``model.typed_graph.hetero_section`` writes it, whose ``target`` is the type
            answered for; ``embedding`` then names a submodule whose input holds the embedding.
            A link model's (``encode(x_dict, ...)`` and ``decode(z_dict, edge_label_index)``)
            adds ``target_edge_type``, the relation it predicts. None: a graph of one type.
    """

    task: Task = Task.NODE
    model_class: str
    model_file: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)
    in_dim: int
    out_dim: int
    num_layers: int
    output: Output = Output.LOGITS
    edge_input: EdgeInput = EdgeInput.NONE
    edge_dim: int = 0
    boundary_degrees: bool = False
    trim: bool = False
    max_degree: int = 0
    embedding: str = ""
    hetero: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.task = Task.parse(self.task)
        self.output = Output(self.output)
        self.edge_input = EdgeInput(self.edge_input)
        if self.hetero is not None:
            check_hetero_task(self.task, self.hetero)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["task"] = self.task.value
        data["output"] = self.output.value
        data["edge_input"] = self.edge_input.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UserModelConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}; rebuild the archive")
        return cls(**data)


def is_user_config(data: Mapping[str, Any]) -> bool:
    """A ``model_config.json`` of the user's class (presets name an ``arch`` instead)."""
    return "model_class" in data


def import_model_class(model_class: str, model_file: Path | None) -> type[torch.nn.Module]:
    """The class named by ``model_class``: looked up in ``model_file`` when given, else imported
    by its dotted path. Raises ValueError with the fix."""
    if model_file is not None:
        module = _load_file(model_file)
        where = str(model_file)
        name = model_class
    else:
        module_name, _, name = model_class.rpartition(".")
        if not module_name:
            raise ValueError(
                f"--model-class {model_class!r} is not a dotted path and no --model-file was "
                "given: give --model-file my_model.py, or a path such as "
                "torch_geometric.nn.models.GraphSAGE"
            )
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(
                f"--model-class {model_class}: cannot import {module_name} ({error}); "
                "give --model-file with the class's source file"
            ) from None
        where = module_name
    found = getattr(module, name, None)
    if not (inspect.isclass(found) and issubclass(found, torch.nn.Module)):
        classes = sorted(
            key
            for key, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, torch.nn.Module)
        )
        raise ValueError(
            f"{where} has no torch.nn.Module class {name!r}"
            + (f"; its module classes are {', '.join(classes[:12])}" if classes else "")
        )
    return found


def _load_file(path: Path) -> types.ModuleType:
    """Imports a model file under a name of its own (so two archives' files never clash)."""
    if not path.is_file():
        raise ValueError(f"--model-file {path}: no such file")
    name = _MODULE_PREFIX + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"--model-file {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look classes up here
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise ValueError(
            f"--model-file {path}: importing it failed: {type(error).__name__}: {error}"
        ) from None
    return module


def instantiate(cls: type[torch.nn.Module], model_args: Mapping[str, Any]) -> torch.nn.Module:
    """``cls(**model_args)``; a wrong argument is named with the constructor's signature. A
    tensor argument (PNA's ``deg``) is a JSON list where the constructor annotates it ``Tensor``
    (:func:`tensor_parameters`), or ``{"tensor": [...]}`` anywhere."""
    tensors = tensor_parameters(cls)
    try:
        return cls(
            **{key: _decoded(key, value, key in tensors) for key, value in model_args.items()}
        )
    except TypeError as error:
        try:
            signature = str(inspect.signature(cls))
        except (TypeError, ValueError):
            signature = "(...)"
        raise ValueError(
            f"{cls.__name__}(**model_args) failed: {error}; its constructor is "
            f"{cls.__name__}{signature}: give --model-args as a JSON object of those arguments"
        ) from None


def _decoded(key: str, value: Any, tensor: bool) -> Any:
    if isinstance(value, dict) and set(value) == {"tensor"}:
        return torch.tensor(value["tensor"])
    if tensor and isinstance(value, list):
        try:
            return torch.tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(
                f"--model-args {key}: a tensor argument is a list of numbers (or of equal "
                f"lists), got {value!r}: {error}"
            ) from None
    return value


def tensor_parameters(cls: type[torch.nn.Module]) -> set[str]:
    """Constructor arguments annotated ``Tensor`` (``Optional[Tensor]`` too): those of
    ``cls``, and, where ``cls`` passes ``**kwargs`` on to its layers as PyG's ``BasicGNN``
    models do (``PNA`` to ``PNAConv``), those of the layer classes its ``init_conv`` builds."""
    classes: list[Any] = [cls]
    init_conv = getattr(cls, "init_conv", None)
    code = getattr(init_conv, "__code__", None)
    if code is not None:
        names = getattr(init_conv, "__globals__", {})
        classes += [names.get(name) for name in code.co_names]
    found: set[str] = set()
    for candidate in classes:
        if not (inspect.isclass(candidate) and issubclass(candidate, torch.nn.Module)):
            continue
        try:
            hints = typing.get_type_hints(candidate.__init__)
        except (NameError, TypeError, AttributeError, SyntaxError):  # unresolved: names none
            continue
        found |= {name for name, hint in hints.items() if _is_tensor_hint(hint)}
    return found


def _is_tensor_hint(hint: Any) -> bool:
    if hint is Tensor:
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and Tensor in (
        typing.get_args(hint)
    )


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A ``torch.save(model.state_dict(), F)`` file, read with ``weights_only=True``; any
    other file is refused in one line that says what to save instead."""
    save_instead = "save torch.save(model.state_dict(), F) in your training script"
    if not path.is_file():
        raise ValueError(f"--weights {path}: no such file")
    kind = _archive_kind(path)
    if kind is not None:
        raise ValueError(f"--weights {path} is a {kind}, not a state_dict; {save_instead}")
    if not zipfile.is_zipfile(path):
        with path.open("rb") as f:
            head = f.read(16)
        if head[8:9] == b"{":  # safetensors: an 8-byte header length, then JSON
            raise ValueError(
                f"--weights {path} is a safetensors file, which is not read here; load it "
                "with safetensors.torch.load_file and torch.save the dict it returns"
            )
        if not head.startswith(_PICKLE_PROTOCOL):  # a legacy torch.save file is a pickle
            raise ValueError(
                f"--weights {path} is not a torch or safetensors weights file (it starts "
                f"with {head!r}; torch.save writes a zip archive); {save_instead}"
            )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # UnpicklingError, RuntimeError, EOFError, ...
        if type(error).__name__ == "UnpicklingError":
            raise ValueError(
                f"--weights {path} holds pickled objects (a whole module, or a checkpoint "
                f"with Python objects), which weights_only=True refuses to load; {save_instead}"
            ) from None
        raise ValueError(
            f"--weights {path}: not a torch.save file ({type(error).__name__}); {save_instead}"
        ) from None
    if not isinstance(loaded, Mapping):
        raise ValueError(
            f"--weights {path} holds a {type(loaded).__name__}, not a state_dict; {save_instead}"
        )
    tensors = {key: value for key, value in loaded.items() if isinstance(value, Tensor)}
    if len(tensors) != len(loaded):
        nested = [str(key) for key, value in loaded.items() if isinstance(value, Mapping)]
        hint = (
            f" (it looks like a training checkpoint; save checkpoint[{nested[0]!r}])"
            if (nested)
            else ""
        )
        raise ValueError(
            f"--weights {path} holds values that are not tensors{hint}; {save_instead}"
        )
    sparse = sorted(str(key) for key, value in tensors.items() if value.layout != torch.strided)
    if sparse:
        layout = tensors[sparse[0]].layout
        raise ValueError(
            f"--weights {path} holds sparse tensors ({', '.join(sparse[:3])}: {layout}), "
            "which no module's parameters are; save the model's own state_dict(), or each "
            "tensor's .to_dense()"
        )
    return {str(key): value for key, value in tensors.items()}


# The PROTO opcode that starts every pickle of protocol 2 or later.
_PICKLE_PROTOCOL = b"\x80"


def _archive_kind(path: Path) -> str | None:
    """TorchScript and torch.export files are zip archives with their own layout."""
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(name.endswith("constants.pkl") or "/code/" in name for name in names):
        return "TorchScript file (torch.jit.save)"
    if any(
        "serialized_exported_program" in name or name.endswith("archive_format") for name in names
    ):
        return "torch.export program"
    return None


def load_weights(module: torch.nn.Module, state_dict: Mapping[str, Tensor], source: str) -> None:
    """Loads ``state_dict`` strictly; missing, unexpected or mis-shaped keys are listed with
    the fix in one line."""
    mismatch = key_mismatch(module, state_dict)
    if not mismatch:
        module.load_state_dict(dict(state_dict))
        return
    fix = "check --model-args against the arguments the model was trained with"
    prefix = mismatch.wrapper_prefix()
    if prefix:
        fix = (
            f"the weights' keys start with {prefix!r} (a wrapper): save the inner module's "
            "state_dict()"
        )
    raise ValueError(
        f"the weights in {source} do not fit {type(module).__name__}: {mismatch.describe()}; {fix}"
    )


def build_user_module(config: UserModelConfig, model_dir: Path) -> torch.nn.Module:
    """The user's class with its arguments, untrained (the model file from ``model_dir``)."""
    model_file = None
    if config.model_file is not None:
        model_file = model_dir / MODEL_FILE_DIR / config.model_file
    cls = import_model_class(config.model_class, model_file)
    return instantiate(cls, config.model_args)


def parse_model_args(text: str, source: str) -> dict[str, Any]:
    """``--model-args`` (JSON text) or the content of ``--model-args-file``: a JSON object."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{source} is not JSON ({error.msg} at column {error.colno}); for example "
            "'{\"hidden\": 64}'"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"{source} must be a JSON object of constructor arguments, got {value!r}")
    return value
