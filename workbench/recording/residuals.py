"""The residual stream at every layer boundary, reduced to its extremes while the model runs.

:func:`scan_residuals` hooks every boundary (:func:`workbench.recording.hooks.resid`:
boundary ``l < n_layers`` is the input of block ``l``, boundary ``n_layers`` the output of
the last block) and keeps, per prompt and boundary, only the largest |activations| with
their position and dimension, the median |activation| and the spread over positions. Each
hook reduces its boundary before the next layer runs, so no activation cache is held.

Massive activations (Sun et al. 2024, "Massive Activations in Large Language Models",
section 2): a few activations, in fixed dimensions, larger than 100 in magnitude and about
1,000 times the median magnitude. :func:`is_massive` is the one rule, strict on both
bounds; :func:`massive_by_boundary` reduces a scan to one row per boundary.

The spread ``max_t |h[t] - h[0]|`` tests Gu et al. 2024's repeated-token property ("When
Attention Sink Emerges in Language Models", appendix C): without absolute position
embeddings, a sequence of one repeated token has the same hidden state at every position,
so its spread is float round-off (:func:`spread_by_boundary`).

Examples:
    >>> scan = scan_residuals(model, prompts)                       # doctest: +SKIP
    >>> massive_by_boundary(scan)[["layer", "top1", "ratio"]]        # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import hooks

MASSIVE_MAGNITUDE = 100.0
"""Sun et al.'s bound: a massive activation has |h| greater than this."""
MASSIVE_RATIO = 1000.0
"""Sun et al.'s bound: a massive activation is more than this many times the median |h|."""


def is_massive(magnitude: Any, ratio: Any, *, min_magnitude: float = MASSIVE_MAGNITUDE,
               min_ratio: float = MASSIVE_RATIO) -> Any:
    """Sun et al.'s rule: ``magnitude > min_magnitude`` and ``ratio > min_ratio``.

    Args:
        magnitude: |h| (a number, array or Series).
        ratio: |h| over the median |h| of its prompt, of the same shape.
        min_magnitude: the bound on |h|, strict.
        min_ratio: the bound on the ratio, strict.

    Returns:
        A bool of the shape of the inputs.
    """
    return (magnitude > min_magnitude) & (ratio > min_ratio)


def _extremes(x: Float[Tensor, "pos d_model"], prompt: int, boundary: int, top_k: int
              ) -> list[dict[str, Any]]:
    """The top-k |activation| of one prompt at one boundary, with position and dimension."""
    x = x.float()
    magnitude = x.abs()
    values, index = magnitude.reshape(-1).topk(top_k)
    median = float(magnitude.median())
    spread = float((x - x[0]).abs().max())
    return [{"prompt": prompt, "layer": boundary, "rank": rank + 1,
             "value": float(x.reshape(-1)[index[rank]]), "magnitude": float(values[rank]),
             "position": int(index[rank]) // x.shape[1], "dim": int(index[rank]) % x.shape[1],
             "median_abs": median, "spread": spread, "max_abs": float(values[0])}
            for rank in range(top_k)]


def scan_residuals(model: Model, prompts: Sequence[Prompt], *, max_batch_tokens: int = 2048,
                   top_k: int = 3) -> pd.DataFrame:
    """The largest residual-stream activations at every layer boundary of every prompt.

    Args:
        model: the model.
        prompts: the prompts (any lengths; padding is never counted).
        max_batch_tokens: batch size in tokens.
        top_k: how many of the largest |activations| to keep per prompt and boundary.

    Returns:
        One row per (prompt, boundary, rank 1..top_k), sorted so: ``prompt``, ``layer``
        (the boundary), ``rank``, ``value`` (signed), ``magnitude``, ``position``, ``dim``,
        and per (prompt, boundary) ``median_abs`` (median |h| over positions and
        dimensions), ``spread`` (max over positions and dimensions of |h[t] - h[0]|) and
        ``max_abs`` (the largest |h|).
    """
    n_layers = model.info.n_layers
    rows: list[dict[str, Any]] = []
    state: dict[str, list[int]] = {}

    def make_hook(boundary: int):
        def hook(resid: Tensor, hook: object) -> None:
            for row, (index, n) in enumerate(zip(state["indices"], state["lengths"],
                                                 strict=True)):
                rows.extend(_extremes(resid[row, :n], index, boundary, top_k))
        return hook

    fwd = [(hooks.resid(b, n_layers), make_hook(b)) for b in range(n_layers + 1)]
    with torch.inference_mode():
        for batch in model.batches(prompts, max_tokens=max_batch_tokens):
            state.update(indices=batch.indices, lengths=batch.lengths)
            hooks.run_hooked(model.bridge, batch, fwd, stop_after=hooks.resid(n_layers, n_layers))
    return pd.DataFrame(rows).sort_values(["prompt", "layer", "rank"], ignore_index=True)


def massive_by_boundary(scan: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per boundary (and group of ``by`` columns): the typical extremes over prompts.

    Args:
        scan: :func:`scan_residuals` rows, with any ``by`` columns added.
        by: columns that split the prompts into groups (e.g. an input kind).

    Returns:
        One row per group and boundary, in order of first appearance: the ``by``
        columns, ``layer``, ``top1 .. topK`` (median over prompts of each rank's |h|),
        ``median_abs`` (median over prompts of the median |h|), ``ratio`` (median over
        prompts of top-1 |h| / median |h|), ``top1_position`` and ``top1_dim`` (the most
        common position and dimension of the largest |h|; the smallest on a tie) with
        ``top1_position_share`` and ``top1_dim_share`` (the fraction of prompts where it
        sits there), and ``n_prompts``.
    """
    keys = [*by, "layer"]
    ranks = sorted(scan["rank"].unique())
    rows = []
    for key, df in scan.groupby(keys, sort=False):
        top1 = df[df["rank"] == 1]
        position, dim = top1.position.mode().iloc[0], top1.dim.mode().iloc[0]
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row["layer"] = int(row["layer"])
        for rank in ranks:
            row[f"top{rank}"] = float(df[df["rank"] == rank].magnitude.median())
        row |= {"median_abs": float(top1.median_abs.median()),
                "ratio": float((top1.magnitude / top1.median_abs).median()),
                "top1_position": int(position),
                "top1_position_share": float((top1.position == position).mean()),
                "top1_dim": int(dim), "top1_dim_share": float((top1.dim == dim).mean()),
                "n_prompts": len(top1)}
        rows.append(row)
    return pd.DataFrame(rows)


def spread_by_boundary(scan: pd.DataFrame) -> pd.DataFrame:
    """Per boundary: the largest spread ``|h[t] - h[0]|`` over the prompts of ``scan``,
    against the largest |h| (the repeated-token check of the module docstring).

    Returns:
        ``layer, max_abs_deviation, max_abs_activation, n_prompts, relative_deviation``
        (the deviation over the activation; round-off when every position is equal).
    """
    per = scan[scan["rank"] == 1].groupby("layer")
    out = per.agg(max_abs_deviation=("spread", "max"), max_abs_activation=("max_abs", "max"),
                  n_prompts=("prompt", "nunique")).reset_index()
    out["relative_deviation"] = out.max_abs_deviation / out.max_abs_activation
    return out

