"""Permutation equivariance: where does word order enter a transformer's attention?

Question. Self-attention has no recurrence and no convolution (Vaswani et al. 2017,
"Attention Is All You Need", section 3.5: "since our model contains no recurrence and no
convolution, in order for the model to make use of the order of the sequence, we must
inject some information about the relative or absolute position of the tokens"). So an
attention sublayer with no position term and no mask is permutation *equivariant*: for any
permutation matrix ``P``, ``f(P X) = P f(X)``. Order can enter only through (a) position
embeddings added to the input (BERT's learned absolute positions), (b) rotary embeddings
that rotate queries and keys by their position (RoPE, Su et al. 2021, "RoFormer: Enhanced
Transformer with Rotary Position Embedding"), or (c) a causal mask, which on its own
carries position: a causal transformer with no position encoding still tells positions
apart (Haviv et al. 2022, "Transformer Language Models without Positional Encodings
Still Learn Positional Information"; Kazemnejad et al. 2023, "The Impact of Positional
Encoding on Length Generalization in Transformers", NoPE). This experiment measures each
of these on the real models, layer by layer.

Measure. For a permutation ``P`` of the positions (``(P X)[i] = X[perm[i]]``), every row
reports ``max |f(P X) - P f(X)| / max |f(X)|`` (the largest error relative to the largest
output), and its verdict against a tolerance stated in advance: ``sublayer_tolerance``
(1e-5) for one attention sublayer and for head permutations, which are a few float32
matmuls (float32's epsilon is 1.2e-7, and a permutation only reorders sums over keys), and
``model_tolerance`` (1e-3) for whole-model outputs, where 30 float32 layers compound that
rounding and RoPE's float32 angles add more (next paragraph). Both were fixed before any
measurement; the ``min_rel_error`` column shows how far above them position information
and masks move the outputs. Expectations are ``equivariant`` / ``unchanged`` (the
error must be within the tolerance in every case) or ``not equivariant`` / ``changes``
(beyond it in every case); a row passes when its expectation holds.

Conditions (``f`` is the attention sublayer ``MHA(X) = concat_h(A_h V_h) W_O + b_O``,
read at ``blocks.{l}.attn.o.hook_out``, fed the real input of layer ``l`` on each prompt
(``attn.hook_in``: the normed residual for Llama, the block input for BERT); the sublayer
is called directly, so the same ``X`` enters every condition):

- attention sublayer, ``no positions, no mask`` -> equivariant (Vaswani et al. 2017).
  RoPE is removed by overwriting ``hook_rot_q``/``hook_rot_k`` (after rotation) with the
  values of ``hook_q``/``hook_k`` (before), so the rotation is skipped exactly, whatever
  RoPE variant the model uses. BERT's attention has no position term at all (its
  positions are added at the embeddings). "No mask" is a 4-D additive mask of zeros,
  which the bridge uses as given (a 4-D mask replaces its own causal mask).
- ``no positions, causal mask`` -> not equivariant (Haviv et al. 2022): the same
  lower-triangular additive mask Hugging Face's eager attention builds (0 on and below the
  diagonal, the dtype's minimum above). On minilm, which is bidirectional, the mask is
  imposed; that is noted.
- ``no positions, causal mask, prefix permutation`` -> unchanged. What is tested: for a
  permutation that moves only positions ``0 .. i-1`` (``i`` drawn per seed) and fixes
  every later one, the outputs at positions ``>= i`` equal the unpermuted outputs,
  because query ``t >= i`` sees the same *set* of keys and values ``{x_0 .. x_t}``
  (positions ``< i`` do change). This holds only without positions: with RoPE a moved
  token's key is rotated by its new position, so
- ``RoPE, causal mask, prefix permutation`` -> changes, and ``RoPE, no mask`` -> not
  equivariant (Su et al. 2021). Rotary models only.
- whole model, ``as trained`` -> not equivariant. Outputs are the logits of a model with a
  trained LM head, else the final residual stream (minilm: no trained head, so no
  prediction is ever read from it).
- ``position embeddings zeroed`` (learned-position encoders) -> equivariant: the
  ``pos_embed.hook_out`` hook returns zeros; token types are permuted with the tokens.
- ``RoPE removed`` (rotary decoders: the hook above in every layer, causal mask kept) ->
  not equivariant, because the causal mask carries position (Haviv et al. 2022,
  Kazemnejad et al. 2023); ``RoPE removed, no mask`` (a 4-D zero mask handed to the
  model; Hugging Face passes a 4-D mask through unchanged) -> equivariant; ``RoPE
  removed, prefix permutation`` -> changes at positions ``>= i``: the one-layer argument
  above does not carry over to a stack, because after the first causal layer the state
  at an earlier position ``j`` depends on its own prefix ``{x_0 .. x_j}``, which a prefix
  permutation changes, and this is how a causal model with no position encoding can count
  positions (Haviv et al. 2022). (This expectation was first written as "unchanged", by
  carrying the one-layer argument over; the tiny two-layer test model contradicted it.)
  ``as trained, prefix permutation`` -> changes.
- ``position ids + c`` on a RoPE model -> unchanged for every shift ``c`` with
  ``c + T`` inside the context: RoPE's score between positions ``m`` and ``n`` depends
  only on ``m - n`` (Su et al. 2021, section 3.2.2, eq. 16). The model's real forward gets
  ``position_ids = arange(T) + c``. The invariance is exact in real arithmetic only: the
  model computes the angles ``(m + c) theta`` in float32, whose rounding grows with
  ``c`` (about ``c * 6e-8`` rad); ``position ids + c, float64 RoPE angles`` recomputes
  cos and sin in float64 (``rotary_emb.hook_cos``/``hook_sin``) to separate that rounding
  from the property.
- ``position ids + c`` on learned absolute positions -> changes, by design; a shift with
  ``c + T`` beyond the position table is reported ``n/a``.
- attention heads (at each layer, in the model's own setting: RoPE and causal mask for
  smollm2, bidirectional for minilm): permuting heads, and the matching slices of W_O,
  leaves the layer output unchanged and moves each head's pattern with it, whether the
  permutation is made in the weights or through ``hook_q``/``hook_k``/``hook_v`` (undone
  at ``hook_z``). With grouped-query attention the query heads move with their key-value
  group (query head ``h`` reads kv head ``h // (n_heads / n_kv_heads)``): a random
  permutation of the groups and of the heads inside each group. Two controls must change
  the output: heads permuted without W_O, and query heads moved to another kv group.

Conditions that do not apply to a model are rows with verdict ``n/a`` and the reason.
Tables: ``equivariance`` (every case: model, component, condition, seed, prompt, layer,
shift, max relative error, tolerance, expected, verdict), ``verdicts`` (one row per
component, condition and shift), and for the dashboard ``patterns`` (attention patterns
of ``X`` and ``P X`` at a few layers), ``tokens`` and ``permutations``.

Example:
    workbench run permutation-equivariance --model smollm2 --set seeds=0,1
    python -m experiments.permutation_equivariance --model minilm
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.harness.experiment import Context, experiment
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import check_prompt_set, load_prompt_set
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.scores.attention import additive_mask, causal_mask, full_mask, inverse_permutation
from workbench.store.runs import Run

log = logging.getLogger(__name__)

Component = Literal["attention sublayer", "whole model", "attention heads"]
Expectation = Literal["equivariant", "not equivariant", "unchanged", "changes"]
Requirement = Literal["rotary", "learned", "causal", "bidirectional", "grouped"]
HOLDS: dict[str, bool] = {"equivariant": True, "unchanged": True,
                          "not equivariant": False, "changes": False}
DEMO = {"n_prompts": 2, "max_tokens": 24, "seeds": (0, 1)}


@dataclass(frozen=True)
class Config:
    prompt_set: str = field(default="natural", metadata={"help": "prompts to permute"})
    n_prompts: int = field(default=4, metadata={"help": "how many prompts of the set"})
    max_tokens: int = field(default=32, metadata={
        "help": "prompts are cut to this many tokens (encoders keep their final [SEP])"})
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={
        "help": "permutation seeds; each draws a permutation per prompt and layer"})
    layers: tuple[int, ...] = field(default=(), metadata={
        "help": "layers for the sublayer and head checks (empty: every layer)"})
    shifts: tuple[int, ...] = field(default=(1, 10, 100, 1000), metadata={
        "help": "constants c added to every position id"})
    view_prompts: int = field(default=2, metadata={
        "help": "prompts (at most) whose patterns are stored for the dashboard"})
    view_layers: tuple[int, ...] = field(default=(), metadata={
        "help": "layers whose patterns are stored (empty: first, middle and last)"})
    sublayer_tolerance: float = field(default=1e-5, metadata={
        "help": "max relative error of an equivariant sublayer or head permutation"})
    model_tolerance: float = field(default=1e-3, metadata={
        "help": "max relative error of an equivariant whole-model output"})

    def __post_init__(self) -> None:
        for name in ("seeds", "layers", "shifts", "view_layers"):  # JSON and dicts give lists
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.n_prompts < 1:
            raise ValueError("n_prompts must be at least 1")
        if self.max_tokens < 4:
            raise ValueError("max_tokens must be at least 4 (a prefix permutation needs room)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be a non-empty list of distinct integers")
        if any(c < 1 for c in self.shifts):
            raise ValueError("shifts must be positive")
        if any(layer < 0 for layer in (*self.layers, *self.view_layers)):
            raise ValueError("layers must be non-negative")
        if self.view_prompts < 0:
            raise ValueError("view_prompts must be non-negative")
        if not (0 < self.sublayer_tolerance < 1 and 0 < self.model_tolerance < 1):
            raise ValueError("tolerances must lie strictly between 0 and 1")
        check_prompt_set(self.prompt_set)


# ---- conditions -------------------------------------------------------------------------

@dataclass(frozen=True)
class Condition:
    component: Component
    name: str
    expected: Expectation
    source: str
    requires: tuple[Requirement, ...] = ()


SUBLAYER = (
    Condition("attention sublayer", "no positions, no mask", "equivariant",
              "Vaswani et al. 2017: no recurrence or convolution"),
    Condition("attention sublayer", "no positions, causal mask", "not equivariant",
              "Haviv et al. 2022: a causal mask carries position"),
    Condition("attention sublayer", "no positions, causal mask, prefix permutation",
              "unchanged", "query t >= i sees the same set of keys"),
    Condition("attention sublayer", "RoPE, no mask", "not equivariant",
              "Su et al. 2021: RoPE rotates q, k by position", ("rotary",)),
    Condition("attention sublayer", "RoPE, causal mask, prefix permutation", "changes",
              "Su et al. 2021: a moved key is rotated by its new position", ("rotary",)),
)
WHOLE = (
    Condition("whole model", "as trained", "not equivariant",
              "positions (and a causal mask) enter the model"),
    Condition("whole model", "position embeddings zeroed", "equivariant",
              "Vaswani et al. 2017: order enters only through positions",
              ("learned", "bidirectional")),
    Condition("whole model", "RoPE removed", "not equivariant",
              "Haviv et al. 2022; Kazemnejad et al. 2023 (NoPE)", ("rotary", "causal")),
    Condition("whole model", "RoPE removed, no mask", "equivariant",
              "Vaswani et al. 2017: order enters only through positions and the mask",
              ("rotary", "causal")),
    Condition("whole model", "RoPE removed, prefix permutation", "changes",
              "Haviv et al. 2022: past layer 1, each earlier state encodes its own prefix",
              ("rotary", "causal")),
    Condition("whole model", "as trained, prefix permutation", "changes",
              "Su et al. 2021: positions of the moved tokens change", ("causal",)),
    Condition("whole model", "position ids + c", "unchanged",
              "Su et al. 2021: RoPE scores depend only on m - n", ("rotary",)),
    Condition("whole model", "position ids + c, float64 RoPE angles", "unchanged",
              "Su et al. 2021, without float32 angle rounding", ("rotary",)),
    Condition("whole model", "position ids + c, learned positions", "changes",
              "learned absolute positions: fails by design", ("learned",)),
)
HEADS = (
    Condition("attention heads", "permuted with W_O slices (weights)", "unchanged",
              "MHA is a sum over heads"),
    Condition("attention heads", "permuted (weights): patterns follow heads", "unchanged",
              "hook_pattern's head axis matches the weights'"),
    Condition("attention heads", "permuted via hooks on q, k, v, undone at z", "unchanged",
              "hook_q/k/v/z head axes match the weights'"),
    Condition("attention heads", "permuted (hooks): patterns follow heads", "unchanged",
              "hook_pattern's head axis matches hook_q's"),
    Condition("attention heads", "permuted without W_O slices (control)", "changes",
              "control: W_O must move with its heads"),
    Condition("attention heads", "query heads moved across kv groups (control)", "changes",
              "control: a query head must keep its kv head", ("grouped",)),
)
CONDITIONS: tuple[Condition, ...] = SUBLAYER + WHOLE + HEADS
BY_NAME = {(c.component, c.name): c for c in CONDITIONS}


def missing_requirement(cond: Condition, model: Model) -> str | None:
    """Why ``cond`` does not apply to ``model``, or ``None`` if it does."""
    info = model.info
    facts: dict[Requirement, tuple[bool, str]] = {
        "rotary": (info.positions == "rotary",
                   f"{info.name} has {info.positions} absolute positions, no RoPE"),
        "learned": (info.positions == "learned",
                    f"{info.name} has no position embeddings: RoPE rotates q and k inside "
                    "attention (see the RoPE conditions)"),
        "causal": (info.causal, f"{info.name} is bidirectional: no causal mask to keep"),
        "bidirectional": (not info.causal,
                          f"{info.name} is causal: its mask keeps it from being equivariant"),
        "grouped": (1 < info.n_kv_heads < info.n_heads,
                    f"{info.name} has {info.n_kv_heads} kv heads for {info.n_heads} query "
                    "heads: no groups to cross"),
    }
    for need in cond.requires:
        ok, why = facts[need]
        if not ok:
            return why
    return None


# ---- inputs and permutations ---------------------------------------------------------------

@dataclass(frozen=True)
class Encoded:
    """One prompt's token ids (and segment ids for encoders), cut to ``max_tokens``."""

    ids: Int[Tensor, "batch pos"]
    type_ids: Int[Tensor, "batch pos"] | None
    tokens: list[str]


