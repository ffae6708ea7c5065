"""Attention and its per-head statistics in one fused pass: a FlashAttention-style forward
in Triton that never writes a block of weights to memory.

:func:`attention_statistics` takes one layer's queries, keys and values (after the norms
and rotary, as :mod:`workbench.models.blocked` computes them; grouped-query keys not
repeated) and returns the layer's attention output and, per (batch, head, query row):

- ``lse``: the row's log-sum-exp of its scores (float32);
- ``first``, ``previous``, ``lag``: the weight on key 0, on key ``i - 1`` and on key
  ``i - lag`` (0 where that key does not exist or is not seen);
- ``target``: the weight on a per-query key position (``targets[b, i]``, -1 for none: the
  induction target);
- ``entropy`` (nats) and ``distance``, the expected ``|i - j|`` (the
  ``mean_distance`` metric's; under a causal mask it is ``sum_j w_ij (i - j)``);
- ``received``: per key, the weight it receives summed over the real queries (a second
  kernel over key tiles, each weight rebuilt from its score and its row's ``lse``);
- optionally the ``top_k`` most attended keys of each row (``k <= 16``) and their weights.

Each statistic is kept as FlashAttention keeps its output: running sums rescaled when the
row's running max grows. The entropy is ``log l - sum p (s - m) / l`` from the sums
``l = sum p`` and ``sum p (s - m)``, ``p = exp(s - m)``; a fixed key's weight is its raw
score, recorded when its tile passes, turned into a weight with the final ``lse``.
Scores, weights and statistics are float32 whatever the input dtype (float32, bfloat16,
float16); the output is in the input's dtype.

Precision of the two matrix products, ``q . k`` and ``p . v`` (``precision``,
:data:`Precision`; default :func:`default_precision`):

- ``"ieee"`` (float32 inputs, always): operands converted to float32, Triton's
  ``tl.dot(..., input_precision="ieee")``: float32 products and sums, no TF32;
- ``"tensor"`` (the default for bfloat16 and float16 inputs): ``q``, ``k`` and ``v`` stay
  in their half dtype and the weights ``p`` are rounded to it, so ``tl.dot`` runs on the
  tensor cores (products of half operands are exact in float32, sums are float32).
  Scores, ``lse`` and every statistic are computed from the same half values as under
  ``"ieee"``; only the output also carries ``p``'s rounding. Float32 inputs refuse it.

Against float32 originals that were rounded to a half dtype (a half model's queries and
keys), each operand carries a relative error of at most ``eps`` (:data:`HALF_EPSILON`), so
each score ``s_ij = scale q_i . k_j`` is off by at most
``eta_ij = (2 eps + eps^2) scale sum_d |q_id k_jd|`` (a soft-cap is 1-Lipschitz, so it
keeps the bound). With ``eta_i`` the largest ``eta_ij`` of row ``i``'s seen keys:
``|delta lse_i| <= eta_i`` (the log-sum-exp is 1-Lipschitz in the max-norm); every weight's
relative error is at most ``e^(2 eta_i) - 1``, and so is that of ``first``, ``previous``,
``lag``, ``target``, ``distance`` (a sum of weights times non-negative gaps) and each
row's share of ``received``; ``|delta entropy_i| <= 2 eta_i + (e^(2 eta_i) - 1) H_i``; the
output, whose values and weights are rounded too and which is rounded once on the store,
is within ``((1 + eps)^3 e^(2 eta_i) - 1) sum_j w_ij |v_j|``. Under ``"tensor"`` on the
same half inputs as an ``"ieee"`` run, ``eta`` is 0 and the output is within
``((1 + eps)^2 - 1) sum_j w_ij |v_j|``. ``tests/unit/test_fused_precision.py`` checks
every bound (plus :data:`FLOAT32_TOLERANCE` for the float32 arithmetic itself) under the
interpreter, and ``docs/blocked-attention.md`` lists the largest measured ratios to it.

Variants (:class:`Variant`): causal or bidirectional; a causal sliding window (query ``i``
sees keys ``i - window < j <= i``); key padding of a ragged batch (``key_mask[b, j]``
false for a padded key, left or right padding alike); grouped-query and multi-query heads
(``kv_head`` divides ``head``); soft-capping (``cap * tanh(s / cap)``); any scale (default
``1 / sqrt(d_head)``); queries that are the last positions of the keys (a cache before
them). ``d_head`` need not be a power of two (tiles are padded to one, up to
:data:`MAX_D_HEAD`).

A row that sees no key (a padded query under left padding, or beyond a window) has
``lse = -inf``, output 0 and every weight and statistic 0, as FlashAttention gives it.
Eager attention gives such a row, through its additive ``finfo.min`` mask, weight spread
evenly over every key, and blocked attention spreads it over the block's keys; no real
token reads a padded one and the pattern metrics never count a padded query, so no score
differs.

What it lacks, so a caller keeps the blocked path (:func:`support` says why): ALiBi and
other additive biases, learned sink logits, attention dropout, the family-specific
arithmetic of :mod:`workbench.models.blocked` (GPT-Neo's unscaled float32 step, BLOOM's
``baddbmm``).

Where it runs: a head-score scan whose metrics all read its statistics takes it on CUDA,
or wherever ``attention="fused"`` forces it (:mod:`workbench.recording.fused_scan`, through
the ``fused`` callback of :func:`workbench.models.blocked.blocked`); on CPU the torch
blocked path stays the path. The kernel is exercised here only under Triton's interpreter
(``TRITON_INTERPRET=1``, set before triton is first imported), by
``tests/unit/test_fused.py`` against an eager float32 reference and by
``tests/unit/test_fused_scan.py`` against the blocked path's head scores; nothing of it has
been measured on a GPU (``benchmarks/gpu.py`` is ready to). Triton is an optional
dependency (the ``fused`` extra, pinned to 3.9.0, which ``dev`` pulls in) imported only
when a kernel is launched.

Tolerances, checked by ``tests/unit/test_fused.py`` against an eager float32 softmax of
the whole ``[batch, head, query, key]`` scores at T <= 70, d_head 12 and 16: every
statistic within :data:`FLOAT32_TOLERANCE` (1e-5) times ``max(1, |reference|)`` (the
token distance reaches tens, where 1e-5 is three float32 steps), for float32 inputs and
for bfloat16 ones under ``precision="ieee"`` alike (the reference upcasts the same
bfloat16 values); the output within 1e-5 for float32 inputs and within
:data:`BFLOAT16_OUTPUT_RELATIVE` of its size plus 1e-5 for bfloat16 ones. ``"tensor"`` is
held to the derived bounds above. Largest
differences measured: 1.2e-6 for the output and 9.5e-7 for every statistic but the
distance (1.14e-5 at ~30 tokens, 4.4e-7 relative); bfloat16 outputs 7.7e-3 relative (the
interpreter truncates to bfloat16; a GPU rounds to nearest). Nothing measured on a GPU.

Examples:
    >>> import torch
    >>> q, k, v = torch.randn(1, 4, 32, 16), torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
    >>> stats = attention_statistics(q, k, v, Variant(causal=True))  # doctest: +SKIP
    >>> stats.previous.shape                                          # doctest: +SKIP
    torch.Size([1, 4, 32])
    >>> support("cpu", torch.float32, 16, alibi=True) is not None
    True
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Literal, get_args

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.core.errors import WorkbenchError

MAX_D_HEAD = 256
"""The widest head the kernel takes: a tile holds ``d_head`` (padded to a power of two)
float32 columns of queries and of the output per row."""
MAX_TOP_K = 16
"""The most keys per row the top-k selection keeps (it is a simple insertion, k steps per
key tile)."""
FLOAT32_TOLERANCE = 1e-5
"""Largest difference from eager float32 the tests allow, in units of ``max(1,
|reference|)``: every statistic (float32 or bfloat16 inputs) and a float32 output."""
BFLOAT16_OUTPUT_RELATIVE = 2.0 ** -7
"""The output's bound relative to its size for bfloat16 inputs: one step of bfloat16's 8
significant bits (the float32 result is converted once, on the store; Triton's interpreter
converts by truncation, so a full step rather than the half step of rounding)."""
Statistic = Literal["first", "previous", "lag", "target", "entropy", "distance", "received"]
"""A statistic of the kernel that a head metric can read, by its :class:`Statistics` field
(each pattern metric declares those it reads: ``Metric.statistics`` in
:mod:`workbench.scores.metrics`)."""
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The input dtypes the kernel takes."""
Precision = Literal["ieee", "tensor"]
"""How the kernel's two matrix products take their operands: ``"ieee"``, in float32 (no
TF32); ``"tensor"``, in the inputs' half dtype on the tensor cores, summed in float32."""
HALF_EPSILON: dict[torch.dtype, float] = {torch.bfloat16: 2.0 ** -7,
                                           torch.float16: 2.0 ** -10}
