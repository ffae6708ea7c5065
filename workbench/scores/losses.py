"""Next-token losses of a causal language model, per token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from workbench.core import progress
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
            nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(),
                                  batch.input_ids[:, 1:], reduction="none")
            for row, (index, n) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
                out[index] = nll[row, : n - 1].clone()
    return [t for t in out if t is not None]


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
