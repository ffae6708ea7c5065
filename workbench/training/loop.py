"""The training loop: AdamW with linear warm-up and a cosine (or constant) learning rate.

:class:`TrainSpec` describes the optimisation; :func:`train` runs the loop through the
bridge (``bridge(tokens, return_type="loss")``), so every hook point exists while it
trains, and calls back at the checkpoint steps. The models themselves are built by
:mod:`workbench.models.native`.

A training step is one optimizer update on one batch of ``batch_size`` sequences of
``n_ctx`` tokens, so after ``step`` steps the model has seen ``step * batch_size * n_ctx``
tokens (BOS included). Step 0 is the initialisation.

Examples:
    >>> bridge = build_bridge(ModelSpec(n_layers=2, d_model=64, n_heads=4, n_ctx=128,
    ...                                 d_vocab=2048), tokenizer)           # doctest: +SKIP
    >>> train(bridge, data, TrainSpec(steps=1000), checkpoint_steps={0, 500, 1000},
    ...       on_checkpoint=lambda step, loss: None)                        # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from workbench.core import progress

LrSchedule = Literal["cosine", "constant"]


@dataclass(frozen=True)
class TrainSpec:
    """AdamW with linear warm-up and a cosine (or constant) learning rate."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_fraction: float = 0.1
    lr_schedule: LrSchedule = "cosine"
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    data_seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.warmup_steps < 0:
            raise ValueError("steps and batch_size must be positive, warmup_steps >= 0")
        if self.lr <= 0 or not 0 <= self.min_lr_fraction <= 1:
            raise ValueError("lr must be positive and min_lr_fraction in [0, 1]")
        if self.lr_schedule not in ("cosine", "constant"):
            raise ValueError(f"lr_schedule must be 'cosine' or 'constant', "
                             f"got {self.lr_schedule!r}")

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` for the update made at ``step`` (0-based)."""
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if self.lr_schedule == "constant":
            return warm
        progress_ = min(step, self.steps) / self.steps
        cosine = 0.5 * (1 + math.cos(math.pi * progress_))
        return warm * (self.min_lr_fraction + (1 - self.min_lr_fraction) * cosine)


def optimizer(bridge: Any, spec: TrainSpec) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW with weight decay on matrices only (embeddings included; not on biases or
    norm scales), and its learning-rate schedule."""
    params = [p for p in bridge.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr, betas=(0.9, 0.95),
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, spec.lr_factor)


Checkpoint = Callable[[int, float], None]


def train(bridge: Any, data: Iterator[Int[Tensor, "batch pos"]], spec: TrainSpec, *,
          checkpoint_steps: Collection[int] = (), on_checkpoint: Checkpoint | None = None,
          desc: str = "training") -> list[float]:
    """Train ``bridge`` for ``spec.steps`` steps on batches from ``data``.

    Args:
        bridge: a native ``TransformerBridge`` (:func:`build_bridge`).
        data: training batches (e.g. :func:`workbench.training.data.batches`).
        spec: optimisation settings.
        checkpoint_steps: steps (0 .. ``spec.steps``) after which to call back.
        on_checkpoint: ``fn(step, train_loss)``; ``train_loss`` is the mean loss of the
            batches trained on since the previous checkpoint (NaN at step 0). The model
            is in eval mode during the call and no gradient is tracked.

    Returns:
        The training loss of every step.
    """
    opt, schedule = optimizer(bridge, spec)
    wanted = set(checkpoint_steps)
    losses: list[float] = []
    since: list[float] = []

    def checkpoint(step: int) -> None:
        if on_checkpoint is None or step not in wanted:
            return
        bridge.eval()
        with torch.no_grad():
            on_checkpoint(step, sum(since) / len(since) if since else float("nan"))
        bridge.train()
        since.clear()

    bridge.train()
    checkpoint(0)
    for step in progress.track(range(1, spec.steps + 1), total=spec.steps, desc=desc):
        loss = bridge(next(data), return_type="loss")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if spec.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(bridge.parameters(), spec.grad_clip)
        opt.step()
        schedule.step()
        losses.append(loss.item())
        since.append(losses[-1])
        checkpoint(step)
    bridge.eval()
    return losses
