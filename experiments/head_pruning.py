"""Head pruning: how many attention heads can a trained model lose, and which ones survive?

Reproduces the pruning experiments of Michel, Levy & Neubig 2019 ("Are Sixteen Heads Really
Better than One?", NeurIPS; section 4, figure 3) on the workbench's models, with the
published context of Voita et al. 2019 ("Analyzing Multi-Head Self-Attention: Specialized
Heads Do the Heavy Lifting, the Rest Can Be Pruned", ACL; section 6). Michel et al. prune
20% of the heads of a WMT transformer and 40% of BERT's heads (on MNLI) with no noticeable
impact; Voita et al. prune 38 of 48 encoder heads for a loss of 0.15 BLEU (with gates
trained jointly with the model, so not directly comparable with pruning without retraining,
as done here).

Definitions (``workbench.interventions.importance`` implements the estimators):

- **Head mask** ``xi[layer, head]`` multiplies each query head's output before the output
  projection (Michel et al., eq. 1; :mod:`workbench.interventions`). ``ablation=zero``
  removes a head; ``ablation=mean`` replaces its output by its mean on the fit text.
- **Texts.** Importance is estimated on the ``fit`` part of the Python documentation prose
  and evaluated on the ``heldout`` part (:func:`workbench.inputs.corpus.python_docs`), so that no
  evaluation text is ever used to choose heads. Causal models read ``chunk_tokens``-token
  windows (:func:`workbench.inputs.corpus.token_chunks`); encoders read sentences of 6 to 40 words
  from the same splits, drawn in a seeded order until the token budget is used.
- **Evaluation metric**, causal LM: ``heldout_loss``, the mean next-token cross-entropy
  (nats) on ``eval_tokens`` held-out tokens, and ``second_repeat_loss``, the mean loss on
  the second half of ``repeat_prompts`` sequences of ``repeat_len`` random tokens repeated
  twice (:func:`workbench.inputs.prompts.repeated_random`), leaving out the first token of the
  repeat, which cannot be copied. It is low only while induction works (Olsson et al. 2022,
  "In-context Learning and Induction Heads"). Encoder: ``cosine_similarity``, the mean over
  held-out sentences of ``cos(e_pruned(x), e_full(x))``, with the sentence embedding ``e``
  the mean over real tokens of the final residual stream (mean pooling, as in
  sentence-transformers). Every value has a 95% bootstrap interval over texts.
- **Degradation** ``D``, what importance is about: the next-token loss (causal LM) or
  ``1 - cos(e_pruned, e_full)`` (encoder) on the fit text.
- **Ablation importance** of head ``h`` at mask ``xi``: ``D(xi without h) - D(xi)`` on the
  first ``ablation_tokens`` of the fit text, one forward pass per remaining head
  (``ablation_tokens=0`` skips it unless it orders pruning).
- **Gradient importance** (Michel et al., eq. 2): ``I_h = E_x |dL(x)/dxi_h|``, the absolute
  value taken per example (``accumulate=example``; ``batch`` takes it per batch as in the
  authors' code, which lets opposite-signed examples cancel), normalised per layer by the
  L2 norm over the remaining heads before heads are ranked globally (``normalize=false``
  ranks by the raw value; ``importance_gradient_raw`` in the tables). For a causal LM,
  ``L(x)`` is the example's mean next-token loss. For the encoder, ``D = 1 - cos`` has a
  zero gradient at the unpruned mask (it is at its minimum there), so Michel's ``|dD/dxi|``
  is uninformative; and a masked-LM loss does not exist (the head is random). We use
  ``L(x) = g . u(x)``, a random Gaussian probe ``g ~ N(0, I)`` (``probes`` per sentence) of
  the unit-normalised embedding ``u = e / |e|``. Then ``E_g |dL/dxi_h| = sqrt(2/pi) |du/dxi_h|``,
  and since ``1 - cos = |u(xi) - u(1)|^2 / 2``, whose gradient vanishes at ``xi = 1``,
  removing head ``h`` changes the metric by ``|du/dxi_h|^2 / 2`` to second order: the
  ranking is the exact second-order (Gauss-Newton) Taylor estimate of the metric drop.
- **Iterative pruning** (Michel et al., section 4.2): from the full model, remove the
  ``step_fraction`` least important of all heads, re-estimate importance on the pruned
  model, and repeat up to ``max_fraction``; evaluate after every step. Orders: each kind
  in ``importance`` (least important first), ``reverse-<kind>`` (most important first,
  also re-estimated), and ``n_random`` uniformly random orders (seeds ``seed+1...``).
- **Prunable fraction** of an order: the largest fraction pruned before the metric first
  degrades by more than ``tolerance``: a relative increase ``(L - L_0) / L_0`` of a loss,
  or a drop ``1 - cos`` of the similarity.
- **Survival**: a head's position in an order (0 = removed first) as a percentile. When
  complete runs of ``previous-token-heads``, ``induction-heads`` or ``attention-sinks`` on
  the same model weights exist in the run store, the top ``top_k`` heads of each of their
  metrics are joined with the first importance order: are induction heads pruned late,
  sink heads early? (Spearman correlation of score and survival percentile.)

Tables: ``head_scores`` (``importance_gradient``, normalised per layer;
``importance_gradient_raw``; ``importance_ablation``; each at the unpruned model with a 95%
bootstrap interval over fit texts), ``pruning_curve`` (order, importance, seed, step,
n_pruned, fraction_pruned, metric, value, ci_low, ci_high), ``pruning_order`` (when each
head was removed in each order), ``masks`` (the first importance order's masks at
``budgets``, also written to ``masks/<order>-<budget>.json`` in the run folder for
``--heads-mask``), ``survival`` (the join above), ``speedup`` (encoders: wall-clock time of
the model with heads removed from its weights against masked).

Example:
    workbench run head-pruning --model minilm --set max_fraction=0.8
    workbench run head-overview --model minilm --heads-mask data/runs/<run>/masks/gradient-0.30.json
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.harness.claims import Measurement, claim_check
from workbench.harness.experiment import Context, experiment
from workbench.inputs.batching import Batch, make_batches
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, repeated_random
from workbench.interventions.importance import (
    Accumulation,
    ablation_importance,
    gradient_importance,
    mask_gradients,
    normalize_by_layer,
)
from workbench.interventions.masks import Ablation, HeadMask, applied, head_means
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.scores.losses import repeat_losses, token_losses
from workbench.scores.stats import bootstrap_mean_ci
from workbench.store.runs import Run, RunStore

log = logging.getLogger(__name__)

ImportanceKind = Literal["gradient", "ablation"]
KINDS: tuple[ImportanceKind, ...] = ("gradient", "ablation")
KIND_EXPERIMENTS = ("previous-token-heads", "induction-heads", "attention-sinks")
LOSS_METRICS = ("heldout_loss", "second_repeat_loss")
SIMILARITY = "cosine_similarity"
DEMO = {"chunk_tokens": 64, "fit_tokens": 512, "ablation_tokens": 64, "eval_tokens": 512,
        "repeat_prompts": 4, "repeat_len": 24, "importance": ("gradient",),
        "max_fraction": 0.3, "probes": 4, "budgets": (0.1, 0.3), "speed_repeats": 1,
        "n_boot": 200}


@dataclass(frozen=True)
class Config:
    fit_tokens: int = field(default=2048, metadata={
        "help": "tokens of fit text for gradient importance (never used for evaluation)"})
    ablation_tokens: int = field(default=512, metadata={
        "help": "tokens of the fit text for ablation importance (a forward pass per head; "
                "0 skips it)"})
    eval_tokens: int = field(default=4096, metadata={
        "help": "tokens of held-out text for the evaluation metric"})
    chunk_tokens: int = field(default=128, metadata={
        "help": "tokens per natural-text window (causal models)"})
    repeat_prompts: int = field(default=8, metadata={
        "help": "repeated-random prompts for the second-repeat loss (causal models)"})
    repeat_len: int = field(default=32, metadata={
        "help": "random tokens per repeat in those prompts"})
    importance: tuple[ImportanceKind, ...] = field(default=("gradient", "ablation"), metadata={
        "help": "importance kinds that order iterative pruning (each is one order)"})
    reverse: bool = field(default=True, metadata={
        "help": "also prune most-important-first, by the first importance kind"})
    n_random: int = field(default=3, metadata={"help": "random pruning orders (seeds)"})
    step_fraction: float = field(default=0.1, metadata={
        "help": "fraction of all heads removed per pruning step"})
    max_fraction: float = field(default=1.0, metadata={
        "help": "stop once this fraction of all heads is removed"})
    ablation: Ablation = field(default="zero", metadata={
        "help": "what a removed head becomes: zero, or its mean output on the fit text"})
    normalize: bool = field(default=True, metadata={
        "help": "rank by gradient importance normalised per layer (Michel et al.) or raw"})
    accumulate: Accumulation = field(default="example", metadata={
        "help": "gradient importance: |dL/dxi| per example (Michel's definition) or per batch"})
    probes: int = field(default=8, metadata={
        "help": "random probes of the embedding per sentence (encoder gradient importance)"})
    budgets: tuple[float, ...] = field(default=(0.1, 0.2, 0.3, 0.5), metadata={
        "help": "pruned fractions whose masks are saved (first importance order)"})
    tolerance: float = field(default=0.05, metadata={
        "help": "degradation allowed for the prunable fraction (relative loss increase, "
                "or 1 - cosine similarity)"})
    top_k: int = field(default=10, metadata={
        "help": "heads per metric of other experiments joined with the survival order"})
    speed_repeats: int = field(default=3, metadata={
        "help": "timed runs of the models with heads removed from the weights (0: skip)"})
    batch_tokens: int = field(default=1024, metadata={"help": "tokens per forward batch"})
    n_boot: int = field(default=1000, metadata={"help": "bootstrap resamples for intervals"})
    seed: int = field(default=0, metadata={
        "help": "seed of text selection, random orders, probes and bootstrap"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "importance", tuple(self.importance))
        object.__setattr__(self, "budgets", tuple(float(b) for b in self.budgets))
        positive = ("fit_tokens", "eval_tokens", "chunk_tokens", "repeat_prompts",
                    "repeat_len", "probes", "batch_tokens", "n_boot", "top_k")
        if any(getattr(self, name) < 1 for name in positive):
            raise ValueError(f"{', '.join(positive)} must be positive")
        if min(self.fit_tokens, self.ablation_tokens or self.chunk_tokens,
               self.eval_tokens) < self.chunk_tokens:
            raise ValueError("fit_tokens, ablation_tokens (unless 0) and eval_tokens must "
                             "each be at least chunk_tokens")
        if "ablation" in self.importance and self.ablation_tokens == 0:
            raise ValueError("ablation importance orders pruning, so ablation_tokens > 0")
        if self.ablation_tokens > self.fit_tokens:
            raise ValueError("ablation_tokens is a part of the fit text: at most fit_tokens")
        if not self.importance or len(set(self.importance)) != len(self.importance) or any(
                k not in KINDS for k in self.importance):
            raise ValueError(f"importance: distinct kinds among {', '.join(KINDS)}, "
                             f"got {self.importance}")
        if not 0 < self.step_fraction <= 1 or not 0 < self.max_fraction <= 1:
            raise ValueError("step_fraction and max_fraction must be in (0, 1]")
        if any(not 0 < b <= 1 for b in self.budgets):
            raise ValueError("budgets must be fractions in (0, 1]")
        if self.n_random < 0 or self.speed_repeats < 0 or not 0 < self.tolerance < 1:
            raise ValueError("n_random and speed_repeats must be >= 0, tolerance in (0, 1)")
        if self.ablation not in ("zero", "mean") or self.accumulate not in ("example", "batch"):
            raise ValueError("ablation must be zero or mean; accumulate example or batch")


# ---- texts --------------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def corpus_sentences(split: Literal["fit", "heldout"]) -> list[str]:
    """Sentences of 6 to 40 words from the Python documentation prose of one split."""
    return [s for doc in python_docs(split) for paragraph in doc.split("\n\n")
            for s in _SENTENCE_END.split(paragraph) if 6 <= len(s.split()) <= 40]


def sentence_prompts(model: Model, split: Literal["fit", "heldout"], n_tokens: int,
                     seed: int) -> list[Prompt]:
    """Sentences in a seeded order until they hold ``n_tokens`` tokens (with specials).

    Raises:
        WorkbenchError: the split has fewer tokens than asked for.
    """
    sentences = corpus_sentences(split)
    order = np.random.default_rng(seed).permutation(len(sentences))
    prompts, total = [], 0
    for i in order:
        prompt = Prompt(text=sentences[i], label=f"python-docs-{split}[{i}]")
        prompts.append(prompt)
        total += len(model.encode(prompt)[0])
        if total >= n_tokens:
            return prompts
    raise WorkbenchError(f"the {split} sentences hold {total} tokens, fewer than {n_tokens}")


def _prefix(prompts: Sequence[Prompt], model: Model, n_tokens: int) -> list[Prompt]:
    """The first prompts that together hold at least ``n_tokens`` tokens."""
    total = 0
    for i, prompt in enumerate(prompts):
        total += len(model.encode(prompt)[0])
        if total >= n_tokens:
            return list(prompts[: i + 1])
    return list(prompts)


# ---- what is measured ----------------------------------------------------------------------

def sentence_embeddings(model: Model, prompts: Sequence[Prompt], *,
                        max_batch_tokens: int = 1024) -> Float[Tensor, "prompt d_model"]:
    """Mean over real tokens of the final residual stream (sentence-transformers pooling).

    Any head mask active on the bridge applies.
    """
    encoded = [model.encode(p) for p in prompts]
    out = torch.zeros(len(prompts), model.info.d_model)
    pad = model.tokenizer.pad_token_id or 0
    with torch.inference_mode():
        for batch in make_batches(encoded, pad_id=pad, max_tokens=max_batch_tokens):
            out[batch.indices] = _pooled(model, batch).float()
    return out


def _pooled(model: Model, batch: Batch) -> Float[Tensor, "batch d_model"]:
    """Mean-pooled final residual stream of a batch (differentiable when grad is on)."""
    name = hooks.resid(model.info.n_layers, model.info.n_layers)
    seen: dict[str, Tensor] = {}

    def keep(resid: Tensor, hook: Any) -> None:
        seen["resid"] = resid

    hooks.run_hooked(model.bridge, batch, [(name, keep)], stop_after=name)
    mask = batch.attention_mask[:, :, None].to(seen["resid"].dtype)  # [B, T, 1]
    return (seen["resid"] * mask).sum(1) / mask.sum(1)


@dataclass
class CausalObjective:
    """Next-token loss: fit text for importance, held-out text and repeats for evaluation."""

    fit: list[Prompt]
    ablation_fit: list[Prompt]
    heldout: list[Prompt]
    repeats: list[Prompt]
    repeat_len: int
    bos: bool
    batch_tokens: int
    metrics: tuple[str, ...] = LOSS_METRICS

    def evaluate(self, model: Model) -> dict[str, np.ndarray]:
        """Per-prompt values of every metric under the active mask."""
        held = token_losses(model, self.heldout, max_batch_tokens=self.batch_tokens)
        rep = token_losses(model, self.repeats, max_batch_tokens=self.batch_tokens)
        second = repeat_losses(rep, self.repeat_len, 2, start=int(self.bos))[:, 1]
        return {"heldout_loss": np.array([t.mean().item() for t in held]),
                "second_repeat_loss": second}

    def row_degradation(self, model: Model, batch: Batch) -> Float[Tensor, " batch"]:
        """Each row's mean next-token loss."""
        return self.example_loss(model, batch)[:, 0]

    def example_loss(self, model: Model, batch: Batch) -> Float[Tensor, "batch 1"]:
        logits = model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
        nll = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), batch.input_ids[:, 1:],
                              reduction="none")
        real = batch.attention_mask[:, 1:].float()
        return ((nll * real).sum(1) / real.sum(1))[:, None]