def encode_prompts(model: Model, cfg: Config) -> list[Encoded]:
    """The first ``n_prompts`` prompts, cut to ``max_tokens`` (an encoder keeps [SEP])."""
    prompts = load_prompt_set(cfg.prompt_set, model)[: cfg.n_prompts]
    if len(prompts) < cfg.n_prompts:
        raise WorkbenchError(f"prompt set '{cfg.prompt_set}' has only {len(prompts)} prompts")
    out = []
    for prompt in prompts:
        ids, type_ids = model.encode(prompt)
        if len(ids) > cfg.max_tokens:
            keep_last = not model.info.causal
            cut = cfg.max_tokens - keep_last
            ids = ids[:cut] + ids[-1:] * keep_last
            type_ids = type_ids[:cut] + type_ids[-1:] * keep_last if type_ids else type_ids
        if len(ids) < 4:
            raise WorkbenchError(f"prompt {prompt.label} has {len(ids)} tokens; need >= 4")
        out.append(Encoded(torch.tensor([ids]), torch.tensor([type_ids]) if type_ids else None,
                           model.str_tokens(ids)))
    return out


def _generator(*parts: int) -> torch.Generator:
    seed = 0
    for part in parts:
        seed = seed * 1_000_003 + part
    return torch.Generator().manual_seed(seed % 2**63)


