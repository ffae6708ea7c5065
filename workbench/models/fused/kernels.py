"""The Triton kernels of :mod:`workbench.models.fused` (imported only when one runs).

This module imports triton at its top, so :mod:`workbench.models.fused` imports it only
inside the function that launches a kernel: ``import workbench`` never needs triton.
Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` runs, that is when this module is
first imported; set it before that to run the kernels on the CPU.

Layout: every tensor is contiguous. ``q`` and ``out`` are ``[batch, head, query, d_head]``,
``k`` and ``v`` are ``[batch, kv_head, key, d_head]``; query row ``i`` sits at key position
``i + shift`` (``shift = n_keys - n_queries``: the keys before the queries come from a
cache). ``stats`` is ``[N_STATS, batch, head, query]`` float32, one plane per statistic
in the order of :data:`STATS`.

The two products (``q . k`` and ``p . v``) take their operands one of three ways, chosen
by two flags that every kernel takes:

- neither (``precision="ieee"``): operands converted to float32, ``tl.dot`` with
  ``input_precision="ieee"`` (no TF32);
- ``HALF`` (``precision="tensor"`` on a GPU, or float16 under the interpreter): ``q``,
  ``k`` and ``v`` kept in their half dtype and ``p`` converted to it (round to nearest),
  ``tl.dot`` on half operands with a float32 accumulator, as the tensor cores compute it;
- ``EMULATE`` (``precision="tensor"`` with bfloat16 under Triton's interpreter): the
  interpreter multiplies bfloat16 operands' raw bit patterns in ``tl.dot`` (triton issue
  #11584) and converts float32 to bfloat16 by dropping bits, so the operands are converted
  to float32 (exact for bfloat16 values) and ``p`` is rounded to the nearest bfloat16 by
  integer arithmetic on its bits (:func:`_round_bf16`): the same values a GPU's tensor
  cores multiply, products exact and summed in float32.

The statistics read only the float32 scores and the float32 ``p``: ``p``'s rounding
touches the output alone.
"""

# Triton's DSL: a @triton.jit function is compiled from its source, never run as Python,
# and its values are tl tensors whose indexing, comparisons and static_range loops the
# Python types pyright infers for them do not describe.
# pyright: reportGeneralTypeIssues=false, reportOperatorIssue=false, reportIndexIssue=false
# pyright: reportCallIssue=false, reportArgumentType=false

from __future__ import annotations

import triton
import triton.language as tl

STATS = ("lse", "first", "previous", "lag", "target", "entropy", "distance")
"""The planes of ``stats``, in order."""
LSE, FIRST, PREVIOUS, LAG, TARGET, ENTROPY, DISTANCE = range(len(STATS))
TANH_SERIES = 0.125
"""Below this |x|, tanh is its Taylor series: ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)``
loses digits to cancellation there (libdevice's tanh does not run under the interpreter)."""


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    far = (1.0 - e) / (1.0 + e)
    far = tl.where(x < 0, -far, far)
    x2 = x * x
    # the series to x^9: its first omitted term is below 1e-10 at |x| = 0.125
    near = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0
                                                                   + x2 * 62.0 / 2835.0))))
    return tl.where(tl.abs(x) < TANH_SERIES, near, far)


