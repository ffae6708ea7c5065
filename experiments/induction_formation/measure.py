"""What the induction-formation experiment measures: the probes every checkpoint is
measured on, one model's training with its checkpoint measurements, the phase change
found in its curve, K-composition in the final models, and the result's tables."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from experiments.induction_formation.tables import (
    CHECKPOINTS,
    COMPOSITION,
    COMPOSITION_BY_PROMPT,
    HEAD_SCORES_BY_PROMPT,
    PHASE_CHANGE,
    TRAINING_CURVE_BY_PROMPT,
)
from workbench.inputs.prompts import Prompt, load_prompt_set, random_token_ids, tokens_digest
from workbench.interventions.ablation import ablated
from workbench.models import checkpoints, native
from workbench.models.base import Model
from workbench.recording.capture import head_patterns, pattern_rows
from workbench.scores import metrics, phase_change
from workbench.scores.heads import Scored, score_heads_by_prompt
from workbench.scores.losses import repeat_losses, token_losses
from workbench.store.schema import Table
from workbench.training import data as training_data
from workbench.training import loop

if TYPE_CHECKING:
    from experiments.induction_formation import Config

log = logging.getLogger(__name__)

# induction is Olsson et al.'s second-repeat score; the probes repeat twice, so the pooled
# variant (induction_pooled) would equal it and is not written
REDUCTIONS = metrics.reductions("previous_token", "induction")
INPUTS = "repeated random tokens"
TAG = ["model", "n_layers", "step", "tokens"]


# ---- what is measured at a checkpoint ------------------------------------------------------

@dataclass
class Probes:
    """Fixed inputs every checkpoint of every model is measured on."""

    heldout: Int[Tensor, "window pos"]
    natural: Int[Tensor, "window pos"]
    repeated: list[Prompt]
    display: Prompt
    stream: Int[Tensor, " token"]
    vocab: Model
    """A model without weights that has the run's tokenizer: the random token draws and
    the display tokens need only the vocabulary."""


def make_probes(tokenizer: Any, corpus: training_data.Corpus, cfg: Config) -> Probes:
    """Held-out windows (with and without repeated passages), the repeated random
    sequences and the display sequence."""
    stand_in = native.as_model(None, tokenizer, cfg.model_spec(min(cfg.layers), len(tokenizer)),
                               name="tokenizer")
    stream = training_data.token_stream(tokenizer, corpus.fit)
    heldout_stream = training_data.token_stream(tokenizer, corpus.heldout)

    def windows(repeat_fraction: float) -> Int[Tensor, "window pos"]:
        gen = torch.Generator().manual_seed(10_000 + cfg.seed)
        return training_data.sample_windows(heldout_stream, cfg.heldout_windows, cfg.n_ctx,
                                            bos_id=tokenizer.bos_token_id, generator=gen,
                                            repeat_fraction=repeat_fraction)

    repeated = load_prompt_set("repeated-random", stand_in, n_prompts=cfg.n_repeat_prompts,
                               seq_len=cfg.repeat_len, repeats=2, seed=cfg.seed)
    seq = random_token_ids(stand_in, cfg.pattern_len,
                           torch.Generator().manual_seed(20_000 + cfg.seed))
    display = Prompt(token_ids=(tokenizer.bos_token_id, *seq, *seq), label="display")
    return Probes(windows(cfg.repeat_fraction), windows(0.0), repeated, display, stream,
                  stand_in)


PerProbe = dict[str, np.ndarray]
"""Each probe's value of some ``training_curve`` columns: ``{column: [probe]}``."""


