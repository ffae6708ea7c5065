"""The window edge of attention-sinks: where a sliding layer's first-token mass goes once
the first token is out of its window (definitions in the package docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import reductions
from workbench.scores import patterns
from workbench.scores.stats import summarize
from workbench.store.schema import with_layer_types

if TYPE_CHECKING:
    from experiments.attention_sinks import Config


EDGE_MEASURES = ("first_in", "first_out", "diagonal_in", "diagonal_out", "edge_out",
                 "neighbour_out", "beyond_out")
"""The per-head measures of the window edge, in the order the table stores them."""
Destination = Literal["edge", "diagonal", "spread", "no sink", "kept"]
HALF = 0.5
"""The share of the lost first-token mass one destination must take to be named."""


def edge_length(window: int, n: int) -> int:
    """Tokens of a window-edge document (BOS included): the window, then ``n`` queries
    past it."""
    return window + n


def edge_reductions(window: int, n: int) -> dict[str, reductions.BlockReduction]:
    """The measures of :data:`EDGE_MEASURES` as block reductions, each a mean over the
    ``n`` queries just before the edge (``_in``: ``W - n <= t < W``, the last that still
    see position 0 through a window of ``W`` keys) or just after it (``_out``:
    ``W <= t < W + n``, the first that do not)."""

    def over(rows: Literal["in", "out"], value) -> reductions.BlockReduction:
        lo, hi = (window - n, window) if rows == "in" else (window, window + n)

        def per_query(pattern: Tensor, ctx: reductions.PatternContext):
            q = ctx.queries
            counted = ctx.real_queries & ((q >= lo) & (q < hi))[None, :]
            return value(pattern, ctx), counted
        return reductions.query_mean(per_query)

    def first(pattern: Tensor, ctx: reductions.PatternContext) -> Tensor:
        values = pattern.float()[..., 0]
        return values if ctx.k0 == 0 else torch.zeros_like(values)

    def at(offset: int):
        return lambda pattern, ctx: patterns.weight_at(pattern, ctx, offset)

    def beyond(pattern: Tensor, ctx: reductions.PatternContext) -> Tensor:
        # keys further back than the window: k <= t - W (none of them in a sliding layer)
        far = ctx.keys(pattern.shape[-1])[None, :] <= (ctx.queries - window)[:, None]
        return (pattern.float() * far).sum(-1)

    return {"first_in": over("in", first), "first_out": over("out", first),
            "diagonal_in": over("in", at(0)), "diagonal_out": over("out", at(0)),
            "edge_out": over("out", at(-(window - 1))),
            "neighbour_out": over("out", at(-(window - 2))),
            "beyond_out": over("out", beyond)}


def edge_inputs(model: Model, cfg: Config) -> list[Prompt]:
    """``cfg.edge_prompts`` consecutive windows of the Python docs' prose, each
    :func:`edge_length` tokens long with its BOS."""
    return token_chunks(model, python_docs(cfg.corpus_split), n_chunks=cfg.edge_prompts,
                        n_tokens=edge_length(model.info.sliding_window, cfg.edge_queries),
                        label="edge")


def measure_window_edge(model: Model, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where a sliding layer's first-token mass goes once the first token is out of reach
    (the package docstring defines every measure).

    Returns:
        ``(window_edge, edge_destinations)``: each measure of every head with its
        bootstrap interval over documents, and each head's destination.
    """
    info = model.info
    prompts = edge_inputs(model, cfg)
    per_prompt = reductions.reduce_patterns(
        model, prompts, edge_reductions(info.sliding_window, cfg.edge_queries),
        max_batch_tokens=max(cfg.max_batch_tokens, edge_length(info.sliding_window,
                                                               cfg.edge_queries)),
        desc="window edge")
    table = summarize(per_prompt, n_boot=cfg.n_boot, seed=cfg.seed).rename(
        columns={"metric": "measure"})
    table = with_layer_types(table, info.layer_types)
    order = {m: i for i, m in enumerate(EDGE_MEASURES)}
    table = table.sort_values(["layer", "head", "measure"], key=lambda c: c.map(order)
                              if c.name == "measure" else c, ignore_index=True)
    return table, destinations(table, cfg.eps)


def destinations(table: pd.DataFrame, eps: float) -> pd.DataFrame:
    """Each head's destination of the lost first-token mass, from its ``window_edge`` means
    (the package docstring's definitions)."""
    wide = table.pivot_table(index=["layer", "head", "layer_type"], columns="measure",
                             values="score").reset_index()
    lost = wide.first_in - wide.first_out
    with np.errstate(divide="ignore", invalid="ignore"):
        to_edge = (wide.edge_out - wide.neighbour_out) / lost
        to_diagonal = (wide.diagonal_out - wide.diagonal_in) / lost
    out = pd.DataFrame({"layer": wide.layer.astype("int64"), "head": wide["head"].astype("int64"),
                        "layer_type": wide.layer_type, "first_in": wide.first_in,
                        "lost": lost, "to_edge": to_edge, "to_diagonal": to_diagonal,
                        "spread": 1 - to_edge - to_diagonal})
    out["destination"] = [_destination(r, eps) for r in out.itertuples()]
    return out


def _destination(row, eps: float) -> Destination:
    if row.layer_type == "global":
        return "kept"
    if not row.first_in > eps:
        return "no sink"
    if row.to_edge >= HALF:
        return "edge"
    if row.to_diagonal >= HALF:
        return "diagonal"
    return "spread"
