"""Induction at distance: how far back can each induction head reach?

Olsson et al. (2022, "In-context Learning and Induction Heads") score an induction head on a
random sequence repeated right after itself, so the earlier copy is always ``seq_len``
tokens back. Here the two occurrences of a random sequence are ``D`` tokens apart, with
natural text between them::

    [BOS] r_0 .. r_{L-1}  (D - L tokens of the Python documentation's prose)  r_0 .. r_{L-1}

and ``D`` runs over a grid up to the model's context. At each ``D`` the run reports:

- every head's Olsson score (table ``distance_scores``): the mean, over the queries of the
  second occurrence, of the weight on the token after the query's first occurrence, which
  is ``D - 1`` positions back: ``mean_j A[s + D + j, s + j + 1]`` (``s`` the first
  position after BOS). With ``D = L`` this is the induction-heads experiment's score on
  two repeats. The target is positional, so a filler token that happens to recur never
  counts; the random tokens are distinct and occur nowhere in the prompt's filler. Each
  score has a 95% bootstrap interval over prompts and the score of attention uniform over
  the keys each query sees (``null``). On a sliding-window layer a query sees only its
  last ``sliding_window`` keys, so from ``D > sliding_window`` on the target is out of
  reach: its score, and its null, are exactly 0;
- the in-context loss drop (table ``distance_losses``): the next-token loss on the first
  occurrence minus the loss on the second (each occurrence's first token left out), with
  an interval over prompts. How much the earlier copy still helps at that distance.

Each prompt's values are kept too (``distance_scores_by_prompt``,
``distance_losses_by_prompt``), so that ``workbench compare`` pairs two runs prompt by
prompt.

Every prompt keeps its random sequence and its filler across the grid (the filler of a
shorter ``D`` is the start of the longer one's), so only the distance changes. Each pass
computes attention one block of query rows at a time (:mod:`workbench.models.blocked`)
and reads the final residual only at the two occurrences, so no length needs ``T x T`` or
``T x vocabulary`` memory. Causal language models only.

Example:
    workbench run induction-distance --model smollm2 --set n_prompts=2 --set max_tokens=2048
    workbench run induction-distance --model gemma3 --set distances=256,512,513,2048
    python -m experiments.induction_distance --model smollm2 --set distances=32,64,128
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from experiments.induction_distance.tables import TABLES
from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.core.values import MAX_PROMPTS, MAX_SEQUENCE
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.batching import Batch
from workbench.inputs.corpus import python_docs
from workbench.inputs.nulls import body_start
from workbench.inputs.prompts import Prompt, random_token_ids, tokens_digest
from workbench.models.base import Model
from workbench.recording import hooks
from workbench.recording.reductions import BlockReduction, PatternContext, query_mean
from workbench.scores.logit_attribution import lens_logits
from workbench.scores.patterns import PerQuery, weight_at
from workbench.scores.stats import bootstrap_mean_ci, summarize
from workbench.store.schema import with_layer_types


@dataclass(frozen=True)
class Config:
    n_prompts: int = param(4, "random sequences, each with its own filler text", min=2,
                           max=MAX_PROMPTS)
    seq_len: int = param(32, "tokens per random sequence (L)", min=2, max=MAX_SEQUENCE)
    distances: tuple[int, ...] = param(
        (), "distances D (each >= seq_len), e.g. 64,512,4096; default: seq_len doubling up "
            "to the longest prompt max_tokens allows, and that longest", min=2,
        max=MAX_SEQUENCE)
    max_tokens: int = param(0, "longest prompt of the default grid, tokens (0: the model's "
                               "context)", min=0, max=MAX_SEQUENCE)
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")


def grid(cfg: Config, frame: int, n_ctx: int) -> list[int]:
    """The distances measured: ``cfg.distances``, or ``seq_len, 2 seq_len, 4 seq_len, ...``
    and the longest ``D`` whose prompt (``frame + D + seq_len`` tokens) fits ``max_tokens``.

    Raises:
        WorkbenchError: a distance below ``seq_len`` (the occurrences would overlap) or one
            whose prompt does not fit the model's context.
    """
    longest = min(cfg.max_tokens or n_ctx, n_ctx) - frame - cfg.seq_len
    if cfg.distances:
        for d in cfg.distances:
            if d < cfg.seq_len:
                raise WorkbenchError(f"distance {d} is below seq_len {cfg.seq_len}: the two "
                                     "occurrences would overlap")
            if d > n_ctx - frame - cfg.seq_len:
                raise WorkbenchError(f"distance {d} needs {frame + d + cfg.seq_len} tokens; "
                                     f"the model's context is {n_ctx}")
        return sorted(set(cfg.distances))
    if longest < cfg.seq_len:
        raise WorkbenchError(f"max_tokens {cfg.max_tokens} leaves no distance of at least "
                             f"seq_len {cfg.seq_len}")
    out, d = [], cfg.seq_len
    while d <= longest:
        out.append(d)
        d *= 2
    return out if out[-1] == longest else [*out, longest]


@dataclass(frozen=True)
class Sequences:
    """Each prompt's random sequence and the filler text its distances cut from."""

    random: list[list[int]]
    filler: list[list[int]]

    def prompt(self, model: Model, index: int, distance: int) -> Prompt:
        """Prompt ``index`` with its occurrences ``distance`` apart."""
        seq = self.random[index]
        body = [*seq, *self.filler[index][:distance - len(seq)], *seq]
        return Prompt(token_ids=tuple(model.frame(body)), label=f"distance-{distance}[{index}]")


