"""Next-token losses when each token may attend to only part of its prefix.

Three ways of limiting a causal LM's context, as compared by Xiao et al. 2023 ("Efficient
Streaming Language Models with Attention Sinks", StreamingLLM):

- *dense*: every token attends to its whole prefix;
- *window*: every token attends to the last ``W`` tokens only (itself included);
- *sinks + window*: the first ``k`` tokens of the text stay visible, plus the last ``W - k``.

:class:`Visibility` says which keys a query may see. :func:`windowed_losses` applies it as
an attention mask over the full sequence at absolute positions, computed in chunks of
queries with a key-value cache that keeps only the keys some later query can still see.
Dropping a key that every later query masks out changes nothing, so the chunked result
equals one forward pass with the full ``[pos, pos]`` mask (the tests check this), at a
cost of ``pos x W`` instead of ``pos x pos`` attention scores. Every token's hidden states
at every layer are computed under the same restriction, exactly as in streaming decoding.
:func:`windowed_losses_batched` runs several visibilities as the rows of one batch over a
shared cache, with the same result per row.

:func:`recompute_losses` is the reference that Xiao et al. call *sliding window with
re-computation*: each prediction is made by a fresh forward pass over the last ``W``
tokens, at positions ``0 .. W-1``.

Examples:
    >>> ids = torch.tensor(model.encode(Prompt(text=long_text))[0])      # doctest: +SKIP
    >>> nll = windowed_losses(model, ids, Visibility(n_sinks=4, window=256))  # doctest: +SKIP
    >>> float(nll.mean().exp())                                          # perplexity
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.models.base import Model
from workbench.recording import hooks


@dataclass(frozen=True)
class Visibility:
    """Which earlier tokens a query may attend to.

    Attributes:
        n_sinks: the first ``n_sinks`` tokens of the text stay visible to every later query.
        window: a query sees at most ``window`` keys: the sinks plus the most recent
            ``window - n_sinks`` tokens (itself included). ``None`` is dense attention.
    """

    n_sinks: int = 0
    window: int | None = None

    def __post_init__(self) -> None:
        if self.n_sinks < 0:
            raise WorkbenchError(f"n_sinks must be >= 0, got {self.n_sinks}")
        if self.window is not None and self.window <= self.n_sinks:
            raise WorkbenchError(
                f"the window ({self.window}) must be larger than n_sinks ({self.n_sinks}), "
                "so that a query can at least see itself")

    @property
    def label(self) -> str:
        """``dense``, or Xiao et al.'s ``sinks+recent`` notation (``0+256``, ``4+252``)."""
        if self.window is None:
            return "dense"
        return f"{self.n_sinks}+{self.window - self.n_sinks}"

    def mask(self, query_pos: Int[Tensor, " query"], key_pos: Int[Tensor, " key"]
             ) -> Bool[Tensor, "query key"]:
        """``[i, j]`` is true when the query at ``query_pos[i]`` may see ``key_pos[j]``."""
        q, k = query_pos[:, None], key_pos[None, :]
        causal = k <= q
        if self.window is None:
            return causal
        return causal & ((q - k < self.window - self.n_sinks) | (k < self.n_sinks))

    def still_needed(self, key_pos: Int[Tensor, " key"], next_query: int
                     ) -> Bool[Tensor, " key"]:
        """Keys that some query at ``next_query`` or later can still see."""
        if self.window is None:
            return torch.ones_like(key_pos, dtype=torch.bool)
        return (key_pos < self.n_sinks) | (next_query - key_pos < self.window - self.n_sinks)