def _non_identity(n: int, gen: torch.Generator) -> Int[Tensor, " n"]:
    while True:
        perm = torch.randperm(n, generator=gen)
        if n < 2 or not bool((perm == torch.arange(n)).all()):
            return perm


def full_permutation(n: int, seed: int, prompt: int) -> Int[Tensor, " pos"]:
    """A random non-identity permutation of ``n`` positions, fixed by seed and prompt."""
    return _non_identity(n, _generator(seed, prompt, 1))


def prefix_permutation(n: int, seed: int, prompt: int) -> tuple[int, Int[Tensor, " pos"]]:
    """``(i, perm)``: ``perm`` shuffles positions ``0 .. i-1`` and fixes every later one."""
    gen = _generator(seed, prompt, 2)
    i = int(torch.randint(2, n, (1,), generator=gen))  # 2 <= i <= n - 1
    return i, torch.cat([_non_identity(i, gen), torch.arange(i, n)])


def head_permutation(n_heads: int, n_kv_heads: int, seed: int, layer: int
                     ) -> tuple[Int[Tensor, " head_index"], Int[Tensor, " kv_head"]]:
    """Random query- and kv-head permutations that keep every query head with its kv head.

    New query head ``j`` is old head ``q_perm[j]``; it reads new kv head ``j // r`` (``r``
    query heads per kv head), which is old kv head ``kv_perm[j // r]``, and that must be
    old head ``q_perm[j]``'s own kv head: groups move whole and heads move within them.
    """
    gen = _generator(seed, layer, 3)
    r = n_heads // n_kv_heads
    while True:
        kv_perm = torch.randperm(n_kv_heads, generator=gen)
        within = torch.stack([torch.randperm(r, generator=gen) for _ in range(n_kv_heads)])
        q_perm = einops.rearrange(kv_perm[:, None] * r + within, "g r -> (g r)")
        if n_heads < 2 or not bool((q_perm == torch.arange(n_heads)).all()):
            return q_perm, kv_perm


