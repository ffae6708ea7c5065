"""Surgery on a model's weights: attention heads removed from a Hugging Face model.

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

import copy
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from jaxtyping import Float
from torch import Tensor

from workbench.core.errors import ModelCapabilityError
from workbench.inputs.batching import Batch
from workbench.models.adapters import FAMILIES_BY_ARCHITECTURE, Adapter, Layout, adapter_for
from workbench.models.base import Model


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
    state = {name: _through_bridge(original, name).detach().clone()
             for name in fresh.state_dict()}
    fresh.load_state_dict(state)
    return fresh.eval()


def _through_bridge(module: torch.nn.Module, name: str) -> Tensor:
    """The parameter or buffer ``name`` of a Hugging Face model the bridge has rewired: a
    step the bridge replaced (GPT-Neo's ``attn.attention``) is taken inside the bridge
    component's ``original_component``."""
    *path, leaf = name.split(".")
    for step in path:
        module = _inside(module, step)
        if hasattr(module, step):  # else the bridge collapsed this step into the last one
            module = getattr(module, step)
    return getattr(_inside(module, leaf), leaf)


def _inside(module: Any, attr: str) -> Any:
    while not hasattr(module, attr) and hasattr(module, "original_component"):
        module = module.original_component
    return module


def remove_heads(hf_model: torch.nn.Module, values: Float[Tensor, "layer head_index"]
                 ) -> torch.nn.Module:
    """Slice the removed heads (mask value 0) out of a Hugging Face model, in place.

    Works for every family whose adapter (:mod:`workbench.models.adapters`) allows it:
    separate projections, fused ones (GPT-2's ``Conv1D`` ``c_attn``, Phi-3's ``qkv_proj``,
    Falcon's and GPT-BigCode's multi-query ``query_key_value``/``c_attn``) and fused
    per-head ones (GPT-NeoX). Query heads go from the query and output projections. In a
    grouped-query layer a key-value head stays as long as one of its query heads does; if
    the surviving query heads are spread unevenly over the key-value heads, the layer
    becomes multi-head (one key-value head per surviving query head), since Hugging Face's
    attention needs the same number of query heads per key-value head. A layer with no
    heads left adds only the output bias.

    Args:
        hf_model: a plain Hugging Face model (:func:`plain_copy`), changed in place.
        values: the head mask; heads whose value is 0 are removed, every other head is
            kept as it is (so only a 0/1 mask means the same as masking).

    Returns:
        ``hf_model``.

    Raises:
        ModelCapabilityError: a family without an adapter, or one whose heads cannot be
            removed (the message says why, see :meth:`Adapter.removal_reason`).
    """
    adapter = adapter_of_module(hf_model)
    why = adapter.removal_reason(getattr(hf_model, "config", None))
    if why:
        raise ModelCapabilityError(f"heads cannot be removed from {adapter.family} "
                                   f"weights: {why}")
    config: Any = hf_model.config
    n_heads = config.num_attention_heads
    # Gemma and Qwen3 may set head_dim apart from hidden_size / n_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    with warnings.catch_warnings():  # a layer with no heads left makes empty weights
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        for layer, block in enumerate(adapter.layers(hf_model)):
            attn = adapter.attention_of(block)
            heads = _Heads.plan(_kept(values[layer]), n_heads, _kv_heads(config, attn, n_heads))
            _remove(adapter, block, attn, heads, d_head)
    return hf_model


def adapter_of_module(hf_model: torch.nn.Module) -> Adapter:
    """The adapter of a plain Hugging Face model, from its config's architecture name.

    Raises:
        ModelCapabilityError: not a Hugging Face model of a family with an adapter.
    """
    config = getattr(hf_model, "config", None)
    names = [*(getattr(config, "architectures", None) or []), type(hf_model).__name__]
    for name in names:
        if name in FAMILIES_BY_ARCHITECTURE:
            return adapter_for(name)
    return adapter_for(names[-1])  # raises, listing the known families


@dataclass(frozen=True)
class _Heads:
    """The heads one layer keeps: query heads, the kv head serving each group, and how many
    query heads share a kv head afterwards."""

    keep: list[int]
    kv: list[int]
    groups: int
    n_heads: int
    n_kv: int

    @classmethod
    def plan(cls, keep: list[int], n_heads: int, n_kv: int) -> _Heads:
        kv_of = [h // (n_heads // n_kv) for h in keep]
        per_kv = {kv: kv_of.count(kv) for kv in kv_of}
        if len(set(per_kv.values())) == 1:  # even groups stay grouped
            return cls(keep, sorted(per_kv), next(iter(per_kv.values())), n_heads, n_kv)
        return cls(keep, kv_of, 1, n_heads, n_kv)


def _kv_heads(config: Any, attn: torch.nn.Module, n_heads: int) -> int:
    """Key-value heads of a layer: one for multi-query attention (Falcon, GPT-BigCode)."""
    if getattr(attn, "multi_query", False):
        return 1
    return getattr(config, "num_key_value_heads", None) or n_heads


def _remove(adapter: Adapter, block: torch.nn.Module, attn: torch.nn.Module, heads: _Heads,
            d_head: int) -> None:
    """Slice one layer's attention down to ``heads`` (see :func:`remove_heads`)."""
    out = _get(attn, adapter.o)
    if not heads.keep and adapter.encoder_body is None:
        width = out.weight.shape[1 if adapter.conv1d else 0]
        _set(block, adapter.attention, _NoHeads(width, getattr(out, "bias", None)))
        return
    if not heads.keep:  # BERT-style: the output block (dense, norm) keeps its bias
        _set(attn, adapter.o, _prune(out, _rows([], d_head), "in", adapter.conv1d))
        attn.self = _NoHeads(0, None)
        return
    q_rows, kv_rows = _rows(heads.keep, d_head), _rows(heads.kv, d_head)
    layout = adapter.layout_of(attn)
    if layout == "separate":
        for name, rows in ((adapter.q, q_rows), (adapter.k, kv_rows), (adapter.v, kv_rows)):
            _set(attn, name, _prune(_get(attn, name), rows, "out", adapter.conv1d))
    else:
        qkv = adapter.qkv
        assert qkv is not None, f"{adapter.family}: a fused layout names its projection"
        fused = _fused_rows(layout, heads, q_rows, kv_rows, d_head)
        _set(attn, qkv, _prune(_get(attn, qkv), fused, "out", adapter.conv1d))
    _set(attn, adapter.o, _prune(out, q_rows, "in", adapter.conv1d))
    counts = {"heads": len(heads.keep), "kv_heads": len(heads.kv), "groups": heads.groups,
              "width": len(heads.keep) * d_head, "kv_width": len(heads.kv) * d_head}
    for name, quantity in adapter.head_attrs.items():
        owner, _, attr = name.rpartition(".")
        if owner == "config":  # shared by every layer: this layer gets its own copy
            attn.config = copy.copy(attn.config)
        setattr(_get(attn, owner), attr, counts[quantity])


def _fused_rows(layout: Layout, heads: _Heads, q_rows: Tensor, kv_rows: Tensor,
                d_head: int) -> Tensor:
    """Output rows of a fused q/k/v projection that the kept heads use."""
    if layout == "fused_per_head":  # (head, 3, d_head): q, k, v of each head together
        return _rows(heads.keep, 3 * d_head)
    q_width, kv_width = heads.n_heads * d_head, heads.n_kv * d_head  # [q | k | v]
    return torch.cat([q_rows, q_width + kv_rows, q_width + kv_width + kv_rows])


def _prune(layer: torch.nn.Module, index: Tensor, side: str, conv1d: bool) -> torch.nn.Module:
    """Keep the output (``side="out"``) or input features ``index`` of a linear layer."""
    from transformers.pytorch_utils import prune_linear_layer

    if conv1d:
        return _prune_conv1d(layer, index, side)
    # a Linear here (Conv1D went above), and the index is int64
    return prune_linear_layer(cast(torch.nn.Linear, layer), cast(torch.LongTensor, index),
                              dim=0 if side == "out" else 1)


def _prune_conv1d(layer: Any, index: Tensor, side: str) -> torch.nn.Module:
    """:func:`_prune` for GPT-2's ``Conv1D``, whose weight is stored ``[in, out]``."""
    from transformers.pytorch_utils import Conv1D

    dim = 1 if side == "out" else 0
    weight = layer.weight.detach().index_select(dim, index).clone()
    bias = layer.bias.detach()
    bias = bias.index_select(0, index).clone() if side == "out" else bias.clone()
    pruned = Conv1D(weight.shape[1], weight.shape[0]).to(weight.device, weight.dtype)
    with torch.no_grad():
        pruned.weight.copy_(weight)
        pruned.bias.copy_(bias)
    return pruned


def _get(module: torch.nn.Module, path: str) -> Any:
    return operator.attrgetter(path)(module) if path else module


def _set(module: torch.nn.Module, path: str, value: torch.nn.Module) -> None:
    owner, _, name = path.rpartition(".")
    setattr(_get(module, owner), name, value)


def hf_forward(hf_model: torch.nn.Module, batch: Batch, *, causal: bool
               ) -> Float[Tensor, "batch pos d_vocab"] | Float[Tensor, "batch pos d_model"]:
    """Run a plain Hugging Face model (e.g. one with heads removed) on a batch.

    Args:
        hf_model: a causal LM or a masked-LM encoder of a family with an adapter.
        batch: right-padded inputs.
        causal: return the LM's logits; otherwise the final hidden states of the encoder
            body (the adapter's ``encoder_body``: the masked-LM head, random in encoders
            without one, is skipped).

    Returns:
        Logits ``[batch, pos, d_vocab]`` or hidden states ``[batch, pos, d_model]``.
    """
    if causal:
        return hf_model(batch.input_ids, attention_mask=batch.attention_mask).logits
    body_name = adapter_of_module(hf_model).encoder_body
    body = getattr(hf_model, body_name) if body_name else hf_model
    return body(batch.input_ids, **batch.forward_kwargs()).last_hidden_state


def _kept(values: Float[Tensor, " head_index"]) -> list[int]:
    return [int(h) for h in (values != 0).nonzero().flatten()]


def _rows(heads: Sequence[int], d_head: int) -> Tensor:
    """Indices of the ``d_head`` rows of each head in a projection's output."""
    if not heads:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(h * d_head, (h + 1) * d_head) for h in heads])
