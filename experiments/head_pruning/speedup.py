"""The removal speed-up of head-pruning: the model with heads removed from its weights
(:mod:`workbench.models.surgery`) timed against the full model, and its output against
masking (definitions in the package docstring)."""

from __future__ import annotations

import copy
import math
import os
import time
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from experiments.head_pruning.tables import SPEEDUP
from workbench.core import progress
from workbench.inputs.batching import Batch
from workbench.interventions.masks import applied
from workbench.models.adapters import adapter_of
from workbench.models.surgery import hf_forward, plain_copy, remove_heads
from workbench.scores.embeddings import batch_embeddings, mean_pool
from workbench.store import provenance
from workbench.store.records import busy_load

if TYPE_CHECKING:
    from experiments.head_pruning.measure import Pruner


def _forward(hf_model: torch.nn.Module, batch: Batch, causal: bool) -> Tensor:
    """Logits (causal LM) or mean-pooled final hidden states (encoder)."""
    out = hf_forward(hf_model, batch, causal=causal)
    return out if causal else mean_pool(out, batch.attention_mask)


def _seconds(hf_model: torch.nn.Module, batch: Batch, causal: bool) -> float:
    start = time.perf_counter()
    _forward(hf_model, batch, causal)
    return time.perf_counter() - start


def speedup_table(pruner: Pruner, masks: dict[float, Tensor], repeats: int) -> pd.DataFrame:
    """Wall-clock time of one held-out batch through the model with heads removed from its
    weights, against the full model: ``repeats`` interleaved pairs (full, then removed, back
    to back), summarised by their median and range, with the machine's load before and
    after them; and the largest difference between the removed model's output and the
    masked one's."""
    model = pruner.model
    if repeats < 1 or not masks or pruner.cfg.ablation != "zero":
        return SPEEDUP.empty()
    batch = model.batches(pruner.objective.heldout, max_tokens=pruner.cfg.max_batch_tokens)[0]
    skipped = adapter_of(model).removal_reason(model.bridge.original_model.config)
    if skipped:  # masks still work through hooks: only this step is left out, with why
        return pd.DataFrame([{"budget": budget, "n_removed": int((values == 0).sum()),
                              **dict.fromkeys(SPEEDUP.names[2:-2], math.nan),
                              "repeats": 0, "busy": None,
                              "batch_tokens": int(batch.attention_mask.sum()),
                              "skipped": skipped}
                             for budget, values in masks.items()], columns=SPEEDUP.names)
    plain = plain_copy(model)
    rows = []
    with torch.inference_mode():
        _seconds(plain, batch, model.info.causal)  # warm up
        for budget, values in progress.track(list(masks.items()), desc="removal speed-up"):
            before = provenance.load_average()
            timed = _time_removed(pruner, plain, batch, values, repeats)
            after = provenance.load_average()
            rows.append({"budget": budget, "n_removed": int((values == 0).sum()), **timed,
                         "load_before": before[0] if before else math.nan,
                         "load_after": after[0] if after else math.nan,
                         "busy": busy_load([before, after], os.cpu_count())})
    return pd.DataFrame(rows, columns=SPEEDUP.names)


def spread(values: list[float], name: str) -> dict[str, float]:
    """The median of ``values`` as ``name``, their least and greatest as ``name_low`` and
    ``name_high``."""
    return {name: float(np.median(values)), f"{name}_low": float(min(values)),
            f"{name}_high": float(max(values))}


def _time_removed(pruner: Pruner, plain: torch.nn.Module, batch: Batch,
                  values: Tensor, repeats: int) -> dict[str, float | int]:
    """Parameters, the median and range of the times and of their ratios, and the largest
    output difference from masking, for the heads of ``values`` removed from a copy of
    ``plain``."""
    model, causal = pruner.model, pruner.model.info.causal
    removed = remove_heads(copy.deepcopy(plain), values)
    _seconds(removed, batch, causal)  # warm up
    full_s, removed_s = [], []
    for _ in range(repeats):  # interleaved, so that a slow moment hits both alike
        full_s.append(_seconds(plain, batch, causal))
        removed_s.append(_seconds(removed, batch, causal))
    with applied(model, pruner.head_mask(values)):
        masked = (model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
                  if causal else batch_embeddings(model, batch))
    ratios = [f / r for f, r in zip(full_s, removed_s, strict=True)]
    return {"params_full": sum(p.numel() for p in plain.parameters()),
            "params_removed": sum(p.numel() for p in removed.parameters()),
            **spread(full_s, "seconds_full"), **spread(removed_s, "seconds_removed"),
            **spread(ratios, "speedup"), "repeats": repeats,
            "max_abs_diff": _max_abs_diff(masked, _forward(removed, batch, causal),
                                          batch.attention_mask if causal else None),
            "batch_tokens": int(batch.attention_mask.sum()), "skipped": ""}


def _max_abs_diff(a: Tensor, b: Tensor, mask: Tensor | None) -> float:
    """Largest ``|a - b|`` over the rows (and, with ``mask``, the real positions), one row
    at a time: a causal model's outputs are whole logits (1 GiB for a batch on gemma3), so
    no temporary of their size is made."""
    keeps = mask.bool() if mask is not None else [slice(None)] * len(a)
    rows = [(a[row, keep].float() - b[row, keep].float()).abs().max()  # NaN propagates
            for row, keep in enumerate(keeps)]
    return float(torch.stack(rows).max())
