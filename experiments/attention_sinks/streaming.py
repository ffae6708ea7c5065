"""Streaming perplexity of attention-sinks: one long text under dense attention, a window,
sinks plus a window, and a fresh window recomputed for each prediction (definitions in the
package docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from workbench.inputs.corpus import python_docs, token_chunks
from workbench.models.base import Model
from workbench.scores.stats import bootstrap_mean_ci
from workbench.scores.streaming import (
    Visibility,
    recompute_losses,
    windowed_losses,
    windowed_losses_batched,
)

if TYPE_CHECKING:
    from experiments.attention_sinks import Config


def stream_ids(model: Model, cfg: Config) -> Int[Tensor, " pos"]:
    """The streamed text: the Python docs' prose, BOS first, ``cfg.stream_tokens`` long."""
    chunk = token_chunks(model, ["\n\n".join(python_docs(cfg.corpus_split))], n_chunks=1,
                         n_tokens=cfg.stream_tokens, label="stream")[0]
    return torch.tensor(chunk.token_ids)


def _ppl(nll: np.ndarray) -> float:
    return float(np.exp(nll.mean())) if len(nll) else float("nan")


def _variants(cfg: Config) -> list[tuple[str, Visibility]]:
    out = [("dense", Visibility()), ("window", Visibility(0, cfg.window))]
    out += [("sinks+window", Visibility(k, cfg.window))
            for k in sorted({cfg.n_sinks, *cfg.sink_sweep})]
    return out


def measure_streaming(model: Model, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Perplexity of one long text under every attention variant.

    Returns:
        ``(table, losses)``: one row per variant (see :func:`_streaming_row`), and the loss
        of every evaluated target, ``variant, label, n_sinks, position, nll`` (``position``
        is the query position ``t``; the target is token ``t + 1``).
    """
    ids = stream_ids(model, cfg)
    variants = _variants(cfg)
    # the windowed variants run as one batch (one shared cache: the sinks, the last W keys
    # and the chunk); dense runs alone, since in a batch it would keep every key for every row
    dense = [windowed_losses(model, ids, variants[0][1], chunk=cfg.chunk, desc="stream dense")]
    windows = windowed_losses_batched(model, ids, [vis for _, vis in variants[1:]],
                                      chunk=cfg.chunk, desc="stream windows")
    frames = []
    for (variant, vis), nll in zip(variants, [*dense, *windows], strict=True):
        frames.append(pd.DataFrame({"variant": variant, "label": vis.label,
                                    "n_sinks": vis.n_sinks, "position": np.arange(len(nll)),
                                    "nll": nll.numpy()}))
    sample = list(range(cfg.window, len(ids) - 1, cfg.recompute_stride))
    nll = recompute_losses(model, ids, cfg.window, sample,
                           max_batch_tokens=cfg.max_batch_tokens)
    frames.append(pd.DataFrame({"variant": "recompute", "label": f"recompute {cfg.window}",
                                "n_sinks": 0, "position": sample, "nll": nll.numpy()}))
    losses = pd.concat(frames, ignore_index=True)
    table = pd.DataFrame([_streaming_row(g, cfg, sample, len(ids))
                          for _, g in losses.groupby("label", sort=False)])
    return table.astype({"window": "Int64"}), losses


def _streaming_row(losses: pd.DataFrame, cfg: Config, sample: list[int], n_tokens: int
                   ) -> dict:
    """Perplexities of one variant: all targets, targets past the window, the common sample."""
    first = losses.iloc[0]
    recompute = first.variant == "recompute"
    by_pos = losses.set_index("position").nll
    matched = by_pos.reindex(sample).to_numpy()
    low, high = bootstrap_mean_ci(matched[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
    return {
        "variant": first.variant, "label": first.label, "n_sinks": int(first.n_sinks),
        "window": None if first.variant == "dense" else cfg.window,
        "positions": "fresh window" if recompute else "absolute",
        "ppl": float("nan") if recompute else _ppl(by_pos.to_numpy()),
        "ppl_beyond_window": float("nan") if recompute
        else _ppl(by_pos[by_pos.index >= cfg.window].to_numpy()),
        "ppl_matched": _ppl(matched), "matched_low": float(np.exp(low[0])),
        "matched_high": float(np.exp(high[0])), "n_matched": len(sample),
        "n_targets": len(by_pos), "n_tokens": n_tokens,
    }