# ---- running the model ---------------------------------------------------------------------

def _capture(store: dict[str, Tensor], key: str) -> Callable[[Tensor, Any], None]:
    def hook(tensor: Tensor, hook: Any) -> None:
        store[key] = tensor.detach().clone()

    return hook


def no_rope_hooks(layers: Sequence[int]) -> list[tuple[str, Any]]:
    """Skip RoPE exactly: ``hook_rot_q``/``hook_rot_k`` return the unrotated ``hook_q``/``hook_k``.

    Both pairs of hooks see ``[batch, pos, head, d_head]`` (the bridge converts the rotary
    hooks from Hugging Face's ``[batch, head, pos, d_head]``), so the values can be handed
    over as they are.
    """
    fwd: list[tuple[str, Any]] = []
    for layer in layers:
        stash: dict[str, Tensor] = {}
        for name in ("q", "k"):
            fwd.append((f"blocks.{layer}.attn.hook_{name}", _capture(stash, name)))

            def restore(tensor: Tensor, hook: Any, stash=stash, name=name) -> Tensor:
                return stash[name]

            fwd.append((f"blocks.{layer}.attn.hook_rot_{name}", restore))
    return fwd


def zero_position_hooks() -> list[tuple[str, Any]]:
    """Learned absolute position embeddings replaced by zeros."""
    return [("pos_embed.hook_out", lambda tensor, hook: torch.zeros_like(tensor))]


def float64_angle_hooks(model: Model, position_ids: Int[Tensor, "batch pos"]
                        ) -> list[tuple[str, Any]]:
    """RoPE's cos and sin recomputed from float64 angles ``position * theta``.

    The frequencies ``theta`` are the model's own (float32) ones, so only the rounding of
    the product changes. A rotary embedding this does not reproduce (to 1e-3, far above the
    float32 angle error) is refused rather than silently replaced.
    """
    rotary = getattr(model.bridge, "rotary_emb", None)
    inner = getattr(rotary, "original_component", None)
    inv_freq = getattr(inner, "inv_freq", None)
    if inv_freq is None:
        raise WorkbenchError(f"{model.info.name}: no rotary inv_freq to recompute angles from")
    angles = position_ids.double()[..., None] * inv_freq.double()  # [B, T, d_head/2]
    angles = torch.cat([angles, angles], dim=-1)
    scaling = float(getattr(inner, "attention_scaling", 1.0))

    def make(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Any], Tensor]:
        def hook(tensor: Tensor, hook: Any) -> Tensor:
            exact = (fn(angles) * scaling).to(tensor.dtype).expand_as(tensor)
            if float((exact - tensor).abs().max()) > 1e-3:
                raise WorkbenchError(f"{model.info.name}: its rotary embedding is not the "
                                     "standard RoPE; float64 angles are not supported")
            return exact

        return hook

    return [("rotary_emb.hook_cos", make(torch.cos)), ("rotary_emb.hook_sin", make(torch.sin))]


def layer_inputs(model: Model, enc: Encoded, layers: Sequence[int]
                 ) -> dict[int, Float[Tensor, "batch pos d_model"]]:
    """What each layer's attention sublayer reads (``attn.hook_in``) on one prompt."""
    store: dict[str, Tensor] = {}
    fwd = [(f"blocks.{layer}.attn.hook_in", _capture(store, str(layer))) for layer in layers]
    n = enc.ids.shape[1]
    batch = Batch(enc.ids, torch.ones_like(enc.ids), enc.type_ids, [n], [0])
    hooks.run_hooked(model.bridge, batch, fwd, stop_after=f"blocks.{max(layers)}.attn.hook_in")
    return {layer: store[str(layer)] for layer in layers}


def sublayer(model: Model, layer: int, x: Float[Tensor, "batch pos d_model"], *, rope: bool,
             causal: bool, fwd_hooks: Sequence[tuple[str, Any]] = ()
             ) -> tuple[Float[Tensor, "batch pos d_model"],
                        Float[Tensor, "batch head_index query_pos key_pos"]]:
    """One attention sublayer on ``x``: its output (``attn.o.hook_out``) and pattern.

    Args:
        rope: rotate q and k by position (rotary models; ignored otherwise).
        causal: a causal mask; otherwise every query sees every key.
        fwd_hooks: more hooks for the call (e.g. head permutations).
    """
    n = x.shape[1]
    mask = causal_mask(n) if causal else full_mask(n)
    kwargs: dict[str, Any] = {"attention_mask": additive_mask(mask, x.dtype)[None, None]}
    extra = list(fwd_hooks)
    if model.info.positions == "rotary":
        kwargs["position_embeddings"] = model.bridge.rotary_emb(x, torch.arange(n)[None])
        if not rope:
            extra += no_rope_hooks([layer])
    store: dict[str, Tensor] = {}
    fwd = [(f"blocks.{layer}.attn.o.hook_out", _capture(store, "out")),
           (hooks.pattern(layer), _capture(store, "pattern")), *extra]
    with model.bridge.hooks(fwd_hooks=fwd):
        model.bridge.blocks[layer].attn(x, **kwargs)
    return store["out"], store["pattern"]


