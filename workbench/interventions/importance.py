"""Head importance: how much a model's output depends on each attention head.

Two estimators over a head mask ``xi[layer, head]`` (see :mod:`workbench.interventions`):

- **Gradient importance** (Michel et al. 2019, "Are Sixteen Heads Really Better than
  One?", section 4.1, eq. 2): ``I_h = E_x |dL(x)/dxi_h|``, the expected absolute
  sensitivity of the loss to the head's mask value, evaluated at the current mask.
  :func:`mask_gradients` returns ``dL(x)/dxi_h`` *per example* in one backward pass per
  batch: each example gets its own copy of the mask (``xi[example, layer, head]``), and
  since an example's loss depends only on its own copy, the gradient of the batch's
  summed loss with respect to copy ``b`` is exactly ``dL(x_b)/dxi``. The absolute value is
  taken per example (:func:`gradient_importance`); taking it per batch (``|mean_b
  dL(x_b)/dxi_h|``, what accumulating ``mask.grad.abs()`` after each batch's backward
  pass computes) is a different estimator, in which opposite-signed examples cancel.
  By the chain rule, with ``z_h`` the head's output at hook ``hook_z`` before the mask,
  ``dL/dxi_h = sum_pos <dL/dz'_h, z_h>`` for zero ablation (``z' = xi z``) and
  ``sum_pos <dL/dz'_h, z_h - mean_h>`` for mean ablation.
- **Ablation importance**: ``D(mask without h) - D(mask)``, the change of a degradation
  ``D`` (a loss, or one minus a similarity) when head ``h`` alone is removed from the
  current mask; the model is evaluated once per remaining head, several heads to a
  forward pass (:func:`ablation_importance`).

Michel et al. normalise gradient importance per layer by the L2 norm before ranking
heads globally (:func:`normalize_by_layer`).

Examples:
    >>> grads = mask_gradients(model, prompts, example_loss, mask)      # doctest: +SKIP
    >>> scores = normalize_by_layer(gradient_importance(grads), keep=mask > 0)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import Prompt
from workbench.interventions import replay
from workbench.interventions.masks import HeadMask
from workbench.models.base import Model
from workbench.recording import hooks

Accumulation = Literal["example", "batch"]
ExampleLoss = Callable[[Model, Batch], Float[Tensor, "batch output"]]
"""``fn(model, batch)`` runs the forward pass (hooks active) and returns one or more
differentiable losses per example of the batch."""
RowDegradation = Callable[[Model, Batch], Float[Tensor, " batch"]]
"""``fn(model, batch)`` runs the forward pass (hooks active) and returns a degradation
(a loss, one minus a similarity) per row of the batch; ``batch.indices`` says which
example each row is."""


def per_example_mask_hooks(xi: Float[Tensor, "batch layer head_index"],
                           means: Float[Tensor, "layer head_index d_head"] | None = None
                           ) -> list[tuple[str, Any]]:
    """Hooks on every layer's ``hook_z`` applying a separate mask to each example."""
    fwd = []
    for layer in range(xi.shape[1]):
        def hook(z: Tensor, hook: Any, layer: int = layer) -> Tensor:
            x = xi[:, layer].to(z.dtype)[:, None, :, None]  # [B, 1, H, 1]
            if means is None:
                return z * x
            return z * x + (1 - x) * means[layer].to(z.dtype)[None, None]

        fwd.append((hooks.z(layer), hook))
    return fwd


def mask_gradients(model: Model, prompts: Sequence[Prompt], example_loss: ExampleLoss,
                   values: Float[Tensor, "layer head_index"], *,
                   means: Float[Tensor, "layer head_index d_head"] | None = None,
                   max_batch_tokens: int = 1024, desc: str = "mask gradients"
                   ) -> Float[Tensor, "example output layer head_index"]:
    """``dL_o(x)/dxi`` for every example ``x``, loss output ``o`` and head, at mask ``values``.

    Args:
        model: the model (its parameters are not differentiated).
        prompts: the examples.
        example_loss: see :data:`ExampleLoss`; called with the mask hooks active.
        values: the mask at which to differentiate (1 keeps a head, 0 removes it).
        means: per-head mean outputs for mean ablation (``None``: zero ablation).
        max_batch_tokens: tokens per forward pass.

    Returns:
        Signed gradients in prompt order.
    """
    batches = model.batches(prompts, max_tokens=max_batch_tokens)
    out: list[Tensor | None] = [None] * len(prompts)
    for batch in progress.track(batches, desc=desc):
        xi = values.detach().float()[None].repeat(len(batch.indices), 1, 1).requires_grad_(True)
        with torch.enable_grad(), frozen(model.bridge), \
                model.bridge.hooks(fwd_hooks=per_example_mask_hooks(xi, means)):
            losses = example_loss(model, batch)  # [B, outputs]
            grads = [torch.autograd.grad(losses[:, o].sum(), [xi],
                                         retain_graph=o + 1 < losses.shape[1])[0]
                     for o in range(losses.shape[1])]
        stacked = torch.stack(grads, dim=1).detach()  # [B, outputs, layer, head]
        for row, index in enumerate(batch.indices):
            out[index] = stacked[row]
    return torch.stack([g for g in out if g is not None])


