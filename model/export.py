"""Writes and reads a trained model as plain files: no pickled code, only tensors and JSON.

``model.pt`` is a ``state_dict`` that ``torch.load(..., weights_only=True)`` reads, and
``model_config.json`` rebuilds the module with ``build_model``; together they are what the
model archive carries at its top level.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from model.config import ModelConfig
from model.registry import build_model
from model.served.factory import preset_keys, served_preset, served_user_model
from model.train import TrainResult
from model.user_model import (
    UserModelConfig,
    build_user_module,
    is_user_config,
    load_weights,
    read_state_dict,
)
from model.weights import key_mismatch

WEIGHTS_FILE = "model.pt"
CONFIG_FILE = "model_config.json"
METRICS_FILE = "metrics.json"


def export_model(result: TrainResult, config: ModelConfig, out_dir: str | Path) -> None:
    """Writes ``model.pt``, ``model_config.json`` and ``metrics.json`` into ``out_dir``.

    The weights are checked against the config first, so an export that would not load is
    refused here rather than when a server starts.
    """
    metrics = {
        "arch": config.arch.value,
        "test_accuracy": result.test_accuracy,
        "val_accuracy": result.val_accuracy,
        "train_accuracy": result.train_accuracy,
        "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch,
        "seconds": result.seconds,
    }
    write_model_files(result.state_dict, config, metrics, out_dir)


def write_model_files(
    state_dict: Mapping[str, Tensor],
    config: ModelConfig,
    metrics: Mapping[str, object],
    out_dir: str | Path,
) -> None:
    """Checks ``state_dict`` against ``config``, then writes the three model files."""
    check_state_dict(build_model(config), state_dict, source="the weights to export")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(dict(state_dict), out / WEIGHTS_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    (out / METRICS_FILE).write_text(json.dumps(dict(metrics), indent=2) + "\n")


def load_model(
    model_dir: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, ModelConfig | UserModelConfig]:
    """Rebuilds the module from ``model_config.json`` and ``model.pt``, on ``map_location``,
    in eval mode: a preset, or the user's class behind the served-model contract, as the one
    factory builds them (``model.served.factory``). Weights are read with
    ``weights_only=True`` (no code runs on load)."""
    directory = Path(model_dir)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found; a model directory holds {WEIGHTS_FILE} and {CONFIG_FILE} "
                "(written by `python -m model train --out DIR`)"
            )
    try:
        data = json.loads(config_path.read_text())
        if isinstance(data, Mapping) and is_user_config(data):
            return _load_user_model(directory, UserModelConfig.from_dict(data), map_location)
        config = ModelConfig.from_dict(data)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{config_path}: {error}") from error
    try:
        state_dict = torch.load(weights_path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises RuntimeError, KeyError, UnpicklingError, ...
        if type(error).__name__ == "UnpicklingError":  # (no pickle import on the load path)
            raise ValueError(
                f"{weights_path}: holds objects other than tensors, which weights_only=True "
                "refuses to load (never load it with weights_only=False: that runs code from "
                "the file); save the model's state_dict() and package that"
            ) from error
        detail = (str(error).strip().splitlines() or [repr(error)])[0][:200]
        raise ValueError(
            f"{weights_path}: cannot read it as a torch.save file ({detail}); it is truncated "
            "or not a state_dict; re-export it with `python -m model train` or "
            "`python -m model package`"
        ) from error
    if not isinstance(state_dict, Mapping):
        raise ValueError(
            f"{weights_path} must hold a state_dict (a dict of tensors), "
            f"got {type(state_dict).__name__}"
        )
    model = served_preset(config)
    state_dict = preset_keys(model, state_dict)
    check_state_dict(model, state_dict, source=str(weights_path))
    model.load_state_dict(state_dict)
    return model.to(map_location).eval(), config


def _load_user_model(
    directory: Path, config: UserModelConfig, map_location: str | torch.device
) -> tuple[torch.nn.Module, UserModelConfig]:
    module = build_user_module(config, directory)
    weights = directory / WEIGHTS_FILE
    load_weights(module, read_state_dict(weights), str(weights))
    return served_user_model(module, config).to(map_location).eval(), config


def check_state_dict(
    model: torch.nn.Module, state_dict: Mapping[str, object], *, source: str
) -> None:
    """Raises a ValueError naming every missing, unexpected and mis-shaped key."""
    mismatch = key_mismatch(model, state_dict)
    if mismatch:
        raise ValueError(
            f"the weights in {source} do not match the {type(model).__name__} that the model "
            f"config describes ({mismatch.describe()}); check that the weights were trained "
            "with this model_config.json (arch, in_dim, hidden_dim, out_dim, num_layers, heads)"
        )
