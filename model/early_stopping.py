"""Early stopping on a validation score and the epoch loop every task's training runs."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from tqdm import tqdm


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


def fit_epochs(
    model: torch.nn.Module,
    train_epoch: Callable[[torch.optim.Optimizer], float],
    val_score: Callable[[], float],
    *,
    lr: float,
    weight_decay: float = 0.0,
    epochs: int,
    patience: int,
    desc: str,
    score_name: str,
    progress: bool,
) -> tuple[EarlyStopping, int]:
    """The epoch loop of every training: ``train_epoch(optimizer)`` (Adam's steps, returning
    the loss shown), then early stopping on ``val_score()``; ``model`` ends with the best
    epoch's weights. Returns the stopping state (best weights and score) and the epochs run."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    early = EarlyStopping(patience)
    bar = tqdm(
        range(1, epochs + 1),
        desc=desc,
        disable=None if progress else True,  # None: off when stderr is not a terminal
    )
    epoch = 0
    for epoch in bar:
        model.train()
        loss = train_epoch(optimizer)
        score = val_score()
        stop = early.update(model, epoch, score)
        bar.set_postfix({"loss": f"{loss:.4f}", score_name: f"{score:.3f}"})
        if stop:
            break
    bar.close()
    model.load_state_dict(early.best_state)
    return early, epoch


def step(optimizer: torch.optim.Optimizer, loss: Tensor) -> float:
    """One optimizer step on ``loss`` (gradients from it alone); its value."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.item())