def sequences(model: Model, cfg: Config, longest: int) -> Sequences:
    """``n_prompts`` random sequences and fillers of ``longest - seq_len`` tokens: windows
    of the Python documentation's prose (taken from ``n_prompts`` evenly spaced starts,
    round the end when the text is shorter), each sequence of distinct tokens that occur
    nowhere in its filler."""
    text = "\n\n".join(python_docs())
    stream = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(model.tokenizer.all_special_ids)
    stream = [t for t in stream if t not in special]
    need = max(longest - cfg.seq_len, 0)
    gen = torch.Generator().manual_seed(cfg.seed)
    random, filler = [], []
    for i in range(cfg.n_prompts):
        start = i * len(stream) // cfg.n_prompts
        part = [stream[(start + k) % len(stream)] for k in range(need)]
        used, seq = set(part), []
        while len(seq) < cfg.seq_len:
            for token in random_token_ids(model, cfg.seq_len, gen):
                if token not in used and len(seq) < cfg.seq_len:
                    used.add(token)
                    seq.append(token)
        random.append(seq)
        filler.append(part)
    return Sequences(random, filler)


def induction_at(distance: int, seq_len: int, start: int) -> BlockReduction:
    """Olsson's score with the earlier occurrence ``distance`` back: each query of the
    second occurrence (positions ``start + distance .. + seq_len - 1``) reads its weight
    ``distance - 1`` keys back."""

    @query_mean
    def induction_at_distance(pattern: torch.Tensor, ctx: PatternContext) -> PerQuery:
        first = start + distance
        second = (ctx.queries >= first) & (ctx.queries < first + seq_len)
        return weight_at(pattern, ctx, 1 - distance), ctx.real_queries & second[None, :]

    return induction_at_distance


def uniform_null(model: Model, distance: int, seq_len: int, start: int) -> list[float]:
    """Per layer, the score of attention uniform over the keys each query sees."""
    queries = np.arange(start + distance, start + distance + seq_len)
    window = model.info.sliding_window
    out = []
    for kind in model.info.layer_types:
        if kind == "sliding" and window is not None:
            seen = np.minimum(queries + 1, window) if distance <= window else np.inf
        else:
            seen = queries + 1
        out.append(float(np.mean(1.0 / seen)))
    return out


@dataclass(frozen=True)
class Pass:
    """One batch's head scores and occurrence losses."""

    scores: torch.Tensor
    """``[batch, layer, head]``"""
    first_loss: torch.Tensor
    """``[batch]``"""
    second_loss: torch.Tensor


def measure(model: Model, batch: Batch, distance: int, seq_len: int) -> Pass:
    """Score every head and the two occurrences' losses in one pass over ``batch``."""
    start, n_layers = body_start(model), model.info.n_layers
    reduction = induction_at(distance, seq_len, start)
    base = PatternContext(input_ids=batch.input_ids, lengths=torch.tensor(batch.lengths),
                          query_mask=batch.attention_mask.bool(), layer=-1, causal=True)
    parts: dict[int, object] = {}

    def consume(block) -> None:
        part = reduction.part(block.weights, base.block(block))
        parts[block.layer] = part if block.layer not in parts else parts[block.layer] + part

    final = hooks.resid(n_layers, n_layers)
    with torch.inference_mode(), hooks.patterns_fed(model, consume):
        resid = hooks.capture(model, batch, [final])[final]
        scores = torch.stack([parts[layer].result() for layer in range(n_layers)], 1)
        steps = torch.arange(seq_len - 1)
        losses = []
        for at in (start, start + distance):
            rows = resid[:, at + steps]  # predicting the tokens at at + 1 .. at + L - 1
            logits = lens_logits(model, rows.reshape(-1, rows.shape[-1]), None).float()
            target = batch.input_ids[:, at + 1 + steps].reshape(-1)
            nll = F.cross_entropy(logits, target, reduction="none")
            losses.append(nll.reshape(len(batch.lengths), -1).mean(-1))
    return Pass(scores.float(), *losses)


