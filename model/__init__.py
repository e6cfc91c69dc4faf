"""GNNs for serving, node, link and graph level, one type or several: the presets, users' own
models behind the one served-model contract (``model.served``), training, export and
precomputed rows; ``build_model`` rebuilds one from its ``model_config.json``."""

from model.config import Arch, ModelConfig, Task
from model.registry import build_model

__all__ = ["Arch", "ModelConfig", "Task", "build_model"]
