"""The fused kernel's ``precision="tensor"`` (half operands on the tensor cores) against
error bounds derived before any run, on CPU under Triton's interpreter.

The derivation (``eps`` = :data:`workbench.models.fused.HALF_EPSILON` of the half dtype,
the largest relative error of one rounded operand). Float32 originals ``q, k, v`` are
rounded to the half dtype, ``q' = q (1 + a)``, ``k' = k (1 + b)``, ``|a|, |b| <= eps``, so
each product ``q'_d k'_d = q_d k_d (1 + a + b + ab)`` and each score moves by at most

    eta_ij = (2 eps + eps^2) scale sum_d |q_id k_jd|

(a soft-cap ``c tanh(s / c)`` is 1-Lipschitz and keeps it). With ``eta_i`` the largest
``eta_ij`` over the keys row ``i`` sees:

- ``lse`` is 1-Lipschitz in the max-norm of the scores: ``|delta lse_i| <= eta_i``;
- a weight ``w_ij = exp(s_ij - lse_i)`` moves by a factor within ``e^(+-2 eta_i)``, so
  ``|delta w_ij| <= (e^(2 eta_i) - 1) w_ij``; the same bound holds for ``first``,
  ``previous``, ``lag``, ``target``, for ``distance = sum_j w_ij |i - j|`` (non-negative
  terms) and for ``received_j`` summed over the rows (``sum_i (e^(2 eta_i) - 1) w_ij``);
- ``H = lse - sum_j w_j s_j``: ``delta H = delta lse - sum_j w'_j delta s_j -
  sum_j (w'_j - w_j) log w_j`` (the weights sum to 1 on both sides, so ``s_j`` may be
  replaced by ``s_j - lse = log w_j``), hence ``|delta H_i| <= 2 eta_i + (e^(2 eta_i) - 1) H_i``;
- the output ``o_i = sum_j w_ij v_j`` has every term's factor off by at most
  ``(1 + eps)^3 e^(2 eta_i)`` (the weight, ``v_j``'s rounding, ``p``'s rounding to the
  half dtype before ``p . v``, and the store's), so
  ``|delta o_i| <= ((1 + eps)^3 e^(2 eta_i) - 1) sum_j w_ij |v_j|``.

Against an ``"ieee"`` run on the same half values, ``eta = 0``: the statistics agree to
float32 arithmetic and the output is within ``((1 + eps)^2 - 1) sum_j w_ij |v_j|``. Every
bound here adds :data:`~workbench.models.fused.FLOAT32_TOLERANCE` times
``max(1, |reference|)``, the float32 agreement ``tests/unit/test_fused.py`` holds the
kernel to; nothing was tuned to the measurements. :func:`ratios` gives each statistic's
largest error divided by its bound; ``docs/blocked-attention.md`` lists the largest over
these cases.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_fused import BLOCK, DEVICE, Case, eager, visible
from workbench.core.errors import WorkbenchError
from workbench.models import fused
from workbench.models.fused import Variant, attention_statistics, kernels

# test_fused's import has skipped this module where triton cannot run
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

HALVES = (torch.bfloat16, torch.float16)
WEIGHTS = ("first", "previous", "lag", "target")
CASES = [
    Case("gqa softcap", Variant(softcap=2.0, scale=0.5), kv_heads=2, spread=3.0),
    Case("window left padding", Variant(window=7), n_q=45, n_k=45, kv_heads=1,
         lengths=(45, 20), left_pad=True),
    Case("bidirectional right padding", Variant(causal=False), n_q=40, n_k=40,
         lengths=(40, 23), d_head=12),
]


def originals(case: Case, seed: int) -> tuple[torch.Tensor, ...]:
    """Float32 ``q, k, v`` of the case (the values a half model would round)."""
    return case.tensors(seed, torch.float32)


def row_eta(q: torch.Tensor, k: torch.Tensor, case: Case, eps: float) -> torch.Tensor:
    """``[batch, head, query]``: the bound on each row's score error (0 for a row that
    sees no key)."""
    q, k = q.cpu().abs(), k.cpu().abs().repeat_interleave(case.heads // case.kv_heads, 1)
    scale = case.variant.scale if case.variant.scale is not None else case.d_head ** -0.5
    each = (2 * eps + eps ** 2) * scale * torch.einsum("bhqd,bhkd->bhqk", q, k)
    mask = case.key_mask()
    seen = visible(case.variant, case.n_q, case.n_k, mask.cpu() if mask is not None else None,
                   case.batch)
    return each.masked_fill(~seen, 0.0).amax(-1)


def magnitude(weights: torch.Tensor, v: torch.Tensor, case: Case) -> torch.Tensor:
    """``sum_j w_ij |v_j|`` per output element."""
    v = v.cpu().float().abs().repeat_interleave(case.heads // case.kv_heads, 1)
    return weights @ v


def bounds(eta: torch.Tensor, want: dict, scale_v: torch.Tensor, eps: float,
           roundings: int, real_q: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each statistic's bound from the derivation (before the float32 allowance)."""
    grow = torch.expm1(2 * eta)
    out = {name: grow * want[name] for name in (*WEIGHTS, "distance")}
    out["lse"] = eta
    out["entropy"] = 2 * eta + grow * want["entropy"]
    out["received"] = (grow[..., None] * want["weights"] * real_q[:, None, :, None]).sum(-2)
    factor = (1 + eps) ** roundings * torch.exp(2 * eta) - 1
    out["output"] = factor[..., None] * scale_v
    return out


