"""Head overview: is each head's attention broad or focused, local or long-range?

The first look at a model's heads, in the manner of Clark et al. 2019 ("What Does BERT Look
At? An Analysis of BERT's Attention", section 3, which measures each head's attention
entropy to separate broad from focused heads) and of Vig & Belinkov 2019 ("Analyzing the
Structure of Attention in a Transformer Language Model", mean attention distance by layer).

Metrics in ``head_scores.parquet`` (mean over prompts, with a 95% bootstrap interval;
``per_prompt_scores.parquet`` holds each prompt's value):

- ``entropy``: mean over queries of H(A[q, :]) = -sum_k A[q, k] log A[q, k], in nats.
- ``normalized_entropy``: H divided by log(number of keys the query can see); 1 is uniform
  attention, 0 is all weight on one token. Queries that see one key are left out.
- ``mean_distance``: mean over queries of sum_k A[q, k] |q - k|, in tokens.
- ``self_attention``: mean over queries of A[q, q].

The patterns are reduced as the forward pass runs; nothing is cached.

Classes (``head_classes``, :mod:`workbench.scores.classes`), read from the same pass: the
most local kind of head, ``previous-token`` (its weight on the previous token against its
total weight on the tokens 2-4 back), and the most focused, ``sink`` (Gu et al. 2024: alpha_1,
the mean weight on the first position, above ``sink_eps``), each also against uniform
attention, at the false-discovery rate ``fdr`` over the model's heads.

Example:
    workbench run head-overview --model smollm2 --set prompt_set=natural
    python -m experiments.head_overview --model minilm
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from experiments.head_overview.tables import TABLES
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.prompts import Prompt, check_prompt_set, load_prompt_set
from workbench.models.base import Model, Tokenizing
from workbench.scores import classes, metrics
from workbench.scores.heads import score_and_classify
from workbench.store.schema import with_layer_types

REDUCTIONS = metrics.reductions("entropy", "normalized_entropy", "mean_distance",
                                "self_attention")
CLASSED = metrics.reductions("previous_token", "first_token")
"""Scored in the same pass for the classes only (not stored in head_scores)."""


@dataclass(frozen=True)
class Config:
    prompt_set: str = param("natural", "prompt set to score on")
    sink_eps: float = param(classes.SINK_EPS, "the sink class's threshold on alpha_1 (Gu et "
                            "al. 2024: 0.3)", min=0.0, max=1.0)
    fdr: float = shared("fdr")
    n_null_draws: int = shared("n_null_draws")
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    def __post_init__(self) -> None:
        check_prompt_set(self.prompt_set)
        self.testing()

    def testing(self) -> classes.Testing:
        return classes.Testing(fdr=self.fdr, n_draws=self.n_null_draws, seed=self.seed,
                               eps=self.sink_eps)


@dataclass
class Result:
    head_scores: pd.DataFrame
    per_prompt: pd.DataFrame
    head_classes: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"head_scores": self.head_scores, "per_prompt_scores": self.per_prompt,
                "head_classes": self.head_classes}

    def summary(self) -> list[str]:
        ent = self.head_scores[self.head_scores.metric == "normalized_entropy"]
        focused = ent.nsmallest(3, "score")
        broad = ent.nlargest(3, "score")

        def fmt(df: pd.DataFrame) -> str:
            return ", ".join(f"L{r.layer}H{r.head} ({r.score:.2f})" for r in df.itertuples())

        return [f"most focused heads (normalized entropy): {fmt(focused)}",
                f"broadest heads (normalized entropy): {fmt(broad)}",
                *(classes.summary_line(self.head_classes, name)
                  for name in self.head_classes.head_class.unique())]


def inputs(cfg: Config, model: Tokenizing) -> Mapping[str, Sequence[Prompt]]:
    """The prompts the run batches, for the check of a resample head mask before the
    model loads (:attr:`workbench.harness.experiment.Experiment.inputs`)."""
    return {f"prompt set {cfg.prompt_set}": load_prompt_set(cfg.prompt_set, model)}


@experiment("head-overview", config=Config, tables=TABLES, inputs=inputs)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Entropy, distance and self-attention of every head on a prompt set."""
    prompts = load_prompt_set(cfg.prompt_set, model)
    scored = score_and_classify(model, prompts, REDUCTIONS | CLASSED, inputs=cfg.prompt_set,
                                testing=cfg.testing(), n_boot=cfg.n_boot, seed=cfg.seed,
                                max_batch_tokens=cfg.max_batch_tokens)
    per_prompt = scored.per_prompt[scored.per_prompt.metric.isin(list(REDUCTIONS))]
    head_scores = scored.head_scores[scored.head_scores.metric.isin(list(REDUCTIONS))]
    return Result(with_layer_types(head_scores.drop(columns=["null", "inputs"])
                                   .reset_index(drop=True), model.info.layer_types),
                  per_prompt.reset_index(drop=True), scored.head_classes)