@dataclass
class Result:
    distance_scores: pd.DataFrame
    distance_losses: pd.DataFrame
    sliding_window: int | None
    losses_by_prompt: pd.DataFrame | None = None
    """The ``distance_losses_by_prompt`` rows (``None``: not kept)."""
    scores_by_prompt: pd.DataFrame | None = None
    """The ``distance_scores_by_prompt`` rows (``None``: not kept)."""

    def tables(self) -> dict[str, pd.DataFrame]:
        out = {"distance_scores": self.distance_scores,
               "distance_losses": self.distance_losses}
        if self.losses_by_prompt is not None:
            out["distance_losses_by_prompt"] = self.losses_by_prompt
        if self.scores_by_prompt is not None:
            out["distance_scores_by_prompt"] = self.scores_by_prompt
        return out

    def summary(self) -> list[str]:
        scores, losses = self.distance_scores, self.distance_losses
        near, far = int(scores.distance.min()), int(scores.distance.max())
        lines = [f"distances {near} .. {far} ({scores.distance.nunique()} values), "
                 f"{int(scores.n_prompts.max())} prompts"]
        top = scores[scores.distance == near].nlargest(3, "score")
        for r in top.itertuples():
            at_far = scores[(scores.distance == far) & (scores.layer == r.layer)
                            & (scores["head"] == r.head)].score.iloc[0]
            lines.append(f"L{r.layer}H{r.head}: induction {r.score:.3f} at D={near}, "
                         f"{at_far:.3f} at D={far}")
        if self.sliding_window is not None:
            lines += _sliding_lines(scores, self.sliding_window)
        for r in losses[losses.distance.isin([near, far])].itertuples():
            lines.append(f"loss drop at D={r.distance}: {r.drop:.2f} nats "
                         f"[{r.ci_low:.2f}, {r.ci_high:.2f}]")
        return lines


def _sliding_lines(scores: pd.DataFrame, window: int) -> list[str]:
    beyond = scores[scores.distance > window]
    if beyond.empty:
        return [f"no distance beyond the {window}-token window was measured"]
    local = beyond[beyond.layer_type == "sliding"].score.max()
    far = beyond[beyond.layer_type == "global"]
    best = far.loc[far.score.idxmax()] if not far.empty else None
    line = f"beyond the {window}-token window: sliding layers' largest score {local:.3f}"
    if best is not None:
        line += (f"; global layers' best head L{int(best.layer)}H{int(best['head'])} "
                 f"{best.score:.3f} at D={int(best.distance)}")
    return [line]