def heldout_metrics(model: Model, windows: Int[Tensor, "window pos"], cfg: Config,
                    prefix: str = "") -> tuple[dict[str, float], PerProbe]:
    """Held-out loss and the ICL score (late minus early; negative = learns in context),
    over the windows and on each window alone (windows of one length: the means of the
    second are the first)."""
    with torch.inference_mode():
        nll = model.bridge(windows, return_type="loss", loss_per_token=True)  # [W, T-1]

    def at(position: int) -> Tensor:  # loss on the token at ``position`` is nll[:, position-1]
        lo, hi = position - cfg.icl_band - 1, position + cfg.icl_band
        return nll[:, lo:hi]

    early, late = at(cfg.icl_early), at(cfg.icl_late)
    mean_early, mean_late = float(early.mean()), float(late.mean())
    each_early, each_late = early.double().mean(-1), late.double().mean(-1)
    return ({f"{prefix}heldout_loss": float(nll.mean()), f"{prefix}loss_early": mean_early,
             f"{prefix}loss_late": mean_late, f"{prefix}icl_score": mean_late - mean_early},
            {f"{prefix}heldout_loss": nll.double().mean(-1).numpy(),
             f"{prefix}loss_early": each_early.numpy(), f"{prefix}loss_late": each_late.numpy(),
             f"{prefix}icl_score": (each_late - each_early).numpy()})


def copy_losses(model: Model, prompts: Sequence[Prompt], repeat_len: int
                ) -> tuple[dict[str, float], PerProbe]:
    """Mean loss on the first and second copy, each without its first token, over the
    prompts and on each prompt alone."""
    each = repeat_losses(token_losses(model, prompts), repeat_len, 2)  # [prompt, copy]
    first, second = each.mean(axis=0)
    return ({"first_repeat_loss": float(first), "second_repeat_loss": float(second)},
            {"first_repeat_loss": each[:, 0], "second_repeat_loss": each[:, 1]})


def probe_digests(probes: Probes) -> list[list[str]]:
    """Each probe's token digest: of the repeated-passage windows, the plain windows and
    the repeated random sequences, in that order."""
    def windows(ids: Tensor) -> list[str]:
        return [tokens_digest(Prompt(token_ids=tuple(row))) for row in ids.tolist()]

    return [windows(probes.heldout), windows(probes.natural),
            [tokens_digest(p) for p in probes.repeated]]


def curve_by_prompt(values: Sequence[PerProbe], digests: Sequence[list[str]]
                    ) -> pd.DataFrame:
    """``prompt, tokens, quantity, value`` rows of one checkpoint's per-probe values, each
    of ``values`` measured on the probes whose digests are the same entry of ``digests``."""
    frames = [pd.DataFrame({"prompt": np.arange(len(each), dtype=np.int64), "tokens": kind,
                            "quantity": quantity, "value": np.asarray(each, dtype=np.float64)})
              for per, kind in zip(values, digests, strict=True)
              for quantity, each in per.items()]
    return pd.concat(frames, ignore_index=True)


def head_scores(model: Model, prompts: Sequence[Prompt], cfg: Config) -> Scored:
    """previous_token and induction of every head, summarised over prompts, with nulls,
    and each prompt's scores."""
    scored = score_heads_by_prompt(model, prompts, REDUCTIONS, inputs=INPUTS,
                                   n_boot=cfg.n_boot, seed=cfg.seed)
    # every score here is on the same probes: the aggregate does not repeat their name
    return Scored(scored.head_scores.drop(columns="inputs"), scored.by_prompt)


@dataclass(frozen=True)
class Checkpoint:
    """What one checkpoint measured."""

    row: dict[str, Any]
    """Its ``training_curve`` row, less the checkpoint's tag."""
    scored: Scored
    patterns: pd.DataFrame
    curve_by_prompt: pd.DataFrame
    """Its ``training_curve_by_prompt`` rows, less the tag."""


def measure(model: Model, probes: Probes, cfg: Config, train_loss: float) -> Checkpoint:
    """One checkpoint: its curve row (with each probe's values), head scores (with each
    prompt's) and display patterns."""
    scored = head_scores(model, probes.repeated, cfg)
    best = scored.head_scores.groupby("metric").score.max()
    measured = [heldout_metrics(model, probes.heldout, cfg),
                heldout_metrics(model, probes.natural, cfg, prefix="natural_"),
                copy_losses(model, probes.repeated, cfg.repeat_len)]
    row = {"train_loss": train_loss, **{k: v for mean, _ in measured for k, v in mean.items()},
           "max_induction": float(best["induction"]),
           "max_previous_token": float(best["previous_token"])}
    return Checkpoint(row, scored, pattern_rows(head_patterns(model, probes.display)),
                      curve_by_prompt([per for _, per in measured], probe_digests(probes)))


