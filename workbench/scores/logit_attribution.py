"""What the residual stream writes to the logits: the logit lens and direct logit attribution.

A causal LM reads its logits off the final residual stream ``x`` (the last block's output)
through the final norm and the unembedding, then the family's output transform (Gemma 2's
soft cap; the identity elsewhere)::

    logits = T(n(x) W_U + b_U)            n(x) = (x [- mean x]) / s * w  [+ b]

A **logit difference** ``d = logits[a] - logits[b]`` (:class:`Contrast`: an answer token
minus another token, or minus the mean logit over the vocabulary) is what both tools read.

**Logit lens** (nostalgebraist 2020): the residual stream at every layer boundary read as if
it were the final one, through the model's own final norm and unembedding
(:func:`lens_logits`, :func:`logit_lens`). The choice of the norm's scale is stated with
every use: ``frozen`` (the default) divides every boundary's stream by the scale the final
norm computed on the *final* stream at that position (the clean run's, from
``ln_final.hook_scale``), which keeps the lens linear in the stream, so the lens of a
boundary is the sum of the direct effects of the parts written so far (TransformerLens'
``accumulated_resid(apply_ln=True)``); ``recomputed`` applies the norm module itself to each
boundary's stream (its own scale, the classic reading). At the last boundary both are the
model's logits.

**Direct logit attribution** (:func:`direct_effects`): with the final norm's scale frozen at
its value on the input (:mod:`workbench.models.norms`), ``d`` is linear in the final stream,
and the stream is a sum of parts (:mod:`workbench.scores.components`: the embeddings, every
head's ``z W_O``, every MLP, the biases), so::

    d = sum_c <n_lin(c), u>  +  <b, u>  +  (b_U[a] - b_U[b])        u = W_U[:, a] - W_U[:, b]

exactly: each part's *direct effect*, the final norm's bias (``ln_final_bias``) and the
unembedding's bias (``unembed_bias``). Their sum is the model's own logit difference within
float round-off (:attr:`DirectEffects.error`); a family whose output transform is not the
identity (Gemma 2's soft-capped logits) is refused (:func:`require_direct`), the same split
would not sum there.

Examples:
    >>> contrast = Contrast(torch.tensor([io]), torch.tensor([s]))     # doctest: +SKIP
    >>> effects = direct_effects(model, batch, contrast, torch.tensor([-1]))  # doctest: +SKIP
    >>> effects.parts.sum(1) - effects.total                          # doctest: +SKIP
    array([2.1e-07])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.inputs.batching import Batch
from workbench.models.base import Model
from workbench.models.norms import final_norm, normalise
from workbench.recording import hooks
from workbench.scores.components import part_hooks, stream_parts

LensScale = Literal["frozen", "recomputed"]
"""The final norm's scale in the logit lens: the final stream's, frozen (linear), or each
boundary's own."""
LN_FINAL_BIAS, UNEMBED_BIAS = "ln_final_bias", "unembed_bias"
"""The two parts of a logit difference that no component writes."""
PROBE_TOLERANCE = 1e-4
"""Relative miss of the direct effects' sum above which :func:`require_direct` refuses."""


@dataclass(frozen=True)
class Contrast:
    """A logit difference per row: the ``answer`` token's logit minus the ``other`` token's,
    or minus the mean logit over the vocabulary where ``other`` is ``None``."""

    answer: Int[Tensor, " n"]
    other: Int[Tensor, " n"] | None = None

    def __post_init__(self) -> None:
        if self.other is not None and self.other.shape != self.answer.shape:
            raise WorkbenchError(f"a contrast needs one other token per answer, got "
                                 f"{tuple(self.other.shape)} for {tuple(self.answer.shape)}")

    def repeat(self, copies: int) -> Contrast:
        """The contrast of ``copies`` copies of its rows stacked (copy-major)."""
        return Contrast(self.answer.repeat(copies),
                        None if self.other is None else self.other.repeat(copies))


def output_transform(model: Model, logits: Tensor) -> Tensor:
    """The family's transform of the unembedding's output (elementwise: a soft cap, a
    scale), as the bridge applies it."""
    adapter = getattr(model.bridge, "adapter", None)
    if adapter is None:
        return logits
    return adapter.apply_output_logits_transform(logits)


