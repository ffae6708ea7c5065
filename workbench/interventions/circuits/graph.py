"""The computational graph of heads and MLPs that circuits are cut from.

Nodes, read off the model's facts (:class:`workbench.store.records.ModelInfo`):

- *senders*, which write to the residual stream: the input embedding (``embed``, token
  plus learned positions), each head's output (``LxHy``, ``z W_O``) and each MLP's output
  (``LxMLP``, after any norm on it), in forward order. Where the attention output passes a
  norm before the residual add (Gemma 2 and 3's ``post_attention_layernorm``), a head's
  output is its part of the normed sum, ``z_h W_O^h / s * w``, with ``s`` the norm's scale
  in the same pass (:mod:`workbench.models.norms`): the heads' parts then add up to what the
  attention writes to the stream, exactly, on every input;
- *receivers*, which read it: each head's query input (``LxHy.q``), each key-value head's
  key and value inputs (``LxKVg.k``, ``LxKVg.v``: with grouped-query attention one key or
  value input serves the query heads of its group, so edges into it are per key-value
  head), each MLP's input (``LxMLP.in``) and the logits (``logits``, the final norm's input).

An edge is one sender's output into one receiver's input along the residual stream: the
sender sits in an earlier layer, or it is a head of the receiver MLP's own layer (a block
whose attention and MLP read one input in parallel, GPT-J or GPT-NeoX, has no such edge).
A receiver's input is the sum of the outputs of the senders with an edge into it, plus
biases, which do not change between inputs and are not nodes.

Examples:
    >>> graph = build_graph(model)                      # doctest: +SKIP
    >>> graph.n_edges, graph.edge_name(0)               # doctest: +SKIP
    (1234, 'embed -> L0H0.q')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Bool
from torch import Tensor

from workbench.core.errors import ModelCapabilityError
from workbench.models.base import Model
from workbench.models.norms import EMBED, output_norm

SenderKind = Literal["embed", "head", "mlp"]
ReceiverKind = Literal["q", "k", "v", "mlp", "logits"]
LayerType = Literal["global", "sliding"]


@dataclass(frozen=True)
class Sender:
    """A node that writes to the residual stream."""

    name: str
    kind: SenderKind
    layer: int
    """-1 for the embedding"""
    head: int | None
    layer_type: LayerType | None
    """the attention span of its layer (``None`` for the embedding)"""


@dataclass(frozen=True)
class Receiver:
    """A node input that reads the residual stream."""

    name: str
    kind: ReceiverKind
    layer: int
    """``n_layers`` for the logits"""
    head: int | None
    """the query head (``q``) or key-value head (``k``, ``v``); ``None`` otherwise"""
    layer_type: LayerType | None
    """the attention span of its layer (``None`` for the logits)"""


@dataclass(frozen=True)
class Graph:
    """Senders, receivers and which sender feeds which receiver.

    Attributes:
        senders: in forward order (the embedding, then each layer's heads and MLP).
        receivers: in forward order (each layer's q, k, v inputs and MLP, then the logits).
        edges: ``[sender, receiver]``, true where the sender's output reaches the receiver.
        parallel: attention and MLP of a block read one input (no head -> same-layer MLP).
    """

    senders: tuple[Sender, ...]
    receivers: tuple[Receiver, ...]
    edges: Bool[Tensor, "sender receiver"]
    parallel: bool

    @property
    def n_edges(self) -> int:
        return int(self.edges.sum())

    def edge_index(self) -> tuple[Tensor, Tensor]:
        """``(sender indices, receiver indices)`` of every edge, sender-major."""
        s, r = torch.nonzero(self.edges, as_tuple=True)
        return s, r

    def edge_name(self, k: int) -> str:
        """``sender -> receiver`` of the ``k``-th edge of :meth:`edge_index`."""
        s, r = self.edge_index()
        return f"{self.senders[int(s[k])].name} -> {self.receivers[int(r[k])].name}"

    def n_before(self, receiver: Receiver) -> int:
        """How many senders (a prefix of :attr:`senders`) can feed ``receiver``."""
        n_heads = sum(1 for s in self.senders if s.kind == "head" and s.layer == 0)
        per_layer = n_heads + 1
        if receiver.kind == "logits":
            return len(self.senders)
        if receiver.kind == "mlp" and not self.parallel:
            return 1 + receiver.layer * per_layer + n_heads
        return 1 + receiver.layer * per_layer


def require_graph(model: Model) -> None:
    """Refuse a model whose heads' outputs are not separate parts of the stream.

    A norm on the attention output (Gemma 2 and 3) is taken in: each head's part of its
    output is a sender (see the module docstring).

    Raises:
        ModelCapabilityError: an encoder; a model with no language-model head; queries and
            keys normalized over every head together (OLMo 2), so one head's query input is
            not its own; a block with no norm before its attention, whose receivers the
            graph reads at that norm's input; a centring norm, or an output bias, on the
            attention output, whose parts would not be the heads'.
    """
    model.require(causal=True, lm_head=True, what="circuit discovery")
    name = model.info.name
    for layer in range(model.info.n_layers):
        block = model.bridge.blocks[layer]
        if getattr(block.attn, "_qk_norm_phase", None) == "pre_reshape":
            raise ModelCapabilityError(f"{name} normalizes queries and keys over every head "
                                       "together, so one head's query input is not its own "
                                       "receiver; circuit discovery needs per-head queries")
        if f"blocks.{layer}.ln1.hook_in" not in model.bridge.hook_dict:
            raise ModelCapabilityError(f"{name} has no norm before its attention (layer "
                                       f"{layer}); circuit discovery reads a head's input there")
        norm = output_norm(model, layer)
        if norm is None:
            continue
        bias = getattr(block.attn.o, "bias", None)
        if norm.center or (bias is not None and bool(bias.detach().any())):
            raise ModelCapabilityError(f"{name}'s attention output norm (layer {layer}) "
                                       "centres its input or follows an output bias, so the "
                                       "heads' parts of it are not theirs alone")


def build_graph(model: Model) -> Graph:
    """The graph of ``model``'s heads and MLPs (see the module docstring).

    Raises:
        ModelCapabilityError: see :func:`require_graph`.
    """
    require_graph(model)
    info = model.info
    parallel = bool(getattr(model.bridge.cfg, "parallel_attn_mlp", False))
    types: tuple[LayerType, ...] = tuple(info.layer_types)
    senders = [Sender(EMBED, "embed", -1, None, None)]
    receivers: list[Receiver] = []
    for layer in range(info.n_layers):
        kind = types[layer]
        senders += [Sender(f"L{layer}H{h}", "head", layer, h, kind) for h in range(info.n_heads)]
        senders.append(Sender(f"L{layer}MLP", "mlp", layer, None, kind))
        receivers += [Receiver(f"L{layer}H{h}.q", "q", layer, h, kind)
                      for h in range(info.n_heads)]
        for which in ("k", "v"):
            receivers += [Receiver(f"L{layer}KV{g}.{which}", which, layer, g, kind)
                          for g in range(info.n_kv_heads)]
        receivers.append(Receiver(f"L{layer}MLP.in", "mlp", layer, None, kind))
    receivers.append(Receiver("logits", "logits", info.n_layers, None, None))
    graph = Graph(tuple(senders), tuple(receivers), torch.zeros(0, 0, dtype=torch.bool),
                  parallel)
    edges = torch.zeros(len(senders), len(receivers), dtype=torch.bool)
    for r, receiver in enumerate(receivers):
        edges[: graph.n_before(receiver), r] = True
    return Graph(graph.senders, graph.receivers, edges, parallel)
