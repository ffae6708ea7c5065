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
  and evaluated on the ``heldout`` part (:func:`workbench.inputs.corpus.python_docs`), so
  that no evaluation text is ever used to choose heads. Causal models read
  ``chunk_tokens``-token windows (:func:`workbench.inputs.corpus.token_chunks`); encoders
  read sentences of 6 to 40 words from the same splits, drawn in a seeded order until the
  token budget is used (:func:`workbench.inputs.sentences.sentence_prompts`).
- **Evaluation metric**, causal LM: ``heldout_loss``, the mean next-token cross-entropy
  (nats) on ``eval_tokens`` held-out tokens, and ``second_repeat_loss``, the mean loss on
  the second half of ``repeat_prompts`` sequences of ``repeat_len`` random tokens repeated
  twice (:func:`workbench.inputs.prompts.repeated_random`), leaving out the first token of the
  repeat, which cannot be copied. It is low only while induction works (Olsson et al. 2022,
  "In-context Learning and Induction Heads"). Encoder: ``cosine_similarity``, the mean over
  held-out sentences of ``cos(e_pruned(x), e_full(x))``, with the sentence embedding ``e``
  the mean over real tokens of the final residual stream (mean pooling, as in
  sentence-transformers; :mod:`workbench.scores.embeddings`). Every value has a 95%
  bootstrap interval over texts.
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
  ``L(x)`` is the example's mean next-token loss (:func:`workbench.scores.losses.row_losses`).
  For the encoder, ``D = 1 - cos`` has a zero gradient at the unpruned mask (it is at its
  minimum there), so Michel's ``|dD/dxi|`` is uninformative; and a masked-LM loss does not
  exist (the head is random). We use ``L(x) = g . u(x)``, a random Gaussian probe
  ``g ~ N(0, I)`` (``probes`` per sentence) of the unit-normalised embedding ``u = e / |e|``.
  Then ``E_g |dL/dxi_h| = sqrt(2/pi) |du/dxi_h|``, and since
  ``1 - cos = |u(xi) - u(1)|^2 / 2``, whose gradient vanishes at ``xi = 1``, removing head
  ``h`` changes the metric by ``|du/dxi_h|^2 / 2`` to second order: the ranking is the
  exact second-order (Gauss-Newton) Taylor estimate of the metric drop.
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
n_pruned, fraction_pruned, metric, value, ci_low, ci_high), ``pruning_curve_by_prompt``
(each text's value of every metric at every step of every order, which
``pruning_curve`` averages: what ``workbench compare`` pairs), ``head_scores_by_prompt``
(each fit text's ``importance_gradient_raw`` and ablation text's ``importance_ablation``,
which ``head_scores`` averages; the normalised ``importance_gradient`` is no mean over
texts), ``pruning_order`` (when each head was removed in each order), ``masks`` (the
first importance order's masks at ``budgets``, also written to
``masks/<order>-<budget>.json`` in the run folder for ``--heads-mask``), ``survival``
(the join above, naming every run it read), ``speedup`` (wall-clock time of the model
with heads removed from its weights,
:mod:`workbench.models.surgery`, against the full model: the median and range of
``speed_repeats`` interleaved pairs, flagged ``busy`` when the machine's load was above its
cores; and the largest difference from masking).
``tables.py`` declares every column.

Examples:
    From the command line, then a later run with a saved mask (``<run>`` is the first run's
    folder, ``data/runs/<id>``)::

        workbench run head-pruning --model minilm --set max_fraction=0.8
        workbench run head-overview --model minilm --heads-mask <run>/masks/gradient-0.30.json

    From Python (outside the run store, so no masks are written and nothing is joined)::

        >>> from workbench.models import load_model
        >>> result = run(load_model("minilm"), Config(max_fraction=0.3))  # doctest: +SKIP
        >>> result.tables()["pruning_curve"].head()                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from experiments.head_pruning import checks  # noqa: F401 (registers the claim checks)
