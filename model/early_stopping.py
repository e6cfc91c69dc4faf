"""Early stopping on a validation score and the epoch loop every task's training runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm import tqdm


@dataclass(frozen=True)
class Schedule:
    """How a training's epoch loop runs: at most ``epochs`` epochs, stopping after ``patience``
    without a better validation score; Adam with ``lr`` and ``weight_decay``; ``desc`` labels
    the progress bar (shown when ``progress`` and stderr is a terminal). A schedule that could
    train nothing is refused at construction, before any data is split."""

    epochs: int
    patience: int
    lr: float
    desc: str
    weight_decay: float = 0.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.patience < 1:
            raise ValueError(
                f"epochs and patience must be >= 1, got {self.epochs} and {self.patience}"
            )


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
    schedule: Schedule,
    score_name: str,
) -> tuple[EarlyStopping, int]:
    """The epoch loop of every training: ``train_epoch(optimizer)`` (Adam's steps, returning
    the loss shown), then early stopping on ``val_score()`` (shown as ``score_name``);
    ``model`` ends with the best epoch's weights. Returns the stopping state (best weights and
    score) and the epochs run."""
    optimizer = torch.optim.Adam(
        model.parameters(), lr=schedule.lr, weight_decay=schedule.weight_decay
    )
    early = EarlyStopping(schedule.patience)
    bar = tqdm(
        range(1, schedule.epochs + 1),
        desc=schedule.desc,
        disable=None if schedule.progress else True,  # None: off when stderr is not a terminal
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