@dataclass
class EncoderObjective:
    """Cosine similarity of sentence embeddings to the unpruned model's."""

    fit: list[Prompt]
    ablation_fit: list[Prompt]
    heldout: list[Prompt]
    reference_fit: Float[Tensor, "example d_model"]
    reference_heldout: Float[Tensor, "example d_model"]
    probes: Float[Tensor, "example probe d_model"]
    batch_tokens: int
    metrics: tuple[str, ...] = (SIMILARITY,)

    def evaluate(self, model: Model) -> dict[str, np.ndarray]:
        emb = sentence_embeddings(model, self.heldout, max_batch_tokens=self.batch_tokens)
        return {SIMILARITY: F.cosine_similarity(emb, self.reference_heldout, dim=-1).numpy()}

    def row_degradation(self, model: Model, batch: Batch) -> Float[Tensor, " batch"]:
        """One minus each row's cosine similarity to the unpruned embedding (the ablation
        sentences are the first fit sentences, so ``batch.indices`` index both)."""
        pooled = _pooled(model, batch).float()
        return 1 - F.cosine_similarity(pooled, self.reference_fit[batch.indices], dim=-1)

    def example_loss(self, model: Model, batch: Batch) -> Float[Tensor, "batch probe"]:
        unit = F.normalize(_pooled(model, batch).float(), dim=-1)  # u = e / |e|
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
        repeats = repeated_random(model, n_prompts=cfg.repeat_prompts, seq_len=cfg.repeat_len,
                                  seed=cfg.seed)
        return CausalObjective(fit, _prefix(fit, model, cfg.ablation_tokens), heldout, repeats,
                               cfg.repeat_len, model.info.bos_token_id is not None,
                               cfg.batch_tokens)
    fit = sentence_prompts(model, "fit", cfg.fit_tokens, cfg.seed)
    heldout = sentence_prompts(model, "heldout", cfg.eval_tokens, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    probes = torch.randn(len(fit), cfg.probes, model.info.d_model, generator=gen)
    return EncoderObjective(
        fit, _prefix(fit, model, cfg.ablation_tokens), heldout,
        sentence_embeddings(model, fit, max_batch_tokens=cfg.batch_tokens),
        sentence_embeddings(model, heldout, max_batch_tokens=cfg.batch_tokens),
        probes, cfg.batch_tokens)


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
                              values, means=self.means, max_batch_tokens=self.cfg.batch_tokens)

    def ablations(self, values: Float[Tensor, "layer head_index"]
                  ) -> Float[Tensor, "example layer head_index"]:
        return ablation_importance(self.model, self.objective.ablation_fit,
                                   self.objective.row_degradation, self.head_mask(values),
                                   means=self.means, max_batch_tokens=self.cfg.batch_tokens)

    def raw_gradient(self, grads: Tensor) -> Float[Tensor, "layer head_index"]:
        """Michel et al.'s ``E|dL/dxi|`` (``accumulate=batch``: per batch of
        ``batch_tokens // chunk_tokens`` consecutive examples)."""
        batch = max(1, self.cfg.batch_tokens // self.cfg.chunk_tokens)
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

    def head_scores(self) -> pd.DataFrame:
        """Both importances of every head of the unpruned model, with 95% intervals.

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
        if self.cfg.accumulate == "batch":  # the per-example intervals do not apply
            for frame in frames:
                frame[["ci_low", "ci_high"]] = np.nan
        if self.cfg.ablation_tokens:
            diffs = self.ablations(full)
            self._scores[("ablation", key)] = diffs.mean(0)
            frames.append(_score_frame("importance_ablation", diffs.mean(0).numpy(),
                                       *bootstrap_mean_ci(diffs.numpy(), **boot), len(diffs)))
        return pd.concat(frames, ignore_index=True)


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


def _score_frame(metric: str, score: np.ndarray, low: np.ndarray, high: np.ndarray,
                 n: int) -> pd.DataFrame:
    layers, heads = np.indices(score.shape)
    return pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "metric": metric,
                         "score": score.ravel(), "ci_low": low.ravel(),
                         "ci_high": high.ravel(), "n_prompts": n})


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


# ---- which kinds of heads survive -----------------------------------------------------------

def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation (Pearson's on average ranks; no SciPy needed)."""
    return float(a.rank().corr(b.rank()))


def kind_scores(store: RunStore | None, model: dict[str, Any]) -> pd.DataFrame:
    """Head scores of the newest complete, unmasked run of each head-finding and sink
    experiment on the same model weights (empty when there are none).

    Args:
        store: the run store to search.
        model: ``ModelInfo.to_dict()`` (or a run's ``model`` record): name and checksum.
    """
    frames = []
    for name in KIND_EXPERIMENTS if store is not None else ():
        run = store.latest_on_weights(name, model)
        if run is None:
            continue
        try:
            scores = run.table("head_scores")
        except WorkbenchError as exc:
            log.warning("cannot read head scores of %s: %s", run.id, exc)
            continue
        frames.append(scores[["layer", "head", "metric", "score"]].assign(
            experiment=name, run=run.id))
    if not frames:
        return pd.DataFrame(columns=["layer", "head", "metric", "score", "experiment", "run"])
    return pd.concat(frames, ignore_index=True)


def survival_table(order: pd.DataFrame, kinds: pd.DataFrame, top_k: int) -> pd.DataFrame:
    """For every metric of the other experiments: do its top heads survive longer?

    Args:
        order: rows of :func:`order_table` for one order.
        kinds: :func:`kind_scores`.
        top_k: heads per metric.

    Returns:
        experiment, run, metric, order, top_k, heads, top_mean_survival (1 = removed last,
        0.5 expected for heads unrelated to the order), z (its distance from 0.5 in
        standard errors of the mean of ``top_k`` positions drawn without replacement) and
        spearman (score against survival over all heads).
    """
    columns = ["experiment", "run", "metric", "order", "top_k", "heads",
               "top_mean_survival", "z", "spearman"]
    if kinds.empty or order.empty:
        return pd.DataFrame(columns=columns)
    n = len(order)
    rows = []
    for (experiment_name, run_id, metric), group in kinds.groupby(
            ["experiment", "run", "metric"], sort=True):
        joined = group.merge(order[["layer", "head", "survival"]], on=["layer", "head"])
        joined = joined[np.isfinite(joined.score)]
        if len(joined) < 3:
            continue
        k = min(top_k, len(joined))
        top = joined.nlargest(k, "score")
        se = math.sqrt((1 / 12) / k * (n - k) / max(n - 1, 1)) if k < n else float("nan")
        rows.append({"experiment": experiment_name, "run": run_id, "metric": metric,
                     "order": order.order.iloc[0], "top_k": k,
                     "heads": ", ".join(f"L{r.layer}H{r.head}" for r in top.itertuples()),
                     "top_mean_survival": float(top.survival.mean()),
                     "z": float((top.survival.mean() - 0.5) / se) if se == se else np.nan,
                     "spearman": spearman(joined.score, joined.survival)})
    return pd.DataFrame(rows, columns=columns)


# ---- removing heads from the weights -----------------------------------------------------------

class _NoHeads(torch.nn.Module):
    """An attention with every head removed: it adds only the output projection's bias."""

    def __init__(self, width: int, bias: Tensor | None) -> None:
        super().__init__()
        self.width = width  # 0 for BERT's self-attention, d_model for a Llama attention
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone())

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, None]:
        out = hidden_states.new_zeros(*hidden_states.shape[:-1], self.width)
        return (out if self.bias is None else out + self.bias), None


