"""Node-classification GNNs: architectures, training and export; ``build_model`` rebuilds one
from its ``model_config.json``."""

from model.architectures import build_model
from model.config import Arch, ModelConfig, Task

__all__ = ["Arch", "ModelConfig", "Task", "build_model"]