def _tables(model: Model, cfg: Config, per_prompt: pd.DataFrame, losses: pd.DataFrame
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    start, frames = body_start(model), []
    for distance, part in per_prompt.groupby("distance"):
        table = summarize(part.drop(columns="distance"), n_boot=cfg.n_boot, seed=cfg.seed)
        null = uniform_null(model, int(distance), cfg.seq_len, start)
        table["distance"] = int(distance)
        table["null"] = table.layer.map(lambda layer, null=null: null[int(layer)])
        frames.append(table.drop(columns="metric"))
    scores = with_layer_types(pd.concat(frames, ignore_index=True), model.info.layer_types)
    scores = scores[[c.name for c in TABLES["distance_scores"].columns]]
    rows = []
    for distance, part in losses.groupby("distance"):
        drop = (part.first_loss - part.second_loss).to_numpy()
        low, high = bootstrap_mean_ci(drop[:, None], n_boot=cfg.n_boot, seed=cfg.seed)
        rows.append({"distance": int(distance), "first_loss": part.first_loss.mean(),
                     "second_loss": part.second_loss.mean(), "drop": drop.mean(),
                     "ci_low": float(low[0]), "ci_high": float(high[0]),
                     "n_prompts": len(part)})
    return scores, pd.DataFrame(rows)


def _long(out: Pass, indices: Sequence[int], distance: int) -> tuple[pd.DataFrame, list[dict]]:
    b, n_layers, n_heads = out.scores.shape
    grid_ = np.stack(np.meshgrid(np.arange(b), np.arange(n_layers), np.arange(n_heads),
                                 indexing="ij"), -1).reshape(-1, 3)
    frame = pd.DataFrame({"prompt": np.asarray(indices)[grid_[:, 0]], "layer": grid_[:, 1],
                          "head": grid_[:, 2], "metric": "induction",
                          "score": out.scores.reshape(-1).numpy(), "distance": distance})
    losses = [{"prompt": i, "distance": distance, "first_loss": float(f),
               "second_loss": float(s)}
              for i, f, s in zip(indices, out.first_loss, out.second_loss, strict=True)]
    return frame, losses


MODEL_DEFAULTS = {"gemma3": {"n_prompts": 2}}
"""gemma3's own default: two prompts, to its whole 32,768-token context. The grid's
passes add up to about twice the longest one, and one 32k pass takes close to 3 minutes
on 2 cores, so four prompts took 19 min 6 s and two 9 min 47 s. Over two prompts an
interval is their range, no more (``--set n_prompts=4`` for four)."""


@dataclass(frozen=True)
class Plan:
    """The distances a run measures and the sequences it builds its prompts from."""

    frame: int
    distances: list[int]
    seqs: Sequences


def plan(model: Model, cfg: Config) -> Plan:
    """The model-dependent checks, before a run exists, and the inputs they build.

    Raises:
        WorkbenchError: ``max_tokens`` beyond the model's context, or a grid that cannot
            be measured on it (:func:`grid`).
    """
    if cfg.max_tokens > model.info.n_ctx:
        raise WorkbenchError(f"max_tokens {cfg.max_tokens} is beyond {model.info.name}'s "
                             f"context of {model.info.n_ctx} tokens (0 means the whole "
                             "context)")
    frame = len(model.frame([]))
    distances = grid(cfg, frame, model.info.n_ctx)
    return Plan(frame, distances, sequences(model, cfg, max(distances)))


@experiment("induction-distance", config=Config, tables=TABLES, requires="causal_lm",
            demo={"n_prompts": 2, "max_tokens": 1024, "n_boot": 200},
            demo_models=("smollm2", "gemma3"), model_defaults=MODEL_DEFAULTS, plan=plan)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Every head's induction score, and the loss drop, as the earlier copy moves away."""
    planned = ctx.planned if ctx is not None and ctx.planned is not None else plan(model, cfg)
    frame, distances, seqs = planned.frame, planned.distances, planned.seqs
    frames, losses, digests = [], [], []
    # a step's time grows with its prompts' length: on smollm2 (2 prompts, loaded cores)
    # 4,129 tokens took 6 min 15 s and 8,192 about 10 min, so length is the weight
    weights = [frame + d + cfg.seq_len for d in distances]
    with progress.stages("induction-distance", len(distances), weights) as stage:
        for distance in distances:
            stage(f"D={distance}")
            prompts = [seqs.prompt(model, i, distance) for i in range(cfg.n_prompts)]
            digests += [(i, distance, tokens_digest(p)) for i, p in enumerate(prompts)]
            for batch in progress.track(model.batches(prompts, max_tokens=cfg.max_batch_tokens),
                                        desc=f"scoring D={distance}"):
                part, rows = _long(measure(model, batch, distance, cfg.seq_len),
                                   batch.indices, distance)
                frames.append(part)
                losses += rows
    per_prompt = pd.concat(frames, ignore_index=True)
    scores, loss_table = _tables(model, cfg, per_prompt, pd.DataFrame(losses))
    return Result(scores, loss_table, model.info.sliding_window,
                  losses_by_prompt(pd.DataFrame(losses), digests),
                  scores_by_prompt(per_prompt, digests))


def losses_by_prompt(losses: pd.DataFrame, digests: Sequence[tuple[int, int, str]]
                     ) -> pd.DataFrame:
    """The ``distance_losses_by_prompt`` rows from the ``prompt, distance, first_loss,
    second_loss`` rows and each ``(prompt, distance)``'s token digest."""
    tokens = pd.DataFrame(digests, columns=["prompt", "distance", "tokens"])
    out = losses.merge(tokens, on=["prompt", "distance"], validate="one_to_one")
    out["drop"] = out.first_loss - out.second_loss
    out = out.astype({"prompt": "int64", "distance": "int64"})
    return out[["prompt", "tokens", "distance", "first_loss", "second_loss", "drop"]]


def scores_by_prompt(scores: pd.DataFrame, digests: Sequence[tuple[int, int, str]]
                     ) -> pd.DataFrame:
    """The ``distance_scores_by_prompt`` rows from the ``prompt, layer, head, metric,
    score, distance`` rows of the passes and each ``(prompt, distance)``'s token digest."""
    tokens = pd.DataFrame(digests, columns=["prompt", "distance", "tokens"])
    out = scores.merge(tokens, on=["prompt", "distance"], validate="many_to_one")
    out = out.astype({"prompt": "int64", "distance": "int64", "layer": "int64",
                      "head": "int64", "score": "float64"})
    out = out.sort_values(["distance", "prompt", "layer", "head"], ignore_index=True)
    return out[[c.name for c in TABLES["distance_scores_by_prompt"].columns]]
