"""Induction heads: which heads complete repeated patterns, and is the circuit causal?

An induction head attends from a token to whatever followed that token's earlier
occurrence and copies it, so that ``[A][B] ... [A]`` predicts ``[B]`` (Olsson et al. 2022,
"In-context Learning and Induction Heads"; Elhage et al. 2021, "A Mathematical Framework
for Transformer Circuits"). It needs a previous-token head in an earlier layer, whose
output its keys read (K-composition). GPT-2 small's induction heads 5.1, 5.5, 6.9, 7.2 and
7.10 are the classic reference. The protocol needs a causal model: on a bidirectional
encoder every position already sees the answer, so the experiment refuses encoders.

Head scores (``head_scores.parquet``), each with a 95% bootstrap interval and a null:

- ``induction`` (prefix matching, Olsson et al. 2022): on ``n_prompts`` sequences of
  ``seq_len`` random tokens (drawn from the middle 80% of the vocabulary, which excludes
  the most and least frequent ids) repeated ``repeats`` times after BOS, the weight each
  query puts on the tokens that followed earlier occurrences of its own token, averaged
  over the queries that have an earlier occurrence; the BOS column never counts
  (:func:`workbench.patterns.induction`). Null: the same score for uniform attention.
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
  layers below the deepest of the ``n_track`` top induction heads are ablated (zero and
  mean ablation of the head's output, through hooks on ``hook_z``; means over the
  ``natural`` prompt set), and the tracked induction heads' mean score and the
  second-repeat loss are measured again. The control ablates the same number of random
  heads from the same layers (``n_random`` draws; never a chosen or tracked head).
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

The run stores ``example/``: the attention patterns of one repeated sequence, shown by the
dashboard's heads page (the induction stripe is unmistakable).

Example:
    workbench run induction-heads --model smollm2
    workbench run induction-heads --model smollm2 --set n_random=10 --set n_prompts=64
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from workbench.harness.claims import Measurement, claim_check
from workbench.harness.experiment import Context, experiment
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, load_prompt_set, random_token_ids
from workbench.interventions.masks import HeadMask, applied, head_means
from workbench.models.base import Model
from workbench.recording.record import record
from workbench.recording.reductions import reduce_patterns
from workbench.scores import patterns
from workbench.scores.heads import copying_scores, score_heads, summarize_tokens, top_heads
from workbench.scores.losses import repeat_losses, token_losses
from workbench.scores.stats import bootstrap_mean_ci
from workbench.store.runs import Run

Heads = list[tuple[int, int]]


@dataclass(frozen=True)
class Config:
    n_prompts: int = field(default=32, metadata={"help": "repeated random sequences"})
    seq_len: int = field(default=40, metadata={"help": "tokens per random sequence"})
    repeats: int = field(default=3, metadata={"help": "times each sequence is repeated"})
    n_natural: int = field(default=16, metadata={
        "help": "natural-text windows (128 tokens) for previous_token"})
    n_ablate: int = field(default=3, metadata={"help": "previous-token heads to ablate"})
    n_track: int = field(default=3, metadata={"help": "top induction heads to track"})
    n_random: int = field(default=5, metadata={"help": "random same-layer ablation draws"})
    icl_prompts: int = field(default=96, metadata={"help": "natural-text windows for ICL"})
    icl_tokens: int = field(default=512, metadata={"help": "tokens per ICL window (> 500)"})
    icl_halfwidth: int = field(default=10, metadata={
        "help": "icl_score_window averages positions 50 +- this and 500 +- this"})
    copying_tokens: int = field(default=200, metadata={"help": "tokens for the copying score"})
    n_boot: int = field(default=1000, metadata={"help": "bootstrap resamples"})
    seed: int = field(default=0, metadata={"help": "seed for tokens, draws and bootstrap"})
    max_batch_tokens: int = field(default=2048, metadata={"help": "tokens per forward batch"})

    def __post_init__(self) -> None:
        if self.repeats < 2 or self.seq_len < 2:
            raise ValueError("repeats and seq_len must be at least 2")
        if self.icl_tokens <= 500 + self.icl_halfwidth:
            raise ValueError("icl_tokens must exceed 500 + icl_halfwidth (the score reads "
                             "position 500)")
        if not 0 <= self.icl_halfwidth <= 40:
            raise ValueError("icl_halfwidth must be in 0..40")
        if min(self.n_prompts, self.n_natural, self.icl_prompts, self.copying_tokens) < 2:
            raise ValueError("n_prompts, n_natural, icl_prompts and copying_tokens must be >= 2")
        if min(self.n_ablate, self.n_track, self.n_random) < 1:
            raise ValueError("n_ablate, n_track and n_random must be >= 1")


@dataclass
class Result:
    head_scores: pd.DataFrame
    repeat_loss: pd.DataFrame
    ablation: pd.DataFrame
    icl: pd.DataFrame
    loss_by_position: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"head_scores": self.head_scores, "repeat_loss": self.repeat_loss,
                "ablation": self.ablation, "icl": self.icl,
                "loss_by_position": self.loss_by_position}

    def summary(self) -> list[str]:
        top = self.head_scores[self.head_scores.metric == "induction"].nlargest(3, "score")
        lines = ["top induction heads: " + ", ".join(
            f"L{r.layer}H{r.head} {r.score:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
            for r in top.itertuples()) + f" (uniform null {top.null.iloc[0]:.3f})"]
        lines.append("loss by repeat: " + ", ".join(
            f"#{r.repeat} {r.loss:.2f}" for r in self.repeat_loss.itertuples()))
        for kind in ("zero", "mean"):
            lines.append(_ablation_line(self.ablation, kind))
        for icl in self.icl.itertuples():
            lines.append(f"{icl.metric} ({icl.definition}): {icl.value:.3f} "
                         f"[{icl.ci_low:.3f}, {icl.ci_high:.3f}] nats")
        return lines


def _ablation_line(table: pd.DataFrame, kind: str) -> str:
    clean = table[table.condition == "clean"].iloc[0]
    prev = table[(table.condition == "previous-token") & (table.kind == kind)].iloc[0]
    rand = table[(table.condition == "random") & (table.kind == kind)]
    return (f"{kind} ablation of {prev.heads}: tracked induction score "
            f"{clean.induction_tracked:.2f} -> {prev.induction_tracked:.2f} "
            f"(random same-layer heads: {rand.induction_tracked.mean():.2f} "
            f"+- {rand.induction_tracked.std(ddof=0):.2f}); second-repeat loss "
            f"{clean.second_repeat_loss:.2f} -> {prev.second_repeat_loss:.2f} "
            f"(random: {rand.second_repeat_loss.mean():.2f})")


def _measure(model: Model, prompts: Sequence[Prompt], tracked: Heads, cfg: Config
             ) -> tuple[float, np.ndarray]:
    """Mean induction score of the tracked heads, and ``[prompt, repeat]`` losses."""
    layers = sorted({layer for layer, _ in tracked})
    per_prompt = reduce_patterns(model, prompts, {"induction": patterns.induction},
                                 max_batch_tokens=cfg.max_batch_tokens, layers=layers,
                                 desc="induction")
    keep = per_prompt.set_index(["layer", "head"]).index.isin(tracked)
    induction = float(per_prompt[keep].groupby(["layer", "head"]).score.mean().mean())
    losses = token_losses(model, prompts, max_batch_tokens=1024)
    return induction, repeat_losses(losses, cfg.seq_len, cfg.repeats)


def choose_ablation(head_scores: pd.DataFrame, tracked: Heads, k: int) -> Heads:
    """Top previous-token heads that can feed a tracked induction head (earlier layer)."""
    deepest = max(layer for layer, _ in tracked)
    prev = head_scores[(head_scores.metric == "previous_token") & (head_scores.layer < deepest)]
    return top_heads(prev, "previous_token", k, exclude=tracked)


def random_same_layer(chosen: Heads, avoid: Heads, n_heads: int, rng: random.Random) -> Heads:
    """One random head from each chosen head's layer, never a chosen or avoided head."""
    picked: Heads = []
    for layer, _ in chosen:
        options = [(layer, h) for h in range(n_heads)
                   if (layer, h) not in chosen and (layer, h) not in avoid
                   and (layer, h) not in picked]
        picked.append(rng.choice(options))
    return picked