def plain_copy(model: Model) -> torch.nn.Module:
    """The bridge's Hugging Face model as a plain module sharing no storage with it.

    The bridge swaps its own components into the model it holds, so it is rebuilt from
    the config and its weights are copied (parameter names resolve through the bridge).
    """
    original = model.bridge.original_model
    with torch.random.fork_rng():
        fresh = type(original)(original.config)
    state = {}
    for name in fresh.state_dict():
        try:
            state[name] = original.get_parameter(name).detach().clone()
        except AttributeError:
            state[name] = original.get_buffer(name).detach().clone()
    fresh.load_state_dict(state)
    return fresh.eval()


def _rows(heads: Sequence[int], d_head: int) -> Tensor:
    if not heads:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(h * d_head, (h + 1) * d_head) for h in heads])


def remove_heads(hf_model: torch.nn.Module, values: Float[Tensor, "layer head_index"]
                 ) -> torch.nn.Module:
    """Slice the removed heads (mask value 0) out of a Llama or BERT model, in place.

    Query heads go from the query and output projections. In a grouped-query layer a
    key-value head stays as long as one of its query heads does; if the surviving query
    heads are spread unevenly over the key-value heads, the layer becomes multi-head
    (one key-value head per surviving query head), since Hugging Face's attention needs
    the same number of query heads per key-value head. A layer with no heads left adds
    only the output bias.

    Raises:
        WorkbenchError: another architecture.
    """
    from transformers.pytorch_utils import prune_linear_layer

    with warnings.catch_warnings():  # a layer with no heads left makes empty weights
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return _remove(hf_model, values, prune_linear_layer)