@triton.jit
def _round_bf16(x):
    """Float32 ``x`` rounded to the nearest bfloat16 (ties to even), kept in float32.

    bfloat16 is float32's upper 16 bits: adding ``0x7FFF`` plus the lowest kept bit carries
    into the kept bits exactly when the dropped half is above one half of a step, or equal
    to it with an odd kept bit. For finite ``x`` only (a weight ``p`` in [0, 1] here)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _operand(x, HALF: tl.constexpr):
    """A loaded ``q``, ``k`` or ``v`` tile as a dot operand: in its half dtype for the
    tensor cores (``HALF``), else float32 (exact for half values)."""
    if HALF:
        return x
    return x.to(tl.float32)


@triton.jit
def _weights_operand(p, v, HALF: tl.constexpr, EMULATE: tl.constexpr):
    """The float32 weights ``p`` as the left operand of ``p . v``: converted to ``v``'s
    half dtype (``HALF``: round to nearest on a GPU), rounded to bfloat16 values by their
    bits (``EMULATE``), or left in float32."""
    if HALF:
        return p.to(v.dtype)
    if EMULATE:
        return _round_bf16(p)
    return p


@triton.jit
def _scores(q, k_ptrs, cols, rows_abs, kmask_ptr, n_keys, d_ok, scale, softcap,
            window, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr,
            PADDED: tl.constexpr, HALF: tl.constexpr):
    """One tile of float32 scores ``[BLOCK_M, BLOCK_N]`` (-inf where a key is not seen)
    and the mask of the keys seen."""
    col_ok = cols < n_keys
    kt = _operand(tl.load(k_ptrs, mask=col_ok[None, :] & d_ok[:, None], other=0.0), HALF)
    # input_precision governs float32 operands only (no TF32); half operands ignore it
    s = tl.dot(q, kt, input_precision="ieee") * scale
    if SOFTCAP:
        s = softcap * _tanh(s / softcap)
    seen = col_ok[None, :] & (rows_abs[:, None] >= 0)
    if CAUSAL:
        seen = seen & (cols[None, :] <= rows_abs[:, None])
    if WINDOW:
        seen = seen & (cols[None, :] > rows_abs[:, None] - window)
    if PADDED:
        real = tl.load(kmask_ptr + cols, mask=col_ok, other=0)
        seen = seen & (real[None, :] != 0)
    return tl.where(seen, s, float("-inf")), seen


@triton.jit
def _key_range(q_start, shift, n_keys, window, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """The key tiles some row of a query tile may see: ``lo .. hi``, ``lo`` on a tile edge."""
    lo = 0
    hi = n_keys
    if CAUSAL:
        hi = tl.minimum(n_keys, q_start + shift + BLOCK_M)
    if WINDOW:
        lo = tl.maximum(0, q_start + shift - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    return lo, hi


@triton.jit
def _wanted(rows_abs, lag, targets):
    """``[BLOCK_M, 4]``: each row's first, previous, lag and target key (-1 or less: none)."""
    which = tl.arange(0, 4)[None, :]
    at = rows_abs[:, None]
    return tl.where(which == 0, 0, tl.where(which == 1, at - 1,
                                            tl.where(which == 2, at - lag, targets[:, None])))


@triton.jit
def _pick(s, cols, want):
    """Each row's raw scores ``[BLOCK_M, 4]`` at its wanted keys in this tile (0 where
    absent), and whether the tile held each and the row sees it (0 or 1)."""
    hit = (cols[None, None, :] == want[:, :, None]) & (s[:, None, :] > float("-inf"))
    return tl.sum(tl.where(hit, s[:, None, :], 0.0), 2), tl.max(hit.to(tl.int32), 2)


@triton.jit
def _top_insert(top_s, top_i, s, start, cols, slots, TOPK: tl.constexpr):
    """Merge a tile's scores into each row's running top-k (kept unsorted): TOPK times,
    the tile's best key replaces the row's weakest kept one where it beats it."""
    for _ in tl.static_range(TOPK):
        best = tl.max(s, 1)
        at = tl.argmax(s, 1)
        slot = tl.argmin(top_s, 1)
        put = (slots[None, :] == slot[:, None]) & (best > tl.min(top_s, 1))[:, None]
        chosen = cols[None, :] == (start + at)[:, None]
        top_s = tl.where(put, best[:, None], top_s)
        top_i = tl.where(put, (start + at)[:, None], top_i)
        s = tl.where(chosen, float("-inf"), s)
    return top_s, top_i


@triton.jit
def _store_rows(stats_ptr, plane, rows_at, row_ok, m, l_sum, ent, dist, raw, hit):
    """Every row statistic from the final sums; returns the lse. A row that saw no key
    (``l_sum == 0``) gets lse -inf and 0 for everything else."""
    live = l_sum > 0.0
    safe_l = tl.where(live, l_sum, 1.0)
    m_ref = tl.where(live, m, 0.0)
    lse = tl.where(live, m_ref + tl.log(safe_l), float("-inf"))
    tl.store(stats_ptr + rows_at, lse, mask=row_ok)
    for which in tl.static_range(4):
        column = tl.arange(0, 4)[None, :] == which
        seen = tl.sum(tl.where(column, hit, 0), 1) > 0
        w = tl.exp(tl.sum(tl.where(column, raw, 0.0), 1) - (m_ref + tl.log(safe_l)))
        tl.store(stats_ptr + (1 + which) * plane + rows_at, tl.where(seen & live, w, 0.0),
                 mask=row_ok)
    # H = -sum w log w = log l - sum p (s - m) / l with p = exp(s - m): no large lse cancels
    tl.store(stats_ptr + 5 * plane + rows_at,
             tl.where(live, tl.log(safe_l) - ent / safe_l, 0.0), mask=row_ok)
    tl.store(stats_ptr + 6 * plane + rows_at, tl.where(live, dist / safe_l, 0.0), mask=row_ok)
    return lse