def ablation_table(model: Model, prompts: Sequence[Prompt], head_scores: pd.DataFrame,
                   cfg: Config) -> pd.DataFrame:
    """Clean, previous-token-ablated and random-ablated measurements."""
    tracked = top_heads(head_scores, "induction", cfg.n_track)
    chosen = choose_ablation(head_scores, tracked, cfg.n_ablate)
    means = head_means(model, load_prompt_set("natural", model))
    rng = random.Random(cfg.seed)
    draws = [random_same_layer(chosen, tracked, model.info.n_heads, rng)
             for _ in range(cfg.n_random)]
    conditions = [("clean", "none", -1, [])]
    for kind in ("zero", "mean"):
        conditions.append(("previous-token", kind, -1, chosen))
        conditions += [("random", kind, i, heads) for i, heads in enumerate(draws)]
    rows = []
    for condition, kind, draw, heads in conditions:
        mask = HeadMask.for_model(model, ablation="mean" if kind == "mean" else "zero")
        with applied(model, mask.without(heads) if heads else None, means=means):
            induction, losses = _measure(model, prompts, tracked, cfg)
        rows.append({"condition": condition, "kind": kind, "draw": draw,
                     "heads": " ".join(f"L{layer}H{h}" for layer, h in heads) or "-",
                     "tracked": " ".join(f"L{layer}H{h}" for layer, h in tracked),
                     "induction_tracked": induction,
                     "first_repeat_loss": float(losses[:, 0].mean()),
                     "second_repeat_loss": float(losses[:, 1].mean())})
    return pd.DataFrame(rows)