# ---- training one model --------------------------------------------------------------------

@dataclass
class Measured:
    """Everything measured on one model across its checkpoints."""

    curve: list[dict[str, Any]] = field(default_factory=list)
    scores: list[pd.DataFrame] = field(default_factory=list)
    by_prompt: list[pd.DataFrame] = field(default_factory=list)
    patterns: list[pd.DataFrame] = field(default_factory=list)
    curve_by_prompt: list[pd.DataFrame] = field(default_factory=list)

    def add(self, tag: dict[str, Any], checkpoint: Checkpoint) -> None:
        self.curve.append({**tag, **checkpoint.row})
        self.scores.append(checkpoint.scored.head_scores.assign(**tag))
        # the per-prompt tables' ``tokens`` is each prompt's digest, not the tokens trained
        within = {k: v for k, v in tag.items() if k != "tokens"}
        self.by_prompt.append(checkpoint.scored.by_prompt.assign(**within))
        self.curve_by_prompt.append(checkpoint.curve_by_prompt.assign(**within))
        self.patterns.append(checkpoint.patterns.assign(**tag))


def train_one(n_layers: int, tokenizer: Any, probes: Probes, cfg: Config,
              workdir: Path | None, extra: dict[str, Any]) -> tuple[Model, Measured]:
    """Train one model, measuring it on the schedule and, in a run folder, checkpointing it.

    Args:
        workdir: the run folder, whose ``tokenizer/`` the checkpoints pair with; ``None``
            saves no checkpoint.
        extra: facts stored with every checkpoint (run id, corpus fingerprint).
    """
    spec = cfg.model_spec(n_layers, len(tokenizer))
    bridge = native.build_bridge(spec, tokenizer)
    model = native.as_model(bridge, tokenizer, spec, name=f"L{n_layers}")
    measured = Measured()

    def on_checkpoint(step: int, train_loss: float) -> None:
        tokens = cfg.tokens(step)
        if workdir is not None:
            checkpoints.save(workdir, bridge, spec, step=step, tokens=tokens, extra=extra)
        checkpoint = measure(model, probes, cfg, train_loss)
        measured.add({"model": f"L{n_layers}", "n_layers": n_layers, "step": step,
                      "tokens": tokens}, checkpoint)
        row = checkpoint.row
        log.info("L%d step %d: heldout %.3f, icl %+.3f, max induction %.2f", n_layers, step,
                 row["heldout_loss"], row["icl_score"], row["max_induction"])

    data = training_data.batches(probes.stream, cfg.batch_size, cfg.n_ctx,
                                 bos_id=tokenizer.bos_token_id, seed=cfg.seed,
                                 repeat_fraction=cfg.repeat_fraction)
    loop.train(bridge, data, cfg.train_spec(), checkpoint_steps=cfg.checkpoint_steps(),
               on_checkpoint=on_checkpoint, desc=f"training L{n_layers}")
    return model, measured


# ---- the phase change and K-composition ------------------------------------------------------

TEXTS = {"": "repeated-passage held-out windows", "natural_": "plain held-out text"}
"""The two kinds of held-out text, by the prefix of their training_curve columns."""