def _remove(hf_model: torch.nn.Module, values: Tensor, prune_linear_layer: Callable
            ) -> torch.nn.Module:
    inner = getattr(hf_model, "model", None)
    if inner is not None and hasattr(inner, "layers"):  # Llama
        for layer, block in enumerate(inner.layers):
            _remove_llama(block, [int(h) for h in (values[layer] != 0).nonzero().flatten()],
                          prune_linear_layer)
    elif hasattr(hf_model, "bert"):
        for layer, block in enumerate(hf_model.bert.encoder.layer):
            keep = [int(h) for h in (values[layer] != 0).nonzero().flatten()]
            attn = block.attention
            rows = _rows(keep, attn.self.attention_head_size)
            for name in ("query", "key", "value"):
                setattr(attn.self, name, prune_linear_layer(getattr(attn.self, name), rows, 0))
            attn.output.dense = prune_linear_layer(attn.output.dense, rows, 1)
            attn.self.num_attention_heads = len(keep)
            attn.self.all_head_size = len(rows)
            if not keep:
                attn.self = _NoHeads(0, None)
    else:
        raise WorkbenchError(f"removing heads is implemented for Llama and BERT models, "
                             f"not {type(hf_model).__name__}")
    return hf_model


def _remove_llama(block: torch.nn.Module, keep: list[int], prune: Callable) -> None:
    attn = block.self_attn
    cfg = attn.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if not keep:
        block.self_attn = _NoHeads(cfg.hidden_size, attn.o_proj.bias)
        return
    kv_of = [h // (n_heads // n_kv) for h in keep]
    per_kv = {kv: kv_of.count(kv) for kv in kv_of}
    if len(set(per_kv.values())) == 1:  # even groups stay grouped
        kv_heads, groups = sorted(per_kv), next(iter(per_kv.values()))
    else:
        kv_heads, groups = kv_of, 1
    attn.q_proj = prune(attn.q_proj, _rows(keep, attn.head_dim), 0)
    attn.k_proj = prune(attn.k_proj, _rows(kv_heads, attn.head_dim), 0)
    attn.v_proj = prune(attn.v_proj, _rows(kv_heads, attn.head_dim), 0)
    attn.o_proj = prune(attn.o_proj, _rows(keep, attn.head_dim), 1)
    attn.num_key_value_groups = groups


def _hf_forward(hf_model: torch.nn.Module, batch: Batch, causal: bool) -> Tensor:
    """Logits (causal LM) or mean-pooled final hidden states (encoder, body only)."""
    if causal:
        return hf_model(batch.input_ids, attention_mask=batch.attention_mask).logits
    body = getattr(hf_model, "bert", hf_model)
    hidden = body(batch.input_ids, **batch.forward_kwargs()).last_hidden_state
    mask = batch.attention_mask[:, :, None].to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def _seconds(hf_model: torch.nn.Module, batch: Batch, causal: bool) -> float:
    start = time.perf_counter()
    _hf_forward(hf_model, batch, causal)
    return time.perf_counter() - start


def speedup_table(pruner: Pruner, masks: dict[float, Tensor], repeats: int) -> pd.DataFrame:
    """Wall-clock time of one held-out batch through the model with heads removed from its
    weights, against the full model (the fastest of ``repeats`` interleaved runs each),
    and the largest difference between the removed model's output and the masked one's."""
    columns = ["budget", "n_removed", "params_full", "params_removed", "seconds_full",
               "seconds_removed", "speedup", "max_abs_diff", "batch_tokens"]
    model, causal = pruner.model, pruner.model.info.causal
    if repeats < 1 or not masks or pruner.cfg.ablation != "zero":
        return pd.DataFrame(columns=columns)
    plain = plain_copy(model)
    prompts = pruner.objective.heldout
    pad = model.tokenizer.pad_token_id or 0
    batch = next(make_batches([model.encode(p) for p in prompts], pad_id=pad,
                              max_tokens=pruner.cfg.batch_tokens))
    rows = []
    with torch.inference_mode():
        _seconds(plain, batch, causal)  # warm up
        for budget, values in progress.track(list(masks.items()), desc="removal speed-up"):
            removed = remove_heads(copy.deepcopy(plain), values)
            _seconds(removed, batch, causal)  # warm up
            full_s, removed_s = [], []
            for _ in range(repeats):
                full_s.append(_seconds(plain, batch, causal))
                removed_s.append(_seconds(removed, batch, causal))
            with applied(model, pruner.head_mask(values)):
                masked = (model.bridge(batch.input_ids, attention_mask=batch.attention_mask)
                          if causal else _pooled(model, batch))
            diff = (masked.float() - _hf_forward(removed, batch, causal).float())
            real = batch.attention_mask.bool() if causal else slice(None)
            rows.append({"budget": budget, "n_removed": int((values == 0).sum()),
                         "params_full": sum(p.numel() for p in plain.parameters()),
                         "params_removed": sum(p.numel() for p in removed.parameters()),
                         "seconds_full": min(full_s), "seconds_removed": min(removed_s),
                         "speedup": min(full_s) / min(removed_s),
                         "max_abs_diff": float(diff[real].abs().max()),
                         "batch_tokens": int(batch.attention_mask.sum())})
            del removed
    return pd.DataFrame(rows, columns=columns)


# ---- reading curves ----------------------------------------------------------------------------

def degradation(metric: str, value: float, baseline: float) -> float:
    """How much worse ``value`` is than ``baseline``: a relative increase for losses, a
    drop for the similarity."""
    if metric == SIMILARITY:
        return baseline - value
    return (value - baseline) / baseline


def prunable_fraction(curve: pd.DataFrame, metric: str, tolerance: float) -> float:
    """The largest fraction pruned before ``metric`` first degrades by more than
    ``tolerance``, along one order (rows of one order and seed)."""
    rows = curve[curve.metric == metric].sort_values("fraction_pruned")
    baseline = float(rows.value.iloc[0])
    best = 0.0
    for row in rows.itertuples():
        if degradation(metric, row.value, baseline) > tolerance:
            break
        best = float(row.fraction_pruned)
    return best


def curve_summary(curve: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per fraction pruned: the metric for every order, and the random orders'
    mean, standard deviation, minimum and maximum over seeds."""
    rows = curve[curve.metric == metric]
    wide = rows[rows.order != "random"].pivot_table(index="fraction_pruned", columns="order",
                                                    values="value")
    rand = rows[rows.order == "random"].groupby("fraction_pruned").value
    if len(rand):
        wide["random_mean"] = rand.mean()
        wide["random_sd"] = rand.std(ddof=1) if rand.size().min() > 1 else np.nan
        wide["random_min"], wide["random_max"] = rand.min(), rand.max()
    return wide.reset_index()


def _nearest(table: pd.DataFrame, fraction: float) -> pd.Series:
    return table.iloc[int((table.fraction_pruned - fraction).abs().to_numpy().argmin())]


def _heads(scores: pd.DataFrame, metric: str, n: int, largest: bool) -> str:
    df = scores[scores.metric == metric]
    picked = df.nlargest(n, "score") if largest else df.nsmallest(n, "score")
    return ", ".join(f"L{r.layer}H{r.head} ({r.score:.3g})" for r in picked.itertuples())


@dataclass
class Result:
    head_scores: pd.DataFrame
    pruning_curve: pd.DataFrame
    pruning_order: pd.DataFrame
    masks: pd.DataFrame
    survival: pd.DataFrame
    speedup: pd.DataFrame
    metrics: tuple[str, ...]
    tolerance: float
    notes: list[str] = field(default_factory=list)

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"head_scores": self.head_scores, "pruning_curve": self.pruning_curve,
                "pruning_order": self.pruning_order, "masks": self.masks,
                "survival": self.survival, "speedup": self.speedup}

    def summary(self) -> list[str]:
        return [*self._curve_lines(), *self._importance_lines(), *self._survival_lines(),
                *self._speed_lines(), *self.notes]

    def _curve_lines(self) -> list[str]:
        lines = []
        for metric in self.metrics:
            table = curve_summary(self.pruning_curve, metric)
            orders = [c for c in table.columns if c not in ("fraction_pruned", "random_sd",
                                                           "random_min", "random_max")]
            lines.append(f"{metric}, unpruned: {table.iloc[0][orders[0]]:.4f}")
            shown = sorted({int(_nearest(table, f).name) for f in (0.1, 0.2, 0.3, 0.5)})
            for index in shown:
                row = table.loc[index]
                parts = [f"{o} {row[o]:.3f}" for o in orders if o != "random_mean"]
                if "random_mean" in row:
                    parts.append(f"random {row.random_mean:.3f} ± {row.random_sd:.3f}")
                lines.append(f"  {row.fraction_pruned:.0%} pruned: " + ", ".join(parts))
            primary = self.metrics[0]
            if metric == primary:
                lines.append(self._prunable_line(primary))
        return lines

    def _prunable_line(self, metric: str) -> str:
        parts = []
        for order, group in self.pruning_curve.groupby("order", sort=False):
            fractions = [prunable_fraction(g, metric, self.tolerance)
                         for _, g in group.groupby("seed", dropna=False)]
            parts.append(f"{order} {np.mean(fractions):.0%}" + (
                f" ± {np.std(fractions, ddof=1):.0%}" if len(fractions) > 1 else ""))
        what = "drops by" if metric == SIMILARITY else "rises by"
        return (f"  prunable before {metric} {what} more than "
                f"{self.tolerance:g}{'' if metric == SIMILARITY else ' (relative)'}: "
                + ", ".join(parts))

    def _importance_lines(self) -> list[str]:
        present = set(self.head_scores.metric)
        lines = [f"{metric}: least {_heads(self.head_scores, metric, 3, False)}; "
                 f"most {_heads(self.head_scores, metric, 3, True)}"
                 for metric in ("importance_gradient", "importance_ablation")
                 if metric in present]
        if "importance_ablation" in present:
            wide = self.head_scores.pivot_table(index=["layer", "head"], columns="metric",
                                                values="score")
            lines.append("Spearman correlation with ablation importance: gradient "
                         f"{spearman(wide.importance_gradient, wide.importance_ablation):.2f}"
                         ", unnormalised gradient "
                         f"{spearman(wide.importance_gradient_raw, wide.importance_ablation):.2f}")
        return lines

    def _survival_lines(self) -> list[str]:
        if self.survival.empty:
            return [f"no complete run of {', '.join(KIND_EXPERIMENTS)} on these weights: "
                    "survival by kind of head skipped"]
        return [f"top {r.top_k} {r.metric} heads ({r.experiment}) in the {r.order} order: "
                f"mean survival {r.top_mean_survival:.2f} (0.5 expected by chance, "
                f"z = {r.z:.1f}), Spearman with score {r.spearman:.2f}"
                for r in self.survival.itertuples()]

    def _speed_lines(self) -> list[str]:
        return [f"heads removed from the weights at {r.budget:.0%} ({r.n_removed} heads): "
                f"{r.seconds_full * 1000:.0f} ms -> {r.seconds_removed * 1000:.0f} ms per "
                f"{r.batch_tokens} tokens ({r.speedup:.2f}x), output within "
                f"{r.max_abs_diff:.1e} of masking" for r in self.speedup.itertuples()]


# ---- the experiment ----------------------------------------------------------------------------

@experiment("head-pruning", config=Config, tables=None, demo=DEMO)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    ctx = ctx or Context()
    workdir = ctx.workdir
    """Importance of every head, iterative pruning curves, and the heads that survive."""
    info = model.info
    objective = make_objective(model, cfg)
    means = (head_means(model, objective.fit, max_batch_tokens=cfg.batch_tokens)
             if cfg.ablation == "mean" else None)
    pruner = Pruner(model, objective, cfg, means)
    head_scores = pruner.head_scores()
    counts = schedule(info.n_layers * info.n_heads, cfg.step_fraction, cfg.max_fraction)
    orders = prune_all(pruner, counts)
    curve = curve_table(pruner, orders, counts)
    order = order_table(orders, counts, info.n_layers, info.n_heads)
    first = orders[0]
    masks = budget_masks(first, counts, cfg.budgets, info.n_layers * info.n_heads)
    notes = []
    if workdir is not None:
        written = save_masks(pruner, first, masks, workdir / "masks")
        notes.append(f"masks for --heads-mask: {', '.join(p.name for p in written)} "
                     "in the run folder's masks/")
    kinds = kind_scores(ctx.store, info.to_dict())
    survival = survival_table(order[order.order == first.order], kinds, cfg.top_k)
    speed = speedup_table(pruner, masks, cfg.speed_repeats)
    if cfg.ablation != "zero":
        notes.append("no removal speed-up: removing heads equals zero ablation, not mean")
    return Result(head_scores, curve, order, mask_table(first, masks), survival, speed,
                  objective.metrics, cfg.tolerance, notes)


# ---- claim checks ------------------------------------------------------------------------------

def _better(metric: str, value: float, other: float) -> bool:
    return value > other if metric == SIMILARITY else value < other


@claim_check("pruning_beats_random")
def pruning_beats_random(run: Run, *, order: str, metric: str,
                         fractions: list[float]) -> Measurement:
    """At each fraction pruned, ``order`` leaves a better ``metric`` than the mean of the
    random orders (the pruning step nearest each fraction)."""
    table = curve_summary(run.table("pruning_curve"), metric)
    if order not in table.columns or "random_mean" not in table.columns:
        raise WorkbenchError(f"run {run.id} has no '{order}' and random pruning curves")
    parts, passed = [], True
    for fraction in fractions:
        row = _nearest(table, fraction)
        passed &= _better(metric, row[order], row.random_mean)
        parts.append(f"{row.fraction_pruned:.0%}: {row[order]:.3f} vs random "
                     f"{row.random_mean:.3f} ± {row.random_sd:.3f}")
    return Measurement(f"{metric}, {order} order vs random: " + "; ".join(parts), passed)


@claim_check("prunable_fraction_at_least")
def prunable_fraction_at_least(run: Run, *, order: str, metric: str, tolerance: float,
                               fraction: float) -> Measurement:
    """Along ``order``, at least ``fraction`` of the heads go before ``metric`` degrades by
    more than ``tolerance`` (relative increase of a loss, drop of the similarity)."""
    curve = run.table("pruning_curve")
    mine = curve[curve.order == order]
    if mine.empty:
        raise WorkbenchError(f"run {run.id} has no '{order}' pruning curve")
    found = prunable_fraction(mine, metric, tolerance)
    random = [prunable_fraction(g, metric, tolerance)
              for _, g in curve[curve.order == "random"].groupby("seed")]
    tail = f"; random orders {np.mean(random):.0%}" if random else ""
    reached = mine.fraction_pruned.max()
    cap = (" (as far as the run pruned: it cannot decide more)"
           if found >= reached and fraction > reached else "")
    return Measurement(f"{found:.0%} of heads{cap} pruned in the {order} order before "
                       f"{metric} degraded by more than {tolerance:g}{tail} "
                       f"(needed {fraction:.0%})", bool(found >= fraction - 1e-9), found)


if __name__ == "__main__":
    import sys

    from workbench.cli import main

    main(["run", "head-pruning", *sys.argv[1:]])
