"""Architecture adapters: what each model family's attention looks like, in one place.

Hugging Face names and lays out the same computation differently in each family: separate
``q_proj``/``k_proj``/``v_proj`` linears (Llama), one fused ``c_attn`` stored transposed as a
``Conv1D`` (GPT-2), a fused ``query_key_value`` interleaved per head (GPT-NeoX, BLOOM),
rotary embeddings on every dimension, on a fraction of them (GPT-NeoX, Phi, StableLM,
GPT-J) or per layer type (Gemma 3), ALiBi biases (BLOOM), learned absolute positions.
Every experiment that needs more than the bridge's hooks asks the :class:`Adapter` of the
model's family (:func:`adapter_of`) instead of an attribute name; a family without an entry
is refused in one line naming what is missing.

One :data:`FAMILIES` entry per family; :func:`adapter_for` finds it from the Hugging Face
architecture (class) name.

Examples:
    >>> adapter_for("GPT2LMHeadModel").layout, adapter_for("GPT2LMHeadModel").conv1d
    ('fused', True)
    >>> adapter_for("BloomForCausalLM").positions
    'alibi'
    >>> adapter_for("MambaForCausalLM").unsupported
    'a state-space model: it has no attention, so no attention patterns or heads'
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from workbench.core.errors import ModelCapabilityError
from workbench.core.registry import Registry

if TYPE_CHECKING:
    from workbench.models.base import Model

Layout = Literal["separate", "fused", "fused_per_head", "none"]
"""How q, k, v are projected: separate linears; one fused linear whose output is
``[q heads | k heads | v heads]``; one fused linear whose output is ``(head, 3, d_head)``;
no attention at all."""
Positions = Literal["learned", "rotary", "alibi", "relative", "none"]
Rotary = Literal["full", "partial", "none"]
Norm = Literal["pre", "post"]
QKNorm = Literal["none", "per_head", "full_width"]
Quantity = Literal["heads", "kv_heads", "groups", "width", "kv_width"]
"""What an attention attribute counts, so that head removal can update it."""


@dataclass(frozen=True)
class Adapter:
    """How one family's attention is reached and what its position scheme is.

    Attributes:
        family: the registered name (``gpt2``, ``llama``, ...).
        architectures: the Hugging Face model class names of the family.
        blocks: dotted path from the Hugging Face model to its list of blocks.
        attention: dotted path from a block to its attention module.
        layout: see :data:`Layout`.
        q, k, v: the separate projections (``layout == "separate"``).
        qkv: the fused projection (the other layouts).
        o: the output projection.
        conv1d: weights stored ``[in, out]`` (GPT-2's ``Conv1D``), not ``[out, in]``.
        positions: learned absolute, rotary, ALiBi, relative biases, or none.
        rotary: RoPE on every dimension of a head, on a fraction of them, or none.
        rotary_per_layer: the rotary embedding is computed per layer type (Gemma 3).
        local_attention: some layers see only a window of keys (GPT-Neo, Gemma 2/3).
        norm: where the block's norms sit (before or after the sublayer).
        qk_norm: queries and keys normalized per head, or over every head together.
        softcap: attention scores pass through ``cap * tanh(score / cap)`` (Gemma 2).
        attn_out_norm: the attention output passes through a norm before the residual add
            (Gemma 2 and 3's ``post_attention_layernorm``, OLMo 2's post-norm), so the
            heads' outputs do not join the stream as separate terms.
        logit_softcap: the logits pass through ``cap * tanh(logit / cap)`` after the
            unembedding (Gemma 2), so a logit difference is not linear in the stream.
        encoder_body: attribute of an encoder's masked-LM model holding the body whose
            final hidden states are pooled (``None``: a causal LM).
        mask_buffer: a boolean buffer of the attention module that applies the family's
            own causal (and local-window) mask whatever mask it is handed (GPT-Neo).
        head_attrs: integer attributes of the attention module (dotted paths; a
            ``config.`` one is set on a copy of the config) that count heads or widths,
            updated when heads are removed from the weights.
        no_removal: why heads cannot be removed from the weights (``None``: they can).
        no_removal_if: ``{config flag: why}`` for variants of the family whose fused layout
            differs (Falcon's ``new_decoder_architecture`` groups q/k/v per kv head).
        per_head_unless: an attribute of the attention module without which the fused
            projection is laid out per head, ``(head, 3, d_head)`` (Falcon without
            ``multi_query``); ``None``: :attr:`layout` holds for every variant.
        unsupported: why the workbench cannot read this family's attention at all.
        score_hooks: why TransformerBridge does not expose this family's pre-softmax
            scores or rotated queries and keys through its hooks (``None``: it does), which
            an exact attribution of the scores needs.
        gguf: the ``general.architecture`` a GGUF file of this family declares, when
            ``transformers`` can dequantize such files (``None``: it cannot).
    """

    family: str
    architectures: tuple[str, ...]
    blocks: str = "model.layers"
    attention: str = "self_attn"
    layout: Layout = "separate"
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    qkv: str | None = None
    o: str = "o_proj"
    conv1d: bool = False
    positions: Positions = "rotary"
    rotary: Rotary = "full"
    rotary_per_layer: bool = False
    local_attention: bool = False
    norm: Norm = "pre"
    qk_norm: QKNorm = "none"
    softcap: bool = False
    attn_out_norm: bool = False
    logit_softcap: bool = False
    encoder_body: str | None = None
    mask_buffer: str | None = None
    head_attrs: dict[str, Quantity] = field(default_factory=dict)
    no_removal: str | None = None
    no_removal_if: dict[str, str] = field(default_factory=dict)
    per_head_unless: str | None = None
    unsupported: str | None = None
    score_hooks: str | None = None
    gguf: str | None = None

    @property
    def causal(self) -> bool:
        return self.encoder_body is None

    def refusal(self) -> None:
        """Raise the one-line refusal of an unsupported family.

        Raises:
            ModelCapabilityError: the family's attention cannot be read.
        """
        if self.unsupported:
            raise ModelCapabilityError(f"{self.family} ({', '.join(self.architectures)}) is "
                                       f"not supported: {self.unsupported}")

    def layout_of(self, attn: Any) -> Layout:
        """The q/k/v layout of one attention module of this family (see
        :attr:`per_head_unless`)."""
        if self.per_head_unless and not getattr(attn, self.per_head_unless, False):
            return "fused_per_head"
        return self.layout

    def layers(self, hf_model: Any) -> list[Any]:
        """The blocks of a plain Hugging Face model of this family."""
        return list(operator.attrgetter(self.blocks)(hf_model))

    def attention_of(self, block: Any) -> Any:
        """The attention module of one block."""
        return operator.attrgetter(self.attention)(block)

    def removal_reason(self, config: Any = None) -> str | None:
        """Why heads cannot be removed from this family's weights, or ``None``.

        Args:
            config: the model's Hugging Face config, for the variants of a family whose
                layout differs (:attr:`no_removal_if`).
        """
        if self.unsupported:
            return self.unsupported
        for flag, why in self.no_removal_if.items():
            if config is not None and getattr(config, flag, False):
                return why
        return self.no_removal


FAMILIES: Registry[Adapter] = Registry("model family", "model families")
FAMILIES_BY_ARCHITECTURE: dict[str, Adapter] = {}
"""Hugging Face architecture (class) name -> its family's adapter."""
FAMILIES_BY_GGUF: dict[str, Adapter] = {}
"""GGUF ``general.architecture`` -> the adapter of the family such a file loads as."""


def register(adapter: Adapter) -> Adapter:
    """Add a family (a duplicate family, architecture or GGUF architecture name raises)."""
    FAMILIES.register(adapter.family, adapter)
    for arch in adapter.architectures:
        if arch in FAMILIES_BY_ARCHITECTURE:
            raise ValueError(f"architecture {arch} is already registered")
        FAMILIES_BY_ARCHITECTURE[arch] = adapter
    if adapter.gguf is not None:
        if adapter.gguf in FAMILIES_BY_GGUF:
            raise ValueError(f"GGUF architecture {adapter.gguf} is already registered")
        FAMILIES_BY_GGUF[adapter.gguf] = adapter
    return adapter


def adapter_for(architecture: str) -> Adapter:
    """The adapter of a Hugging Face architecture (model class) name.

    Raises:
        ModelCapabilityError: no family has this architecture; the message lists them.
    """
    try:
        return FAMILIES_BY_ARCHITECTURE[architecture]
    except KeyError:
        raise ModelCapabilityError(
            f"architecture {architecture} has no workbench adapter (how its q/k/v/o "
            f"projections and positions are laid out); known families: "
            f"{', '.join(FAMILIES.names())}") from None


def adapter_of(model: Model) -> Adapter:
    """The adapter of a loaded model's family (see :func:`adapter_for`)."""
    return adapter_for(model.info.architecture)


_GPT2_ATTRS: dict[str, Quantity] = {"num_heads": "heads", "split_size": "width",
                                    "embed_dim": "width"}
_LLAMA_ATTRS: dict[str, Quantity] = {"num_key_value_groups": "groups"}
_NO_SCORE_HOOK = "TransformerBridge never calls hook_attn_scores for this family"
_NO_ROTARY_HOOKS = "TransformerBridge never calls hook_rot_q / hook_rot_k for this family"

for _adapter in (
    Adapter("gpt2", ("GPT2LMHeadModel",), blocks="transformer.h", attention="attn",
            layout="fused", qkv="c_attn", o="c_proj", conv1d=True, positions="learned",
            rotary="none", head_attrs=_GPT2_ATTRS, gguf="gpt2"),
    Adapter("gpt-neox", ("GPTNeoXForCausalLM",), blocks="gpt_neox.layers",
            attention="attention", layout="fused_per_head", qkv="query_key_value", o="dense",
            rotary="partial", score_hooks=_NO_ROTARY_HOOKS),
    Adapter("opt", ("OPTForCausalLM",), blocks="model.decoder.layers", o="out_proj",
            positions="learned", rotary="none", head_attrs={"num_heads": "heads",
                                                            "embed_dim": "width"},
            score_hooks=_NO_SCORE_HOOK),
    Adapter("gpt-j", ("GPTJForCausalLM",), blocks="transformer.h", attention="attn",
            o="out_proj", rotary="partial",
            head_attrs={"num_attention_heads": "heads", "embed_dim": "width"},
            score_hooks=_NO_SCORE_HOOK),
    Adapter("bloom", ("BloomForCausalLM",), blocks="transformer.h",
            attention="self_attention", layout="fused_per_head", qkv="query_key_value",
            o="dense", positions="alibi", rotary="none",
            head_attrs={"num_heads": "heads", "hidden_size": "width", "split_size": "width"},
            gguf="bloom",
            no_removal="BLOOM builds the ALiBi biases of every head once, for the whole "
                       "model, so a layer with fewer heads cannot take them"),
    Adapter("phi", ("PhiForCausalLM",), o="dense", rotary="partial", norm="pre",
            head_attrs=_LLAMA_ATTRS),
    Adapter("phi-3", ("Phi3ForCausalLM",), layout="fused", qkv="qkv_proj",
            head_attrs={**_LLAMA_ATTRS, "num_key_value_heads": "kv_heads",
                        "config.num_attention_heads": "heads"},
            score_hooks=_NO_ROTARY_HOOKS, gguf="phi3"),
    Adapter("gpt-neo", ("GPTNeoForCausalLM",), blocks="transformer.h",
            attention="attn.attention", o="out_proj", positions="learned", rotary="none",
            local_attention=True, mask_buffer="bias",
            head_attrs={"num_heads": "heads", "embed_dim": "width"},
            score_hooks=_NO_SCORE_HOOK),
    Adapter("falcon", ("FalconForCausalLM",), blocks="transformer.h",
            attention="self_attention", layout="fused", qkv="query_key_value", o="dense",
            head_attrs={"num_heads": "heads", "hidden_size": "width", "split_size": "width",
                        "num_kv_heads": "kv_heads", "num_key_value_groups": "groups"},
            no_removal_if={
                "new_decoder_architecture": "this Falcon variant fuses q/k/v per kv group, a "
                                            "layout head removal does not slice",
                "alibi": "this Falcon variant builds ALiBi biases for every head at once"},
            per_head_unless="multi_query", score_hooks=_NO_ROTARY_HOOKS, gguf="falcon"),
    Adapter("gpt-bigcode", ("GPTBigCodeForCausalLM",), blocks="transformer.h",
            attention="attn", layout="fused", qkv="c_attn", o="c_proj", positions="learned",
            rotary="none", head_attrs={"num_heads": "heads", "embed_dim": "width",
                                       "split_size": "width", "num_key_value_groups": "groups"}),
    Adapter("stablelm", ("StableLmForCausalLM",), rotary="partial",
            head_attrs={**_LLAMA_ATTRS, "num_heads": "heads", "num_key_value_heads": "kv_heads",
                        "hidden_size": "width"}, gguf="stablelm"),
    Adapter("olmo-2", ("Olmo2ForCausalLM",), norm="post", qk_norm="full_width",
            attn_out_norm=True, head_attrs=_LLAMA_ATTRS,
            no_removal="OLMo 2 normalizes queries and keys over every head together "
                       "(q_norm, k_norm over the full width), so removing a head changes the "
                       "kept heads' queries; only masking is exact"),
    Adapter("gemma-2", ("Gemma2ForCausalLM",), local_attention=True, softcap=True,
            logit_softcap=True, attn_out_norm=True, head_attrs=_LLAMA_ATTRS, gguf="gemma2"),
    Adapter("gemma-3", ("Gemma3ForCausalLM",), rotary_per_layer=True, local_attention=True,
            qk_norm="per_head", attn_out_norm=True, head_attrs=_LLAMA_ATTRS, gguf="gemma3"),
    Adapter("qwen3", ("Qwen3ForCausalLM",), qk_norm="per_head", head_attrs=_LLAMA_ATTRS,
            gguf="qwen3"),
    *(Adapter(name, (arch,), head_attrs=_LLAMA_ATTRS, gguf=gguf) for name, arch, gguf in (
        ("llama", "LlamaForCausalLM", "llama"), ("mistral", "MistralForCausalLM", "mistral"),
        ("mixtral", "MixtralForCausalLM", None), ("qwen2", "Qwen2ForCausalLM", "qwen2"),
        ("starcoder2", "Starcoder2ForCausalLM", "starcoder2"))),
    *(Adapter(name, (arch,), blocks=f"{name}.encoder.layer", attention="attention",
              q="self.query", k="self.key", v="self.value", o="output.dense",
              positions="learned", rotary="none", norm="post", encoder_body=name,
              head_attrs={"self.num_attention_heads": "heads", "self.all_head_size": "width"})
      for name, arch in (("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM"))),
    Adapter("t5", ("T5ForConditionalGeneration",), layout="none", positions="relative",
            rotary="none",
            unsupported="an encoder-decoder whose self-attention uses relative position "
                        "biases (no single attention pattern per layer)"),
    Adapter("mamba", ("MambaForCausalLM",), layout="none", positions="none", rotary="none",
            unsupported="a state-space model: it has no attention, so no attention patterns "
                        "or heads"),
):
    register(_adapter)


@contextlib.contextmanager
def own_mask_lifted(model: Model) -> Iterator[None]:
    """Switch off, for the duration, a mask the family applies inside its attention whatever
    mask it is handed (GPT-Neo's causal and local-window ``bias`` buffer), so that the mask
    a caller hands over is the only one. Nothing happens for other families.

    Args:
        model: a loaded model.
    """
    adapter = FAMILIES_BY_ARCHITECTURE.get(model.info.architecture)
    if adapter is None or adapter.mask_buffer is None:
        yield
        return
    saved = []
    for block in model.bridge.blocks:
        attn = _original(block.attn, adapter.mask_buffer)
        buffer = getattr(attn, adapter.mask_buffer)
        saved.append((attn, buffer))
        setattr(attn, adapter.mask_buffer, torch.ones_like(buffer))
    try:
        yield
    finally:
        for attn, buffer in saved:
            setattr(attn, adapter.mask_buffer, buffer)


@contextlib.contextmanager
def alibi_shifted(model: Model, shift: int) -> Iterator[None]:
    """ALiBi biases of positions ``j + shift`` instead of ``j`` for the duration.

    Hugging Face builds BLOOM's bias as ``slope_h * j`` for key ``j`` (the ``- slope_h *
    i`` of the query is dropped, since softmax ignores a constant per query) and hands it to
    every attention as ``alibi``; adding ``shift`` to every position adds ``slope_h *
    shift`` to every score of head ``h``, which a pre-hook on each attention does.

    Args:
        model: a model of an ALiBi family (its adapter's ``positions`` is ``alibi``).
        shift: the constant added to every position.

    Raises:
        ModelCapabilityError: the family has no ALiBi biases.
    """
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    if adapter_of(model).positions != "alibi":
        raise ModelCapabilityError(f"{model.info.name} has no ALiBi biases to shift")
    n_heads = model.info.n_heads
    # the bias of position 1 is the slope: [heads]
    slopes = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n_heads, torch.float32)[:, 0, 1]

    def shifted(module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        alibi = kwargs["alibi"]  # [batch * heads, 1, key]
        per_row = slopes.repeat(alibi.shape[0] // n_heads).to(alibi.dtype)
        return args, {**kwargs, "alibi": alibi + (per_row * shift)[:, None, None]}

    handles = [block.attn.register_forward_pre_hook(shifted, with_kwargs=True)
               for block in model.bridge.blocks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _original(module: Any, attr: str) -> Any:
    """``module`` or the Hugging Face module a bridge component wraps, whichever has
    ``attr``."""
    while not hasattr(module, attr) and hasattr(module, "original_component"):
        module = module.original_component
    return module