"""The largest relative error of one half-precision operand, per half dtype: the machine
epsilon ``2^(1 - t)`` of a format with ``t`` significant bits (bfloat16 ``t = 8``, float16
``t = 11``; ``torch.finfo(dtype).eps``), the gap between 1 and the next number (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002, section 2.1). It is twice
Higham's unit roundoff ``u = 2^-t``, which bounds rounding to nearest; ``eps`` bounds
truncation as well (Triton's interpreter converts float32 to bfloat16 by dropping bits),
so the error bounds of the module docstring hold for either rounding."""


@dataclass(frozen=True)
class Variant:
    """The attention arithmetic: mask, scale and soft-cap.

    Attributes:
        causal: query ``i`` sees keys ``j <= i`` (else every key).
        window: with ``causal``, query ``i`` sees only keys ``i - window < j <= i``.
        scale: the factor of ``q . k`` (default ``1 / sqrt(d_head)``).
        softcap: scores become ``softcap * tanh(scores / softcap)`` (Gemma 2's logit cap).
    """

    causal: bool = True
    window: int | None = None
    scale: float | None = None
    softcap: float | None = None

    def check(self) -> None:
        """Raise :class:`~workbench.core.errors.WorkbenchError` for a variant the kernel
        cannot compute (the message says what was expected)."""
        if self.window is not None and (not self.causal or self.window < 1):
            raise WorkbenchError(f"window must be a positive number of keys under a causal "
                                 f"mask, got window={self.window!r}, causal={self.causal}")
        if self.softcap is not None and not self.softcap > 0:
            raise WorkbenchError(f"softcap must be positive, got {self.softcap!r}")
        if self.scale is not None and not math.isfinite(self.scale):
            raise WorkbenchError(f"scale must be a finite number, got {self.scale!r}")


