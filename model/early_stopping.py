"""Early stopping on a validation score, shared by every task's training loop."""

from __future__ import annotations

import torch
from torch import Tensor


def check_schedule(epochs: int, patience: int) -> None:
    """Refuses a schedule that could train nothing."""
    if epochs < 1 or patience < 1:
        raise ValueError(f"epochs and patience must be >= 1, got {epochs} and {patience}")


class EarlyStopping:
    """Keeps the weights of the epoch with the best validation score and says when ``patience``
    epochs have passed without a better one."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best_score = -1.0
        self.best_epoch = 0
        self.best_state: dict[str, Tensor] = {}

    def update(self, model: torch.nn.Module, epoch: int, score: float) -> bool:
        """Records ``epoch``'s score (a copy of the weights when it is the best so far); True
        when training should stop."""
        if score > self.best_score:
            self.best_score, self.best_epoch = score, epoch
            self.best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return epoch - self.best_epoch >= self.patience
