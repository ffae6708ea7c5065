"""Induction heads: which heads complete repeated patterns, and is the circuit causal?

An induction head attends from a token to whatever followed that token's earlier
occurrence and copies it, so that ``[A][B] ... [A]`` predicts ``[B]`` (Olsson et al. 2022,
"In-context Learning and Induction Heads"; Elhage et al. 2021, "A Mathematical Framework
for Transformer Circuits"). It needs a previous-token head in an earlier layer, whose
output its keys read (K-composition). GPT-2 small's induction heads 5.1, 5.5, 6.9, 7.2 and
7.10 are the classic reference. The protocol needs a causal model: on a bidirectional
encoder every position already sees the answer, so the experiment refuses encoders.

Head scores (``head_scores.parquet``), each with a 95% bootstrap interval and a null:

- ``induction`` (prefix matching, Olsson et al. 2022, as TransformerLens'
  ``head_detector`` scores it): on ``n_prompts`` sequences of ``seq_len`` random tokens
  (drawn from the middle 80% of the vocabulary, which excludes the most and least
  frequent ids) repeated ``repeats`` times after BOS, the mean weight each query of the
  *second* repeat puts on the token that followed its first occurrence. Generically, over
  the queries ``i`` whose token occurred exactly once before, at ``j``::

      induction = mean_{i : #{j < i : t_j = t_i} = 1} A[i, j + 1]

  which is the second repeat for any ``repeats`` (:func:`workbench.scores.patterns.induction`).
  The top heads, the tracked heads of the K-composition ablation and the claims
  (``gpt2-induction-heads``, ``olsson2022-induction-stripe``, ``olsson2022-k-composition-*``)
  all use this score.
- ``induction_pooled``: on the same prompts, over every query with an earlier occurrence
  (every repeat after the first), the total weight on all the earlier successors::

      induction_pooled = mean_{i : exists j < i, t_j = t_i} sum_{j < i, t_j = t_i} A[i, j + 1]

  (:func:`workbench.scores.patterns.induction_pooled`). It equals ``induction`` when
  ``repeats=2``; with more repeats it also rewards heads that spread their weight over
  several earlier copies. Shown next to ``induction`` (the heads page offers both), used
  by no claim. The BOS column never counts in either; null of both: the same score for
  uniform attention.
- ``copying`` (Elhage et al. 2021, the OV circuit): the z-score of a token's own logit
  among all logits when the head attends to it, on the head's direct path to the
  unembedding, averaged over ``copying_tokens`` random tokens
  (:func:`workbench.scores.heads.copying_scores`). Normalisation: per token, over the whole
  vocabulary; the null (a token unrelated to the one attended to) is exactly 0.
- ``previous_token``: as in the previous-token-heads experiment, on natural text; used to
  pick the heads to ablate.

Causal evidence (tables ``repeat_loss``, ``ablation``, ``icl``, ``loss_by_position``):

- In-context copying: the next-token loss on each repeat of the random sequences
  (the first token of each repeat is left out: nothing before it predicts it). A model
  with induction heads predicts the second repeat far better than the first.
- K-composition: the ``n_ablate`` heads with the highest ``previous_token`` score among
  layers below the deepest of the ``n_track`` top ``induction`` heads are ablated (zero and
  mean ablation of the head's output, through hooks on ``hook_z``; means over the
  ``natural`` prompt set), and the tracked heads' mean ``induction`` score and the
  second-repeat loss are measured again. The control ablates the same number of random
  heads from the same layers (``n_random`` draws; never a chosen or tracked head;
  :func:`workbench.interventions.ablation.random_same_layer`). A condition's losses on
  the first two repeats are read from the prompts cut after the second repeat (a causal
  model's loss on a token does not see the tokens after it: the same losses, with a third
  fewer tokens through the model at the default three repeats); the clean row is the
  ``head_scores`` and ``repeat_loss`` measurements of the same prompts.
- K-composition, path-specific (table ``path_patch``): ablating a head's output removes it
  from every downstream query, key and value at once, so it shows the previous-token heads
  are *necessary*, not that they act through the key. The path patch removes the same
  heads' contribution from only the *key* input of the tracked heads, then from only the
  query, then from only the value (:func:`workbench.interventions.paths.path_removed`: the
  input norm's scale frozen, their ``W n(z W_O)`` subtracted at ``hook_k`` / ``hook_q`` /
  ``hook_v``; with grouped-query attention key and value are the kv group's), against
  ``n_path_random`` (at least 20) draws of random same-layer heads removed the same way.
  The value path cannot move a pattern (it shows in the loss). The K-composition claim
  (``olsson2022-k-composition-key-path``) reads the key-only path; pre-norm models only.
- In-context learning score (Olsson et al. 2022, section 3): the loss on the token at
  position 500 minus the loss on the token at position 50 (position 0 is BOS), averaged
  over ``icl_prompts`` windows of ``icl_tokens`` tokens of natural text. Negative means
  the model predicts better later in the context (it learns in context). Olsson et al.
  average single tokens over a large dataset; the documentation that ships with Python
  holds about 100 windows of 512 tokens, over which one token's loss is too noisy to
  resolve the score (on smollm2: -0.33, 95% interval [-1.08, 0.37] over 96 windows). So
  the table reports both that exact estimator (``icl_score``) and ``icl_score_window``,
  the mean loss over positions ``500 +- icl_halfwidth`` minus the mean over
  ``50 +- icl_halfwidth``, which estimates the same difference with far less noise
  while the loss changes slowly with position (it does: see ``loss_by_position``).

Classes (table ``head_classes``, :mod:`workbench.scores.classes`): every head is tested
for the ``induction`` class, its Olsson score against the same random tokens with every
repeat after the first shuffled (a derangement; the twins are batched with the repeated
sequences and read at the real prompts' targets, where no earlier copy is continued any
more) and against uniform attention, and for the ``previous-token`` class (its weight on
the previous token of the natural text against its total weight on the tokens 2-4 back). A head
is in a class when its Benjamini-Hochberg q over all the model's heads is at most ``fdr``
(default 5%; ``n_null_draws`` sign flips per test, the smallest p 1 / (1 + n_null_draws)).
The claims ``olsson2022-induction-class-*`` read it.

The run stores ``example/``: the attention patterns of one repeated sequence, shown by the
dashboard's heads page (the induction stripe is unmistakable).

Example:
    workbench run induction-heads --model smollm2
    workbench run induction-heads --model smollm2 --set n_random=10 --set n_prompts=64
    python -m experiments.induction_heads --model smollm2 --set n_prompts=16
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from experiments.induction_heads import checks  # noqa: F401 (registers the claim checks)
from experiments.induction_heads.measure import (
    Result,
    ablation_table,
    first_repeats,
    head_score_table,
    icl_tables,
    path_patch_table,
    repeat_loss_prompts,
    repeat_loss_table,
)
from experiments.induction_heads.tables import TABLES
from workbench.core import progress
from workbench.core.options import FixedAblation
from workbench.core.values import MAX_DRAWS, MAX_HEADS, MAX_PROMPTS, MAX_REPEATS, MAX_SEQUENCE
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import load_prompt_set
from workbench.models.base import Model
from workbench.recording.writer import record
from workbench.scores import classes
from workbench.scores.losses import repeat_losses, token_losses


@dataclass(frozen=True)
class Config:
    n_prompts: int = param(32, "repeated random sequences", min=2, max=MAX_PROMPTS)
    seq_len: int = param(40, "tokens per random sequence", min=2, max=MAX_SEQUENCE)
    repeats: int = param(3, "times each sequence is repeated", min=2, max=MAX_REPEATS)
    n_natural: int = param(16, "natural-text windows (128 tokens) for previous_token",
                           min=2, max=MAX_PROMPTS)
    n_ablate: int = param(3, "previous-token heads to ablate", min=1, max=MAX_HEADS)
    n_track: int = param(3, "top induction heads to track", min=1, max=MAX_HEADS)
    n_random: int = param(5, "random same-layer ablation draws", min=1, max=MAX_DRAWS)
    n_path_random: int = param(20, "random same-layer draws of the path patch (Q/K/V only)",
                               min=1, max=MAX_DRAWS)
    icl_prompts: int = param(96, "natural-text windows for ICL", min=2, max=MAX_PROMPTS)
    icl_tokens: int = param(512, "tokens per ICL window (> 500 + icl_halfwidth)",
                            min=501, max=MAX_SEQUENCE)
    icl_halfwidth: int = param(
        10, "icl_score_window averages positions 50 +- this and 500 +- this", min=0, max=40)
    copying_tokens: int = param(200, "tokens for the copying score", min=2, max=MAX_SEQUENCE)
    fdr: float = shared("fdr")
    n_null_draws: int = shared("n_null_draws")
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    def __post_init__(self) -> None:
        if self.icl_tokens <= 500 + self.icl_halfwidth:
            raise ValueError("icl_tokens must exceed 500 + icl_halfwidth (the score reads "
                             "position 500)")
        classes.Testing(fdr=self.fdr, n_draws=self.n_null_draws)  # draws that can reach fdr


@experiment("induction-heads", config=Config, tables=TABLES, requires="causal_lm",
            demo={"n_prompts": 16, "n_random": 3, "icl_prompts": 48, "copying_tokens": 100,
                  "n_boot": 500}, ablations=get_args(FixedAblation))
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Induction and copying scores, repeat losses, K-composition ablation and ICL."""
    ctx = ctx or Context()
    repeated = load_prompt_set("repeated-random", model, n_prompts=cfg.n_prompts,
                               seq_len=cfg.seq_len, repeats=cfg.repeats, seed=cfg.seed)
    natural = token_chunks(model, python_docs(), n_chunks=cfg.n_natural, n_tokens=128,
                           label="docs")
    # each step's seconds in a demo run on smollm2 (2 shared cores), for the time left
    with progress.stages("induction-heads", 6, weights=(147, 18, 261, 170, 361, 3)) as stage:
        stage("head scores")
        head_scores, head_classes, scores_by_prompt = head_score_table(model, repeated,
                                                                       natural, cfg)
        stage("loss on repeats")
        start, _ = first_repeats(repeated, cfg.seq_len, cfg.repeats, keep=cfg.repeats)
        losses = repeat_losses(token_losses(model, repeated), cfg.seq_len, cfg.repeats,
                               start=start)
        stage("K-composition ablation")
        ablation = ablation_table(model, repeated, head_scores, losses, cfg)
        stage("K-composition path patch")
        path_patch = path_patch_table(model, repeated, head_scores, cfg)
        stage("in-context learning")
        icl, by_pos, by_prompt = icl_tables(model, cfg)
        stage("example patterns")
        if ctx.workdir is not None:
            record(model, repeated[:1], ctx.workdir / "example", include_resid=False)
    by_prompt["repeat_loss_by_prompt"] = repeat_loss_prompts(losses, repeated)
    by_prompt["head_scores_by_prompt"] = scores_by_prompt
    return Result(head_scores, repeat_loss_table(losses, cfg), ablation, icl, by_pos,
                  path_patch, head_classes, by_prompt)