@dataclass(frozen=True)
class Statistics:
    """What one fused pass returns (see the module docstring for each statistic).

    Attributes:
        output: ``[batch, head_index, query_pos, d_head]``, in the input dtype.
        lse, first, previous, lag, target, entropy, distance:
            ``[batch, head_index, query_pos]`` float32.
        received: ``[batch, head_index, key_pos]`` float32, or ``None`` when not asked.
        top_keys: ``[batch, head_index, query_pos, k]`` int64 key positions by falling
            weight (-1 past the keys a row sees), or ``None`` when ``top_k`` is 0.
        top_weights: their weights (0 past the keys a row sees), or ``None``.
    """

    output: Float[Tensor, "batch head_index query_pos d_head"]
    lse: Float[Tensor, "batch head_index query_pos"]
    first: Float[Tensor, "batch head_index query_pos"]
    previous: Float[Tensor, "batch head_index query_pos"]
    lag: Float[Tensor, "batch head_index query_pos"]
    target: Float[Tensor, "batch head_index query_pos"]
    entropy: Float[Tensor, "batch head_index query_pos"]
    distance: Float[Tensor, "batch head_index query_pos"]
    received: Float[Tensor, "batch head_index key_pos"] | None = None
    top_keys: Int[Tensor, "batch head_index query_pos k"] | None = None
    top_weights: Float[Tensor, "batch head_index query_pos k"] | None = None


def default_precision(dtype: torch.dtype) -> Precision:
    """``"tensor"`` for half inputs (bfloat16, float16), ``"ieee"`` for float32.

    Examples:
        >>> default_precision(torch.bfloat16), default_precision(torch.float32)
        ('tensor', 'ieee')
    """
    return "tensor" if dtype in HALF_EPSILON else "ieee"