def detect(curve: pd.DataFrame, cfg: Config) -> dict[str, Any]:
    """The phase-change window of one model's curve, and on each kind of held-out text
    (:data:`TEXTS`) the ICL jump and the loss bump, and whether they coincide with it."""
    c = curve.sort_values("step")
    steps = c.step.tolist()
    window = phase_change.rise_window(steps, c.max_induction.tolist(), min_rise=cfg.min_rise)
    row: dict[str, Any] = {
        "detected": window is not None,
        "induction_initial": float(c.max_induction.iloc[0]),
        "induction_final": float(c.max_induction.iloc[-1]),
        "first_repeat_final": float(c.first_repeat_loss.iloc[-1]),
        "second_repeat_final": float(c.second_repeat_loss.iloc[-1]),
    }
    if window is not None:
        row.update({
            "start_step": window.start_step, "end_step": window.end_step,
            "mid_step": window.mid_step, "start_tokens": cfg.tokens(window.start_step),
            "end_tokens": cfg.tokens(window.end_step),
            "mid_tokens": cfg.tokens(window.mid_step),
            "induction_before": window.base, "induction_after": window.peak,
        })
    for prefix in TEXTS:
        row.update(_signals(c, window, cfg, prefix))
    return row


def _signals(c: pd.DataFrame, window: phase_change.Window | None, cfg: Config,
             prefix: str) -> dict[str, Any]:
    """The ICL jump and the loss bump on one kind of held-out text (columns ``prefix*``)."""
    steps, tokens = c.step.tolist(), c.tokens.tolist()
    icl = c[f"{prefix}icl_score"]
    icl_from, icl_to, icl_rate = phase_change.fastest_drop(steps, icl.tolist())
    row: dict[str, Any] = {
        f"{prefix}icl_jump_start": icl_from, f"{prefix}icl_jump_end": icl_to,
        f"{prefix}icl_jump_per_1000_steps": icl_rate,
        f"{prefix}icl_initial": float(icl.iloc[0]), f"{prefix}icl_final": float(icl.iloc[-1]),
    }
    if window is None:
        return row
    lo, hi = window.widened(cfg.window_slack, steps)
    bump = phase_change.loss_bump(steps, tokens, c[f"{prefix}heldout_loss"].tolist(), lo, hi)
    at = c.set_index("step")
    in_window = lo <= icl_from and icl_to <= hi
    row.update({
        f"{prefix}icl_before": float(at[f"{prefix}icl_score"][lo]),
        f"{prefix}icl_after": float(at[f"{prefix}icl_score"][hi]),
        f"{prefix}icl_jump_in_window": in_window,
        f"{prefix}loss_bump_tested": bump.tested,
        f"{prefix}loss_bump_threshold": bump.threshold,
    })
    if not bump.tested:  # the bump and the coincidence stay missing: not known
        return row
    row.update({
        f"{prefix}loss_bump": bump.present, f"{prefix}loss_bump_step": bump.step,
        f"{prefix}loss_bump_excess": bump.excess, f"{prefix}loss_bump_shift": bump.shift,
        f"{prefix}loss_bump_noise": bump.noise, f"{prefix}loss_bump_z": bump.z,
        f"{prefix}coincide": bool(in_window and bump.present),
    })
    return row


def composition(model: Model, table: pd.DataFrame, prompts: Sequence[Prompt],
                cfg: Config) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Zero-ablate each layer-0 head; the strongest induction head above layer 0 again.
    Returns the ``composition`` rows and each prompt's (``composition_by_prompt``, less
    the model's columns)."""
    ind = table[(table.metric == "induction") & (table.layer > 0)]
    best = ind.loc[ind.score.idxmax()]
    layer, head_, before = int(best["layer"]), int(best["head"]), float(best["score"])
    prev = table[(table.metric == "previous_token") & (table.layer == 0)].set_index("head")
    rows, by_prompt = [], []
    for head in range(model.info.n_heads):
        with ablated(model, [(0, head)]):
            scored = head_scores(model, prompts, cfg)

        def target(frame: pd.DataFrame) -> pd.DataFrame:
            return frame[(frame.metric == "induction") & (frame.layer == layer)
                         & (frame["head"] == head_)]

        hit = target(scored.head_scores).score.iloc[0]
        rows.append({"ablated_layer": 0, "ablated_head": head,
                     "ablated_previous_token": float(prev.score[head]),
                     "target_layer": layer, "target_head": head_,
                     "induction_before": before, "induction_after": float(hit)})
        by_prompt.append(target(scored.by_prompt)[["prompt", "tokens", "score"]].assign(
            ablated_head=head, target_layer=layer, target_head=head_))
    each = pd.concat(by_prompt, ignore_index=True).rename(columns={"score": "induction_after"})
    return pd.DataFrame(rows), each