def unembed_bias(model: Model) -> Tensor | None:
    """The unembedding's bias ``[d_vocab]`` (``None`` for a family without one)."""
    bias = getattr(model.bridge, "b_U", None)
    return None if bias is None else bias.detach()


def readout(model: Model, normed: Float[Tensor, "n d_model"], contrast: Contrast
            ) -> Float[Tensor, " n"]:
    """The model's own logit difference read off rows of the final norm's output: the
    unembedding of only the columns needed (every column for a mean contrast), then the
    family's output transform.

    Args:
        model: a causal LM.
        normed: ``ln_final.hook_out`` at the rows' positions.
        contrast: the difference read.

    Returns:
        ``[n]`` logit differences, in ``normed``'s dtype.
    """
    w_u, b_u = model.bridge.W_U.detach(), unembed_bias(model)
    if contrast.other is None:  # every column: a few hundred rows of logits at a time
        out = []
        for start in range(0, len(normed), 256):
            logits = output_transform(model, normed[start: start + 256] @ w_u
                                       + (0 if b_u is None else b_u))
            mine = contrast.answer[start: start + 256, None]
            out.append(logits.gather(1, mine)[:, 0] - logits.mean(1))
        return torch.cat(out) if out else normed.new_zeros(0)
    tokens = torch.stack([contrast.answer, contrast.other], 1)  # [n, 2]
    columns = w_u.T[tokens]  # [n, 2, d_model]
    logits = torch.einsum("nd,ntd->nt", normed, columns)
    if b_u is not None:
        logits = logits + b_u[tokens]
    logits = output_transform(model, logits)
    return logits[:, 0] - logits[:, 1]


def logit_difference(model: Model, batch: Batch, contrast: Contrast,
                     positions: Int[Tensor, " n"]) -> Float[Tensor, " n"]:
    """One pass: each row's logit difference at its position, as the model computes it.
    The pass stops at the final norm's output (the unembedding of the other positions and
    tokens is never computed); hooks active on the bridge apply.

    Args:
        model: a causal LM.
        batch: ``n`` rows.
        contrast: the difference read on each row.
        positions: the position each row's difference is read at (``-1``: the last).

    Returns:
        ``[n]`` logit differences (float32 in a float32 model).
    """
    kept = hooks.capture(model, batch, [hooks.FINAL_OUT])
    rows = torch.arange(batch.input_ids.shape[0])
    return readout(model, kept[hooks.FINAL_OUT][rows, positions], contrast)


# ---- the logit lens ------------------------------------------------------------------------

def lens_logits(model: Model, resid: Float[Tensor, "n d_model"],
                scale: Float[Tensor, " n"] | None) -> Float[Tensor, "n d_vocab"]:
    """Rows of a residual stream read through the final norm and the unembedding.

    Args:
        model: a causal LM.
        resid: the stream at some layer boundary, one row per position read.
        scale: the final norm's frozen scale at each row's position (``ln_final.hook_scale``
            of the pass), or ``None`` to apply the norm module itself (recomputed scale).

    Returns:
        ``[n, d_vocab]`` logits, in the model's dtype, the output transform applied.
    """
    if scale is None:
        module = model.bridge.ln_final
        normed = getattr(module, "_original_component", module)(resid)
    else:
        norm = final_norm(model)
        normed = normalise(resid.double(), scale.double(), norm)
        if norm.bias is not None:
            normed = normed + norm.bias
        normed = normed.to(resid.dtype)
    b_u = unembed_bias(model)
    logits = normed @ model.bridge.W_U.detach() + (0 if b_u is None else b_u)
    return output_transform(model, logits)


@dataclass
class Lens:
    """The logit lens at every layer boundary ``0 .. n_layers`` (boundary ``n_layers`` is
    the model's own output) for ``n`` entries, each with the token it is asked about."""

    scale: LensScale
    answer: Int[np.ndarray, " n"]
    answer_logit: Float[np.ndarray, "boundary n"]
    answer_prob: Float[np.ndarray, "boundary n"]
    answer_rank: Int[np.ndarray, "boundary n"]
    """0 = the top token"""
    top_token: Int[np.ndarray, "boundary n"]
    top_prob: Float[np.ndarray, "boundary n"]
    output_error: float
    """``max |lens at the last boundary - the model's logits| / max |logits|`` over the
    entries, the logits the unembedding of the final norm's output (0 when exact)"""


