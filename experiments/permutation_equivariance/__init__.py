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

- sliding-window layers (gemma3: 15 layers of W = 512 keys), the window as a mask:
  ``sliding window, far-past permutation`` -> unchanged. Only positions ``0 .. i-1`` are
  moved (``i = max(2, (n - W + 1) // 2)``, seeded as the other permutations) and the
  sublayer output is compared at the queries ``t >= i + W - 1``, whose window ``t - W + 1
  .. t`` holds no moved token, under the layer's own window mask and the model's own
  positions: the moved keys carry weight 0, so nothing a local layer sees changes (exactly,
  RoPE included). ``causal mask, far-past permutation (control)`` -> changes: the same
  permutation and queries under the plain causal mask, through which those queries see the
  moved tokens at their new positions. Both apply at sliding layers only; a prompt shorter
  than ``W + 2`` tokens is ``n/a`` and says so.

Conditions that do not apply to a model are rows with verdict ``n/a`` and the reason.
Tables (declared in ``tables.py``): ``equivariance`` (every case: model, component,
condition, seed, prompt, layer, shift, max relative error, tolerance, expected, verdict),
``verdicts`` (one row per component, condition and shift), ``equivariance_by_prompt``
(each prompt's largest and smallest error over its seeds, per condition, layer and shift:
what ``workbench compare`` pairs prompt by prompt), and for the dashboard ``patterns``
(attention patterns of ``X`` and ``P X`` at a few layers), ``tokens`` and
``permutations``.

Where the code lives. This package: ``conditions.py`` (the table of conditions, their
expectations and sources, and which models each applies to), ``permutations.py`` (the
seeded permutations of positions and heads), ``measure.py`` (each condition run on real
inputs, and the tables), ``tables.py`` and ``checks.py`` (the claim check
``equivariance_verdict``). The primitives are the library's:
:mod:`workbench.interventions.positions` (the hooks that skip RoPE, zero the position
embeddings or recompute RoPE's angles in float64), :mod:`workbench.models.head_permutation`
(heads permuted in the weights, grouped-query attention included) and
:mod:`workbench.scores.attention` (the masks, ``relative_error``).

Example:
    workbench run permutation-equivariance --model smollm2 --set seeds=0,1
    python -m experiments.permutation_equivariance --model minilm
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import get_args

import torch

from experiments.permutation_equivariance import (
    checks,  # noqa: F401 (registers the claim check)
    measure,
)
from experiments.permutation_equivariance.measure import PromptContext, Result, Rows
from experiments.permutation_equivariance.tables import TABLES
from workbench.core import progress
from workbench.core.options import FixedAblation
from workbench.core.values import MAX_PROMPTS, MAX_SEQUENCE, MAX_TEXT_TOKENS, SEED
from workbench.harness.config import param
from workbench.harness.experiment import Context, experiment
from workbench.inputs.prompts import check_prompt_set
from workbench.models.base import Model

log = logging.getLogger(__name__)

DEMO = {"n_prompts": 2, "max_tokens": 24, "seeds": (0, 1)}


@dataclass(frozen=True)
class Config:
    """What is permuted, on which prompts and layers, and the tolerances stated in advance."""

    prompt_set: str = param("natural", "prompts to permute")
    n_prompts: int = param(4, "how many prompts of the set", min=1, max=MAX_PROMPTS)
    max_tokens: int = param(32, "prompts are cut to this many tokens (encoders keep their "
                            "final [SEP]); at least 4, so a prefix permutation has room",
                            min=4, max=MAX_SEQUENCE)
    seeds: tuple[int, ...] = param((0, 1, 2), "permutation seeds (distinct); each draws a "
                                   "permutation per prompt and layer", min=0, max=SEED.max)
    layers: tuple[int, ...] = param((), "layers for the sublayer and head checks (empty: "
                                    "every layer)", min=0, layer=True)
    shifts: tuple[int, ...] = param((1, 10, 100, 1000), "constants c added to every position "
                                    "id", min=1, max=MAX_TEXT_TOKENS)
    view_prompts: int = param(2, "prompts (at most) whose patterns are stored for the "
                              "dashboard", min=0, max=MAX_PROMPTS)
    view_layers: tuple[int, ...] = param((), "layers whose patterns are stored (empty: first, "
                                         "middle and last)", min=0, layer=True)
    sublayer_tolerance: float = param(1e-5, "max relative error of an equivariant sublayer or "
                                      "head permutation", min=1e-12, max=0.5)
    model_tolerance: float = param(1e-3, "max relative error of an equivariant whole-model "
                                   "output", min=1e-12, max=0.5)

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be a non-empty list of distinct integers")
        check_prompt_set(self.prompt_set)


@experiment("permutation-equivariance", config=Config, tables=TABLES, demo=DEMO,
            ablations=get_args(FixedAblation))
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Permute tokens, positions and heads; measure what stays equivariant.

    Args:
        model: any bundled model (float32: the tolerances are for float32).
        cfg: the config.
        ctx: unused (the experiment writes no files).

    Returns:
        The cases, the verdicts, and the patterns, tokens and permutations of the views.
    """
    if model.info.dtype != "float32":
        log.warning("the tolerances are for float32; %s is loaded in %s",
                    model.info.name, model.info.dtype)
    layers, views = measure.chosen_layers(model, cfg.layers, cfg.view_layers)
    rows = Rows(model, cfg)
    applicable = rows.not_applicable()
    encoded = measure.encode_prompts(model, cfg.prompt_set, cfg.n_prompts, cfg.max_tokens)
    prompts, patterns = [], []
    with torch.no_grad(), measure.single_thread():
        for p, enc in enumerate(progress.track(encoded, desc="prompts")):
            prompt = PromptContext.draw(p, enc, cfg.seeds)
            prompts.append(prompt)
            patterns += measure.check_prompt(rows, prompt, layers, views, applicable,
                                             view=p < cfg.view_prompts)
            log.info("prompt %d of %d checked", p + 1, cfg.n_prompts)
    return Result.collect(rows, prompts, patterns)
