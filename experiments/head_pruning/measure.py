"""What head-pruning measures: objectives, importance at a mask, pruning orders, the tables.
Which kinds of heads survive is in :mod:`~experiments.head_pruning.survival`, the removal
speed-up in :mod:`~experiments.head_pruning.speedup`, and the reading of the curves and the
result in :mod:`~experiments.head_pruning.summary`.

Every definition is in the package docstring (:mod:`experiments.head_pruning`).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from experiments.head_pruning.tables import HEAD_SCORES, PRUNING_CURVE_BY_PROMPT
from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.inputs.batching import Batch
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, repeated_random, tokens_digest
from workbench.inputs.sentences import prefix_holding, sentence_prompts
from workbench.interventions.importance import (
    ablation_importance,
    gradient_importance,
    mask_gradients,
    normalize_by_layer,
)
from workbench.interventions.masks import HeadMask, applied
from workbench.models.base import Model
from workbench.scores.embeddings import batch_embeddings, sentence_embeddings
from workbench.scores.heads import scores_by_prompt
from workbench.scores.losses import repeat_losses, row_losses, token_losses
from workbench.scores.stats import bootstrap_mean_ci
from workbench.store.schema import with_layer_types

if TYPE_CHECKING:
    from experiments.head_pruning import Config

log = logging.getLogger(__name__)

ImportanceKind = Literal["gradient", "ablation"]
LOSS_METRICS = ("heldout_loss", "second_repeat_loss")
SIMILARITY = "cosine_similarity"


# ---- what is measured ----------------------------------------------------------------------

@dataclass
class CausalObjective:
    """Next-token loss: fit text for importance, held-out text and repeats for evaluation."""

    fit: list[Prompt]
    ablation_fit: list[Prompt]
    heldout: list[Prompt]
    repeats: list[Prompt]
    repeat_len: int
    bos: bool
    max_batch_tokens: int
    metrics: tuple[str, ...] = LOSS_METRICS

    def evaluate(self, model: Model) -> dict[str, np.ndarray]:
        """Per-prompt values of every metric under the active mask."""
        held = token_losses(model, self.heldout, max_batch_tokens=self.max_batch_tokens)
        rep = token_losses(model, self.repeats, max_batch_tokens=self.max_batch_tokens)
        second = repeat_losses(rep, self.repeat_len, 2, start=int(self.bos))[:, 1]
        return {"heldout_loss": np.array([t.mean().item() for t in held]),
                "second_repeat_loss": second}

    def evaluated(self) -> dict[str, list[Prompt]]:
        """The texts each metric of :meth:`evaluate` is measured on, in its order."""
        return {"heldout_loss": self.heldout, "second_repeat_loss": self.repeats}

    def row_degradation(self, model: Model, batch: Batch) -> Float[Tensor, " batch"]:
        """Each row's mean next-token loss."""
        return row_losses(model, batch)

    def example_loss(self, model: Model, batch: Batch) -> Float[Tensor, "batch 1"]:
        """Each row's mean next-token loss, the one output of gradient importance."""
        return row_losses(model, batch)[:, None]


@dataclass
class EncoderObjective:
    """Cosine similarity of sentence embeddings to the unpruned model's."""

    fit: list[Prompt]
    ablation_fit: list[Prompt]
    heldout: list[Prompt]
    reference_fit: Float[Tensor, "example d_model"]
    reference_heldout: Float[Tensor, "example d_model"]
    probes: Float[Tensor, "example probe d_model"]
    max_batch_tokens: int
    metrics: tuple[str, ...] = (SIMILARITY,)

    def evaluate(self, model: Model) -> dict[str, np.ndarray]:
        emb = sentence_embeddings(model, self.heldout, max_batch_tokens=self.max_batch_tokens)
        return {SIMILARITY: F.cosine_similarity(emb, self.reference_heldout, dim=-1).numpy()}

    def evaluated(self) -> dict[str, list[Prompt]]:
        """The texts each metric of :meth:`evaluate` is measured on, in its order."""
        return {SIMILARITY: self.heldout}

    def row_degradation(self, model: Model, batch: Batch) -> Float[Tensor, " batch"]:
        """One minus each row's cosine similarity to the unpruned embedding (the ablation
        sentences are the first fit sentences, so ``batch.indices`` index both)."""
        pooled = batch_embeddings(model, batch).float()
        return 1 - F.cosine_similarity(pooled, self.reference_fit[batch.indices], dim=-1)

    def example_loss(self, model: Model, batch: Batch) -> Float[Tensor, "batch probe"]:
        """``g . u`` for each random probe ``g`` of the row's unit embedding ``u``."""
        unit = F.normalize(batch_embeddings(model, batch).float(), dim=-1)  # u = e / |e|
        return torch.einsum("bd,bpd->bp", unit, self.probes[batch.indices])


