"""What the logit-lens experiment measures: at each read position, the answer token through
the logit lens at every layer boundary, and each component's direct effect on it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import Prompt
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.scores.logit_attribution import Contrast, Lens, direct_effects, logit_lens
from workbench.scores.stats import bootstrap_mean_ci

if TYPE_CHECKING:
    from experiments.logit_lens import Config


def entries(batch: Batch, read: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rows, positions, answers)`` of a batch: the position before each prompt's last
    token (``answer``), or every position but the last (``all``), each with the next token."""
    rows, positions = [], []
    for row, length in enumerate(batch.lengths):
        first = length - 2 if read == "answer" else 0
        for pos in range(max(first, 0), length - 1):
            rows.append(row)
            positions.append(pos)
    rows_t, pos_t = torch.tensor(rows, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
    return rows_t, pos_t, batch.input_ids[rows_t, pos_t + 1]


@dataclass
class Read:
    """Every batch's entries, lens and direct effects, in prompt order."""

    prompts: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    lenses: list[Lens] = field(default_factory=list)
    parts: list[np.ndarray] = field(default_factory=list)
    totals: list[np.ndarray] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    dla_error: float = 0.0
    lens_error: float = 0.0
    ids: dict[int, list[int]] = field(default_factory=dict)


def batches_of(model: Model, prompts: Sequence[Prompt], cfg: Config) -> list[Batch]:
    """The prompts encoded into batches, before a run exists.

    Raises:
        WorkbenchError: a prompt empty or longer than the model's context, or none of two
            tokens (the last token of a prompt is the answer of the position before it).
    """
    batches = model.batches(prompts, max_tokens=cfg.max_batch_tokens)
    if not any(length >= 2 for batch in batches for length in batch.lengths):
        raise WorkbenchError("no prompt has two tokens: nothing to read (the last token of a "
                             "prompt is the answer of the position before it)")
    return batches


def read_all(model: Model, batches: Sequence[Batch], cfg: Config) -> Read:
    """Two passes per batch (the lens, the direct effects), on the attention path
    ``cfg.attention``."""
    out = Read()
    with torch.inference_mode(), hooks.patterns_fed(model, lambda block: None,
                                                    attention=cfg.attention):
        for batch in progress.track(batches, desc="logit lens"):
            rows, positions, answers = entries(batch, cfg.read)
            if not len(rows):
                continue
            lens = logit_lens(model, batch, rows, positions, answers, scale=cfg.scale)
            effects = direct_effects(model, batch, Contrast(answers), positions, rows)
            out.prompts += [batch.indices[r] for r in rows.tolist()]
            out.positions += positions.tolist()
            out.lenses.append(lens)
            out.parts.append(effects.parts)
            out.totals.append(effects.total)
            out.names, out.kinds, out.layers = effects.names, effects.kinds, effects.layers
            out.dla_error = max(out.dla_error, effects.error)
            out.lens_error = max(out.lens_error, lens.output_error)
            for r, i in enumerate(batch.indices):
                out.ids[i] = batch.input_ids[r, : batch.lengths[r]].tolist()
    if not out.lenses:
        raise WorkbenchError("no prompt has two tokens: nothing to read (the last token of a "
                             "prompt is the answer of the position before it)")
    return out


def _cat(lenses: list[Lens], name: str) -> np.ndarray:
    return np.concatenate([getattr(lens, name) for lens in lenses], axis=1)  # [boundary, n]


def lens_table(model: Model, read: Read) -> pd.DataFrame:
    answer = np.concatenate([lens.answer for lens in read.lenses])
    top = _cat(read.lenses, "top_token")
    n_boundaries, n = top.shape
    vocab = sorted(set(answer.tolist()) | set(top.ravel().tolist()))
    text = dict(zip(vocab, model.str_tokens(vocab), strict=True))
    layer = np.repeat(np.arange(n_boundaries), n)
    return pd.DataFrame({
        "prompt": np.tile(read.prompts, n_boundaries), "position": np.tile(read.positions,
                                                                           n_boundaries),
        "layer": layer, "answer_id": np.tile(answer, n_boundaries),
        "answer": [text[t] for t in np.tile(answer, n_boundaries)],
        "answer_logit": _cat(read.lenses, "answer_logit").ravel(),
        "answer_prob": _cat(read.lenses, "answer_prob").ravel(),
        "answer_rank": _cat(read.lenses, "answer_rank").ravel().astype(np.int64),
        "top_id": top.ravel().astype(np.int64), "top": [text[t] for t in top.ravel()],
        "top_prob": _cat(read.lenses, "top_prob").ravel()})


def _per_prompt(read: Read, values: np.ndarray) -> tuple[list[int], np.ndarray]:
    """``values [entry, ...]`` averaged over each prompt's entries: ``[prompt, ...]``."""
    prompts = np.array(read.prompts)
    order = sorted(set(read.prompts))
    return order, np.stack([values[prompts == p].mean(0) for p in order])


def lens_layers_table(read: Read, cfg: Config) -> pd.DataFrame:
    prob = _cat(read.lenses, "answer_prob")  # [boundary, n]
    rank = _cat(read.lenses, "answer_rank")
    order, per = _per_prompt(read, prob.T)  # [prompt, boundary]
    low, high = bootstrap_mean_ci(per, n_boot=cfg.n_boot, seed=cfg.seed)
    return pd.DataFrame({"layer": np.arange(prob.shape[0]), "answer_prob": per.mean(0),
                         "ci_low": low, "ci_high": high,
                         "answer_top": (rank == 0).mean(1), "answer_rank": np.median(rank, 1),
                         "scale": cfg.scale, "n_prompts": len(order)})


def direct_tables(read: Read, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    parts = np.concatenate(read.parts)  # [entry, component]
    totals = np.concatenate(read.totals)
    order, per = _per_prompt(read, parts)
    _, per_total = _per_prompt(read, totals[:, None])
    low, high = bootstrap_mean_ci(per, n_boot=cfg.n_boot, seed=cfg.seed)
    total = float(per_total.mean())
    rows = []
    for c, (name, kind, layer) in enumerate(zip(read.names, read.kinds, read.layers,
                                                strict=True)):
        effect = float(per[:, c].mean())
        rows.append({"component": name, "kind": kind, "layer": layer,
                     "head": int(name.split("H")[1]) if kind == "head" else -1,
                     "effect": effect, "ci_low": float(low[c]), "ci_high": float(high[c]),
                     "share": effect / total if total else float("nan"),
                     "n_prompts": len(order)})
    per_prompt = pd.DataFrame({
        "prompt": np.repeat(order, len(read.names)), "component": read.names * len(order),
        "effect": per.ravel(), "total": np.repeat(per_total[:, 0], len(read.names))})
    return pd.DataFrame(rows), per_prompt


def tokens_table(model: Model, read: Read) -> pd.DataFrame:
    rows = []
    for prompt in sorted(read.ids):
        ids = read.ids[prompt]
        rows += [{"prompt": prompt, "position": p, "token_id": int(t), "token": s}
                 for p, (t, s) in enumerate(zip(ids, model.str_tokens(ids), strict=True))]
    return pd.DataFrame(rows)


def check_table(read: Read) -> pd.DataFrame:
    return pd.DataFrame([
        {"invariant": "dla_sum", "value": read.dla_error,
         "meaning": "max over read positions of |sum of direct effects - centred answer "
                    "logit| / max |centred answer logit|"},
        {"invariant": "lens_output", "value": read.lens_error,
         "meaning": "max |logit lens at the last boundary - the model's logits| / max "
                    "|logits| over the read positions"},
    ])