def repeat_loss_table(losses: np.ndarray, cfg: Config) -> pd.DataFrame:
    low, high = bootstrap_mean_ci(losses, n_boot=cfg.n_boot, seed=cfg.seed)
    return pd.DataFrame({"repeat": np.arange(1, losses.shape[1] + 1),
                         "loss": losses.mean(0), "ci_low": low, "ci_high": high,
                         "n_prompts": losses.shape[0]})


def icl_rows(losses: np.ndarray, halfwidth: int, *, n_boot: int, seed: int) -> pd.DataFrame:
    """ICL scores from ``[prompt, position - 1]`` per-token losses (both estimators)."""
    rows = []
    for metric, w in (("icl_score", 0), ("icl_score_window", halfwidth)):
        # entry t - 1 of a loss vector is the loss on the token at position t
        early = losses[:, 50 - w - 1: 50 + w].mean(1)
        late = losses[:, 500 - w - 1: 500 + w].mean(1)
        diff = late - early
        low, high = bootstrap_mean_ci(diff[:, None], n_boot=n_boot, seed=seed)
        rows.append({"metric": metric, "value": float(diff.mean()), "ci_low": float(low[0]),
                     "ci_high": float(high[0]), "loss_at_50": float(early.mean()),
                     "loss_at_500": float(late.mean()), "n_prompts": len(diff),
                     "definition": "loss@500 - loss@50" if w == 0 else
                     f"mean loss@500+-{w} - mean loss@50+-{w}"})
    return pd.DataFrame(rows)