def model_output(model: Model, enc: Encoded, *, perm: Tensor | None = None,
                 position_ids: Tensor | None = None, no_mask: bool = False,
                 fwd_hooks: Sequence[tuple[str, Any]] = ()) -> Float[Tensor, "pos d_out"]:
    """The whole model's output on a prompt (optionally permuted): logits when the model
    has a trained LM head, else the final residual stream (before the final norm)."""
    ids, type_ids = enc.ids, enc.type_ids
    if perm is not None:
        ids = ids[:, perm]
        type_ids = type_ids[:, perm] if type_ids is not None else None
    kwargs: dict[str, Any] = {}
    if type_ids is not None:
        kwargs["token_type_ids"] = type_ids
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if no_mask:  # Hugging Face uses a 4-D mask as given, and so does the bridge's attention
        kwargs["attention_mask"] = additive_mask(full_mask(ids.shape[1]))[None, None]
    if model.info.has_lm_head:
        with model.bridge.hooks(fwd_hooks=list(fwd_hooks)):
            return model.bridge(ids, return_type="logits", **kwargs)[0]
    store: dict[str, Tensor] = {}
    n_layers = model.info.n_layers
    fwd = [*fwd_hooks, (hooks.resid(n_layers, n_layers), _capture(store, "out"))]
    with model.bridge.hooks(fwd_hooks=fwd):
        model.bridge(ids, return_type=None, **kwargs)
    return store["out"][0]


def output_kind(model: Model) -> str:
    return "logits" if model.info.has_lm_head else "final residual stream"


# ---- head permutations ---------------------------------------------------------------------

def _feature_index(perm: Tensor, d_head: int) -> Tensor:
    """Feature indices of ``(head d_head)`` when the heads are taken in ``perm`` order."""
    return einops.rearrange(perm[:, None] * d_head + torch.arange(d_head), "h d -> (h d)")


@contextlib.contextmanager
def permuted_head_weights(model: Model, layer: int, q_perm: Tensor, kv_perm: Tensor, *,
                          output_slices: bool = True) -> Iterator[None]:
    """Permute one layer's heads in its weights for the duration of the block.

    New query head ``j`` gets old head ``q_perm[j]``'s rows of W_Q (and b_Q), new kv head
    ``g`` old kv head ``kv_perm[g]``'s rows of W_K, W_V (and biases), and, with
    ``output_slices``, W_O's input columns move with the query heads. The original
    tensors are put back afterwards, even on error.
    """
    attn = model.bridge.blocks[layer].attn
    d = model.info.d_head
    q_idx, kv_idx = _feature_index(q_perm, d), _feature_index(kv_perm, d)
    plan = [(attn.q, q_idx, 0), (attn.k, kv_idx, 0), (attn.v, kv_idx, 0)]
    if output_slices:
        plan.append((attn.o, q_idx, 1))
    saved: list[tuple[torch.nn.Parameter, Tensor]] = []
    try:
        with torch.no_grad():
            for bridge, idx, dim in plan:
                linear = bridge.original_component
                params = [linear.weight] + ([linear.bias] if dim == 0 and
                                            linear.bias is not None else [])
                for param in params:
                    saved.append((param, param.data))
                    axis = dim if param.ndim == 2 else 0
                    param.data = param.data.index_select(axis, idx)
        yield
    finally:
        for param, data in reversed(saved):
            param.data = data


def head_permutation_hooks(layer: int, q_perm: Tensor, kv_perm: Tensor
                           ) -> list[tuple[str, Any]]:
    """The same permutation made through hooks: q, k and v heads permuted as they are
    projected, and undone at ``hook_z`` (equivalent to moving W_O's slices with them)."""
    inverse = inverse_permutation(q_perm)

    def by(perm: Tensor) -> Callable[[Tensor, Any], Tensor]:
        return lambda tensor, hook: tensor[:, :, perm]  # [batch, pos, head, d_head]

    attn = f"blocks.{layer}.attn"
    return [(f"{attn}.hook_q", by(q_perm)), (f"{attn}.hook_k", by(kv_perm)),
            (f"{attn}.hook_v", by(kv_perm)), (hooks.z(layer), by(inverse))]


# ---- measuring -----------------------------------------------------------------------------

def relative_error(after: Float[Tensor, "*batch pos d"], before: Float[Tensor, "*batch pos d"],
                   scale_of: Float[Tensor, "*batch pos d"], positions: slice = slice(None)
                   ) -> float:
    """``max |after - before| / max |scale_of|`` over the positions (dim -2) selected."""
    diff = (after[..., positions, :].double() - before[..., positions, :].double()).abs().max()
    return float(diff / scale_of.double().abs().max().clamp_min(1e-30))


@dataclass
class Rows:
    """Accumulates the long ``equivariance`` table for one model."""

    model: Model
    cfg: Config
    rows: list[dict[str, Any]] = field(default_factory=list)

    def tolerance(self, cond: Condition) -> float:
        if cond.component == "whole model":
            return self.cfg.model_tolerance
        return self.cfg.sublayer_tolerance

    def add(self, component: Component, name: str, error: float | None, *, seed: int = -1,
            prompt: int = -1, layer: int = -1, shift: int = 0, prefix: int = 0,
            n_tokens: int = 0, note: str = "", detail: str = "") -> None:
        cond = BY_NAME[(component, name)]
        tol = self.tolerance(cond)
        if error is None:
            holds, verdict = None, "n/a"
        else:
            holds = bool(error <= tol)
            verdict = "pass" if holds == HOLDS[cond.expected] else "fail"
        self.rows.append({
            "model": self.model.info.name, "component": component, "condition": name,
            "seed": seed, "prompt": prompt, "layer": layer, "shift": shift, "prefix": prefix,
            "n_tokens": n_tokens, "max_rel_error": math.nan if error is None else error,
            "tolerance": tol, "expected": cond.expected,
            "holds": holds, "verdict": verdict, "note": note, "detail": detail,
            "source": cond.source,
        })

    def not_applicable(self) -> list[Condition]:
        """Add one ``n/a`` row per condition that does not apply; return those that do."""
        applicable = []
        for cond in CONDITIONS:
            why = missing_requirement(cond, self.model)
            if why is None:
                applicable.append(cond)
            else:
                self.add(cond.component, cond.name, None, note=why)
        return applicable


