"""Sentence embeddings by mean pooling: the mean over real tokens of the final residual stream.

Mean pooling is how sentence-transformers models (the bundled ``minilm`` among them) turn
token states into one vector per sentence (Reimers & Gurevych 2019, "Sentence-BERT",
section 3). Padding is left out of the mean, so an embedding does not depend on the batch
it was computed in. Any hooks or head masks active on the bridge apply.

Examples:
    >>> emb = sentence_embeddings(model, [Prompt(text="A man plays a guitar.")])  # doctest: +SKIP
    >>> emb.shape                                                                # doctest: +SKIP
    torch.Size([1, 384])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.inputs.batching import Batch
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import hooks


def mean_pool(hidden: Float[Tensor, "batch pos d_model"],
              attention_mask: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_model"]:
    """The mean of ``hidden`` over each row's real (unpadded) positions.

    Args:
        hidden: token states of a right-padded batch.
        attention_mask: 1 at real positions, 0 at padding.

    Returns:
        One vector per row, in ``hidden``'s dtype.
    """
    mask = attention_mask[:, :, None].to(hidden.dtype)  # [B, T, 1]
    return (hidden * mask).sum(1) / mask.sum(1)


def batch_embeddings(model: Model, batch: Batch) -> Float[Tensor, "batch d_model"]:
    """Mean-pooled final residual stream of a batch (differentiable when grad is on).

    The forward pass stops at the last block, so the unembedding is never computed.

    Args:
        model: any model; hooks and head masks active on its bridge apply.
        batch: right-padded inputs (:meth:`Model.batches`).

    Returns:
        One embedding per row of the batch, in the model's dtype.
    """
    name = hooks.resid(model.info.n_layers, model.info.n_layers)
    resid = hooks.capture(model, batch, [name], detach=False)[name]
    return mean_pool(resid, batch.attention_mask)


def sentence_embeddings(model: Model, prompts: Sequence[Prompt], *,
                        max_batch_tokens: int = 1024) -> Float[Tensor, "prompt d_model"]:
    """The mean-pooled final residual stream of every prompt, in float32.

    Args:
        model: any model; hooks and head masks active on its bridge apply.
        prompts: the sentences (or sentence pairs).
        max_batch_tokens: tokens per forward pass.

    Returns:
        ``[prompt, d_model]``, row ``i`` the embedding of ``prompts[i]``.
    """
    out = torch.zeros(len(prompts), model.info.d_model)
    with torch.inference_mode():
        for batch in model.batches(prompts, max_tokens=max_batch_tokens):
            out[batch.indices] = batch_embeddings(model, batch).float()
    return out