def logit_lens(model: Model, batch: Batch, rows: Int[Tensor, " n"],
               positions: Int[Tensor, " n"], answer: Int[Tensor, " n"], *,
               scale: LensScale = "frozen", chunk: int = 256) -> Lens:
    """The logit lens of one pass at ``n`` (row, position) entries: each boundary's answer
    logit, probability and rank, and its top token. ``[chunk, d_vocab]`` logits exist at a
    time.

    Args:
        model: a causal LM.
        batch: the inputs.
        rows: the batch row of each entry read.
        positions: the position of each entry read, in its row.
        answer: the token each entry is asked about (e.g. the next token).
        scale: see :data:`LensScale` (stated with every result).
        chunk: entries read at once.
    """
    n_layers = model.info.n_layers
    names = [hooks.resid(b, n_layers) for b in range(n_layers + 1)]
    kept = hooks.capture(model, batch, [*names, hooks.FINAL_SCALE, hooks.FINAL_OUT])
    out: dict[str, list[list[Tensor]]] = {k: [[] for _ in names]
                                          for k in ("logit", "prob", "rank", "top", "top_p")}
    w_u, b_u = model.bridge.W_U.detach(), unembed_bias(model)
    miss, largest = 0.0, 0.0
    for start in range(0, len(rows), chunk):
        at = slice(start, start + chunk)
        index, mine = (rows[at], positions[at]), answer[at][:, None]
        frozen = kept[hooks.FINAL_SCALE][index][:, 0] if scale == "frozen" else None
        for b, name in enumerate(names):
            logits = lens_logits(model, kept[name][index], frozen).double()
            probs = logits.softmax(-1)
            chosen = logits.gather(1, mine)[:, 0]
            top_p, top = probs.max(-1)
            for key, value in (("logit", chosen), ("prob", probs.gather(1, mine)[:, 0]),
                               ("rank", (logits > chosen[:, None]).sum(-1)), ("top", top),
                               ("top_p", top_p)):
                out[key][b].append(value)
        own = output_transform(model, kept[hooks.FINAL_OUT][index] @ w_u
                                + (0 if b_u is None else b_u)).double()
        # the last boundary's logits (there are n_layers + 1 boundaries, never none)
        miss = max(miss, float((logits - own).abs().max()))  # pyright: ignore[reportPossiblyUnboundVariable]
        largest = max(largest, float(own.abs().max()))
    stacked = {k: torch.stack([torch.cat(v) for v in per]).numpy() for k, per in out.items()}
    return Lens(scale, answer.numpy(), stacked["logit"], stacked["prob"], stacked["rank"],
                stacked["top"], stacked["top_p"], miss / max(largest, 1e-30))


# ---- direct logit attribution --------------------------------------------------------------

@dataclass
class DirectEffects:
    """Each part's direct effect on a logit difference, per row (float64)."""

    names: list[str]
    kinds: list[str]
    """embed, head, mlp or bias"""
    layers: list[int]
    """the layer each part comes from; -1 for the embeddings, ``n_layers`` for the
    final norm's and the unembedding's biases"""
    parts: Float[np.ndarray, "n part"]
    total: Float[np.ndarray, " n"]
    """the model's own logit difference (:func:`readout` of ``ln_final.hook_out``)"""

    @property
    def error(self) -> float:
        """``max |sum of parts - total| / max |total|`` over the rows (0 when exact)."""
        miss = np.abs(self.parts.sum(1) - self.total).max(initial=0.0)
        return float(miss / max(float(np.abs(self.total).max(initial=0.0)), 1e-30))


def _directions(model: Model, contrast: Contrast) -> tuple[Tensor, Tensor]:
    """``u = W_U[:, a] - W_U[:, b]`` (or minus the mean column), ``[n, d_model]`` float64,
    and the unembedding bias's difference ``[n]``."""
    w_u, b_u = model.bridge.W_U.detach(), unembed_bias(model)
    if b_u is None:
        b_u = torch.zeros(w_u.shape[1], dtype=w_u.dtype)
    answer = w_u.T[contrast.answer].double()
    if contrast.other is None:
        return answer - w_u.mean(1).double(), (b_u[contrast.answer] - b_u.mean()).double()
    return (answer - w_u.T[contrast.other].double(),
            (b_u[contrast.answer] - b_u[contrast.other]).double())