def interpreted() -> bool:
    """Whether Triton's interpreter is asked for (``TRITON_INTERPRET``): kernels then run
    on the CPU, on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "on", "yes"}


def support(device: torch.device | str, dtype: torch.dtype, d_head: int, *,
            alibi: bool = False, sinks: bool = False, dropout: float = 0.0) -> str | None:
    """Why the fused kernel cannot serve a layer, or ``None`` when it can.

    Args:
        device: where the layer's tensors are.
        dtype: their dtype.
        d_head: the head width.
        alibi: the family adds ALiBi (or any other additive) biases to the scores.
        sinks: the family adds learned sink logits to each row.
        dropout: the attention dropout probability in this pass.

    Returns:
        One line saying why (so the caller keeps the blocked path), or ``None``.

    Examples:
        >>> support("cpu", torch.float32, 16, dropout=0.1)
        'the kernel applies no attention dropout'
    """
    if alibi:
        return "the kernel adds no ALiBi or other bias to the scores"
    if sinks:
        return "the kernel adds no learned sink logits"
    if dropout > 0.0:
        return "the kernel applies no attention dropout"
    if dtype not in DTYPES:
        return f"the kernel takes float32, bfloat16 or float16 tensors, not {dtype}"
    if not 1 <= d_head <= MAX_D_HEAD:
        return f"the kernel takes heads of 1 to {MAX_D_HEAD} dimensions, not {d_head}"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (the 'fused' extra: pip install -e '.[fused]')"
    kind = torch.device(device).type
    if kind == "cpu" and not interpreted():
        return "on CPU the kernel runs only under TRITON_INTERPRET=1 (the blocked path is faster)"
    if kind not in {"cpu", "cuda"}:
        return f"the kernel runs on CUDA devices, not {kind}"
    return None


def _check_precision(precision: object, dtype: torch.dtype) -> None:
    """Refuse a precision that is not one of :data:`Precision`, or ``"tensor"`` for
    float32 inputs."""
    if precision not in get_args(Precision):
        known = ", ".join(map(repr, get_args(Precision)))
        raise WorkbenchError(f"precision must be one of {known}, got {precision!r}")
    if precision == "tensor" and dtype not in HALF_EPSILON:
        raise WorkbenchError(f"precision='tensor' takes bfloat16 or float16 inputs (the "
                             f"tensor cores' operands), not {dtype}; use 'ieee'")


def _check(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None,
           targets: Tensor | None, top_k: int, block: tuple[int, int]) -> None:
    """Refuse shapes, dtypes and options the kernel cannot take, one line each."""
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise WorkbenchError("q must be [batch, head, query, d_head] and k, v the same "
                             f"[batch, kv_head, key, d_head]; got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
    (batch, heads, n_q, d_head), (_, kv_heads, n_k, _) = q.shape, k.shape
    if k.shape[0] != batch or k.shape[3] != d_head or heads % kv_heads or n_q > n_k:
        raise WorkbenchError(f"k and v must share q's batch and d_head, with kv_head dividing "
                             f"head and no more queries than keys; got q {tuple(q.shape)}, "
                             f"k {tuple(k.shape)}")
    if not q.dtype == k.dtype == v.dtype:
        raise WorkbenchError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    why = support(q.device, q.dtype, d_head)
    if why is not None:
        raise WorkbenchError(f"the fused attention kernel cannot run: {why}")
    if key_mask is not None and key_mask.shape != (batch, n_k):
        raise WorkbenchError(f"key_mask must be [batch, key] = {(batch, n_k)}, "
                             f"got {tuple(key_mask.shape)}")
    if targets is not None and targets.shape != (batch, n_q):
        raise WorkbenchError(f"targets must be [batch, query] = {(batch, n_q)}, "
                             f"got {tuple(targets.shape)}")
    if not 0 <= top_k <= MAX_TOP_K:
        raise WorkbenchError(f"top_k must be 0 to {MAX_TOP_K}, got {top_k}")
    if any(n < 16 or n & (n - 1) for n in block):
        # tl.dot takes tiles of at least 16 rows and columns, tl.arange powers of two
        raise WorkbenchError(f"block must be two powers of two of at least 16, got {block}")


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class _Launch:
    """The arguments both kernels share: sizes, the variant's numbers and flags."""

    heads: int
    group: int
    n_queries: int
    n_keys: int
    d_head: int
    scale: float
    softcap: float
    window: int
    flags: dict[str, object]

    @classmethod
    def of(cls, q: Tensor, k: Tensor, variant: Variant, key_mask: Tensor | None,
           block: tuple[int, int], precision: Precision) -> _Launch:
        heads, n_q, d_head = q.shape[1], q.shape[2], q.shape[3]
        # bfloat16 dots under the interpreter are emulated (see kernels' docstring)
        emulate = precision == "tensor" and q.dtype == torch.bfloat16 and interpreted()
        flags = {"BLOCK_M": block[0], "BLOCK_N": block[1], "D_PAD": max(16, _pow2(d_head)),
                 "CAUSAL": variant.causal, "SOFTCAP": variant.softcap is not None,
                 "WINDOW": variant.window is not None, "PADDED": key_mask is not None,
                 "HALF": precision == "tensor" and not emulate, "EMULATE": emulate}
        scale = variant.scale if variant.scale is not None else d_head ** -0.5
        return cls(heads, heads // k.shape[1], n_q, k.shape[2], d_head, float(scale),
                   float(variant.softcap or 1.0), int(variant.window or 0), flags)

    @property
    def sizes(self) -> tuple[int, ...]:
        return (self.heads, self.group, self.n_queries, self.n_keys, self.d_head)

    @property
    def numbers(self) -> tuple[float | int, ...]:
        return (self.scale, self.softcap, self.window)