def ratios(got: fused.Statistics, want: dict, bound: dict[str, torch.Tensor]
           ) -> dict[str, float]:
    """Each statistic's largest ``|got - want| / (bound + FLOAT32_TOLERANCE max(1, |want|))``."""
    out = {}
    for name, limit in bound.items():
        a, b = getattr(got, name).cpu().float(), want[name]
        if name == "lse":
            assert torch.equal(a.isinf(), b.isinf()), "lse: rows that see no key differ"
            a, b, limit = a[b.isfinite()], b[b.isfinite()], limit[b.isfinite()]
        allowed = limit + fused.FLOAT32_TOLERANCE * b.abs().clamp_min(1.0)
        out[name] = float(((a - b).abs() / allowed).max()) if a.numel() else 0.0
    return out


def measure(case: Case, dtype: torch.dtype, seed: int = 0) -> dict[str, dict[str, float]]:
    """The ``"tensor"`` run on the rounded inputs, as ratios to its bounds against an
    ``"ieee"`` run on the same half values (``same``) and against eager float32 on the
    originals (``originals``)."""
    eps = fused.HALF_EPSILON[dtype]
    q, k, v = originals(case, seed)
    half = tuple(x.to(dtype) for x in (q, k, v))
    mask, targets = case.key_mask(), case.targets(seed)
    options = {"key_mask": mask, "targets": targets, "lag": 3, "block": BLOCK}
    got = attention_statistics(*half, case.variant, **options)
    assert got.output.dtype == dtype
    same = attention_statistics(*(x.float() for x in half), case.variant, precision="ieee",
                                **options)
    real_q = (mask.cpu()[:, case.n_k - case.n_q:] if mask is not None
              else torch.ones(case.batch, case.n_q, dtype=torch.bool))
    zero = torch.zeros(case.batch, case.heads, case.n_q)
    on_same = eager(*half, case.variant, mask, targets, lag=3)
    want_same = {f: getattr(same, f).cpu() for f in (*WEIGHTS, "lse", "entropy", "distance",
                                                      "received", "output")}
    want_same["weights"] = on_same["weights"]
    want = eager(q, k, v, case.variant, mask, targets, lag=3)
    return {
        "same": ratios(got, want_same, bounds(zero, want_same, magnitude(
            on_same["weights"], half[2], case), eps, 2, real_q)),
        "originals": ratios(got, want, bounds(row_eta(q, k, case, eps), want, magnitude(
            want["weights"], v, case), eps, 3, real_q)),
    }


def worst(measured: dict[str, dict[str, float]]) -> float:
    return max(max(r.values()) for r in measured.values())


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_tensor_precision_is_within_its_derived_bounds(case: Case, dtype: torch.dtype) -> None:
    measured = measure(case, dtype)
    assert worst(measured) <= 1.0, measured


@settings(max_examples=3, deadline=None)
@given(n_q=st.integers(1, 40), cache=st.integers(0, 9), heads=st.sampled_from([(2, 1), (4, 2)]),
       d_head=st.sampled_from([8, 16, 20]), window=st.sampled_from([None, 4, 11]),
       softcap=st.sampled_from([None, 1.5]), padded=st.booleans(),
       dtype=st.sampled_from(HALVES), seed=st.integers(0, 2 ** 16))
def test_any_small_shape_is_within_the_bounds(n_q, cache, heads, d_head, window, softcap,
                                               padded, dtype, seed) -> None:
    n_k = n_q + cache
    case = Case("drawn", Variant(window=window, softcap=softcap), batch=2, heads=heads[0],
                kv_heads=heads[1], n_q=n_q, n_k=n_k, d_head=d_head, spread=2.0,
                lengths=(n_k, max(1, n_k // 2)) if padded else None)
    measured = measure(case, dtype, seed)
    assert worst(measured) <= 1.0, measured


@triton.jit
def _rounded(x_ptr, y_ptr, n, SIZE: tl.constexpr):
    i = tl.arange(0, SIZE)
    tl.store(y_ptr + i, kernels._round_bf16(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def test_the_interpreter_rounds_weights_to_nearest_bfloat16() -> None:
    """The bit arithmetic of the emulated bfloat16 product equals torch's round to
    nearest, ties to even (ties built as a bfloat16 value plus half a step)."""
    gen = torch.Generator().manual_seed(0)
    spread = torch.rand(1000, generator=gen) * torch.logspace(-30, 1, 1000)
    steps = torch.rand(500, generator=gen).to(torch.bfloat16).float()
    ties = (steps.view(torch.int32) | 0x8000).view(torch.float32)
    x = torch.cat([spread, ties, torch.tensor([0.0, 1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8])])
    y = torch.empty_like(x, device=DEVICE)
    _rounded[(1,)](x.to(DEVICE), y, x.numel(), SIZE=2048)
    assert torch.equal(y.cpu(), x.to(torch.bfloat16).float())


def test_defaults_and_refusals() -> None:
    for dtype in HALVES:
        assert fused.default_precision(dtype) == "tensor"
        assert fused.HALF_EPSILON[dtype] == torch.finfo(dtype).eps
    assert fused.default_precision(torch.float32) == "ieee"
    assert math.log2(fused.HALF_EPSILON[torch.bfloat16]) == -7
    q, k, v = Case("x", n_q=8, n_k=8).tensors()
    with pytest.raises(WorkbenchError, match="precision='tensor' takes bfloat16 or float16"):
        attention_statistics(q, k, v, precision="tensor")
    with pytest.raises(WorkbenchError, match="precision must be one of 'ieee', 'tensor'"):
        attention_statistics(q, k, v, precision="tf32")  # pyright: ignore[reportArgumentType]
