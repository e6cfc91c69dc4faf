"""Node-classification GNNs: architectures, training and export; ``build_model`` rebuilds one
from its ``model_config.json``."""

from model.config import Arch, ModelConfig, Task
from model.registry import build_model

__all__ = ["Arch", "ModelConfig", "Task", "build_model"]
