"""Next-token losses of a causal language model: per token, per example, per repeat.

:func:`token_losses` gives every token's loss without gradients; :func:`row_losses` gives
each row's mean loss of a batch, differentiable, as an example loss for gradient
importance (:func:`workbench.interventions.importance.mask_gradients`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model


def token_losses(model: Model, prompts: Sequence[Prompt], *, max_batch_tokens: int = 1024,
                 desc: str = "loss") -> list[Float[Tensor, " pos_minus_1"]]:
    """Cross-entropy (nats) of predicting each token from the tokens before it.

    Entry ``t`` of a prompt's vector is the loss on token ``t + 1``. Any hooks or head
    masks active on the bridge apply. Batches are kept small because the logits alone
    are ``tokens x d_vocab`` floats (49152 per token on smollm2).

    Raises:
        ModelCapabilityError: the model is not a causal LM with a trained head.
    """
    model.require(causal=True, lm_head=True, what="next-token loss")
    batches = model.batches(prompts, max_tokens=max_batch_tokens)
    out: list[Tensor | None] = [None] * len(prompts)
    with torch.inference_mode():
        for batch in progress.track(batches, desc=desc):
            logits = model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
            nll = next_token_nll(logits, batch.input_ids)
            for row, (index, n) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
                out[index] = nll[row, : n - 1].clone()
    return [t for t in out if t is not None]


def row_losses(model: Model, batch: Batch) -> Float[Tensor, " batch"]:
    """Each row's mean next-token cross-entropy (nats) over its real tokens.

    Differentiable (call it with grad enabled); any hooks or head masks active on the
    bridge apply, so it serves as the per-example loss ``L(x)`` of gradient importance.

    Args:
        model: a causal LM with a trained head.
        batch: right-padded inputs (:meth:`Model.batches`).

    Returns:
        ``[batch]``, row ``b`` the mean over positions ``1 .. lengths[b] - 1`` of the loss
        of predicting each token from the ones before it.

    Raises:
        ModelCapabilityError: the model is not a causal LM with a trained head.
    """
    model.require(causal=True, lm_head=True, what="next-token loss")
    logits = model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
    nll = next_token_nll(logits, batch.input_ids)
    real = batch.attention_mask[:, 1:].float()  # padded targets do not count
    return (nll * real).sum(1) / real.sum(1)


def next_token_nll(logits: Float[Tensor, "batch pos d_vocab"],
                   input_ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos_minus_1"]:
    """Cross-entropy (nats, in float32) of the logits at ``t`` against the token at ``t + 1``."""
    return F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), input_ids[:, 1:],
                           reduction="none")


def repeat_losses(losses: Sequence[Tensor], seq_len: int, repeats: int, *, start: int = 1
                  ) -> np.ndarray:
    """``[prompt, repeat]`` mean loss on each repeat of a repeated sequence.

    ``losses`` are :func:`token_losses` vectors (entry ``t`` is the loss on the token at
    position ``t + 1``). Repeat ``r`` (0-based) holds positions ``start + r * seq_len`` to
    ``start + (r + 1) * seq_len - 1``; ``start`` is 1 after a BOS token, 0 without one.
    Each repeat's first token is left out: nothing before it predicts it.
    """
    out = np.empty((len(losses), repeats))
    for i, loss in enumerate(losses):
        for r in range(repeats):
            first = start + r * seq_len  # position of the repeat's first token
            out[i, r] = loss[first:first + seq_len - 1].mean().item()  # positions first+1..
    return out