def attention_statistics(q: Float[Tensor, "batch head_index query_pos d_head"],
                         k: Float[Tensor, "batch kv_head key_pos d_head"],
                         v: Float[Tensor, "batch kv_head key_pos d_head"],
                         variant: Variant = Variant(), *,
                         key_mask: Bool[Tensor, "batch key_pos"] | None = None,
                         targets: Int[Tensor, "batch query_pos"] | None = None,
                         lag: int = 2, top_k: int = 0, received: bool = True,
                         block: tuple[int, int] = (64, 64),
                         precision: Precision | None = None) -> Statistics:
    """One layer's attention output and its per-row statistics, in one fused pass (and a
    second over key tiles for ``received``).

    Args:
        q: queries, after norms and rotary.
        k, v: keys and values; ``kv_head`` divides ``head_index`` (grouped-query heads are
            not repeated). The queries are the last ``query_pos`` of the ``key_pos``
            positions.
        variant: the mask, scale and soft-cap.
        key_mask: false at a padded key (per batch row); default every key is real.
        targets: a key position per query for ``target`` (-1: none); default none.
        lag: the offset of the ``lag`` statistic (key ``i - lag``).
        top_k: keep each row's ``top_k`` most attended keys (0: none).
        received: run the second pass for ``received``.
        block: query rows and keys per tile (powers of two, at least 16).
        precision: the matrix products' operands, ``"ieee"`` (float32) or ``"tensor"``
            (the half inputs' dtype); default :func:`default_precision` of ``q``'s dtype.

    Returns:
        The :class:`Statistics`.

    Raises:
        WorkbenchError: shapes that do not fit, or a case the kernel cannot serve
            (:func:`support`'s reason).
    """
    from workbench.models.fused import kernels

    variant.check()
    _check(q, k, v, key_mask, targets, top_k, block)
    precision = default_precision(q.dtype) if precision is None else precision
    _check_precision(precision, q.dtype)
    run = _Launch.of(q, k, variant, key_mask, block, precision)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch = q.shape[0]
    mask = (key_mask.to(device=q.device, dtype=torch.int8).contiguous() if key_mask is not None
            else torch.ones(1, dtype=torch.int8, device=q.device))
    want = (targets.to(device=q.device, dtype=torch.int32).contiguous() if targets is not None
            else torch.full((1,), -1, dtype=torch.int32, device=q.device))
    out = torch.empty_like(q)
    stats = q.new_empty((len(kernels.STATS), batch, run.heads, run.n_queries),
                        dtype=torch.float32)
    top_w = q.new_zeros((batch, run.heads, run.n_queries, max(top_k, 1)), dtype=torch.float32)
    top_i = q.new_full(top_w.shape, -1, dtype=torch.int32)
    grid = (math.ceil(run.n_queries / block[0]), batch * run.heads)
    # the sizes and numbers are unpacked tuples, which pyright cannot count among the
    # positional parameters it expects
    kernels.forward[grid](q, k, v, out, stats, mask, want, top_w, top_i, *run.sizes,
                          *run.numbers, lag,  # pyright: ignore[reportCallIssue]
                          TARGETS=targets is not None, TOPK=top_k,
                          TOPK_PAD=_pow2(max(top_k, 1)), **run.flags)
    planes = dict(zip(kernels.STATS, stats.unbind(0), strict=True))
    result = Statistics(out, **planes)
    if received:
        result = _with_received(result, q, k, stats, mask, run, block[1], kernels)
    if top_k:
        result = _with_top(result, top_i, top_w)
    return result


def _with_received(result: Statistics, q: Tensor, k: Tensor, stats: Tensor, mask: Tensor,
                   run: _Launch, block_n: int, kernels: ModuleType) -> Statistics:
    """``result`` with ``received``: the second pass, over key tiles, reading the lse plane."""
    batch = q.shape[0]
    total = q.new_empty((batch, run.heads, run.n_keys), dtype=torch.float32)
    grid = (math.ceil(run.n_keys / block_n), batch * run.heads)
    kernels.received[grid](q, k, stats, mask, total, *run.sizes, *run.numbers, **run.flags)
    return replace(result, received=total)


def _with_top(result: Statistics, top_i: Tensor, top_w: Tensor) -> Statistics:
    """``result`` with the top-k keys sorted by falling weight (the kernel keeps them as
    they came; ties keep the earlier key first)."""
    weights, order = top_w.sort(dim=-1, descending=True, stable=True)
    return replace(result, top_keys=top_i.gather(-1, order).long(), top_weights=weights)