@triton.jit
def _store_top(top_w_ptr, top_i_ptr, rows_at, row_ok, top_s, top_i, slots, lse,
               TOPK: tl.constexpr):
    """The kept keys of each row and their weights (0 where fewer keys were seen)."""
    at = rows_at[:, None] * TOPK + slots[None, :]
    keep = row_ok[:, None] & (slots[None, :] < TOPK)
    finite = tl.where(lse > float("-inf"), lse, 0.0)
    tl.store(top_w_ptr + at, tl.where(top_i >= 0, tl.exp(top_s - finite[:, None]), 0.0),
             mask=keep)
    tl.store(top_i_ptr + at, top_i, mask=keep)


@triton.jit
def _rescale(m, m_tile, l_sum, ent):
    """The running max after a tile, its finite stand-in, the factor that rescales the
    running sums to it, and the entropy sum moved to the new reference.

    ``ent`` holds sum p (s - m_ref); rescaled to m_new it is
    alpha (ent + l (m_ref - m_new)). A row that has seen nothing keeps m = -inf; its sums
    are 0 and stay 0 (the guard keeps 0 * inf from making a NaN)."""
    m_new = tl.maximum(m, m_tile)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    m_old = tl.where(m == float("-inf"), m_ref, m)
    alpha = tl.exp(m_old - m_ref)
    ent = alpha * (ent + l_sum * (m_old - m_ref))
    return m_new, m_ref, alpha, ent