@contextlib.contextmanager
def cache_reaches_attention(model: Model) -> Iterator[None]:
    """Hand each attention bridge the key-value cache its Hugging Face layer passes down.

    transformers 5 passes the cache to attention as ``cache=``; TransformerLens 4.3's
    attention bridges look for ``past_key_values=`` and otherwise attend to the new tokens
    alone (a chunked forward then silently differs from a full one). A pre-hook copies the
    argument across for the duration of the block; it does nothing when no cache is given.
    """

    def forward_cache(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if kwargs.get("cache") is not None and kwargs.get("past_key_values") is None:
            kwargs["past_key_values"] = kwargs["cache"]
        return args, kwargs

    handles = [block.attn.register_forward_pre_hook(forward_cache, with_kwargs=True)
               for block in model.bridge.blocks]
    try:
        with warnings.catch_warnings():
            # the bridge's documented cache argument is deprecated in transformers 5
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated.*")
            yield
    finally:
        for handle in handles:
            handle.remove()


def _keep_cache(cache: Any, index: Int[Tensor, " kept"]) -> None:
    """Keep only the cached keys and values at ``index`` (along the position axis)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)


def _nll(logits: Float[Tensor, "pos d_vocab"], targets: Int[Tensor, " pos"]
         ) -> Float[Tensor, " pos"]:
    return F.cross_entropy(logits.float(), targets, reduction="none")


def windowed_losses(model: Model, ids: Int[Tensor, " pos"], visibility: Visibility, *,
                    chunk: int = 256, desc: str = "streaming") -> Float[Tensor, " pos_minus_1"]:
    """Cross-entropy (nats) of each next token when attention is limited by ``visibility``.

    Args:
        model: a causal LM with a trained head.
        ids: the token ids of one text (with its BOS, if the model uses one).
        visibility: which keys each query may see.
        chunk: queries per forward pass (memory and speed only; the result is the same).

    Returns:
        Entry ``t`` is the loss of predicting ``ids[t + 1]`` from what position ``t`` sees.

    Raises:
        ModelCapabilityError: the model is not a causal LM with a trained head.
    """
    return windowed_losses_batched(model, ids, [visibility], chunk=chunk, desc=desc)[0]


def windowed_losses_batched(model: Model, ids: Int[Tensor, " pos"],
                            visibilities: Sequence[Visibility], *, chunk: int = 256,
                            desc: str = "streaming") -> Float[Tensor, "variant pos_minus_1"]:
    """:func:`windowed_losses` of several visibilities at once, one batch row each.

    The rows share one key-value cache holding every key that some row can still see; a
    row's mask hides the keys only another row needs, and a masked key adds exactly
    nothing to a softmax, so each row equals its own :func:`windowed_losses`. One forward
    pass per chunk instead of one per visibility: the same arithmetic in fewer, larger
    operations (on 2 busy cores each small operation waits for a time slice). Keep a dense
    visibility out of a batch of windows: it would keep every key for every row.

    Args:
        model: a causal LM with a trained head.
        ids: the token ids of one text (with its BOS, if the model uses one).
        visibilities: which keys each query may see, one per batch row.
        chunk: queries per forward pass (memory and speed only; the result is the same).

    Returns:
        Row ``i``, entry ``t``: the loss of ``ids[t + 1]`` under ``visibilities[i]``.

    Raises:
        ModelCapabilityError: the model is not a causal LM with a trained head.
    """
    from transformers import DynamicCache

    model.require(causal=True, lm_head=True, what="streaming perplexity")
    n, rows = len(ids), len(visibilities)
    if n > model.info.n_ctx:
        raise WorkbenchError(f"{n} tokens exceed {model.info.name}'s context of "
                             f"{model.info.n_ctx}")
    cache = DynamicCache()
    cached = torch.empty(0, dtype=torch.long)  # absolute positions of the cached keys
    losses = []
    with torch.inference_mode(), cache_reaches_attention(model):
        for start in progress.track(range(0, n - 1, chunk), desc=desc):
            queries = torch.arange(start, min(start + chunk, n - 1))
            needed = torch.stack([v.still_needed(cached, start) for v in visibilities])
            keep = needed.any(0).nonzero().squeeze(-1)
            _keep_cache(cache, keep)
            cached = torch.cat([cached[keep], queries])
            mask = torch.stack([v.mask(queries, cached) for v in visibilities])[:, None]
            logits = model.bridge(ids[queries].expand(rows, -1), attention_mask=mask,
                                  position_ids=queries.expand(rows, -1),
                                  past_key_values=cache)  # (rows, Q, d_vocab)
            losses.append(torch.stack([_nll(row, ids[queries + 1]) for row in logits]))
    return torch.cat(losses, dim=1)


def _last_position_logits(model: Model, windows: Int[Tensor, "batch pos"]
                          ) -> Float[Tensor, "batch d_vocab"]:
    """Logits at the last position only (the unembedding of the others is skipped)."""
    n_layers = model.info.n_layers
    final = hooks.resid(n_layers, n_layers)
    batch = Batch(windows, torch.ones_like(windows), None, [windows.shape[1]] * len(windows),
                  list(range(len(windows))))
    resid = hooks.capture(model, batch, [final])[final]
    return model.bridge.unembed(model.bridge.ln_final(resid[:, -1:]))[:, 0]


def recompute_losses(model: Model, ids: Int[Tensor, " pos"], window: int,
                     query_positions: Sequence[int], *, max_batch_tokens: int = 2048,
                     desc: str = "recompute") -> Float[Tensor, " n"]:
    """Loss of ``ids[t + 1]`` from a fresh forward pass over ``ids[t - window + 1 : t + 1]``.

    This is Xiao et al.'s *sliding window with re-computation*: every window's hidden
    states are computed from scratch, so its first token is a first token again.

    Args:
        query_positions: positions ``t`` with ``window - 1 <= t <= len(ids) - 2``. (For
            smaller ``t`` the window would be the whole prefix: the dense loss.)

    Returns:
        One loss per query position, in the order given.
    """
    model.require(causal=True, lm_head=True, what="recompute perplexity")
    positions = torch.as_tensor(list(query_positions), dtype=torch.long)
    if len(positions) and (positions.min() < window - 1 or positions.max() > len(ids) - 2):
        raise WorkbenchError(f"query positions must lie in {window - 1}..{len(ids) - 2}")
    per_batch = max(1, max_batch_tokens // window)
    offsets = torch.arange(-window + 1, 1)
    losses = []
    with torch.inference_mode():
        for group in progress.track(positions.split(per_batch), desc=desc):
            windows = ids[group[:, None] + offsets[None, :]]  # (B, W)
            losses.append(_nll(_last_position_logits(model, windows), ids[group + 1]))
    return torch.cat(losses) if losses else torch.empty(0)
