"""The measurements of ``permutation-equivariance``: each condition run on real inputs, one
row per case, and the tables the result returns."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from experiments.permutation_equivariance.conditions import (
    BY_NAME,
    CONDITIONS,
    HOLDS,
    SUBLAYER_SETTINGS,
    WINDOW_CONDITIONS,
    Component,
    Condition,
    PermutationKind,
    missing_requirement,
)
from experiments.permutation_equivariance.permutations import (
    far_past_permutation,
    full_permutation,
    prefix_permutation,
    seeded_head_permutation,
)
from experiments.permutation_equivariance.tables import (
    EQUIVARIANCE,
    EQUIVARIANCE_BY_PROMPT,
    PATTERNS,
    PERMUTATIONS,
    TOKENS,
    VERDICTS,
)
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch, make_batches
from workbench.inputs.prompts import Prompt, load_prompt_set, tokens_digest
from workbench.interventions.positions import float64_angle_hooks, zero_position_hooks
from workbench.models.adapters import alibi_shifted, own_mask_lifted
from workbench.models.base import Model
from workbench.models.head_permutation import permuted_head_weights
from workbench.recording import hooks
from workbench.scores.attention import (
    additive_mask,
    causal_mask,
    full_mask,
    inverse_permutation,
    relative_error,
    sliding_window_mask,
)

if TYPE_CHECKING:
    from experiments.permutation_equivariance import Config

Hooks = Sequence[tuple[str, Any]]

# ---- inputs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    """One prompt, cut to ``max_tokens``, as a batch of one (no padding)."""

    batch: Batch
    tokens: list[str]

    @property
    def ids(self) -> Int[Tensor, "batch pos"]:
        return self.batch.input_ids

    @property
    def type_ids(self) -> Int[Tensor, "batch pos"] | None:
        return self.batch.token_type_ids

    @property
    def n_tokens(self) -> int:
        return int(self.ids.shape[1])

    @property
    def digest(self) -> str:
        """The token digest of the prompt as cut (a per-prompt table's ``tokens``)."""
        return tokens_digest(Prompt(token_ids=tuple(self.ids[0].tolist())))


def encode_prompts(model: Model, prompt_set: str, n_prompts: int, max_tokens: int
                   ) -> list[Encoded]:
    """The first ``n_prompts`` prompts of the set, cut to ``max_tokens`` tokens (an encoder
    keeps its final [SEP], so its input stays well-formed).

    Raises:
        WorkbenchError: the set has fewer prompts, or a prompt has fewer than 4 tokens (a
            prefix permutation needs room).
    """
    prompts = load_prompt_set(prompt_set, model)[:n_prompts]
    if len(prompts) < n_prompts:
        raise WorkbenchError(f"prompt set '{prompt_set}' has only {len(prompts)} prompts")
    out = []
    for prompt in prompts:
        ids, type_ids = model.encode(prompt)
        if len(ids) > max_tokens:
            keep_last = not model.info.causal
            cut = max_tokens - keep_last
            ids = ids[:cut] + ids[-1:] * keep_last
            type_ids = type_ids[:cut] + type_ids[-1:] * keep_last if type_ids else type_ids
        if len(ids) < 4:
            raise WorkbenchError(f"prompt {prompt.label} has {len(ids)} tokens; need >= 4")
        batch = next(make_batches([(ids, type_ids)], pad_id=model.pad_id))
        out.append(Encoded(batch, model.str_tokens(ids)))
    return out


# ---- running the model ---------------------------------------------------------------------

def layer_inputs(model: Model, enc: Encoded, layers: Sequence[int]
                 ) -> dict[int, Float[Tensor, "batch pos d_model"]]:
    """What each layer's attention sublayer reads (``attn.hook_in``) on one prompt."""
    kept = hooks.capture(model, enc.batch, [hooks.attn_in(layer) for layer in layers])
    return {layer: kept[hooks.attn_in(layer)] for layer in layers}


def sublayer(model: Model, layer: int, x: Float[Tensor, "batch pos d_model"], *, rope: bool,
             causal: bool, fwd_hooks: Hooks = (), window: int | None = None
             ) -> tuple[Float[Tensor, "batch pos d_model"],
                        Float[Tensor, "batch head_index query_pos key_pos"]]:
    """One attention sublayer on ``x``: its output (``attn.o.hook_out``) and pattern.

    The sublayer is called directly, so the same ``x`` enters every condition. The mask is
    handed over as a 4-D additive mask, which the bridge uses as given (it replaces its own
    causal mask).

    Args:
        model: the model whose layer is called.
        layer: the layer.
        x: the sublayer's input (see :func:`layer_inputs`).
        rope: rotate q and k by position (rotary models; ignored otherwise).
        causal: a causal mask; otherwise every query sees every key.
        fwd_hooks: more hooks for the call (e.g. head permutations).
        window: with ``causal``, a sliding window of this many keys (the query's own
            included) instead of the whole causal prefix.

    Returns:
        ``(output, pattern)``.
    """
    n = x.shape[1]
    mask = (causal_mask(n) if window is None else sliding_window_mask(n, window)) if causal \
        else full_mask(n)
    kwargs = {**positional_inputs(model, layer, n, rope=rope),
              "attention_mask": additive_mask(mask, x.dtype)[None, None]}
    names = [hooks.attn_o_out(layer), hooks.pattern(layer)]
    kept, keep = hooks.caching_hooks(names)
    with model.bridge.hooks(fwd_hooks=[*keep, *fwd_hooks]), own_mask_lifted(model):
        model.bridge.blocks[layer].attn(x, **kwargs)
    return kept[names[0]], kept[names[1]]


def positional_inputs(model: Model, layer: int, n: int, *, rope: bool) -> dict[str, Any]:
    """What the attention of ``layer`` is handed besides its input and mask, for ``n``
    tokens: the positions as the model itself computes them, or (``rope=False``) none.

    RoPE is removed, in every variant (partial, per layer type, GPT-J's), by giving every
    token position 0: a rotation by angle 0 is the identity, exactly. ALiBi is removed by
    zero biases. Learned absolute positions never reach the attention sublayer.
    """
    positions = torch.arange(n)[None] if rope and model.info.positions == "rotary" \
        else torch.zeros(1, n, dtype=torch.long)
    ids = torch.full((1, n), model.pad_id)
    kwargs = hooks.attention_kwargs(model.bridge, layer, ids, position_ids=positions)
    if "alibi" in kwargs and kwargs["alibi"] is not None:
        kwargs["alibi"] = torch.zeros_like(kwargs["alibi"])
    return kwargs


def model_output(model: Model, enc: Encoded, *, perm: Int[Tensor, " pos"] | None = None,
                 position_ids: Int[Tensor, "batch pos"] | None = None, no_mask: bool = False,
                 fwd_hooks: Hooks = ()) -> Float[Tensor, "pos d_out"]:
    """The whole model's output on a prompt (optionally permuted): logits when the model
    has a trained LM head, else the final residual stream (before the final norm).

    Args:
        model: the model.
        enc: the prompt.
        perm: permute the tokens (and segment ids): position ``i`` gets token ``perm[i]``.
        position_ids: explicit position ids (e.g. shifted by a constant).
        no_mask: hand the model a 4-D mask of zeros (Hugging Face and the bridge's attention
            use a 4-D mask as given, so a causal model loses its causal mask).
        fwd_hooks: hooks for the forward pass.
    """
    ids, type_ids = enc.ids, enc.type_ids
    if perm is not None:
        ids = ids[:, perm]
        type_ids = type_ids[:, perm] if type_ids is not None else None
    kwargs: dict[str, Any] = {}
    if type_ids is not None:
        kwargs["token_type_ids"] = type_ids
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if no_mask:
        kwargs["attention_mask"] = additive_mask(full_mask(ids.shape[1]))[None, None]
    lifted = own_mask_lifted(model) if no_mask else contextlib.nullcontext()
    if model.info.has_lm_head:
        with model.bridge.hooks(fwd_hooks=list(fwd_hooks)), lifted:
            return model.bridge(ids, return_type="logits", **kwargs)[0]
    final = hooks.resid(model.info.n_layers, model.info.n_layers)
    kept, keep = hooks.caching_hooks([final])
    with model.bridge.hooks(fwd_hooks=[*fwd_hooks, *keep]), lifted:
        model.bridge(ids, return_type=None, **kwargs)
    return kept[final][0]


def output_kind(model: Model) -> str:
    return "logits" if model.info.has_lm_head else "final residual stream"


def head_permutation_hooks(layer: int, q_perm: Int[Tensor, " head_index"],
                           kv_perm: Int[Tensor, " kv_head"]) -> list[tuple[str, Any]]:
    """The permutation of :func:`~workbench.models.head_permutation.permuted_head_weights`
    made through hooks: q, k and v heads permuted as they are projected, and undone at
    ``hook_z`` (equivalent to moving W_O's slices with them). It checks that the bridge's
    hooks and its weights agree on the head axis."""
    inverse = inverse_permutation(q_perm)

    def by(perm: Tensor) -> Callable[[Tensor, Any], Tensor]:
        return lambda tensor, hook: tensor[:, :, perm]  # [batch, pos, head, d_head]

    return [(hooks.qkv(layer, "q"), by(q_perm)), (hooks.qkv(layer, "k"), by(kv_perm)),
            (hooks.qkv(layer, "v"), by(kv_perm)), (hooks.z(layer), by(inverse))]


# ---- the rows of the equivariance table ----------------------------------------------------

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
        """One case; ``error=None`` records it as ``n/a`` (the note says why)."""
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


@dataclass
class PromptContext:
    """One prompt with its permutations, shared by every check on it."""

    index: int
    enc: Encoded
    perms: dict[int, Tensor]
    prefixes: dict[int, tuple[int, Tensor]]

    @classmethod
    def draw(cls, index: int, enc: Encoded, seeds: Sequence[int]) -> PromptContext:
        """The prompt's full and prefix permutations, one of each per seed."""
        n = enc.n_tokens
        return cls(index, enc, {s: full_permutation(n, s, index) for s in seeds},
                   {s: prefix_permutation(n, s, index) for s in seeds})

    @property
    def n_tokens(self) -> int:
        return self.enc.n_tokens

    def permutation(self, seed: int, kind: PermutationKind) -> tuple[Tensor, int]:
        """``(perm, i)``: the full permutation (``i = 0``) or the prefix one."""
        if kind == "prefix":
            i, perm = self.prefixes[seed]
            return perm, i
        return self.perms[seed], 0


# ---- the three components ------------------------------------------------------------------

def _sublayer_note(model: Model, name: str) -> str:
    notes = []
    if model.info.positions == "alibi" and name.startswith("no positions"):
        notes.append("ALiBi biases set to zero")
    elif model.info.positions != "rotary" and name.startswith("no positions"):
        notes.append("BERT-style attention has no position term (positions enter at the "
                     "embeddings)")
    elif name.startswith("no positions"):
        notes.append("every token at position 0: RoPE rotates by angle 0")
    if not model.info.causal and "causal" in name:
        notes.append(f"causal mask imposed: {model.info.name} is bidirectional")
    return "; ".join(notes)


def sublayer_cases(rows: Rows, prompt: PromptContext, layer: int,
                   x: Float[Tensor, "batch pos d_model"], names: Sequence[str], view: bool
                   ) -> list[dict[str, Any]]:
    """The attention-sublayer conditions at one layer; returns patterns for the dashboard
    (with ``view``: the original and permuted patterns of the full-permutation conditions)."""
    model, views = rows.model, []
    base: dict[tuple[bool, bool], tuple[Tensor, Tensor]] = {}
    for name in (n for n in names if n not in WINDOW_CONDITIONS):
        rope, causal, kind = SUBLAYER_SETTINGS[name]
        if (rope, causal) not in base:
            base[(rope, causal)] = sublayer(model, layer, x, rope=rope, causal=causal)
        out0, pattern0 = base[(rope, causal)]
        show = view and kind == "full"
        if show:
            views.append(_view(prompt.index, name, layer, -1, "original", pattern0))
        for seed in rows.cfg.seeds:
            perm, i = prompt.permutation(seed, kind)
            out1, pattern1 = sublayer(model, layer, x[:, perm], rope=rope, causal=causal)
            rows.add("attention sublayer", name, relative_error(out1, out0[:, perm], out0,
                                                                slice(i, None)),
                     seed=seed, prompt=prompt.index, layer=layer, prefix=i,
                     n_tokens=prompt.n_tokens, note=_sublayer_note(model, name))
            if show:
                views.append(_view(prompt.index, name, layer, seed, "permuted", pattern1))
    return views


def window_cases(rows: Rows, prompt: PromptContext, layer: int,
                 x: Float[Tensor, "batch pos d_model"], names: Sequence[str]) -> None:
    """The sliding-window conditions at one layer (:data:`.conditions.WINDOW_CONDITIONS`):
    only ``0 .. i-1`` moved, compared at the queries ``t >= i + W - 1`` whose window holds
    none of them, with the model's own positions; under the layer's window mask, and under
    the plain causal mask as the control."""
    model = rows.model
    wanted = [n for n in names if n in WINDOW_CONDITIONS]
    window = model.info.window(layer)
    if not wanted or window is None:
        return  # a global layer has no window (check_prompt notes when no layer has one)
    n = prompt.n_tokens
    for name in wanted:
        mask_window = window if name == WINDOW_CONDITIONS[0] else None
        out0, _ = sublayer(model, layer, x, rope=True, causal=True, window=mask_window)
        for seed in rows.cfg.seeds:
            drawn = far_past_permutation(n, window, seed, prompt.index)
            if drawn is None:
                rows.add("attention sublayer", name, None, seed=seed, prompt=prompt.index,
                         layer=layer, n_tokens=n,
                         note=f"a prompt of {n} tokens does not reach 2 tokens past the "
                              f"{window}-key window (max_tokens >= {window + 2} needed)")
                continue
            i, perm = drawn
            out1, _ = sublayer(model, layer, x[:, perm], rope=True, causal=True,
                               window=mask_window)
            rows.add("attention sublayer", name,
                     relative_error(out1, out0, out0, slice(i + window - 1, None)),
                     seed=seed, prompt=prompt.index, layer=layer, prefix=i, n_tokens=n,
                     note=f"positions 0..i-1 moved (i in the prefix column); compared at "
                          f"queries t >= i + {window - 1}, whose {window}-key windows hold "
                          "no moved token")


def head_cases(rows: Rows, prompt: PromptContext, layer: int,
               x: Float[Tensor, "batch pos d_model"], names: Sequence[str]) -> None:
    """Head permutations at one layer, in the model's own setting (RoPE, its own mask)."""
    model = rows.model
    info = model.info
    setting = {"rope": True, "causal": info.causal}
    out0, pattern0 = sublayer(model, layer, x, **setting)
    for seed in rows.cfg.seeds:
        q_perm, kv_perm = seeded_head_permutation(info.n_heads, info.n_kv_heads, seed, layer)
        errors: dict[str, float] = {}
        with permuted_head_weights(model, layer, q_perm, kv_perm):
            out, pattern = sublayer(model, layer, x, **setting)
        errors["permuted with W_O slices (weights)"] = relative_error(out, out0, out0)
        errors["permuted (weights): patterns follow heads"] = relative_error(
            pattern, pattern0[:, q_perm], pattern0)
        out, pattern = sublayer(model, layer, x, **setting,
                                fwd_hooks=head_permutation_hooks(layer, q_perm, kv_perm))
        errors["permuted via hooks on q, k, v, undone at z"] = relative_error(out, out0, out0)
        errors["permuted (hooks): patterns follow heads"] = relative_error(
            pattern, pattern0[:, q_perm], pattern0)
        with permuted_head_weights(model, layer, q_perm, kv_perm, output_slices=False):
            out, _ = sublayer(model, layer, x, **setting)
        errors["permuted without W_O slices (control)"] = relative_error(out, out0, out0)
        at = {"seed": seed, "prompt": prompt.index, "layer": layer,
              "n_tokens": prompt.n_tokens}
        for name, error in errors.items():
            rows.add("attention heads", name, error, **at,
                     detail=f"query heads {q_perm.tolist()}, kv heads {kv_perm.tolist()}")
        if "query heads moved across kv groups (control)" in names:
            # roll by one: the last query head of each group takes the next group's first
            cross = torch.roll(torch.arange(info.n_heads), -1)
            with permuted_head_weights(model, layer, cross, torch.arange(info.n_kv_heads)):
                out, _ = sublayer(model, layer, x, **setting)
            rows.add("attention heads", "query heads moved across kv groups (control)",
                     relative_error(out, out0, out0), **at,
                     note="query heads rolled by one place, kv heads unmoved",
                     detail=f"query heads {cross.tolist()}")


def whole_model_settings(n_tokens: int) -> dict[str, tuple[dict[str, Any], PermutationKind]]:
    """Whole-model permutation conditions -> (``model_output`` arguments, permutation), for
    a prompt of ``n_tokens``."""
    # every token at position 0: RoPE rotates by angle 0, the identity (any variant)
    no_rope = {"position_ids": torch.zeros(1, n_tokens, dtype=torch.long)}
    return {
        "as trained": ({}, "full"),
        "position embeddings zeroed": ({"fwd_hooks": zero_position_hooks()}, "full"),
        "RoPE removed": (no_rope, "full"),
        "RoPE removed, no mask": ({**no_rope, "no_mask": True}, "full"),
        "RoPE removed, prefix permutation": (no_rope, "prefix"),
        "as trained, prefix permutation": ({}, "prefix"),
    }


def whole_model_cases(rows: Rows, prompt: PromptContext, names: Sequence[str]) -> None:
    """Permute the whole model's input tokens (and segment ids) under each condition."""
    model = rows.model
    settings = whole_model_settings(prompt.n_tokens)
    note = output_kind(model)
    for name in names:
        kwargs, kind = settings[name]
        out0 = model_output(model, prompt.enc, **kwargs)
        for seed in rows.cfg.seeds:
            perm, i = prompt.permutation(seed, kind)
            out1 = model_output(model, prompt.enc, perm=perm, **kwargs)
            rows.add("whole model", name, relative_error(out1, out0[perm], out0, slice(i, None)),
                     seed=seed, prompt=prompt.index, prefix=i, n_tokens=prompt.n_tokens,
                     note=note)


def shift_cases(rows: Rows, prompt: PromptContext, names: Sequence[str]) -> None:
    """Add ``c`` to every position id, with the model's real forward."""
    model = rows.model
    n, n_ctx = prompt.n_tokens, model.info.n_ctx
    start = torch.arange(n)[None]
    base: dict[str, Tensor] = {}
    for c in rows.cfg.shifts:
        where = {"prompt": prompt.index, "shift": c, "n_tokens": n}
        for name in names:
            if c + n > n_ctx:
                rows.add("whole model", name, None, note=f"c + T = {c + n} is beyond the "
                         f"{n_ctx} positions of {model.info.name}", **where)
                continue
            f64 = name.endswith("float64 RoPE angles")

            def hooks_at(pos: Tensor, f64: bool = f64) -> list[tuple[str, Any]]:
                return float64_angle_hooks(model, pos) if f64 else []

            if f64 and (why := _no_float64_angles(model, start)):
                rows.add("whole model", name, None, note=why, **where)
                continue

            if name.endswith("ALiBi"):  # BLOOM takes no position ids: shift its biases
                base.setdefault(name, model_output(model, prompt.enc))
                with alibi_shifted(model, c):
                    out = model_output(model, prompt.enc)
                rows.add("whole model", name, relative_error(out, base[name], base[name]),
                         note=output_kind(model), **where)
                continue
            if name not in base:
                base[name] = model_output(model, prompt.enc, position_ids=start,
                                          fwd_hooks=hooks_at(start))
            out = model_output(model, prompt.enc, position_ids=start + c,
                               fwd_hooks=hooks_at(start + c))
            rows.add("whole model", name, relative_error(out, base[name], base[name]),
                     note=output_kind(model), **where)


def _no_float64_angles(model: Model, position_ids: Tensor) -> str | None:
    """Why RoPE's angles cannot be recomputed in float64 for this model, or ``None``: the
    family computes them inside each attention (GPT-J) or per layer type (Gemma 3), with no
    shared ``rotary_emb`` to hook."""
    try:
        float64_angle_hooks(model, position_ids)
    except WorkbenchError as exc:
        return f"{exc}: the family computes its rotary angles elsewhere"
    return None


def check_prompt(rows: Rows, prompt: PromptContext, layers: Sequence[int],
                 views: Sequence[int], applicable: Sequence[Condition], view: bool
                 ) -> list[dict[str, Any]]:
    """Every applicable condition on one prompt; returns its patterns for the dashboard
    (at ``views`` layers, when ``view``)."""

    def names(component: Component, shift: bool | None = None) -> list[str]:
        return [c.name for c in applicable if c.component == component and
                (shift is None or c.name.startswith("position ids") == shift)]

    patterns = []
    for layer, x in layer_inputs(rows.model, prompt.enc, layers).items():
        patterns += sublayer_cases(rows, prompt, layer, x, names("attention sublayer"),
                                   view and layer in views)
        window_cases(rows, prompt, layer, x, names("attention sublayer"))
        head_cases(rows, prompt, layer, x, names("attention heads"))
    if prompt.index == 0 and not any(rows.model.info.is_sliding(layer) for layer in layers):
        for name in (n for n in names("attention sublayer") if n in WINDOW_CONDITIONS):
            rows.add("attention sublayer", name, None,
                     note="none of the chosen layers has a sliding window")
    whole_model_cases(rows, prompt, names("whole model", shift=False))
    shift_cases(rows, prompt, names("whole model", shift=True))
    return patterns


# ---- results -------------------------------------------------------------------------------

def _view(prompt: int, condition: str, layer: int, seed: int, which: str,
          pattern: Float[Tensor, "batch head_index query_pos key_pos"]) -> dict[str, Any]:
    return {"prompt": prompt, "condition": condition, "layer": layer, "seed": seed,
            "input": which, "pattern": pattern[0].float().numpy()}


_PATTERN_DTYPES = {"prompt": "int64", "condition": "object", "layer": "int64", "seed": "int64",
                   "input": "object", "head": "int16", "query": "int16", "key": "int16",
                   "weight": "float32"}


def patterns_frame(views: list[dict[str, Any]]) -> pd.DataFrame:
    """The ``patterns`` table (see :data:`~.tables.PATTERNS`): one row per (view, head,
    query, key)."""
    frames = []
    for v in views:
        head, query, key = (a.reshape(-1) for a in np.indices(v["pattern"].shape))
        frames.append(pd.DataFrame({
            "prompt": v["prompt"], "condition": v["condition"], "layer": v["layer"],
            "seed": v["seed"], "input": v["input"], "head": head.astype(np.int16),
            "query": query.astype(np.int16), "key": key.astype(np.int16),
            "weight": v["pattern"].reshape(-1)}))
    if not frames:  # typed, so that an empty table still matches its declaration
        return pd.DataFrame({c: pd.Series(dtype=_PATTERN_DTYPES[c]) for c in PATTERNS.names})
    return pd.concat(frames, ignore_index=True)[PATTERNS.names]


def prompts_frames(prompts: Sequence[PromptContext]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``tokens`` and ``permutations`` tables (see :data:`~.tables.TOKENS` and
    :data:`~.tables.PERMUTATIONS`)."""
    tokens, perms = [], []
    for prompt in prompts:
        tokens += [{"prompt": prompt.index, "position": i, "token": t}
                   for i, t in enumerate(prompt.enc.tokens)]
        for seed in prompt.perms:
            for kind in ("full", "prefix"):
                perm, i = prompt.permutation(seed, kind)
                perms += [{"prompt": prompt.index, "seed": seed, "kind": kind, "prefix": i,
                           "position": pos, "source": int(src)}
                          for pos, src in enumerate(perm.tolist())]
    return pd.DataFrame(tokens, columns=TOKENS.names), pd.DataFrame(perms,
                                                                    columns=PERMUTATIONS.names)


VERDICT_KEYS = ["model", "component", "condition", "shift"]


def summarize_verdicts(cases: pd.DataFrame) -> pd.DataFrame:
    """The ``verdicts`` table (see :data:`~.tables.VERDICTS`): one row per (model,
    component, condition, shift); it passes only if every case passes, and is ``n/a``
    when the condition does not apply."""
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
    return frame.drop(columns="_order").reset_index(drop=True)[VERDICTS.names]


BY_PROMPT_KEYS = ["prompt", "component", "condition", "layer", "shift"]


def errors_by_prompt(cases: pd.DataFrame, prompts: Sequence[PromptContext]) -> pd.DataFrame:
    """The ``equivariance_by_prompt`` table (see :data:`~.tables.EQUIVARIANCE_BY_PROMPT`):
    each prompt's measured cases of one condition, layer and shift, reduced over its seeds,
    so that the verdicts' ``max_rel_error`` and ``min_rel_error`` are its reductions over
    prompts and layers."""
    measured = cases[cases.verdict != "n/a"]
    grouped = measured.groupby(BY_PROMPT_KEYS, sort=False).max_rel_error
    out = pd.DataFrame({"max_rel_error": grouped.max(), "min_rel_error": grouped.min(),
                        "n_cases": grouped.size()}).reset_index()
    digests = {p.index: p.enc.digest for p in prompts}
    out["tokens"] = out.prompt.map(digests)
    return out.astype({"prompt": "int64", "layer": "int64", "shift": "int64",
                       "n_cases": "int64"})[EQUIVARIANCE_BY_PROMPT.names]


@dataclass
class Result:
    """Every case, the verdicts, each prompt's errors, and the patterns, tokens and
    permutations of the views."""

    cases: pd.DataFrame
    verdicts: pd.DataFrame
    patterns: pd.DataFrame
    tokens: pd.DataFrame
    permutations: pd.DataFrame
    by_prompt: pd.DataFrame | None = None
    """The ``equivariance_by_prompt`` rows (``None``: not kept)."""

    @classmethod
    def collect(cls, rows: Rows, prompts: Sequence[PromptContext],
                views: list[dict[str, Any]]) -> Result:
        """The tables from the rows of every case, the prompts and the stored patterns."""
        cases = pd.DataFrame(rows.rows, columns=EQUIVARIANCE.names)
        tokens, perms = prompts_frames(prompts)
        return cls(cases, summarize_verdicts(cases), patterns_frame(views), tokens, perms,
                   errors_by_prompt(cases, prompts))

    def tables(self) -> dict[str, pd.DataFrame]:
        out = {EQUIVARIANCE.name: self.cases, VERDICTS.name: self.verdicts,
               PATTERNS.name: self.patterns, TOKENS.name: self.tokens,
               PERMUTATIONS.name: self.permutations}
        if self.by_prompt is not None:
            out[EQUIVARIANCE_BY_PROMPT.name] = self.by_prompt
        return out

    def summary(self) -> list[str]:
        measured = self.verdicts[self.verdicts.verdict != "n/a"]
        failed = measured[measured.verdict == "fail"]
        lines = [f"{len(measured) - len(failed)} of {len(measured)} checks as expected"
                 + (f"; unexpected: {', '.join(_label(r) for r in failed.itertuples())}"
                    if len(failed) else "")]
        for r in measured.itertuples():
            holds = HOLDS[r.expected]
            err = r.max_rel_error if holds else r.min_rel_error
            word = "max" if holds else "min"
            lines.append(f"{_label(r)}: {r.expected}? {r.verdict} "
                         f"({word} rel. error {err:.2g}, tolerance {r.tolerance:g})")
        return lines


def _label(row: Any) -> str:
    shift = f" (c={row.shift})" if row.shift else ""
    return f"{row.component} / {row.condition}{shift}"


# ---- run settings --------------------------------------------------------------------------

def chosen_layers(model: Model, layers: Sequence[int], view_layers: Sequence[int]
                  ) -> tuple[list[int], list[int]]:
    """The layers checked (every one when ``layers`` is empty) and the layers whose patterns
    are stored (first, middle and last checked when ``view_layers`` is empty).

    Raises:
        WorkbenchError: a layer out of range, or a view layer that is not checked.
    """
    n = model.info.n_layers
    for layer in (*layers, *view_layers):
        if layer >= n:
            raise WorkbenchError(f"layer {layer} is out of range: {model.info.name} has {n}")
    checked = sorted(set(layers)) or list(range(n))
    views = sorted(set(view_layers)) or sorted({checked[0], checked[len(checked) // 2],
                                                checked[-1]})
    if not set(views) <= set(checked):
        raise WorkbenchError(f"view_layers {views} must be among the layers checked {checked}")
    return checked, views


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One intra-op thread for the duration: the checks are thousands of tiny calls
    (T <= a few dozen tokens), which on a busy 2-core machine spend far longer
    synchronising threads than computing (measured: 100x slower with 2 threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