# ---- the three components ------------------------------------------------------------------

# sublayer condition -> (RoPE on, causal mask, which permutation)
SUBLAYER_SETTINGS: dict[str, tuple[bool, bool, Literal["full", "prefix"]]] = {
    "no positions, no mask": (False, False, "full"),
    "no positions, causal mask": (False, True, "full"),
    "no positions, causal mask, prefix permutation": (False, True, "prefix"),
    "RoPE, no mask": (True, False, "full"),
    "RoPE, causal mask, prefix permutation": (True, True, "prefix"),
}


@dataclass
class PromptContext:
    """One prompt with its permutations, shared by every check on it."""

    index: int
    enc: Encoded
    perms: dict[int, Tensor]
    prefixes: dict[int, tuple[int, Tensor]]

    @property
    def n_tokens(self) -> int:
        return int(self.enc.ids.shape[1])

    def permutation(self, seed: int, kind: str) -> tuple[Tensor, int]:
        """``(perm, i)``: the full permutation (``i = 0``) or the prefix one."""
        if kind == "prefix":
            i, perm = self.prefixes[seed]
            return perm, i
        return self.perms[seed], 0


def _sublayer_note(model: Model, name: str) -> str:
    notes = []
    if model.info.positions != "rotary" and name.startswith("no positions"):
        notes.append("BERT-style attention has no position term (positions enter at the "
                     "embeddings)")
    if not model.info.causal and "causal" in name:
        notes.append(f"causal mask imposed: {model.info.name} is bidirectional")
    return "; ".join(notes)


def sublayer_cases(rows: Rows, ctx: PromptContext, layer: int, x: Tensor,
                   names: Sequence[str], view: bool) -> list[dict[str, Any]]:
    """The attention-sublayer conditions at one layer; returns patterns for the dashboard."""
    model, views = rows.model, []
    base: dict[tuple[bool, bool], tuple[Tensor, Tensor]] = {}
    for name in names:
        rope, causal, kind = SUBLAYER_SETTINGS[name]
        if (rope, causal) not in base:
            base[(rope, causal)] = sublayer(model, layer, x, rope=rope, causal=causal)
        out0, pattern0 = base[(rope, causal)]
        show = view and kind == "full"
        if show:
            views.append(_view(ctx.index, name, layer, -1, "original", pattern0))
        for seed in rows.cfg.seeds:
            perm, i = ctx.permutation(seed, kind)
            out1, pattern1 = sublayer(model, layer, x[:, perm], rope=rope, causal=causal)
            rows.add("attention sublayer", name, relative_error(out1, out0[:, perm], out0,
                                                                slice(i, None)),
                     seed=seed, prompt=ctx.index, layer=layer, prefix=i,
                     n_tokens=ctx.n_tokens, note=_sublayer_note(model, name))
            if show:
                views.append(_view(ctx.index, name, layer, seed, "permuted", pattern1))
    return views


def head_cases(rows: Rows, ctx: PromptContext, layer: int, x: Tensor,
               names: Sequence[str]) -> None:
    """Head permutations at one layer, in the model's own setting (RoPE, its own mask)."""
    model = rows.model
    info = model.info
    setting = {"rope": True, "causal": info.causal}
    out0, pattern0 = sublayer(model, layer, x, **setting)
    where = {"prompt": ctx.index, "layer": layer, "n_tokens": ctx.n_tokens}
    for seed in rows.cfg.seeds:
        q_perm, kv_perm = head_permutation(info.n_heads, info.n_kv_heads, seed, layer)
        detail = f"query heads {q_perm.tolist()}, kv heads {kv_perm.tolist()}"
        with permuted_head_weights(model, layer, q_perm, kv_perm):
            out, pattern = sublayer(model, layer, x, **setting)
        rows.add("attention heads", "permuted with W_O slices (weights)",
                 relative_error(out, out0, out0), seed=seed, detail=detail, **where)
        rows.add("attention heads", "permuted (weights): patterns follow heads",
                 relative_error(pattern, pattern0[:, q_perm], pattern0), seed=seed,
                 detail=detail, **where)
        out, pattern = sublayer(model, layer, x, **setting,
                                fwd_hooks=head_permutation_hooks(layer, q_perm, kv_perm))
        rows.add("attention heads", "permuted via hooks on q, k, v, undone at z",
                 relative_error(out, out0, out0), seed=seed, detail=detail, **where)
        rows.add("attention heads", "permuted (hooks): patterns follow heads",
                 relative_error(pattern, pattern0[:, q_perm], pattern0), seed=seed,
                 detail=detail, **where)
        with permuted_head_weights(model, layer, q_perm, kv_perm, output_slices=False):
            out, _ = sublayer(model, layer, x, **setting)
        rows.add("attention heads", "permuted without W_O slices (control)",
                 relative_error(out, out0, out0), seed=seed, detail=detail, **where)
        if "query heads moved across kv groups (control)" in names:
            # roll by one: the last query head of each group takes the next group's first
            cross = torch.roll(torch.arange(info.n_heads), -1)
            with permuted_head_weights(model, layer, cross, torch.arange(info.n_kv_heads)):
                out, _ = sublayer(model, layer, x, **setting)
            rows.add("attention heads", "query heads moved across kv groups (control)",
                     relative_error(out, out0, out0), seed=seed,
                     note="query heads rolled by one place, kv heads unmoved",
                     detail=f"query heads {cross.tolist()}", **where)