Objective = CausalObjective | EncoderObjective


def make_objective(model: Model, cfg: Config) -> Objective:
    """The texts and metrics for ``model``: next-token loss if it has a trained LM head,
    sentence-embedding similarity if it is an encoder.

    Raises:
        ModelCapabilityError: a causal model without a trained LM head.
    """
    if model.info.causal:
        model.require(lm_head=True, what="head pruning by next-token loss")
        fit = token_chunks(model, python_docs("fit"), n_chunks=cfg.fit_tokens // cfg.chunk_tokens,
                           n_tokens=cfg.chunk_tokens, label="python-docs-fit")
        heldout = token_chunks(model, python_docs("heldout"),
                               n_chunks=cfg.eval_tokens // cfg.chunk_tokens,
                               n_tokens=cfg.chunk_tokens, label="python-docs-heldout")
        repeats = list(repeated_random(model, n_prompts=cfg.repeat_prompts,
                                       seq_len=cfg.repeat_len, seed=cfg.seed))
        return CausalObjective(fit, prefix_holding(fit, model, cfg.ablation_tokens), heldout,
                               repeats, cfg.repeat_len, model.info.bos_token_id is not None,
                               cfg.max_batch_tokens)
    fit = sentence_prompts(model, "fit", cfg.fit_tokens, cfg.seed)
    heldout = sentence_prompts(model, "heldout", cfg.eval_tokens, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    probes = torch.randn(len(fit), cfg.probes, model.info.d_model, generator=gen)
    return EncoderObjective(
        fit, prefix_holding(fit, model, cfg.ablation_tokens), heldout,
        sentence_embeddings(model, fit, max_batch_tokens=cfg.max_batch_tokens),
        sentence_embeddings(model, heldout, max_batch_tokens=cfg.max_batch_tokens),
        probes, cfg.max_batch_tokens)


# ---- pruning orders -----------------------------------------------------------------------

Head = tuple[int, int]
Chooser = Callable[[Float[Tensor, "layer head_index"], int], list[Head]]


def schedule(n_heads: int, step_fraction: float, max_fraction: float) -> list[int]:
    """Numbers of heads removed after each step: 0, then ``step_fraction`` of all heads per
    step (rounded on the running total, so rounding never drifts) up to ``max_fraction``."""
    cap = math.floor(max_fraction * n_heads + 1e-9)
    counts = [0]
    step = 1
    while counts[-1] < cap:
        nxt = min(math.floor(step * step_fraction * n_heads + 0.5), cap)
        if nxt > counts[-1]:
            counts.append(nxt)
        step += 1
    return counts


def pruning_path(values: Float[Tensor, "layer head_index"], counts: Sequence[int],
                 choose: Chooser) -> tuple[list[Tensor], list[Head]]:
    """Masks after each step of ``counts``, and the heads in the order they were removed.

    Args:
        values: the starting mask (all ones for the full model).
        counts: cumulative numbers of removed heads, from :func:`schedule`.
        choose: ``choose(mask, k)`` returns ``k`` distinct heads still in ``mask``.

    Returns:
        The masks (the first is ``values``) and the removed heads, first removed first.

    Raises:
        WorkbenchError: ``choose`` returned a removed head, or not ``k`` distinct heads.
    """
    masks, removed = [values.clone()], []
    for before, after in itertools.pairwise(counts):
        mask = masks[-1].clone()
        heads = choose(mask, after - before)
        if len(set(heads)) != after - before or any(mask[h] == 0 for h in heads):
            raise WorkbenchError(f"a pruning step must remove {after - before} distinct heads "
                                 f"still in the model; got {heads}")
        for head in heads:
            mask[head] = 0.0
        masks.append(mask)
        removed.extend(heads)
    return masks, removed


def by_importance(importance: Callable[[Tensor], Tensor], *, reverse: bool = False) -> Chooser:
    """Remove the ``k`` least (``reverse``: most) important remaining heads, re-estimating
    importance on the current mask at every step; ties go to the lower (layer, head)."""
    def choose(mask: Tensor, k: int) -> list[Head]:
        scores = importance(mask)
        kept = [(float(scores[layer, head]), layer, head)
                for layer, head in (mask != 0).nonzero().tolist()]
        kept.sort(key=lambda c: ((-c[0] if reverse else c[0]), c[1], c[2]))
        return [(layer, head) for _, layer, head in kept[:k]]

    return choose


def in_order(order: Sequence[Head]) -> Chooser:
    """Remove heads in a fixed order (e.g. a random permutation)."""
    def choose(mask: Tensor, k: int) -> list[Head]:
        return [h for h in order if mask[h] != 0][:k]

    return choose


def random_order(n_layers: int, n_heads: int, seed: int) -> list[Head]:
    """A uniformly random order of all heads, reproducible from ``seed``."""
    perm = np.random.default_rng(seed).permutation(n_layers * n_heads)
    return [(int(i) // n_heads, int(i) % n_heads) for i in perm]


# ---- importance and evaluation at a mask ---------------------------------------------------

@dataclass
class Pruner:
    """Importance and evaluation of one model at any mask, each computed once per mask."""

    model: Model
    objective: Objective
    cfg: Config
    means: Float[Tensor, "layer head_index d_head"] | None = None
    _evals: dict[bytes, dict[str, np.ndarray]] = field(default_factory=dict)
    _scores: dict[tuple[str, bytes], Tensor] = field(default_factory=dict)

    def head_mask(self, values: Float[Tensor, "layer head_index"]) -> HeadMask:
        return HeadMask(values, ablation=self.cfg.ablation, model=self.model.info.name)

    def evaluate(self, values: Float[Tensor, "layer head_index"]) -> dict[str, np.ndarray]:
        """Per-prompt evaluation metrics of the model pruned to ``values``."""
        key = values.numpy().tobytes()
        if key not in self._evals:
            with applied(self.model, self.head_mask(values), means=self.means):
                self._evals[key] = self.objective.evaluate(self.model)
        return self._evals[key]

    def gradients(self, values: Float[Tensor, "layer head_index"]
                  ) -> Float[Tensor, "example output layer head_index"]:
        return mask_gradients(self.model, self.objective.fit, self.objective.example_loss,
                              values, means=self.means, max_batch_tokens=self.cfg.max_batch_tokens)

    def ablations(self, values: Float[Tensor, "layer head_index"]
                  ) -> Float[Tensor, "example layer head_index"]:
        return ablation_importance(self.model, self.objective.ablation_fit,
                                   self.objective.row_degradation, self.head_mask(values),
                                   means=self.means, max_batch_tokens=self.cfg.max_batch_tokens)

    def raw_gradient(self, grads: Tensor) -> Float[Tensor, "layer head_index"]:
        """Michel et al.'s ``E|dL/dxi|`` (``accumulate=batch``: per batch of
        ``max_batch_tokens // chunk_tokens`` consecutive examples)."""
        batch = max(1, self.cfg.max_batch_tokens // self.cfg.chunk_tokens)
        return gradient_importance(grads, accumulate=self.cfg.accumulate, batch_size=batch)

    def gradient_score(self, grads: Tensor, values: Tensor) -> Tensor:
        """The raw gradient importance, normalised per layer over the kept heads unless
        ``normalize`` is off (removed heads are NaN either way)."""
        raw = self.raw_gradient(grads)
        if self.cfg.normalize:
            return normalize_by_layer(raw, keep=values != 0)
        return torch.where(values != 0, raw, torch.full_like(raw, float("nan")))

    def score(self, kind: ImportanceKind, values: Float[Tensor, "layer head_index"]
              ) -> Float[Tensor, "layer head_index"]:
        """The importance that ranks heads for pruning (higher = more important)."""
        key = (kind, values.numpy().tobytes())
        if key not in self._scores:
            if kind == "gradient":
                self._scores[key] = self.gradient_score(self.gradients(values), values)
            else:
                self._scores[key] = self.ablations(values).nanmean(0)
        return self._scores[key]

    def head_scores(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """Both importances of every head of the unpruned model, with 95% intervals, and
        each fit text's (the ``head_scores_by_prompt`` rows; ``None`` with
        ``accumulate=batch`` and no ablation importance).

        ``importance_gradient`` is always normalised per layer (Michel et al.'s score);
        ``normalize`` only decides which of the two ranks heads for pruning.
        """
        full = torch.ones(self.model.info.n_layers, self.model.info.n_heads)
        key = full.numpy().tobytes()
        grads = self.gradients(full)
        self._scores[("gradient", key)] = self.gradient_score(grads, full)
        raw = self.raw_gradient(grads)
        per_example = grads.abs().mean(1).numpy()  # [example, layer, head]
        boot = {"n_boot": self.cfg.n_boot, "seed": self.cfg.seed}
        frames = [
            _score_frame("importance_gradient", normalize_by_layer(raw).numpy(),
                         *_normalized_ci(per_example, **boot), len(per_example)),
            _score_frame("importance_gradient_raw", raw.numpy(),
                         *bootstrap_mean_ci(per_example, **boot), len(per_example)),
        ]
        by_prompt = []
        if self.cfg.accumulate == "batch":  # the per-example intervals do not apply
            for frame in frames:
                frame[["ci_low", "ci_high"]] = np.nan
        else:  # importance_gradient_raw is the mean of each example's |dL/dxi|
            by_prompt.append(scores_by_prompt(
                _prompt_frame("importance_gradient_raw", per_example),
                self.objective.fit, "fit text"))
        if self.cfg.ablation_tokens:
            diffs = self.ablations(full)
            self._scores[("ablation", key)] = diffs.mean(0)
            frames.append(_score_frame("importance_ablation", diffs.mean(0).numpy(),
                                       *bootstrap_mean_ci(diffs.numpy(), **boot), len(diffs)))
            by_prompt.append(scores_by_prompt(
                _prompt_frame("importance_ablation", diffs.numpy()),
                self.objective.ablation_fit, "ablation text"))
        scores = with_layer_types(pd.concat(frames, ignore_index=True),
                                  self.model.info.layer_types)
        return scores, pd.concat(by_prompt, ignore_index=True) if by_prompt else None


def _normalized_ci(per_example: np.ndarray, *, n_boot: int, seed: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap interval of the per-layer-normalised mean over examples."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_example), size=(n_boot, len(per_example)))
    means = per_example[idx].mean(1)  # [boot, layer, head]
    norms = np.linalg.norm(means, axis=2, keepdims=True)
    normed = means / np.where(norms > 0, norms, 1.0)
    low, high = np.percentile(normed, [2.5, 97.5], axis=0)
    return low, high


def _prompt_frame(metric: str, per_example: np.ndarray) -> pd.DataFrame:
    """``prompt, layer, head, metric, score`` rows of ``[example, layer, head]`` values."""
    prompts, layers, heads = np.indices(per_example.shape)
    return pd.DataFrame({"prompt": prompts.ravel(), "layer": layers.ravel(),
                         "head": heads.ravel(), "metric": metric,
                         "score": per_example.ravel().astype(np.float64)})


def _score_frame(metric: str, score: np.ndarray, low: np.ndarray, high: np.ndarray,
                 n: int) -> pd.DataFrame:
    layers, heads = np.indices(score.shape)
    return pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "metric": metric,
                         "score": score.ravel(), "ci_low": low.ravel(),
                         "ci_high": high.ravel(), "n_prompts": n}, columns=HEAD_SCORES.names)


# ---- orders and their tables ----------------------------------------------------------------

@dataclass
class PrunedOrder:
    """One way of pruning: the masks after each step and the order heads were removed in."""

    order: str
    importance: str
    seed: int | None
    masks: list[Tensor]
    removed: list[Head]


def prune_all(pruner: Pruner, counts: list[int]) -> list[PrunedOrder]:
    """Every order of the config: importance kinds, most-important-first, random seeds."""
    cfg, info = pruner.cfg, pruner.model.info
    full = torch.ones(info.n_layers, info.n_heads)
    orders = []
    plans: list[tuple[str, str, int | None, Chooser]] = [
        (kind, kind, None, by_importance(lambda m, k=kind: pruner.score(k, m)))
        for kind in cfg.importance]
    if cfg.reverse:
        kind = cfg.importance[0]
        plans.append((f"reverse-{kind}", kind, None,
                      by_importance(lambda m: pruner.score(kind, m), reverse=True)))
    for i in range(cfg.n_random):
        seed = cfg.seed + 1 + i
        plans.append(("random", "", seed, in_order(random_order(info.n_layers, info.n_heads,
                                                                seed))))
    for name, kind, seed, choose in progress.track(plans, desc="pruning orders"):
        log.info("pruning order %s%s", name, f" (seed {seed})" if seed is not None else "")
        masks, removed = pruning_path(full, counts, choose)
        orders.append(PrunedOrder(name, kind, seed, masks, removed))
    return orders


def curve_table(pruner: Pruner, orders: Sequence[PrunedOrder], counts: Sequence[int]
                ) -> pd.DataFrame:
    """The evaluation metrics after every step of every order, with bootstrap intervals."""
    n_total = pruner.model.info.n_layers * pruner.model.info.n_heads
    rows = []
    for po in orders:
        for step, values in enumerate(progress.track(po.masks, desc=f"evaluate {po.order}")):
            for metric, per_prompt in pruner.evaluate(values).items():
                low, high = bootstrap_mean_ci(per_prompt, n_boot=pruner.cfg.n_boot,
                                              seed=pruner.cfg.seed)
                rows.append({"order": po.order, "importance": po.importance, "seed": po.seed,
                             "step": step, "n_pruned": counts[step],
                             "fraction_pruned": counts[step] / n_total, "metric": metric,
                             "value": float(per_prompt.mean()), "ci_low": float(low),
                             "ci_high": float(high), "n_prompts": len(per_prompt)})
    df = pd.DataFrame(rows)
    df["seed"] = df["seed"].astype("Int64")
    return df


def curve_by_prompt(pruner: Pruner, orders: Sequence[PrunedOrder], counts: Sequence[int]
                    ) -> pd.DataFrame:
    """Each evaluation text's metrics after every step of every order: the values
    :func:`curve_table` averages (read from the same evaluations, not run again)."""
    digests = {metric: [tokens_digest(p) for p in prompts]
               for metric, prompts in pruner.objective.evaluated().items()}
    frames = []
    for po in orders:
        for step, values in enumerate(po.masks):
            for metric, per_prompt in pruner.evaluate(values).items():
                frames.append(pd.DataFrame({
                    "prompt": np.arange(len(per_prompt)), "tokens": digests[metric],
                    "order": po.order, "importance": po.importance, "seed": po.seed,
                    "step": step, "metric": metric, "n_pruned": counts[step],
                    "value": per_prompt.astype(np.float64)}))
    df = pd.concat(frames, ignore_index=True)
    df["seed"] = df["seed"].astype("Int64")
    return df[PRUNING_CURVE_BY_PROMPT.names]


def order_table(orders: Sequence[PrunedOrder], counts: Sequence[int], n_layers: int,
                n_heads: int) -> pd.DataFrame:
    """When each head was removed in each order.

    ``position`` counts removals (0 = first), ``step`` is the pruning step that removed it
    and ``fraction_pruned`` the fraction of heads removed after that step (both missing
    for heads never removed). ``survival`` is the position as a percentile in [0, 1]
    (1 = removed last); heads never removed share the mean of the remaining positions.
    """
    n_total = n_layers * n_heads
    rows = []
    for po in orders:
        n_removed = len(po.removed)
        rank = {head: i for i, head in enumerate(po.removed)}
        for layer in range(n_layers):
            for head in range(n_heads):
                pos = rank.get((layer, head))
                step = next(s for s in range(1, len(counts)) if pos < counts[s]) \
                    if pos is not None else None
                mean_rank = pos if pos is not None else (n_removed + n_total - 1) / 2
                rows.append({"order": po.order, "importance": po.importance, "seed": po.seed,
                             "layer": layer, "head": head, "position": pos, "step": step,
                             "fraction_pruned": counts[step] / n_total if step else None,
                             "survival": (mean_rank + 0.5) / n_total})
    df = pd.DataFrame(rows)
    for col in ("seed", "position", "step"):
        df[col] = df[col].astype("Int64")
    df["fraction_pruned"] = df["fraction_pruned"].astype(float)
    return df


def budget_masks(po: PrunedOrder, counts: Sequence[int], budgets: Sequence[float],
                 n_total: int) -> dict[float, Tensor]:
    """The mask of ``po`` at each budget: after the step whose fraction pruned is nearest
    the budget (the smaller on a tie)."""
    out = {}
    for budget in budgets:
        step = min(range(len(counts)), key=lambda s: (abs(counts[s] - budget * n_total), s))
        out[budget] = po.masks[step]
    return out


def mask_table(po: PrunedOrder, masks: dict[float, Tensor]) -> pd.DataFrame:
    """The masks of :func:`budget_masks` in long format, one row per head and budget."""
    frames = []
    for budget, values in masks.items():
        layers, heads = np.indices(values.shape)
        frames.append(pd.DataFrame({
            "order": po.order, "budget": budget,
            "fraction_pruned": float((values == 0).float().mean()),
            "layer": layers.ravel(), "head": heads.ravel(),
            "keep": values.numpy().ravel().astype(int)}))
    return pd.concat(frames, ignore_index=True)


def save_masks(pruner: Pruner, po: PrunedOrder, masks: dict[float, Tensor],
               folder: Path) -> list[Path]:
    """Write each budget's mask as a ``--heads-mask`` file ``<order>-<budget>.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for budget, values in masks.items():
        mask = pruner.head_mask(values)
        mask.note = (f"head-pruning: {po.order} order, {int((values == 0).sum())} heads "
                     f"removed (budget {budget:.2f})")
        if mask.ablation == "mean":
            mask.note += "; mean-ablated with means over the fit text of the run"
        written.append(mask.save(folder / f"{po.order}-{budget:.2f}.json"))
    return written