from experiments.head_pruning.measure import (
    ImportanceKind,
    Pruner,
    budget_masks,
    curve_by_prompt,
    curve_table,
    make_objective,
    mask_table,
    order_table,
    prune_all,
    save_masks,
    schedule,
)
from experiments.head_pruning.speedup import speedup_table
from experiments.head_pruning.summary import Result
from experiments.head_pruning.survival import kind_scores, survival_table
from experiments.head_pruning.tables import TABLES
from workbench.core import progress
from workbench.core.options import FixedAblation
from workbench.core.values import MAX_DRAWS, MAX_HEADS, MAX_PROMPTS, MAX_SEQUENCE, MAX_TEXT_TOKENS
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.interventions.importance import Accumulation
from workbench.interventions.masks import head_means
from workbench.models.base import Model

MIN_SPEED_REPEATS = 5
"""Timed pairs of the speed-up: enough for a median that one slow moment does not move."""
DEMO = {"chunk_tokens": 64, "fit_tokens": 512, "ablation_tokens": 64, "eval_tokens": 512,
        "repeat_prompts": 4, "repeat_len": 24, "importance": ("gradient",),
        "max_fraction": 0.3, "probes": 4, "budgets": (0.1, 0.3), "speed_repeats": 5,
        "n_boot": 200, "n_random": 3}
"""The demo config, also the base of the pruning claims (``data/claims/head_pruning.json``):
three random orders, as when the claims were registered."""
MODEL_DEFAULTS = {"gemma3": {"fit_tokens": 1024, "eval_tokens": 1024, "ablation_tokens": 256,
                             "max_batch_tokens": 512, "reverse": False}}
"""gemma3's own defaults. Its 262,144-token unembedding costs more than the rest of the
model per token, and every evaluation, gradient and ablation reads losses through it, so
the default config took 18 min 25 s there. Its default reads half the text (an interval
on every value says what that costs), times 512-token batches, and leaves out the
most-important-first order (``--set reverse=true`` adds it back): 8 min 17 s on 2 idle
cores."""


@dataclass(frozen=True)
class Config:
    fit_tokens: int = param(
        2048, "tokens of fit text for gradient importance (never used for evaluation)",
        min=1, max=MAX_TEXT_TOKENS)
    ablation_tokens: int = param(
        512, "tokens of the fit text for ablation importance (a forward pass per head; "
             "0 skips it)", min=0, max=MAX_TEXT_TOKENS)
    eval_tokens: int = param(
        2048, "tokens of held-out text for the evaluation metric (each pruning step of each "
              "order evaluates them once)", min=1, max=MAX_TEXT_TOKENS)
    chunk_tokens: int = param(128, "tokens per natural-text window (causal models)",
                              min=1, max=MAX_SEQUENCE)
    repeat_prompts: int = param(
        8, "repeated-random prompts for the second-repeat loss (causal models)",
        min=1, max=MAX_PROMPTS)
    repeat_len: int = param(32, "random tokens per repeat in those prompts",
                            min=1, max=MAX_SEQUENCE)
    importance: tuple[ImportanceKind, ...] = param(
        ("gradient",), "distinct importance kinds that order iterative pruning (each is one "
                       "order; ablation re-estimates every remaining head's ablation "
                       "importance at every step: about 13 more minutes on smollm2 on 2 "
                       "cores, estimated)")
    reverse: bool = param(True, "also prune most-important-first, by the first importance kind")
    n_random: int = param(2, "random pruning orders (seeds)", min=0, max=100)
    step_fraction: float = param(0.1, "fraction of all heads removed per pruning step",
                                 min=0.001, max=1)
    max_fraction: float = param(1.0, "stop once this fraction of all heads is removed",
                                min=0.001, max=1)
    ablation: FixedAblation = param(
        "zero", "what a removed head becomes: zero, or its mean output on the fit text (not "
                "resample: importance batches copies of one prompt, which has no donor)")
    normalize: bool = param(
        True, "rank by gradient importance normalised per layer (Michel et al.) or raw")
    accumulate: Accumulation = param(
        "example", "gradient importance: |dL/dxi| per example (Michel's definition) or per batch")
    probes: int = param(
        8, "random probes of the embedding per sentence (encoder gradient importance)",
        min=1, max=MAX_DRAWS)
    budgets: tuple[float, ...] = param(
        (0.1, 0.2, 0.3, 0.5), "pruned fractions whose masks are saved (first importance order)",
        min=0.001, max=1)
    tolerance: float = param(
        0.05, "degradation allowed for the prunable fraction (relative loss increase, "
              "or 1 - cosine similarity)", min=0, max=1)
    top_k: int = param(
        10, "heads per metric of other experiments joined with the survival order",
        min=1, max=MAX_HEADS)
    speed_repeats: int = param(
        MIN_SPEED_REPEATS, "timed pairs (full, then heads removed from the weights) of the "
        "speed-up, at least 5 for a median and range (0: skip)", min=0, max=100)
    # half the usual batch, which also sets the examples per gradient batch
    # (accumulate=batch) and the batch timed for the speed-up
    max_batch_tokens: int = shared("max_batch_tokens", 1024)
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")  # of text selection, random orders, probes and bootstrap

    def __post_init__(self) -> None:
        if not self.importance or len(set(self.importance)) != len(self.importance):
            raise ValueError(f"importance: one or more distinct kinds, got {self.importance}")
        if min(self.fit_tokens, self.ablation_tokens or self.chunk_tokens,
               self.eval_tokens) < self.chunk_tokens:
            raise ValueError("fit_tokens, ablation_tokens (unless 0) and eval_tokens must "
                             "each be at least chunk_tokens")
        if "ablation" in self.importance and self.ablation_tokens == 0:
            raise ValueError("ablation importance orders pruning, so ablation_tokens > 0")
        if self.ablation_tokens > self.fit_tokens:
            raise ValueError("ablation_tokens is a part of the fit text: at most fit_tokens")
        if 0 < self.speed_repeats < MIN_SPEED_REPEATS:
            raise ValueError(f"speed_repeats: 0 (skip) or at least {MIN_SPEED_REPEATS}, so the "
                             f"speed-up has a median and range; got {self.speed_repeats}")