@triton.jit
def forward(q_ptr, k_ptr, v_ptr, out_ptr, stats_ptr, kmask_ptr, target_ptr, top_w_ptr,
            top_i_ptr, n_heads, group, n_queries, n_keys, d_head, scale, softcap, window, lag,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
            CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr,
            PADDED: tl.constexpr, HALF: tl.constexpr, EMULATE: tl.constexpr,
            TARGETS: tl.constexpr, TOPK: tl.constexpr, TOPK_PAD: tl.constexpr):
    """One tile of query rows of one (batch, head): the output and every row statistic,
    keys visited one tile at a time with FlashAttention's running-max rescaling."""
    q_start, bh = tl.program_id(0) * BLOCK_M, tl.program_id(1)
    b = bh // n_heads
    kv = b * (n_heads // group) + (bh % n_heads) // group
    shift = n_keys - n_queries
    rows = q_start + tl.arange(0, BLOCK_M)
    row_ok = rows < n_queries
    rows_abs = tl.where(row_ok, rows + shift, -1)
    dims = tl.arange(0, D_PAD)
    d_ok = dims < d_head
    q = _operand(tl.load(q_ptr + (bh * n_queries + rows)[:, None] * d_head + dims[None, :],
                         mask=row_ok[:, None] & d_ok[None, :], other=0.0), HALF)
    targets = tl.full([BLOCK_M], -1, tl.int32)
    if TARGETS:
        targets = tl.load(target_ptr + b * n_queries + rows, mask=row_ok, other=-1)
    want = _wanted(rows_abs, lag, targets)
    zero = tl.zeros([BLOCK_M], tl.float32)
    m, l_sum, ent, dist = zero + float("-inf"), zero, zero, zero
    raw, hit = tl.zeros([BLOCK_M, 4], tl.float32), tl.zeros([BLOCK_M, 4], tl.int32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    slots = tl.arange(0, TOPK_PAD)
    top_s = tl.where(slots[None, :] < TOPK, float("-inf"), float("inf")) + zero[:, None]
    top_i = tl.full([BLOCK_M, TOPK_PAD], -1, tl.int32)
    lo, hi = _key_range(q_start, shift, n_keys, window, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        s, seen = _scores(q, k_ptr + (kv * n_keys + cols)[None, :] * d_head + dims[:, None],
                          cols, rows_abs, kmask_ptr + b * n_keys, n_keys, d_ok, scale,
                          softcap, window, CAUSAL, SOFTCAP, WINDOW, PADDED, HALF)
        m, m_ref, alpha, ent = _rescale(m, tl.max(s, 1), l_sum, ent)
        p = tl.where(seen, tl.exp(s - m_ref[:, None]), 0.0)
        # unseen keys have p = 0; their -inf score must not meet it (0 * inf is NaN)
        ent += tl.sum(p * (tl.where(seen, s, m_ref[:, None]) - m_ref[:, None]), 1)
        l_sum = alpha * l_sum + tl.sum(p, 1)
        gap = tl.abs(rows_abs[:, None] - cols[None, :]).to(tl.float32)
        dist = alpha * dist + tl.sum(p * gap, 1)
        v = _operand(tl.load(v_ptr + (kv * n_keys + cols)[:, None] * d_head + dims[None, :],
                             mask=(cols < n_keys)[:, None] & d_ok[None, :], other=0.0), HALF)
        acc = acc * alpha[:, None] + tl.dot(_weights_operand(p, v, HALF, EMULATE), v,
                                            input_precision="ieee")
        tile_raw, tile_hit = _pick(s, cols, want)
        raw, hit = raw + tile_raw, hit + tile_hit
        if TOPK > 0:
            top_s, top_i = _top_insert(top_s, top_i, s, start, cols, slots, TOPK)
    out = acc / tl.where(l_sum > 0.0, l_sum, 1.0)[:, None]
    tl.store(out_ptr + (bh * n_queries + rows)[:, None] * d_head + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    rows_at = bh * n_queries + rows
    lse = _store_rows(stats_ptr, n_queries * tl.num_programs(1), rows_at, row_ok, m, l_sum,
                      ent, dist, raw, hit)
    if TOPK > 0:
        _store_top(top_w_ptr, top_i_ptr, rows_at, row_ok, top_s, top_i, slots, lse, TOPK)


@triton.jit
def received(q_ptr, k_ptr, stats_ptr, kmask_ptr, out_ptr, n_heads, group, n_queries, n_keys,
             d_head, scale, softcap, window, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             D_PAD: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
             WINDOW: tl.constexpr, PADDED: tl.constexpr, HALF: tl.constexpr,
             EMULATE: tl.constexpr):
    """One tile of keys of one (batch, head): the weight each key receives, summed over
    the real queries, each weight rebuilt from its score and its row's lse (pass one's)."""
    k_start = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = bh // n_heads
    kv = b * (n_heads // group) + (bh % n_heads) // group
    shift = n_keys - n_queries
    cols = k_start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D_PAD)
    d_ok = dims < d_head
    k_ptrs = k_ptr + (kv * n_keys + cols)[None, :] * d_head + dims[:, None]
    total = tl.zeros([BLOCK_N], tl.float32)
    # a causal query row sees this tile only from key k_start on
    q_lo = 0
    if CAUSAL:
        q_lo = (tl.maximum(0, k_start - shift) // BLOCK_M) * BLOCK_M
    for q_start in range(q_lo, n_queries, BLOCK_M):
        rows = q_start + tl.arange(0, BLOCK_M)
        row_ok = rows < n_queries
        rows_abs = tl.where(row_ok, rows + shift, -1)
        q = _operand(tl.load(q_ptr + (bh * n_queries + rows)[:, None] * d_head + dims[None, :],
                             mask=row_ok[:, None] & d_ok[None, :], other=0.0), HALF)
        s, seen = _scores(q, k_ptrs, cols, rows_abs, kmask_ptr + b * n_keys, n_keys, d_ok,
                          scale, softcap, window, CAUSAL, SOFTCAP, WINDOW, PADDED, HALF)
        lse = tl.load(stats_ptr + bh * n_queries + rows, mask=row_ok, other=float("-inf"))
        counted = row_ok & (lse > float("-inf"))
        if PADDED:
            real = tl.load(kmask_ptr + b * n_keys + rows_abs, mask=row_ok, other=0)
            counted = counted & (real != 0)
        lse = tl.where(counted, lse, 0.0)
        w = tl.where(seen & counted[:, None], tl.exp(s - lse[:, None]), 0.0)
        total += tl.sum(w, 0)
    tl.store(out_ptr + bh * n_keys + cols, total, mask=cols < n_keys)