def direct_effects(model: Model, batch: Batch, contrast: Contrast,
                   positions: Int[Tensor, " n"], rows: Int[Tensor, " n"] | None = None, *,
                   chunk: int = 64) -> DirectEffects:
    """Split the logit difference of ``n`` (row, position) entries of one pass over the parts
    of the final residual stream, the final norm's scale frozen at its value on the input.

    Args:
        model: a causal LM whose output transform is the identity (:func:`require_direct`).
        batch: the inputs.
        contrast: the difference split at each entry.
        positions: each entry's position (``-1``: the last).
        rows: each entry's row (default: entry ``i`` is row ``i``).
        chunk: entries whose parts (``[part, chunk, d_model]`` float64) are formed at once.

    Returns:
        The parts' direct effects and the model's own logit differences.
    """
    n_layers = model.info.n_layers
    kept = hooks.capture(model, batch, [*part_hooks(model, n_layers), hooks.FINAL_SCALE,
                                        hooks.FINAL_OUT])
    rows = torch.arange(batch.input_ids.shape[0]) if rows is None else rows
    norm, w_o = final_norm(model), model.bridge.W_O.detach()
    u, bias_diff = _directions(model, contrast)
    pieces, parts = [], []
    for start in range(0, len(rows), chunk):
        at = slice(start, start + chunk)
        index = (rows[at], positions[at])
        parts = stream_parts(model, kept, index, n_layers, w_o=w_o)
        scale = kept[hooks.FINAL_SCALE][index][:, 0].double()
        stack = normalise(torch.stack([p.value for p in parts]), scale, norm)  # [C, m, d]
        pieces.append(torch.einsum("cnd,nd->nc", stack, u[at]))
    effects = torch.cat(pieces) if pieces else torch.zeros(0, 0, dtype=torch.float64)
    ln_bias = (u @ norm.bias) if norm.bias is not None else torch.zeros(len(rows),
                                                                       dtype=torch.float64)
    total = readout(model, kept[hooks.FINAL_OUT][rows, positions], contrast).double()
    return DirectEffects(
        names=[p.name for p in parts] + [LN_FINAL_BIAS, UNEMBED_BIAS],
        kinds=[p.kind for p in parts] + ["bias", "bias"],
        layers=[p.layer for p in parts] + [n_layers, n_layers],
        parts=torch.cat([effects, ln_bias[:, None], bias_diff[:, None]], 1).numpy(),
        total=total.numpy())


def require_direct(model: Model) -> None:
    """Refuse a model whose logit differences the direct effects do not reproduce on a
    short probe: not a causal LM, no final norm, or an output transform that is not linear
    (Gemma 2 soft-caps its logits).

    Raises:
        ModelCapabilityError: with the reason.
    """
    model.require(causal=True, lm_head=True, what="direct logit attribution")
    info = model.info
    probe = torch.tensor([1.0, -50.0, 200.0])
    if not torch.equal(output_transform(model, probe.clone()), probe):
        raise ModelCapabilityError(
            f"{info.name} transforms its logits after the unembedding (a soft cap or a "
            "scale), so a logit difference is not the sum of the parts' direct effects")
    ids = torch.tensor([[info.bos_token_id or 0, *((7 + 11 * i) % info.d_vocab
                                                   for i in range(5))]])
    batch = Batch.of(ids)
    try:
        with torch.no_grad():
            # the model's most and least likely next tokens: a difference far from 0, so
            # the relative miss measures the split, not a cancellation
            logits = model.logits(ids)[0, -1]
            contrast = Contrast(logits.argmax()[None], logits.argmin()[None])
            effects = direct_effects(model, batch, contrast, torch.tensor([-1]))
    except (WorkbenchError, AttributeError, KeyError, IndexError, RuntimeError, TypeError,
            ValueError) as exc:
        raise ModelCapabilityError(
            f"direct logit attribution cannot read {info.name}'s residual stream "
            f"({type(exc).__name__}: {str(exc)[:120]})") from None
    if not effects.error <= PROBE_TOLERANCE:
        raise ModelCapabilityError(
            f"the direct effects do not reproduce {info.name}'s logit differences (they "
            f"miss by {effects.error:.1e}, relative): something between its residual stream "
            "and its logits is not linear with the final norm's scale frozen")