# ---- result ----------------------------------------------------------------------------------

@dataclass
class Result:
    training_curve: pd.DataFrame
    head_scores: pd.DataFrame
    phase_change: pd.DataFrame
    checkpoint_patterns: pd.DataFrame
    pattern_tokens: pd.DataFrame
    checkpoints: pd.DataFrame
    composition: pd.DataFrame
    corpus: pd.DataFrame
    head_scores_by_prompt: pd.DataFrame | None = None
    """Each probe's head scores at every checkpoint (``None``: not kept)."""
    training_curve_by_prompt: pd.DataFrame | None = None
    """Each probe's training-curve values at every checkpoint (``None``: not kept)."""
    composition_by_prompt: pd.DataFrame | None = None
    """Each probe's induction score in the composition test (``None``: not kept, or no
    model of two layers or more)."""

    def tables(self) -> dict[str, pd.DataFrame]:
        kept = {"head_scores_by_prompt": self.head_scores_by_prompt,
                "training_curve_by_prompt": self.training_curve_by_prompt,
                "composition_by_prompt": self.composition_by_prompt}
        by_prompt = {name: frame for name, frame in kept.items() if frame is not None}
        return {"training_curve": self.training_curve, "head_scores": self.head_scores,
                **by_prompt,
                "phase_change": self.phase_change,
                "checkpoint_patterns": self.checkpoint_patterns,
                "pattern_tokens": self.pattern_tokens, "checkpoints": self.checkpoints,
                "composition": self.composition, "corpus": self.corpus}

    def summary(self) -> list[str]:
        lines = [_summary_line(r) for r in self.phase_change.itertuples()]
        if not self.composition.empty:
            worst = self.composition.loc[self.composition.induction_after.idxmin()]
            lines.append(
                f"K-composition: ablating L0H{worst.ablated_head} (previous_token "
                f"{worst.ablated_previous_token:.2f}) takes L{worst.target_layer}H"
                f"{worst.target_head}'s induction from {worst.induction_before:.2f} to "
                f"{worst.induction_after:.2f}")
        return lines


def _summary_line(r: Any) -> str:
    repeat = (f"second-repeat loss {r.second_repeat_final:.2f} vs first "
              f"{r.first_repeat_final:.2f}; ICL {r.icl_initial:+.2f} -> {r.icl_final:+.2f}")
    if not r.detected:
        return (f"{r.model}: no phase change (max induction {r.induction_initial:.2f} -> "
                f"{r.induction_final:.2f}); {repeat}")
    signals = "; ".join(f"{text}: {signals_in_words(r, prefix)}"
                        for prefix, text in TEXTS.items())
    return (f"{r.model}: phase change at steps {r.start_step:.0f}-{r.end_step:.0f} "
            f"({r.start_tokens / 1e6:.2f}M-{r.end_tokens / 1e6:.2f}M tokens), max induction "
            f"{r.induction_before:.2f} -> {r.induction_after:.2f}; {signals}; {repeat}")


def signals_in_words(r: Any, prefix: str) -> str:
    """The ICL jump and the loss bump on one kind of text, from a ``phase_change`` row."""
    def get(name: str) -> Any:
        return getattr(r, f"{prefix}{name}")

    jump = (f"ICL jump at {get('icl_jump_start')}-{get('icl_jump_end')} "
            f"({'in' if _true(get('icl_jump_in_window')) else 'not in'} window)")
    if not _true(get("loss_bump_tested")):
        return f"{jump}, loss bump not testable (too few checkpoints around the window)"
    bump = (f"loss bump {'yes' if _true(get('loss_bump')) else 'no'} ({get('loss_bump_z'):.1f} "
            f"noise SDs at step {get('loss_bump_step'):.0f}, needed > "
            f"{get('loss_bump_threshold'):.1f})")
    return f"{jump}, {bump}, {'coincide' if _true(get('coincide')) else 'do not coincide'}"