def icl_tables(model: Model, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The in-context-learning scores and the mean loss at every position."""
    windows = token_chunks(model, python_docs(), n_chunks=cfg.icl_prompts,
                           n_tokens=min(cfg.icl_tokens, model.info.n_ctx), label="docs")
    losses = torch.stack(token_losses(model, windows, desc="icl loss")).numpy()  # [P, T-1]
    by_pos = pd.DataFrame({"position": np.arange(1, losses.shape[1] + 1),
                           "loss": losses.mean(0)})
    return icl_rows(losses, cfg.icl_halfwidth, n_boot=cfg.n_boot, seed=cfg.seed), by_pos


@experiment("induction-heads", config=Config, tables=None, requires="causal_lm",
            demo={"n_prompts": 16, "n_random": 3, "icl_prompts": 48, "copying_tokens": 100,
                  "n_boot": 500})
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    workdir = ctx.workdir if ctx else None
    """Induction and copying scores, repeat losses, K-composition ablation and ICL."""
    repeated = load_prompt_set("repeated-random", model, n_prompts=cfg.n_prompts,
                               seq_len=cfg.seq_len, repeats=cfg.repeats, seed=cfg.seed)
    natural = token_chunks(model, python_docs(), n_chunks=cfg.n_natural, n_tokens=128,
                           label="docs")
    common = {"n_boot": cfg.n_boot, "seed": cfg.seed, "max_batch_tokens": cfg.max_batch_tokens}
    gen = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.tensor(random_token_ids(model, cfg.copying_tokens, gen))
    head_scores = pd.concat([
        score_heads(model, repeated, {"induction": patterns.induction},
                    inputs="repeated random tokens", **common),
        summarize_tokens(copying_scores(model, tokens), "copying", null=0.0,
                         inputs="random tokens (direct path)", n_boot=cfg.n_boot,
                         seed=cfg.seed),
        score_heads(model, natural, {"previous_token": patterns.previous_token},
                    inputs="natural text", **common),
    ], ignore_index=True)
    losses = repeat_losses(token_losses(model, repeated), cfg.seq_len, cfg.repeats)
    ablation = ablation_table(model, repeated, head_scores, cfg)
    icl, by_pos = icl_tables(model, cfg)
    if workdir is not None:
        record(model, repeated[:1], workdir / "example", include_resid=False)
    return Result(head_scores, repeat_loss_table(losses, cfg), ablation, icl, by_pos)


# ---- checks for the claims registry -------------------------------------------------------

@claim_check("second_repeat_loss_ratio_below")
def second_repeat_loss_ratio_below(run: Run, *, ratio: float) -> Measurement:
    """Loss on the second repeat is below ``ratio`` times the loss on the first."""
    table = run.table("repeat_loss").set_index("repeat")
    first, second = table.loc[1], table.loc[2]
    got = second.loss / first.loss
    return Measurement(f"first repeat {first.loss:.2f} nats [{first.ci_low:.2f}, "
                       f"{first.ci_high:.2f}], second {second.loss:.2f} [{second.ci_low:.2f}, "
                       f"{second.ci_high:.2f}]; ratio {got:.3f} (needs < {ratio})",
                       bool(got < ratio), float(got))


@claim_check("icl_score_negative")
def icl_score_negative(run: Run, *, metric: str = "icl_score_window") -> Measurement:
    """The in-context-learning score's 95% interval lies below zero (``metric`` picks the
    estimator; the other one is reported alongside)."""
    table = run.table("icl").set_index("metric")
    icl = table.loc[metric]
    others = "; ".join(f"{name}: {row.value:.3f} [{row.ci_low:.3f}, {row.ci_high:.3f}]"
                       for name, row in table.iterrows() if name != metric)
    return Measurement(f"{icl.definition} = {icl.value:.3f} [{icl.ci_low:.3f}, "
                       f"{icl.ci_high:.3f}] nats ({icl.loss_at_50:.2f} -> {icl.loss_at_500:.2f})"
                       f"; {others}", bool(icl.ci_high < 0), float(icl.value))


@claim_check("previous_token_ablation_beats_random")
def previous_token_ablation_beats_random(run: Run, *, kind: str = "zero") -> Measurement:
    """Ablating the previous-token heads lowers the tracked induction heads' score more
    than every random same-layer draw does."""
    table = run.table("ablation")
    clean = table[table.condition == "clean"].induction_tracked.iloc[0]
    prev = table[(table.condition == "previous-token") & (table.kind == kind)]
    rand = table[(table.condition == "random") & (table.kind == kind)]
    drop_prev = clean - prev.induction_tracked.iloc[0]
    drops = clean - rand.induction_tracked
    return Measurement(
        f"{kind} ablation of {prev.heads.iloc[0]}: tracked induction score drops by "
        f"{drop_prev:.3f}; random same-layer heads: {drops.mean():.3f} on average, at most "
        f"{drops.max():.3f} over {len(drops)} draws", bool(drop_prev > drops.max()),
        float(drop_prev))


if __name__ == "__main__":
    import sys

    from workbench.cli import main

    main(["run", "induction-heads", *sys.argv[1:]])