@contextmanager
def frozen(module: torch.nn.Module) -> Iterator[None]:
    """Parameters not differentiated inside the block, as they were afterwards.

    Only the mask needs a gradient: with the parameters' ``requires_grad`` off, autograd
    skips every weight gradient (a third less time for smollm2's mask gradients, the same
    numbers).
    """
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def gradient_importance(grads: Float[Tensor, "example output layer head_index"], *,
                        accumulate: Accumulation = "example",
                        batch_size: int | None = None) -> Float[Tensor, "layer head_index"]:
    """Michel et al.'s ``E |dL/dxi_h|`` from per-example gradients.

    Args:
        grads: from :func:`mask_gradients`; loss outputs (e.g. random probes) are averaged
            after the absolute value, like examples.
        accumulate: ``example`` takes the absolute value of each example's gradient (the
            estimator as defined); ``batch`` of each batch's mean gradient (consecutive
            groups of ``batch_size`` examples), as accumulating ``|mask.grad|`` after each
            batch's backward pass does.
        batch_size: examples per batch for ``accumulate="batch"``.
    """
    if accumulate == "example":
        return grads.abs().mean((0, 1))
    if accumulate != "batch" or not batch_size or batch_size < 1:
        raise ValueError("accumulate must be 'example', or 'batch' with a positive batch_size")
    chunks = grads.split(batch_size, dim=0)
    return torch.stack([c.mean(0).abs().mean(0) for c in chunks]).mean(0)


def normalize_by_layer(importance: Float[Tensor, "layer head_index"],
                       keep: Bool[Tensor, "layer head_index"] | None = None
                       ) -> Float[Tensor, "layer head_index"]:
    """Divide each layer's importances by their L2 norm (Michel et al. 2019, section 4.1).

    Only the heads in ``keep`` count towards the norm; the others come back as NaN.
    A layer whose kept importances are all zero is left at zero.
    """
    keep = torch.ones_like(importance, dtype=torch.bool) if keep is None else keep
    kept = torch.where(keep, importance, torch.zeros_like(importance))
    norm = kept.norm(dim=1, keepdim=True)
    out = kept / torch.where(norm > 0, norm, torch.ones_like(norm))
    return torch.where(keep, out, torch.full_like(out, float("nan")))


def ablation_importance(model: Model, prompts: Sequence[Prompt], degradation: RowDegradation,
                        mask: HeadMask, *,
                        means: Float[Tensor, "layer head_index d_head"] | None = None,
                        max_batch_tokens: int = 1024, desc: str = "ablation importance"
                        ) -> Float[Tensor, "example layer head_index"]:
    """Per-example ``D(mask without h) - D(mask)`` for every head ``h`` still in ``mask``.

    Heads already removed get NaN. Each batch of prompts is repeated once per candidate
    mask (one per head removed from the current mask) in a single forward pass of at most
    ``max_batch_tokens`` tokens, with :func:`per_example_mask_hooks` giving every copy its
    own mask: the same numbers as one pass per head, with less overhead per pass.

    Removing a head of layer ``l`` changes nothing below ``l``, so the blocks below it are
    not run again: one pass of the current mask keeps every block's output, and a pass of
    layer ``l``'s candidates replays blocks ``0 .. l-1`` from it
    (:mod:`workbench.interventions.replay`; about half the blocks' work on average).

    Args:
        model: the model.
        prompts: the examples.
        degradation: see :data:`RowDegradation`.
        mask: the current mask (its ablation kind decides zero or mean ablation).
        means: per-head means, for a ``mean`` mask.
        max_batch_tokens: tokens per forward pass, copies included.
    """
    if mask.ablation == "resample":
        # every copy of a batch is the same prompt: each would be its own donor
        raise WorkbenchError("ablation importance batches copies of one prompt, so it "
                             "cannot resample a head from another prompt; use zero or mean")
    n_layers, n_heads = mask.shape
    remaining = [(layer, head) for layer in range(n_layers) for head in range(n_heads)
                 if mask.values[layer, head] != 0]
    candidates = [mask.without([h]).values.float() for h in remaining]
    means = means if mask.ablation == "mean" else None
    current = torch.full((len(prompts),), float("nan"))
    values = torch.full((len(candidates), len(prompts)), float("nan"))

    def run(group: list[Tensor], batch: Batch) -> Tensor:
        xi = torch.stack(group).repeat_interleave(len(batch.indices), dim=0)  # [K*B, L, H]
        with model.bridge.hooks(fwd_hooks=per_example_mask_hooks(xi, means)):
            return degradation(model, batch.repeat(len(group))).float().reshape(len(group), -1)

    with torch.inference_mode():
        for batch in model.batches(prompts, max_tokens=max_batch_tokens):
            per_pass = max(1, max_batch_tokens // batch.input_ids.numel())
            with replay.kept(model.bridge) as prefix:
                current[batch.indices] = run([mask.values.float()], batch)[0]
            passes = [(layer, idx[i: i + per_pass])
                      for layer in range(n_layers)
                      if (idx := [i for i, h in enumerate(remaining) if h[0] == layer])
                      for i in range(0, len(idx), per_pass)]
            for layer, idx in progress.track(passes, desc=desc):
                with replay.replayed(model.bridge, prefix, layer, copies=len(idx)):
                    values[idx[0]: idx[-1] + 1, batch.indices] = run(
                        [candidates[i] for i in idx], batch)
    diffs = torch.full((len(prompts), n_layers, n_heads), float("nan"))
    for i, (layer, head) in enumerate(remaining):
        diffs[:, layer, head] = values[i] - current
    return diffs
