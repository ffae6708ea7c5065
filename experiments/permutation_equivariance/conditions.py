"""The conditions of ``permutation-equivariance``: what is permuted or removed, what is
expected of it, the source of the expectation, and which models it applies to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workbench.models.base import Model

Component = Literal["attention sublayer", "whole model", "attention heads"]
Expectation = Literal["equivariant", "not equivariant", "unchanged", "changes"]
Requirement = Literal["rotary", "learned", "alibi", "causal", "bidirectional", "grouped",
                      "sliding"]
PermutationKind = Literal["full", "prefix"]

HOLDS: dict[Expectation, bool] = {"equivariant": True, "unchanged": True,
                                  "not equivariant": False, "changes": False}
"""Whether an expectation asks the error to be within the tolerance (True) or beyond it."""


@dataclass(frozen=True)
class Condition:
    """One row of the table of conditions."""

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
    Condition("attention sublayer", "sliding window, far-past permutation", "unchanged",
              "a sliding layer's query sees only its last W keys: tokens moved further back "
              "are masked", ("sliding",)),
    Condition("attention sublayer", "causal mask, far-past permutation (control)", "changes",
              "control: without the window the same queries see the moved tokens, rotated "
              "by their new positions", ("sliding", "rotary")),
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
    Condition("whole model", "position ids + c, ALiBi", "unchanged",
              "Press et al. 2022: ALiBi adds slope * (j - i), which depends only on j - i",
              ("alibi",)),
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

WINDOW_CONDITIONS = ("sliding window, far-past permutation",
                     "causal mask, far-past permutation (control)")
"""The sublayer conditions of a sliding layer's window (RoPE on, the model's own positions):
a permutation of only the positions ``0 .. i-1``, checked at the queries ``t >= i + W - 1``
whose window ``t - W + 1 .. t`` holds no moved token, under the layer's window mask
(unchanged) and, as the control, under the plain causal mask (changes)."""

SUBLAYER_SETTINGS: dict[str, tuple[bool, bool, PermutationKind]] = {
    "no positions, no mask": (False, False, "full"),
    "no positions, causal mask": (False, True, "full"),
    "no positions, causal mask, prefix permutation": (False, True, "prefix"),
    "RoPE, no mask": (True, False, "full"),
    "RoPE, causal mask, prefix permutation": (True, True, "prefix"),
}
"""Sublayer condition -> (RoPE on, causal mask, which permutation)."""


def missing_requirement(cond: Condition, model: Model) -> str | None:
    """Why ``cond`` does not apply to ``model``, or ``None`` if it does."""
    info = model.info
    facts: dict[Requirement, tuple[bool, str]] = {
        "rotary": (info.positions == "rotary",
                   f"{info.name} has {info.positions} positions, no RoPE"),
        "learned": (info.positions == "learned",
                    f"{info.name} has no position embeddings: its {info.positions} positions "
                    "act inside attention (see its own conditions)"),
        "alibi": (info.positions == "alibi", f"{info.name} has {info.positions} positions, "
                  "no ALiBi biases"),
        "causal": (info.causal, f"{info.name} is bidirectional: no causal mask to keep"),
        "bidirectional": (not info.causal,
                          f"{info.name} is causal: its mask keeps it from being equivariant"),
        "grouped": (1 < info.n_kv_heads < info.n_heads,
                    f"{info.name} has {info.n_kv_heads} kv heads for {info.n_heads} query "
                    "heads: no groups to cross"),
        "sliding": (bool(info.sliding_layers),
                    f"{info.name} has no sliding-window layer: every query sees every "
                    "earlier key"),
    }
    for need in cond.requires:
        ok, why = facts[need]
        if not ok:
            return why
    return None
