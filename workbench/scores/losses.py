"""Next-token losses of a causal language model: per token, per example, per repeat.

:func:`token_losses` gives every token's loss without gradients; :func:`row_losses` gives
each row's mean loss of a batch, differentiable, as an example loss for gradient
importance (:func:`workbench.interventions.importance.mask_gradients`).

:func:`token_losses` never forms a pass's logits: the pass stops at the final norm, and
:func:`final_nll` unembeds the vocabulary a block of ``VOCAB_BLOCK`` entries at a time
with a running log-sum-exp. The logits of 1,024 tokens of a 262,144-token vocabulary are 1
GiB in float32, and a cross-entropy of the whole ``[batch, pos, d_vocab]`` tensor reads
them back from memory: on Gemma 3 270M (2 cores) the losses of 8 x 121 tokens took 7.0 s
with the whole logits, 3.8 s by blocks; within 6e-5 nats of float64 (mean 5e-6), where a
cross-entropy along the strided vocabulary axis of the whole logits was up to 1.3e-3 off.
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
from workbench.recording import hooks
from workbench.scores.logit_attribution import output_transform, unembed_bias

VOCAB_BLOCK = 4096
"""Vocabulary entries unembedded at a time by :func:`final_nll`: a block of logits of
1,024 tokens is 16 MiB, which stays in cache while its log-sum-exp is taken (on 2 cores:
2.3 s at 4,096, 2.5 s at 8,192, 3.0 s at 32,768 for 968 tokens of Gemma 3 270M)."""


def token_losses(model: Model, prompts: Sequence[Prompt], *, max_batch_tokens: int = 1024,
                 desc: str = "loss") -> list[Float[Tensor, " pos_minus_1"]]:
    """Cross-entropy (nats) of predicting each token from the tokens before it.

    Entry ``t`` of a prompt's vector is the loss on token ``t + 1``. Any hooks or head
    masks active on the bridge apply. Each pass stops at the final norm and is unembedded
    by :func:`final_nll` (a model whose final norm has no ``ln_final.hook_out``, or with a
    hook on its unembedding, runs whole).

    Raises:
        ModelCapabilityError: the model is not a causal LM with a trained head.
    """
    model.require(causal=True, lm_head=True, what="next-token loss")
    batches = model.batches(prompts, max_tokens=max_batch_tokens)
    out: list[Tensor | None] = [None] * len(prompts)
    with torch.inference_mode():
        for batch in progress.track(batches, desc=desc):
            nll = _batch_nll(model, batch)
            for row, (index, n) in enumerate(zip(batch.indices, batch.lengths, strict=True)):
                out[index] = nll[row, : n - 1].clone()
    return [t for t in out if t is not None]


def _batch_nll(model: Model, batch: Batch, *, detach: bool = True
               ) -> Float[Tensor, "batch pos_minus_1"]:
    """:func:`next_token_nll` of a batch's pass (entries whose target is padding are not
    losses: 0, or whatever the whole pass gives): stopped at the final norm, with only the
    real targets unembedded by :func:`final_nll`, where it can be; else run whole."""
    if not _unembeds_blocked(model):
        logits = model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
        return next_token_nll(logits, batch.input_ids)
    normed = hooks.capture(model, batch, [hooks.FINAL_OUT], detach=detach)[hooks.FINAL_OUT]
    real = batch.attention_mask[:, 1:].bool()  # right-padded: a real target, real context
    nll = normed.new_zeros(real.shape)
    nll[real] = final_nll(model, normed[:, :-1][real], batch.input_ids[:, 1:][real])
    return nll


def _unembeds_blocked(model: Model) -> bool:
    """Whether :func:`token_losses` can stop at the final norm and unembed by blocks: the
    final norm's output is a hook point, and no hook is on the unembedding it would skip."""
    unembed = getattr(model.bridge, "unembed", None)
    points = [getattr(unembed, name, None) for name in ("hook_in", "hook_out")]
    watched = any(p is not None and (p.fwd_hooks or p.bwd_hooks) for p in points)
    return hooks.FINAL_OUT in model.bridge.hook_dict and unembed is not None and not watched


def final_nll(model: Model, normed: Float[Tensor, "n d_model"], targets: Int[Tensor, " n"]
              ) -> Float[Tensor, " n"]:
    """Cross-entropy (nats, in float32) of the logits of rows of the final norm's output
    against a target token each, without forming the ``[n, d_vocab]`` logits.

    The vocabulary is unembedded ``VOCAB_BLOCK`` entries at a time, each block's logits
    through the family's output transform (a soft cap) and a log-sum-exp, the blocks'
    combined by ``logaddexp``; the target's logit is its column's dot product. The same
    loss as ``F.cross_entropy`` of the whole logits within float round-off (the matrix
    products sum in another order).

    Args:
        model: a causal LM with a trained head.
        normed: ``ln_final.hook_out`` at the rows' positions.
        targets: the token each row predicts.

    Returns:
        ``[n]`` losses.
    """
    w_u, b_u = model.bridge.W_U.detach(), unembed_bias(model)  # [d_model, d_vocab]
    total = torch.full((len(targets),), float("-inf"))
    for start in range(0, w_u.shape[1], VOCAB_BLOCK):
        block = slice(start, start + VOCAB_BLOCK)
        logits = normed @ w_u[:, block] + (0 if b_u is None else b_u[block])
        total = torch.logaddexp(total, output_transform(model, logits).float().logsumexp(-1))
    own = torch.einsum("nd,dn->n", normed, w_u[:, targets])
    own = output_transform(model, own + (0 if b_u is None else b_u[targets]))
    return total - own.float()


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
    nll = _batch_nll(model, batch, detach=False)
    real = batch.attention_mask[:, 1:].float()  # padded targets do not count
    return (nll * real).sum(1) / real.sum(1)


def next_token_nll(logits: Float[Tensor, "batch pos d_vocab"],
                   input_ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos_minus_1"]:
    """Cross-entropy (nats, in float32) of the logits at ``t`` against the token at ``t + 1``.

    Taken over rows of logits (the vocabulary contiguous): over a strided vocabulary axis
    (``[batch, d_vocab, pos]``) the reduction summed less accurately, up to 1.3e-3 nats
    from float64 on Gemma 3 270M's 262,144 logits (6e-5 by rows)."""
    batch, pos, d_vocab = logits.shape
    rows = logits[:, :-1].reshape(-1, d_vocab).float()
    return F.cross_entropy(rows, input_ids[:, 1:].reshape(-1),
                           reduction="none").view(batch, pos - 1)


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
