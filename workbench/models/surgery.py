"""Surgery on a model's weights: attention heads removed from a Hugging Face Llama or BERT.

A head mask (:mod:`workbench.interventions.masks`) zeroes a head's output but still
computes it. Removing the head slices its rows out of the query, key and value projections
and its columns out of the output projection, as Michel et al. 2019 ("Are Sixteen Heads
Really Better than One?", section 4.3) do to time pruned models: the model holds fewer
parameters and does less work, and computes what the zero-masked model computes, up to
floating-point rounding.

The bridge rewires the Hugging Face module it wraps, so surgery works on a plain copy
(:func:`plain_copy`) run by :func:`hf_forward`, never on the bridge itself.

Examples:
    >>> values = torch.ones(model.info.n_layers, model.info.n_heads)   # doctest: +SKIP
    >>> values[0, 2] = 0                                                # doctest: +SKIP
    >>> smaller = remove_heads(plain_copy(model), values)               # doctest: +SKIP
    >>> logits = hf_forward(smaller, model.batches(prompts)[0], causal=True)  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.models.base import Model

Prune = Callable[[torch.nn.Linear, Tensor, int], torch.nn.Linear]
"""``prune(linear, index, dim)`` keeps the rows (``dim=0``) or columns (``dim=1``) in
``index`` (Hugging Face's ``prune_linear_layer``)."""


class _NoHeads(torch.nn.Module):
    """An attention with every head removed: it adds only the output projection's bias."""

    def __init__(self, width: int, bias: Tensor | None) -> None:
        super().__init__()
        self.width = width  # 0 for BERT's self-attention, d_model for a Llama attention
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone())

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, None]:
        out = hidden_states.new_zeros(*hidden_states.shape[:-1], self.width)
        return (out if self.bias is None else out + self.bias), None


def plain_copy(model: Model) -> torch.nn.Module:
    """The bridge's Hugging Face model as a plain module sharing no storage with it.

    The bridge swaps its own components into the model it holds, so the copy is rebuilt
    from the config and the weights are copied over (parameter names resolve through the
    bridge).

    Args:
        model: a workbench model wrapping a Hugging Face model.

    Returns:
        A fresh Hugging Face model in eval mode with the same weights.
    """
    original = model.bridge.original_model
    with torch.random.fork_rng():  # building the module draws random initial weights
        fresh = type(original)(original.config)
    state = {}
    for name in fresh.state_dict():
        try:
            state[name] = original.get_parameter(name).detach().clone()
        except AttributeError:
            state[name] = original.get_buffer(name).detach().clone()
    fresh.load_state_dict(state)
    return fresh.eval()


def remove_heads(hf_model: torch.nn.Module, values: Float[Tensor, "layer head_index"]
                 ) -> torch.nn.Module:
    """Slice the removed heads (mask value 0) out of a Llama or BERT model, in place.

    Query heads go from the query and output projections. In a grouped-query layer a
    key-value head stays as long as one of its query heads does; if the surviving query
    heads are spread unevenly over the key-value heads, the layer becomes multi-head
    (one key-value head per surviving query head), since Hugging Face's attention needs
    the same number of query heads per key-value head. A layer with no heads left adds
    only the output bias.

    Args:
        hf_model: a plain Hugging Face model (:func:`plain_copy`), changed in place.
        values: the head mask; heads whose value is 0 are removed, every other head is
            kept as it is (so only a 0/1 mask means the same as masking).

    Returns:
        ``hf_model``.

    Raises:
        WorkbenchError: another architecture.
    """
    from transformers.pytorch_utils import prune_linear_layer

    inner = getattr(hf_model, "model", None)
    with warnings.catch_warnings():  # a layer with no heads left makes empty weights
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        if inner is not None and hasattr(inner, "layers"):
            for layer, block in enumerate(inner.layers):
                _remove_llama(block, _kept(values[layer]), prune_linear_layer)
        elif hasattr(hf_model, "bert"):
            for layer, block in enumerate(hf_model.bert.encoder.layer):
                _remove_bert(block, _kept(values[layer]), prune_linear_layer)
        else:
            raise WorkbenchError(f"removing heads is implemented for Llama and BERT models, "
                                 f"not {type(hf_model).__name__}")
    return hf_model


def hf_forward(hf_model: torch.nn.Module, batch: Batch, *, causal: bool
               ) -> Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch pos d_model"]:
    """Run a plain Hugging Face model (e.g. one with heads removed) on a batch.

    Args:
        hf_model: a Llama (causal) or BERT model.
        batch: right-padded inputs.
        causal: return the LM's logits; otherwise the final hidden states of the encoder
            body (BERT's masked-LM head, random in encoders without one, is skipped).

    Returns:
        Logits ``[batch, pos, d_vocab]`` or hidden states ``[batch, pos, d_model]``.
    """
    if causal:
        return hf_model(batch.input_ids, attention_mask=batch.attention_mask).logits
    body = getattr(hf_model, "bert", hf_model)
    return body(batch.input_ids, **batch.forward_kwargs()).last_hidden_state


def _kept(values: Float[Tensor, " head_index"]) -> list[int]:
    return [int(h) for h in (values != 0).nonzero().flatten()]


def _rows(heads: Sequence[int], d_head: int) -> Tensor:
    """Indices of the ``d_head`` rows of each head in a projection's output."""
    if not heads:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(h * d_head, (h + 1) * d_head) for h in heads])


def _remove_bert(block: torch.nn.Module, keep: list[int], prune: Prune) -> None:
    attn = block.attention
    rows = _rows(keep, attn.self.attention_head_size)
    for name in ("query", "key", "value"):
        setattr(attn.self, name, prune(getattr(attn.self, name), rows, 0))
    attn.output.dense = prune(attn.output.dense, rows, 1)
    attn.self.num_attention_heads = len(keep)
    attn.self.all_head_size = len(rows)
    if not keep:
        attn.self = _NoHeads(0, None)  # the output projection keeps its bias


def _remove_llama(block: torch.nn.Module, keep: list[int], prune: Prune) -> None:
    attn = block.self_attn
    cfg = attn.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if not keep:
        block.self_attn = _NoHeads(cfg.hidden_size, attn.o_proj.bias)
        return
    kv_of = [h // (n_heads // n_kv) for h in keep]
    per_kv = {kv: kv_of.count(kv) for kv in kv_of}
    if len(set(per_kv.values())) == 1:  # even groups stay grouped
        kv_heads, groups = sorted(per_kv), next(iter(per_kv.values()))
    else:
        kv_heads, groups = kv_of, 1
    attn.q_proj = prune(attn.q_proj, _rows(keep, attn.head_dim), 0)
    attn.k_proj = prune(attn.k_proj, _rows(kv_heads, attn.head_dim), 0)
    attn.v_proj = prune(attn.v_proj, _rows(kv_heads, attn.head_dim), 0)
    attn.o_proj = prune(attn.o_proj, _rows(keep, attn.head_dim), 1)
    attn.num_key_value_groups = groups