def whole_model_settings(model: Model) -> dict[str, tuple[dict[str, Any], str]]:
    """Whole-model permutation conditions -> (``model_output`` arguments, permutation)."""
    no_rope = no_rope_hooks(range(model.info.n_layers)) if model.info.positions == "rotary" \
        else []
    return {
        "as trained": ({}, "full"),
        "position embeddings zeroed": ({"fwd_hooks": zero_position_hooks()}, "full"),
        "RoPE removed": ({"fwd_hooks": no_rope}, "full"),
        "RoPE removed, no mask": ({"fwd_hooks": no_rope, "no_mask": True}, "full"),
        "RoPE removed, prefix permutation": ({"fwd_hooks": no_rope}, "prefix"),
        "as trained, prefix permutation": ({}, "prefix"),
    }


def whole_model_cases(rows: Rows, ctx: PromptContext, names: Sequence[str]) -> None:
    """Permute the whole model's input tokens (and segment ids) under each condition."""
    model = rows.model
    settings = whole_model_settings(model)
    note = output_kind(model)
    for name in names:
        kwargs, kind = settings[name]
        out0 = model_output(model, ctx.enc, **kwargs)
        for seed in rows.cfg.seeds:
            perm, i = ctx.permutation(seed, kind)
            out1 = model_output(model, ctx.enc, perm=perm, **kwargs)
            rows.add("whole model", name, relative_error(out1, out0[perm], out0, slice(i, None)),
                     seed=seed, prompt=ctx.index, prefix=i, n_tokens=ctx.n_tokens, note=note)


def shift_cases(rows: Rows, ctx: PromptContext, names: Sequence[str]) -> None:
    """Add ``c`` to every position id, with the model's real forward."""
    model = rows.model
    n, n_ctx = ctx.n_tokens, model.info.n_ctx
    start = torch.arange(n)[None]
    base: dict[str, Tensor] = {}
    for c in rows.cfg.shifts:
        where = {"prompt": ctx.index, "shift": c, "n_tokens": n}
        for name in names:
            if c + n > n_ctx:
                rows.add("whole model", name, None, note=f"c + T = {c + n} is beyond the "
                         f"{n_ctx} positions of {model.info.name}", **where)
                continue
            f64 = name.endswith("float64 RoPE angles")

            def hooks_at(pos: Tensor, f64: bool = f64) -> list[tuple[str, Any]]:
                return float64_angle_hooks(model, pos) if f64 else []

            if name not in base:
                base[name] = model_output(model, ctx.enc, position_ids=start,
                                          fwd_hooks=hooks_at(start))
            out = model_output(model, ctx.enc, position_ids=start + c,
                               fwd_hooks=hooks_at(start + c))
            rows.add("whole model", name, relative_error(out, base[name], base[name]),
                     note=output_kind(model), **where)


# ---- results -------------------------------------------------------------------------------

def _view(prompt: int, condition: str, layer: int, seed: int, which: str,
          pattern: Float[Tensor, "batch head_index query_pos key_pos"]) -> dict[str, Any]:
    return {"prompt": prompt, "condition": condition, "layer": layer, "seed": seed,
            "input": which, "pattern": pattern[0].float().numpy()}


