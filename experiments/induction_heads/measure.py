"""What the induction-heads experiment measures: head scores, repeat losses, the
K-composition ablation and the in-context-learning score."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from experiments.induction_heads.tables import PATH_PATCH
from workbench.core import progress
from workbench.core.errors import ModelCapabilityError
from workbench.inputs.corpus import python_docs, token_chunks
from workbench.inputs.prompts import Prompt, load_prompt_set, random_token_ids, tokens_digest
from workbench.interventions import replay
from workbench.interventions.ablation import Head, ablated, random_same_layer
from workbench.interventions.masks import head_means
from workbench.interventions.paths import path_removed, read_points
from workbench.models.base import Model
from workbench.recording.reductions import reduce_patterns
from workbench.scores import classes, metrics
from workbench.scores.heads import (
    copying_scores,
    score_and_classify,
    scores_by_prompt,
    summarize_tokens,
    tokens_by_prompt,
    top_heads,
)
from workbench.scores.losses import repeat_losses, token_losses
from workbench.scores.qk_attribution import require_pre_norm
from workbench.scores.stats import bootstrap_mean_ci
from workbench.store.schema import with_layer_types

if TYPE_CHECKING:
    from experiments.induction_heads import Config

log = logging.getLogger(__name__)


@dataclass
class Result:
    head_scores: pd.DataFrame
    repeat_loss: pd.DataFrame
    ablation: pd.DataFrame
    icl: pd.DataFrame
    loss_by_position: pd.DataFrame
    path_patch: pd.DataFrame | None = None
    head_classes: pd.DataFrame | None = None
    by_prompt: dict[str, pd.DataFrame] = field(default_factory=dict)
    """The per-prompt tables (``repeat_loss_by_prompt``, ``icl_by_prompt``,
    ``loss_by_prompt``) by name."""

    def tables(self) -> dict[str, pd.DataFrame]:
        out = {"head_scores": self.head_scores, "repeat_loss": self.repeat_loss,
               "ablation": self.ablation, "icl": self.icl,
               "loss_by_position": self.loss_by_position}
        if self.path_patch is not None:
            out["path_patch"] = self.path_patch
        if self.head_classes is not None:
            out["head_classes"] = self.head_classes
        return {**out, **self.by_prompt}

    def summary(self) -> list[str]:
        top = self.head_scores[self.head_scores.metric == "induction"].nlargest(3, "score")
        lines = ["top induction heads: " + ", ".join(
            f"L{r.layer}H{r.head} {r.score:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
            for r in top.itertuples()) + f" (uniform null {top.null.iloc[0]:.3f}; Olsson's "
            f"second-repeat score)"]
        pooled = self.head_scores[self.head_scores.metric == "induction_pooled"]
        if len(pooled):
            best = pooled.nlargest(3, "score")
            lines.append("top induction_pooled heads (every repeat): " + ", ".join(
                f"L{r.layer}H{r.head} {r.score:.2f}" for r in best.itertuples()))
        if self.head_classes is not None:
            lines += [classes.summary_line(self.head_classes, name)
                      for name in self.head_classes.head_class.unique()]
        lines.append("loss by repeat: " + ", ".join(
            f"#{r.repeat} {r.loss:.2f}" for r in self.repeat_loss.itertuples()))
        for kind in ("zero", "mean"):
            lines.append(_ablation_line(self.ablation, kind))
        if self.path_patch is not None and len(self.path_patch):
            lines += [_path_line(self.path_patch, path) for path, _ in PATHS]
        for icl in self.icl.itertuples():
            if icl.definition.startswith("n/a"):
                lines.append(f"{icl.metric}: {icl.definition}")
                continue
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


def _path_line(table: pd.DataFrame, path: str) -> str:
    clean = table[table.condition == "clean"].iloc[0]
    prev = table[(table.condition == "previous-token") & (table.path == path)].iloc[0]
    rand = table[(table.condition == "random") & (table.path == path)]
    as_low = int((rand.induction_tracked <= prev.induction_tracked).sum())
    return (f"{prev.heads} removed from the {path} input only: tracked induction score "
            f"{clean.induction_tracked:.2f} -> {prev.induction_tracked:.2f} (random same-layer "
            f"heads: {rand.induction_tracked.mean():.2f}, as low in {as_low}/{len(rand)} "
            f"draws); second-repeat loss "
            f"{clean.second_repeat_loss:.2f} -> {prev.second_repeat_loss:.2f}")


# ---- head scores -------------------------------------------------------------------------

COPYING_INPUTS = "random tokens (direct path)"

def head_score_table(model: Model, repeated: Sequence[Prompt], natural: Sequence[Prompt],
                     cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """induction (Olsson et al.'s second-repeat score) and induction_pooled on the
    repeated sequences, copying on random tokens, previous_token on natural text; the
    induction and previous-token classes (the shuffled-repeat twins batched with the
    repeated sequences); and the ``head_scores_by_prompt`` rows of every metric (copying's
    "prompts" are its single random tokens)."""
    common = {"n_boot": cfg.n_boot, "seed": cfg.seed, "max_batch_tokens": cfg.max_batch_tokens,
              "testing": classes.Testing(fdr=cfg.fdr, n_draws=cfg.n_null_draws, seed=cfg.seed)}
    gen = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.tensor(random_token_ids(model, cfg.copying_tokens, gen))
    induction = score_and_classify(model, repeated,
                                   metrics.reductions("induction", "induction_pooled"),
                                   inputs="repeated random tokens",
                                   repeats=(cfg.seq_len, cfg.repeats), **common)
    previous = score_and_classify(model, natural, metrics.reductions("previous_token"),
                                  inputs="natural text", **common)
    copying = copying_scores(model, tokens)
    scores = with_layer_types(pd.concat([
        induction.head_scores,
        summarize_tokens(copying, "copying", null=0.0, inputs=COPYING_INPUTS,
                         n_boot=cfg.n_boot, seed=cfg.seed),
        previous.head_scores,
    ], ignore_index=True), model.info.layer_types)
    by_prompt = pd.concat([
        scores_by_prompt(induction.per_prompt, repeated, "repeated random tokens"),
        tokens_by_prompt(copying, "copying", tokens, inputs=COPYING_INPUTS),
        scores_by_prompt(previous.per_prompt, natural, "natural text")], ignore_index=True)
    return scores, pd.concat([induction.head_classes, previous.head_classes],
                             ignore_index=True), by_prompt


def repeat_loss_table(losses: np.ndarray, cfg: Config) -> pd.DataFrame:
    """Mean loss per repeat, with a bootstrap interval over prompts, from ``[prompt,
    repeat]`` losses."""
    low, high = bootstrap_mean_ci(losses, n_boot=cfg.n_boot, seed=cfg.seed)
    return pd.DataFrame({"repeat": np.arange(1, losses.shape[1] + 1),
                         "loss": losses.mean(0), "ci_low": low, "ci_high": high,
                         "n_prompts": losses.shape[0]})


def repeat_loss_prompts(losses: np.ndarray, prompts: Sequence[Prompt]) -> pd.DataFrame:
    """The ``repeat_loss_by_prompt`` rows: each prompt's loss on each repeat, from
    ``[prompt, repeat]`` losses."""
    n_prompts, n_repeats = losses.shape
    return pd.DataFrame({
        "prompt": np.repeat(np.arange(n_prompts), n_repeats),
        "tokens": np.repeat([tokens_digest(p) for p in prompts], n_repeats),
        "repeat": np.tile(np.arange(1, n_repeats + 1), n_prompts),
        "loss": losses.reshape(-1).astype(float)})


# ---- K-composition ablation --------------------------------------------------------------

def _tracked_score(model: Model, prompts: Sequence[Prompt], tracked: list[Head], cfg: Config
                   ) -> float:
    """Mean ``induction`` (Olsson) score of the tracked heads (the pass stops after the
    deepest of their layers)."""
    layers = sorted({layer for layer, _ in tracked})
    per_prompt = reduce_patterns(model, prompts, metrics.reductions("induction"),
                                 max_batch_tokens=cfg.max_batch_tokens, layers=layers,
                                 desc="induction")
    keep = per_prompt.set_index(["layer", "head"]).index.isin(tracked)
    return float(per_prompt[keep].groupby(["layer", "head"]).score.mean().mean())


def _tracked(model: Model, prompts: Sequence[Prompt], tracked: list[Head], cfg: Config
             ) -> tuple[float, np.ndarray]:
    """Mean ``induction`` (Olsson) score of the tracked heads, and ``[prompt, 2]`` losses
    on the first two repeats.

    The losses are read from the prompts cut after their second repeat: a causal model's
    loss on a token sees only the tokens before it, so the cut pass gives the same losses
    there, and the later repeats (a third of the tokens with the default three) are not
    run through the model and its unembedding at all.
    """
    induction = _tracked_score(model, prompts, tracked, cfg)
    start, cut = first_repeats(prompts, cfg.seq_len, cfg.repeats, keep=2)
    losses = token_losses(model, cut, max_batch_tokens=1024)
    return induction, repeat_losses(losses, cfg.seq_len, 2, start=start)


def first_repeats(prompts: Sequence[Prompt], seq_len: int, repeats: int, *, keep: int
                  ) -> tuple[int, list[Prompt]]:
    """Repeated-random prompts cut after their first ``keep`` repeats, and the position of
    the first repeat's first token (1 after a BOS token, 0 without one)."""
    lengths = sorted({len(p.token_ids or ()) for p in prompts})
    start = lengths[0] - seq_len * repeats if len(lengths) == 1 else -1
    if start not in (0, 1):
        raise ValueError(f"not {repeats} repeats of {seq_len} tokens after at most a BOS "
                         f"token: prompt lengths {lengths}")
    end = start + keep * seq_len
    return start, [replace(p, token_ids=p.token_ids[:end]) for p in prompts]


def choose_ablation(head_scores: pd.DataFrame, tracked: list[Head], k: int) -> list[Head]:
    """Top previous-token heads that can feed a tracked induction head (earlier layer)."""
    deepest = max(layer for layer, _ in tracked)
    prev = head_scores[(head_scores.metric == "previous_token") & (head_scores.layer < deepest)]
    return top_heads(prev, "previous_token", k, exclude=tracked)


def _labels(heads: Sequence[Head]) -> str:
    return " ".join(f"L{layer}H{h}" for layer, h in heads)


def within_context(model: Model, prompts: Sequence[Prompt]) -> list[Prompt]:
    """``prompts``, each one longer than the model's context cut to its first ``n_ctx``
    tokens (BOS included), so that a short-context model gets the same reference text."""
    out = []
    for prompt in prompts:
        ids = model.frame(model.tokenizer(prompt.text, add_special_tokens=False)["input_ids"])
        fits = len(ids) <= model.info.n_ctx
        out.append(prompt if fits else
                   Prompt(token_ids=tuple(ids[:model.info.n_ctx]), label=prompt.label))
    return out


def ablation_table(model: Model, prompts: Sequence[Prompt], head_scores: pd.DataFrame,
                   losses: np.ndarray, cfg: Config) -> pd.DataFrame:
    """Clean, previous-token-ablated and random-ablated measurements; the tracked heads
    are the top ``induction`` (Olsson) heads, scored by ``induction`` again.

    The clean row is not measured again: its score and losses are those of
    ``head_scores`` and of the ``[prompt, repeat]`` ``losses``, measured on the same
    ``prompts`` (the same numbers within float round-off)."""
    tracked = top_heads(head_scores, "induction", cfg.n_track)
    chosen = choose_ablation(head_scores, tracked, cfg.n_ablate)
    means = head_means(model, within_context(model, load_prompt_set("natural", model)))
    rng = random.Random(cfg.seed)
    draws = [random_same_layer(chosen, tracked, model.info.n_heads, rng)
             for _ in range(cfg.n_random)]
    scored = head_scores[head_scores.metric == "induction"].set_index(["layer", "head"])
    rows = [{"condition": "clean", "kind": "none", "draw": -1,
             **_row([], tracked, float(scored.score.loc[tracked].mean()), losses)}]
    conditions: list[tuple[str, str, int, list[Head]]] = []
    for kind in ("zero", "mean"):
        conditions.append(("previous-token", kind, -1, chosen))
        conditions += [("random", kind, i, heads) for i, heads in enumerate(draws)]
    for condition, kind, draw, heads in progress.track(conditions, desc="conditions"):
        with ablated(model, heads, kind="mean" if kind == "mean" else "zero", means=means):
            rows.append({"condition": condition, "kind": kind, "draw": draw,
                         **_measured(model, prompts, heads, tracked, cfg)})
    return pd.DataFrame(rows)


def _measured(model: Model, prompts: Sequence[Prompt], heads: list[Head], tracked: list[Head],
              cfg: Config, *, losses: bool = True) -> dict:
    """One condition's row: the heads removed, the tracked heads' mean induction score and
    the loss on the first two repeats (NaN without ``losses``: the full forward pass with
    the unembedding costs several times the score, which stops at the tracked layers)."""
    if losses:
        return _row(heads, tracked, *_tracked(model, prompts, tracked, cfg))
    return _row(heads, tracked, _tracked_score(model, prompts, tracked, cfg), None)


def _row(heads: list[Head], tracked: list[Head], induction: float,
         by_repeat: np.ndarray | None) -> dict:
    """A condition's row from the tracked heads' mean induction score and the ``[prompt,
    repeat]`` losses (``None``: not measured)."""
    first, second = ((np.nan, np.nan) if by_repeat is None else
                     (float(by_repeat[:, 0].mean()), float(by_repeat[:, 1].mean())))
    return {"heads": _labels(heads) or "-", "tracked": _labels(tracked),
            "induction_tracked": induction, "first_repeat_loss": first,
            "second_repeat_loss": second}


# ---- K-composition, path-specific: the path patch into Q, K or V only --------------------

PATHS = (("key", "k"), ("query", "q"), ("value", "v"))


def path_patch_table(model: Model, prompts: Sequence[Prompt], head_scores: pd.DataFrame,
                     cfg: Config) -> pd.DataFrame:
    """The ablation's previous-token heads removed from only the key, only the query or
    only the value input of the tracked induction heads
    (:func:`workbench.interventions.paths.path_removed`), against ``n_path_random`` draws of
    random same-layer heads removed the same way; the rest of the model still sees them.
    Empty for a model the linearised patch does not apply to (post-norm)."""
    try:
        require_pre_norm(model)
    except ModelCapabilityError as exc:
        log.warning("no path patch: %s", exc)
        return PATH_PATCH.empty()
    tracked = top_heads(head_scores, "induction", cfg.n_track)
    chosen = choose_ablation(head_scores, tracked, cfg.n_ablate)
    rng = random.Random(cfg.seed + 1)  # not the ablation's draws: an independent control
    draws = [random_same_layer(chosen, tracked, model.info.n_heads, rng)
             for _ in range(cfg.n_path_random)]
    conditions: list[tuple[str, str, int, list[Head]]] = []
    for path, _ in PATHS:
        conditions.append(("previous-token", path, -1, chosen))
        conditions += [("random", path, i, heads) for i, heads in enumerate(draws)]
    letter = dict(PATHS)
    # every patch is at a tracked layer: the blocks below the lowest run once, on the clean
    # pass, and are replayed after it, their sources' outputs (and the pass's start) too
    upto = min(layer for layer, _ in tracked)
    source_layers = sorted({layer for heads in (chosen, *draws) for layer, _ in heads})
    kept = read_points(model, [la for la in source_layers if la < upto])
    rows = []
    with replay.kept(model.bridge, kept) as prefix:
        rows.append({"condition": "clean", "path": "none", "draw": -1,
                     **_measured(model, prompts, [], tracked, cfg)})
    for condition, path, draw, heads in progress.track(conditions, desc="path patch"):
        patch = path_removed(model, [f"L{la}H{h}" for la, h in heads], tracked, letter[path])
        with replay.replayed(model.bridge, prefix, upto), patch:
            rows.append({"condition": condition, "path": path, "draw": draw,
                         **_measured(model, prompts, heads, tracked, cfg,
                                     losses=condition != "random")})
    return pd.DataFrame(rows)


# ---- in-context learning -----------------------------------------------------------------

def _bands(losses: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Each window's mean loss at positions ``50 +- w`` and ``500 +- w``, from ``[prompt,
    position - 1]`` per-token losses (entry t - 1 of a loss vector is the loss on the token
    at position t)."""
    return losses[:, 50 - w - 1: 50 + w].mean(1), losses[:, 500 - w - 1: 500 + w].mean(1)


ESTIMATORS = (("icl_score", False), ("icl_score_window", True))
"""The two ICL estimators: the single tokens, and the bands of ``icl_halfwidth``."""


def icl_rows(losses: np.ndarray, halfwidth: int, *, n_boot: int, seed: int) -> pd.DataFrame:
    """ICL scores from ``[prompt, position - 1]`` per-token losses (both estimators)."""
    rows = []
    for metric, banded in ESTIMATORS:
        w = halfwidth if banded else 0
        early, late = _bands(losses, w)
        diff = late - early
        low, high = bootstrap_mean_ci(diff[:, None], n_boot=n_boot, seed=seed)
        rows.append({"metric": metric, "value": float(diff.mean()), "ci_low": float(low[0]),
                     "ci_high": float(high[0]), "loss_at_50": float(early.mean()),
                     "loss_at_500": float(late.mean()), "n_prompts": len(diff),
                     "definition": "loss@500 - loss@50" if w == 0 else
                     f"mean loss@500+-{w} - mean loss@50+-{w}"})
    return pd.DataFrame(rows)


def icl_prompt_rows(losses: np.ndarray, halfwidth: int, digests: Sequence[str], *,
                    applies: bool = True) -> pd.DataFrame:
    """The ``icl_by_prompt`` rows: each window's score by both estimators (NaN where the
    score does not apply: the context is too short)."""
    frames = []
    for metric, banded in ESTIMATORS:
        if applies:
            early, late = _bands(losses, halfwidth if banded else 0)
        else:
            early = late = np.full(len(losses), np.nan)
        frames.append(pd.DataFrame({
            "prompt": np.arange(len(losses)), "tokens": list(digests), "metric": metric,
            "value": late - early, "loss_at_50": early, "loss_at_500": late}))
    return pd.concat(frames, ignore_index=True)


def loss_prompt_rows(losses: np.ndarray, digests: Sequence[str]) -> pd.DataFrame:
    """The ``loss_by_prompt`` rows from ``[prompt, position - 1]`` per-token losses."""
    n_prompts, n_positions = losses.shape
    return pd.DataFrame({
        "prompt": np.repeat(np.arange(n_prompts), n_positions),
        "tokens": np.repeat(list(digests), n_positions),
        "position": np.tile(np.arange(1, n_positions + 1), n_prompts),
        "loss": losses.reshape(-1).astype(float)})


def icl_tables(model: Model, cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame,
                                                   dict[str, pd.DataFrame]]:
    """The in-context-learning scores, the mean loss at every position, and the
    per-prompt tables of both (``icl_by_prompt``, ``loss_by_prompt``)."""
    windows = token_chunks(model, python_docs(), n_chunks=cfg.icl_prompts,
                           n_tokens=min(cfg.icl_tokens, model.info.n_ctx), label="docs")
    losses = torch.stack(token_losses(model, windows, desc="icl loss")).numpy()  # [P, T-1]
    by_pos = pd.DataFrame({"position": np.arange(1, losses.shape[1] + 1),
                           "loss": losses.mean(0)})
    digests = [tokens_digest(w) for w in windows]
    why = icl_not_applicable(model.info.name, losses.shape[1] + 1, cfg.icl_halfwidth)
    by_prompt = {"icl_by_prompt": icl_prompt_rows(losses, cfg.icl_halfwidth, digests,
                                                  applies=why is None),
                 "loss_by_prompt": loss_prompt_rows(losses, digests)}
    if why:
        return icl_unavailable(why, len(losses)), by_pos, by_prompt
    return (icl_rows(losses, cfg.icl_halfwidth, n_boot=cfg.n_boot, seed=cfg.seed), by_pos,
            by_prompt)


def icl_not_applicable(name: str, n_tokens: int, halfwidth: int) -> str | None:
    """Why Olsson's ICL score (loss at token 500 minus at 50) cannot be read from windows of
    ``n_tokens`` tokens, or ``None``. The positions are the definition's, so a shorter
    context gets no score rather than one at other positions under the same name."""
    if n_tokens > 500 + halfwidth:
        return None
    return (f"n/a: {name} sees {n_tokens} tokens, and the score reads position "
            f"500 + {halfwidth}")


def icl_unavailable(why: str, n_prompts: int) -> pd.DataFrame:
    """The ``icl`` table of a model whose context is too short: NaN scores, and why."""
    nan = float("nan")
    return pd.DataFrame([{"metric": metric, "value": nan, "ci_low": nan, "ci_high": nan,
                          "loss_at_50": nan, "loss_at_500": nan, "n_prompts": n_prompts,
                          "definition": why} for metric in ("icl_score", "icl_score_window")])