# importance batches copies of one prompt: a resampled head's donor would be the prompt
@experiment("head-pruning", config=Config, tables=TABLES, demo=DEMO,
            model_defaults=MODEL_DEFAULTS, ablations=get_args(FixedAblation))
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Importance of every head, iterative pruning curves, and the heads that survive."""
    ctx = ctx or Context()
    info = model.info
    n_total = info.n_layers * info.n_heads
    objective = make_objective(model, cfg)
    means = (head_means(model, objective.fit, max_batch_tokens=cfg.max_batch_tokens)
             if cfg.ablation == "mean" else None)
    pruner = Pruner(model, objective, cfg, means)
    # each step's seconds in a demo run on smollm2 (2 shared cores), for the time left
    with progress.stages("head-pruning", 4, weights=(283, 43, 103, 53)) as stage:
        stage("head importance")
        head_scores, scores_by_prompt = pruner.head_scores()
        stage("pruning orders")
        counts = schedule(n_total, cfg.step_fraction, cfg.max_fraction)
        orders = prune_all(pruner, counts)
        stage("curves, masks and survival")
        curve = curve_table(pruner, orders, counts)
        by_prompt = curve_by_prompt(pruner, orders, counts)
        order = order_table(orders, counts, info.n_layers, info.n_heads)
        first = orders[0]
        masks = budget_masks(first, counts, cfg.budgets, n_total)
        notes = []
        if ctx.workdir is not None:
            written = save_masks(pruner, first, masks, ctx.workdir / "masks")
            notes.append(f"masks for --heads-mask: {', '.join(p.name for p in written)} "
                         "in the run folder's masks/")
        survival = survival_table(order[order.order == first.order],
                                  kind_scores(ctx.store, info), cfg.top_k)
        stage("removal speed-up")
        speed = speedup_table(pruner, masks, cfg.speed_repeats)
    if cfg.ablation != "zero":
        notes.append("no removal speed-up: removing heads equals zero ablation, not mean")
    return Result(head_scores, curve, order, mask_table(first, masks), survival, speed,
                  objective.metrics, cfg.tolerance, notes, by_prompt, scores_by_prompt)