def patterns_frame(views: list[dict[str, Any]]) -> pd.DataFrame:
    """Long format: prompt, condition, layer, seed (-1 for the original input), input
    ("original" or "permuted"), head, query, key, weight. A permuted pattern is stored as
    computed on ``P X``, so its rows and columns are in the permuted order."""
    frames = []
    for v in views:
        head, query, key = (a.reshape(-1) for a in np.indices(v["pattern"].shape))
        frames.append(pd.DataFrame({
            "prompt": v["prompt"], "condition": v["condition"], "layer": v["layer"],
            "seed": v["seed"], "input": v["input"], "head": head.astype(np.int16),
            "query": query.astype(np.int16), "key": key.astype(np.int16),
            "weight": v["pattern"].reshape(-1)}))
    columns = ["prompt", "condition", "layer", "seed", "input", "head", "query", "key", "weight"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def prompts_frames(prompts: Sequence[PromptContext]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``tokens`` (prompt, position, token) and ``permutations`` (prompt, seed, kind,
    prefix, position, source: the original position of the token now at ``position``)."""
    tokens, perms = [], []
    for ctx in prompts:
        tokens += [{"prompt": ctx.index, "position": i, "token": t}
                   for i, t in enumerate(ctx.enc.tokens)]
        for seed in ctx.perms:
            for kind in ("full", "prefix"):
                perm, i = ctx.permutation(seed, kind)
                perms += [{"prompt": ctx.index, "seed": seed, "kind": kind, "prefix": i,
                           "position": pos, "source": int(src)}
                          for pos, src in enumerate(perm.tolist())]
    return pd.DataFrame(tokens), pd.DataFrame(perms)


VERDICT_KEYS = ["model", "component", "condition", "shift"]


def summarize_verdicts(cases: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, component, condition, shift): cases, the largest and smallest
    relative error, tolerance, expectation, verdict (pass only if every case passes;
    ``n/a`` when the condition does not apply) and a note."""
    out = []
    order = {(c.component, c.name): i for i, c in enumerate(CONDITIONS)}
    for key, group in cases.groupby(VERDICT_KEYS, sort=False):
        measured = group[group.verdict != "n/a"]
        verdict = "n/a" if measured.empty else (
            "pass" if bool((measured.verdict == "pass").all()) else "fail")
        notes = [n for n in dict.fromkeys(group.note) if n]
        out.append({
            **dict(zip(VERDICT_KEYS, key, strict=True)), "n_cases": len(measured),
            "n_failed": int((measured.verdict == "fail").sum()),
            "max_rel_error": measured.max_rel_error.max() if len(measured) else math.nan,
            "min_rel_error": measured.max_rel_error.min() if len(measured) else math.nan,
            "tolerance": group.tolerance.iloc[0], "expected": group.expected.iloc[0],
            "verdict": verdict, "note": notes[0] if len(notes) == 1 else "; ".join(notes[:2]),
            "source": group.source.iloc[0], "_order": order[(key[1], key[2])],
        })
    frame = pd.DataFrame(out).sort_values(["_order", "shift"], kind="stable")
    return frame.drop(columns="_order").reset_index(drop=True)


@dataclass
class Result:
    cases: pd.DataFrame
    verdicts: pd.DataFrame
    patterns: pd.DataFrame
    tokens: pd.DataFrame
    permutations: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"equivariance": self.cases, "verdicts": self.verdicts,
                "patterns": self.patterns, "tokens": self.tokens,
                "permutations": self.permutations}

    def summary(self) -> list[str]:
        measured = self.verdicts[self.verdicts.verdict != "n/a"]
        failed = measured[measured.verdict == "fail"]
        lines = [f"{len(measured) - len(failed)} of {len(measured)} checks as expected"
                 + (f"; unexpected: {', '.join(_label(r) for r in failed.itertuples())}"
                    if len(failed) else "")]
        for r in measured.itertuples():
            holds = r.expected in ("equivariant", "unchanged")
            err = r.max_rel_error if holds else r.min_rel_error
            word = "max" if holds else "min"
            lines.append(f"{_label(r)}: {r.expected}? {r.verdict} "
                         f"({word} rel. error {err:.2g}, tolerance {r.tolerance:g})")
        return lines


def _label(row: Any) -> str:
    shift = f" (c={row.shift})" if row.shift else ""
    return f"{row.component} / {row.condition}{shift}"


def _layers(model: Model, cfg: Config) -> tuple[list[int], list[int]]:
    n = model.info.n_layers
    for layer in (*cfg.layers, *cfg.view_layers):
        if layer >= n:
            raise WorkbenchError(f"layer {layer} is out of range: {model.info.name} has {n}")
    layers = sorted(set(cfg.layers)) or list(range(n))
    views = sorted(set(cfg.view_layers)) or sorted({layers[0], layers[len(layers) // 2],
                                                     layers[-1]})
    if not set(views) <= set(layers):
        raise WorkbenchError(f"view_layers {views} must be among the layers checked {layers}")
    return layers, views


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """One intra-op thread for the duration: the checks are thousands of tiny calls
    (T <= a few dozen tokens), which on a busy 2-core machine spend far longer
    synchronising threads than computing (measured: 100x slower with 2 threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@experiment("permutation-equivariance", config=Config, tables=None, demo=DEMO)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Permute tokens, positions and heads; measure what stays equivariant."""
    if model.info.dtype != "float32":
        log.warning("the tolerances are for float32; %s is loaded in %s",
                    model.info.name, model.info.dtype)
    layers, views = _layers(model, cfg)
    rows = Rows(model, cfg)
    applicable = rows.not_applicable()

    def names(component: Component, shift: bool | None = None) -> list[str]:
        return [c.name for c in applicable if c.component == component and
                (shift is None or c.name.startswith("position ids") == shift)]

    contexts, pattern_views = [], []
    with torch.no_grad(), _single_thread():
        for p, enc in enumerate(progress.track(encode_prompts(model, cfg), desc="prompts")):
            n = int(enc.ids.shape[1])
            ctx = PromptContext(p, enc, {s: full_permutation(n, s, p) for s in cfg.seeds},
                                {s: prefix_permutation(n, s, p) for s in cfg.seeds})
            contexts.append(ctx)
            for layer, x in layer_inputs(model, enc, layers).items():
                view = p < cfg.view_prompts and layer in views
                pattern_views += sublayer_cases(rows, ctx, layer, x,
                                                names("attention sublayer"), view)
                head_cases(rows, ctx, layer, x, names("attention heads"))
            whole_model_cases(rows, ctx, names("whole model", shift=False))
            shift_cases(rows, ctx, names("whole model", shift=True))
            log.info("prompt %d of %d checked", p + 1, cfg.n_prompts)
    cases = pd.DataFrame(rows.rows)
    tokens, perms = prompts_frames(contexts)
    return Result(cases, summarize_verdicts(cases), patterns_frame(pattern_views), tokens, perms)


# ---- claims --------------------------------------------------------------------------------

@claim_check("equivariance_verdict")
def equivariance_verdict(run: Run, *, component: str, condition: str | list[str],
                         shift: int | None = None) -> Measurement:
    """Every case of ``component`` / ``condition`` (one name or several, at every shift or
    at one) met its expectation within the run's tolerance."""
    table = run.table("verdicts")
    parts, passed, values = [], True, []
    for name in [condition] if isinstance(condition, str) else condition:
        picked = table[(table.component == component) & (table.condition == name)
                       & (table.verdict != "n/a")]
        if shift is not None:
            picked = picked[picked["shift"] == shift]
        if picked.empty:
            raise WorkbenchError(f"run {run.id} measured no '{component} / {name}'"
                                 + (f" at shift {shift}" if shift is not None else ""))
        expected = picked.expected.iloc[0]
        holds = expected in ("equivariant", "unchanged")
        err = picked.max_rel_error.max() if holds else picked.min_rel_error.min()
        n_failed = int(picked.n_failed.sum())
        parts.append(f"{name}: {expected}, {'max' if holds else 'min'} rel. error {err:.2g} "
                     f"over {int(picked.n_cases.sum())} cases (tolerance "
                     f"{picked.tolerance.iloc[0]:g}, {n_failed} failed)")
        passed &= n_failed == 0
        values.append(float(err))
    return Measurement("; ".join(parts), passed, values[0] if len(values) == 1 else None)


if __name__ == "__main__":
    import sys

    from workbench.cli import main

    main(["run", "permutation-equivariance", *sys.argv[1:]])
