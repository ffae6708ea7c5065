"""Every head's attention on one prompt, captured in memory.

:func:`head_patterns` runs one prompt and keeps every layer's attention weights, for a
probe small enough to hold at once (a short sequence shown at every checkpoint of a
training run, say); :func:`pattern_rows` turns that stack into a long table that a run can
store and a page can draw. Recordings of many prompts go to disk instead
(:mod:`workbench.recording.writer`), and per-head statistics are reduced on the fly
(:mod:`workbench.recording.reductions`).

Examples:
    >>> stack = head_patterns(model, Prompt(text="The cat sat on the mat"))  # doctest: +SKIP
    >>> stack.shape                      # [layer, head_index, query_pos, key_pos]  # doctest: +SKIP
    >>> pattern_rows(stack).head()       # layer, head, query, key, weight  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import hooks


def head_patterns(model: Model, prompt: Prompt
                  ) -> Float[Tensor, "layer head_index query_pos key_pos"]:
    """Every head's attention weights on one prompt.

    Args:
        model: the model (causal or encoder; any active head mask applies).
        prompt: the prompt, encoded by :meth:`Model.encode` (token ids are used as they are).

    Returns:
        ``[layer, head_index, query_pos, key_pos]`` float32 weights; each query's row sums
        to 1 over the keys it can see.
    """
    (batch,) = model.batches([prompt])
    names = [hooks.pattern(layer) for layer in range(model.info.n_layers)]
    with torch.inference_mode():
        kept = hooks.capture(model, batch, names)
    return torch.stack([kept[name][0].float() for name in names])


def pattern_rows(stack: Float[Tensor, "layer head_index query_pos key_pos"], *,
                 causal: bool = True) -> pd.DataFrame:
    """A pattern stack in long format, one row per (layer, head, query, key).

    Args:
        stack: e.g. from :func:`head_patterns`.
        causal: keep only the lower triangle (``key <= query``, what a causal query can
            see; the rest is 0 by construction); ``False`` keeps every pair.

    Returns:
        ``layer, head, query, key`` (int16) and ``weight`` (float32), ordered by layer,
        head, then query and key.
    """
    n_layers, n_heads, n, _ = stack.shape
    q, k = np.tril_indices(n) if causal else np.indices((n, n)).reshape(2, -1)
    values = stack[:, :, q, k].numpy()  # [L, H, n_pairs]
    return pd.DataFrame({
        "layer": np.repeat(np.arange(n_layers), n_heads * len(q)).astype(np.int16),
        "head": np.tile(np.repeat(np.arange(n_heads), len(q)), n_layers).astype(np.int16),
        "query": np.tile(q, n_layers * n_heads).astype(np.int16),
        "key": np.tile(k, n_layers * n_heads).astype(np.int16),
        "weight": values.reshape(-1).astype(np.float32),
    })