def _true(value: Any) -> bool:
    """A bool column's value that is present and true (missing reads as not true)."""
    return value is not None and not pd.isna(value) and bool(value)


def result(cfg: Config, corpus: training_data.Corpus, probes: Probes,
           trained: dict[int, Model], measured: dict[int, Measured],
           workdir: Path | None) -> Result:
    """The result's tables from every model's measurements."""
    layers = sorted(measured)
    curve = _first(pd.DataFrame([row for n in layers for row in measured[n].curve]), TAG)
    scores = _first(pd.concat([t for n in layers for t in measured[n].scores],
                              ignore_index=True), [*TAG, "layer", "head", "metric", "score"])
    phase = _typed(pd.DataFrame([{"model": f"L{n}", "n_layers": n,
                                  **detect(curve[curve.n_layers == n], cfg)} for n in layers]),
                   PHASE_CHANGE)
    comp, comp_by_prompt = [], []
    for n in layers if cfg.composition else []:
        if n >= 2:
            final = scores[(scores.n_layers == n) & (scores.step == cfg.steps)]
            rows, each = composition(trained[n], final, probes.repeated, cfg)
            comp.append(rows.assign(model=f"L{n}", n_layers=n))
            comp_by_prompt.append(each.assign(model=f"L{n}", n_layers=n))
    display = list(probes.display.token_ids)
    return Result(
        training_curve=curve,
        head_scores=scores,
        phase_change=phase,
        checkpoint_patterns=_first(pd.concat([t for n in layers for t in measured[n].patterns],
                                             ignore_index=True), TAG),
        pattern_tokens=pd.DataFrame({"position": range(len(display)), "token_id": display,
                                     "token": probes.vocab.str_tokens(display)}),
        checkpoints=_checkpoint_table(workdir),
        composition=pd.concat(comp, ignore_index=True) if comp else _typed(None, COMPOSITION),
        corpus=pd.DataFrame([{**corpus.describe(), "sources": ",".join(corpus.sources),
                              "fit_tokens": len(probes.stream),
                              "vocab": len(probes.vocab.tokenizer)}]),
        head_scores_by_prompt=pd.concat([t for n in layers for t in measured[n].by_prompt],
                                        ignore_index=True)[HEAD_SCORES_BY_PROMPT.names],
        training_curve_by_prompt=pd.concat(
            [t for n in layers for t in measured[n].curve_by_prompt],
            ignore_index=True)[TRAINING_CURVE_BY_PROMPT.names],
        composition_by_prompt=(pd.concat(comp_by_prompt, ignore_index=True)
                               [COMPOSITION_BY_PROMPT.names] if comp_by_prompt else None),
    )


def _checkpoint_table(workdir: Path | None) -> pd.DataFrame:
    if workdir is None:
        return _typed(None, CHECKPOINTS)
    return _typed(pd.DataFrame([
        {"model": f"L{c.n_layers}", "n_layers": c.n_layers, "step": c.step,
         "name": checkpoints.checkpoint_name(workdir.name, c.n_layers, c.step),
         "path": str(c.path.relative_to(workdir))}
        for c in checkpoints.list_checkpoints(workdir)]), CHECKPOINTS)


def _first(df: pd.DataFrame, first: Sequence[str]) -> pd.DataFrame:
    return df[[*first, *(c for c in df.columns if c not in first)]]


def _typed(df: pd.DataFrame | None, table: Table) -> pd.DataFrame:
    """``df`` with exactly ``table``'s columns in its order: a column no row has (the
    phase-change window when none was found) is all missing, and a table with no rows
    still has every column, of its declared kind."""
    if df is None or df.empty:
        return table.empty()
    df = df.reindex(columns=table.names)
    for c in table.columns:
        if c.kind == "bool" and df[c.name].dtype != bool:
            df[c.name] = df[c.name].astype(object)  # True, False or missing
    return df
