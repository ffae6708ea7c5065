"""Induction formation: train small attention-only models and watch induction heads form.

Olsson et al. 2022 ("In-context Learning and Induction Heads", sections 3 and 4, figures
"phase change") found that transformers with two or more layers go through a phase change
early in training: induction heads form in a narrow window, together with a jump in
in-context learning and a bump in the training loss, while one-layer attention-only
models show neither (an induction head needs a previous-token head in an earlier layer
whose output its keys read, K-composition, so one layer cannot build one). This
experiment reproduces that on a laptop CPU.

It trains one TransformerLens-native model per entry of ``layers`` (attention-only by
default; ``attn_only=false`` adds MLPs) on text that ships with Python (the
``pydoc_data`` topics and the standard library's docstrings, plus any ``text_files``;
see :mod:`workbench.training.data`) with a byte-pair tokenizer trained on the same text.
All models share the tokenizer, the data order (``seed``) and the checkpoint steps.

Training windows are natural text, but a fraction ``repeat_fraction`` (default: all) of
them has one passage of the window copied to a later place in it
(:func:`workbench.training.data.repeat_passage`). Natural text repeats itself (names,
phrases, boilerplate) but seldom within a 128-token context of this small corpus; the
repeats make copying pay off often enough that induction heads form within a laptop budget
(Olsson et al. train on far more, longer text). ``repeat_fraction=0`` trains on plain text.

The default size was chosen by what forms induction heads on 2 CPU cores in minutes. With
the 2-layer model at ``d_model`` 64 (4 heads of 16 dimensions) and a 2,048-token
vocabulary, no induction head formed in 2,000 steps; at ``d_model`` 128 with 512 tokens a
weak one formed (max induction about 0.25 on random tokens); at ``d_model`` 256 (heads of
64 dimensions) with 512 tokens it forms abruptly within a few hundred steps. Wide heads
matter because an induction head must match and copy token identities through its
low-rank QK and OV circuits; a smaller vocabulary leaves fewer identities to tell apart.

Definitions, measured at every checkpoint (step 0 is the initialisation; ``tokens`` is
``step * batch_size * n_ctx``):

- ``train_loss``: mean next-token loss (nats) of the training batches since the previous
  checkpoint; ``heldout_loss``: on ``heldout_windows`` fixed windows of held-out
  documents.
- ``icl_score`` (Olsson et al. 2022, section 3, "in-context learning score"): the loss on
  the token at position ``icl_late`` minus the loss on the token at position
  ``icl_early`` (position 0 is BOS), each averaged over ``icl_band`` positions either
  side and over the held-out windows. The held-out windows are drawn like the training
  windows (with ``repeat_fraction`` of them carrying a repeated passage); the
  ``natural_heldout_loss`` and ``natural_icl_score`` columns (and ``natural_loss_early``,
  ``natural_loss_late``) measure the same on the same held-out text with no repeats.
  The paper uses positions 500 and 50 of 512; the defaults scale them to the context.
  The ICL score is the noisiest curve here: with 64 windows and 5 positions per end its
  standard error is about 0.2 nats, enough for the steepest-fall detector below to land on
  noise early in training; the defaults (256 windows, 11 positions per end) bring it to
  about 0.07.
  **Negative means the model predicts better late in the context**, i.e. it learns in
  context; a jump is a fall.
- ``previous_token`` and ``induction`` head scores: exactly :func:`workbench.scores.
  previous_token` and :func:`workbench.patterns.induction` (the definitions of the
  head-finding experiments), applied with :func:`workbench.recording.reductions.reduce_patterns` to
  ``n_repeat_prompts`` sequences of ``repeat_len`` random tokens (the middle 80% of the
  vocabulary) repeated twice after BOS (the ``repeated-random`` prompt set) and
  summarised with :func:`workbench.scores.stats.summarize` (mean, 95% bootstrap interval).
  ``null`` is the score of a uniform pattern on the same prompts.
- ``first_repeat_loss`` / ``second_repeat_loss``: the mean next-token loss on the first
  and second copy of those sequences, leaving out each copy's first token (nothing
  before it predicts it). Induction makes the second far lower than the first.

The phase change (:mod:`workbench.scores.phase_change`) is found from the data, per model:

- the *window* is where the largest ``induction`` score of any head rises fastest: from
  the last checkpoint at or below 20% of its rise to the first at or above 80%, found only
  when the rise is at least ``min_rise``;
- the *in-context-learning jump* is the checkpoint interval where ``icl_score`` falls
  fastest per step;
- the *loss bump* is the held-out loss falling faster per e-fold of tokens inside the
  window than in the two intervals before it (a smooth power-law curve never speeds up);
- they *coincide* when the ICL jump and the bump both lie in the window widened by
  ``window_slack`` checkpoints on each side.

K-composition (optional, ``composition=true``): in each final model with two or more
layers, every layer-0 head is zero-ablated in turn (its ``hook_z`` output set to 0) and the
induction score of the strongest induction head above layer 0 is measured again; ablating
the previous-token head should destroy the stripe.

Checkpoints are saved in the run folder (``checkpoints/L{n}/step_{step:06d}/``) and load
anywhere a MODEL is accepted as ``<run-id>/L<n>:<step>`` (see :mod:`workbench.
checkpoints`); ``checkpoints`` lists them. ``checkpoint_patterns`` keeps every head's
attention on one repeated random sequence at every checkpoint for the dashboard.

Example:
    workbench run induction-formation
    workbench run induction-formation --set seed=1 --set steps=3000
    workbench record <run-id>/L2:1500 --prompt-set natural
    python -m experiments.induction_formation --set layers=1,2,3
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from workbench.harness.claims import Measurement, claim_check
from workbench.harness.experiment import Context, experiment
from workbench.inputs.prompts import Prompt, load_prompt_set, random_token_ids
from workbench.interventions.masks import HeadMask, applied
from workbench.models import checkpoints, native
from workbench.models.base import Model
from workbench.recording.reductions import null_scores, reduce_patterns
from workbench.scores import patterns, phase_change
from workbench.scores.losses import repeat_losses, token_losses
from workbench.scores.stats import summarize
from workbench.store.runs import Run
from workbench.training import data as training_data
from workbench.training import loop

log = logging.getLogger(__name__)

Source = Literal["pydoc", "docstrings"]
METRICS = {"previous_token": patterns.previous_token, "induction": patterns.induction}


@dataclass(frozen=True)
class Config:
    layers: tuple[int, ...] = field(default=(1, 2), metadata={
        "help": "train one model per entry, with this many layers"})
    attn_only: bool = field(default=True, metadata={
        "help": "attention-only models (false adds an MLP to every block)"})
    d_model: int = field(default=256, metadata={"help": "residual stream width"})
    n_heads: int = field(default=4, metadata={"help": "attention heads per layer"})
    d_mlp: int = field(default=256, metadata={"help": "MLP width (only with attn_only=false)"})
    n_ctx: int = field(default=128, metadata={"help": "context length in tokens (BOS included)"})
    positions: native.Positions = field(default="learned", metadata={
        "help": "learned absolute positions or rotary"})
    vocab_size: int = field(default=512, metadata={"help": "byte-pair vocabulary size"})
    sources: tuple[Source, ...] = field(default=("pydoc", "docstrings"), metadata={
        "help": "built-in training text: pydoc (doc topics), docstrings (standard library)"})
    text_files: tuple[str, ...] = field(default=(), metadata={
        "help": "extra UTF-8 text files for the corpus (each paragraph a document)"})
    repeat_fraction: float = field(default=1.0, metadata={
        "help": "fraction of training windows in which one passage is repeated later on"})
    steps: int = field(default=1000, metadata={"help": "training steps (optimizer updates)"})
    batch_size: int = field(default=32, metadata={"help": "sequences per step"})
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate (AdamW)"})
    warmup_steps: int = field(default=100, metadata={"help": "linear warm-up steps"})
    lr_schedule: loop.LrSchedule = field(default="cosine", metadata={
        "help": "cosine decay to min_lr_fraction after warm-up, or constant"})
    min_lr_fraction: float = field(default=0.1, metadata={
        "help": "final learning rate as a fraction of lr (cosine)"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    checkpoint_every: int = field(default=25, metadata={
        "help": "save and measure a checkpoint every this many steps (and at step 0)"})
    heldout_windows: int = field(default=256, metadata={
        "help": "held-out windows for the held-out loss and the ICL score"})
    icl_early: int = field(default=13, metadata={
        "help": "early position of the ICL score (Olsson: 50 of 512)"})
    icl_late: int = field(default=122, metadata={
        "help": "late position of the ICL score (Olsson: 500 of 512)"})
    icl_band: int = field(default=5, metadata={
        "help": "ICL positions are averaged over this many positions either side"})
    n_repeat_prompts: int = field(default=16, metadata={
        "help": "repeated random sequences for head scores and repeat losses"})
    repeat_len: int = field(default=40, metadata={"help": "random tokens per repeat"})
    pattern_len: int = field(default=16, metadata={
        "help": "random tokens per repeat of the sequence whose patterns are stored"})
    min_rise: float = field(default=0.3, metadata={
        "help": "smallest rise of the max induction score that counts as a phase change"})
    window_slack: int = field(default=1, metadata={
        "help": "checkpoints either side of the window still counted as in it"})
    composition: bool = field(default=True, metadata={
        "help": "K-composition check: ablate each layer-0 head of the final models"})
    n_boot: int = field(default=200, metadata={"help": "bootstrap resamples for intervals"})
    seed: int = field(default=0, metadata={
        "help": "seed of the weights, the data order and the probe sequences"})

    def __post_init__(self) -> None:
        if not self.layers or min(self.layers) < 1 or len(set(self.layers)) != len(self.layers):
            raise ValueError("layers must be distinct positive layer counts, e.g. 1,2")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by n_heads "
                             f"{self.n_heads}")
        if min(self.steps, self.batch_size, self.checkpoint_every, self.heldout_windows,
               self.n_repeat_prompts, self.n_boot) < 1:
            raise ValueError("steps, batch_size, checkpoint_every, heldout_windows, "
                             "n_repeat_prompts and n_boot must be positive")
        if self.vocab_size < 300:
            raise ValueError("vocab_size must be at least 300")
        if not 1 <= self.icl_early - self.icl_band < self.icl_late + self.icl_band < self.n_ctx:
            raise ValueError(f"need 1 <= icl_early - icl_band < icl_late + icl_band < n_ctx "
                             f"({self.n_ctx})")
        longest = 1 + 2 * max(self.repeat_len, self.pattern_len)
        if min(self.repeat_len, self.pattern_len) < 2 or longest > self.n_ctx:
            raise ValueError(f"repeat_len and pattern_len must be >= 2, and 1 + 2 x each "
                             f"must fit in n_ctx ({self.n_ctx})")
        for name, value in (("min_rise", self.min_rise), ("repeat_fraction",
                                                           self.repeat_fraction),
                            ("min_lr_fraction", self.min_lr_fraction)):
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1]")
        if not set(self.sources) <= {"pydoc", "docstrings"}:
            raise ValueError("sources must be among pydoc, docstrings")
        if not self.sources and not self.text_files:
            raise ValueError("the corpus needs at least one source or text file")

    def model_spec(self, n_layers: int, d_vocab: int) -> native.ModelSpec:
        return native.ModelSpec(
            n_layers=n_layers, d_model=self.d_model, n_heads=self.n_heads, n_ctx=self.n_ctx,
            d_vocab=d_vocab, attn_only=self.attn_only,
            d_mlp=None if self.attn_only else self.d_mlp, positions=self.positions,
            seed=self.seed)

    def train_spec(self) -> loop.TrainSpec:
        return loop.TrainSpec(
            steps=self.steps, batch_size=self.batch_size, lr=self.lr,
            warmup_steps=self.warmup_steps, min_lr_fraction=self.min_lr_fraction,
            lr_schedule=self.lr_schedule, weight_decay=self.weight_decay,
            data_seed=self.seed)

    def checkpoint_steps(self) -> list[int]:
        return sorted({*range(0, self.steps + 1, self.checkpoint_every), self.steps})

    def tokens(self, step: int) -> int:
        return step * self.batch_size * self.n_ctx


# ---- what is measured at a checkpoint ------------------------------------------------------

@dataclass
class Probes:
    """Fixed inputs every checkpoint of every model is measured on."""

    heldout: Int[Tensor, "window pos"]
    natural: Int[Tensor, "window pos"]
    repeated: list[Prompt]
    display: Prompt
    stream: Int[Tensor, " token"]


def make_probes(tokenizer: Any, corpus: training_data.Corpus, cfg: Config,
                stand_in: Model) -> Probes:
    """Held-out windows, repeated random sequences and the display sequence.

    ``stand_in`` is any model with the run's tokenizer (the random token draw only needs
    the vocabulary).
    """
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
    return Probes(windows(cfg.repeat_fraction), windows(0.0), repeated, display, stream)


def heldout_metrics(model: Model, windows: Int[Tensor, "window pos"], cfg: Config,
                    prefix: str = "") -> dict[str, float]:
    """Held-out loss and the ICL score (late minus early; negative = learns in context)."""
    with torch.inference_mode():
        nll = model.bridge(windows, return_type="loss", loss_per_token=True)  # [W, T-1]

    def at(position: int) -> float:  # loss on the token at ``position`` is nll[:, position-1]
        lo, hi = position - cfg.icl_band - 1, position + cfg.icl_band
        return float(nll[:, lo:hi].mean())

    early, late = at(cfg.icl_early), at(cfg.icl_late)
    return {f"{prefix}heldout_loss": float(nll.mean()), f"{prefix}loss_early": early,
            f"{prefix}loss_late": late, f"{prefix}icl_score": late - early}


def copy_losses(model: Model, prompts: Sequence[Prompt], repeat_len: int
                ) -> dict[str, float]:
    """Mean loss on the first and second copy, each without its first token."""
    first, second = repeat_losses(token_losses(model, prompts), repeat_len, 2).mean(axis=0)
    return {"first_repeat_loss": float(first), "second_repeat_loss": float(second)}


def head_scores(model: Model, prompts: Sequence[Prompt], cfg: Config) -> pd.DataFrame:
    """previous_token and induction of every head, summarised over prompts, with nulls."""
    per_prompt = reduce_patterns(model, prompts, METRICS, desc="head scores")
    table = summarize(per_prompt, n_boot=cfg.n_boot, seed=cfg.seed)
    null = null_scores(model, prompts, METRICS).groupby("metric").score.mean()
    return table.assign(null=table.metric.map(null))


def patterns(model: Model, prompt: Prompt) -> Float[Tensor, "layer head_index query_pos key_pos"]:
    """Every head's attention on one prompt."""
    from workbench.recording import hooks

    found: dict[int, Tensor] = {}

    def keep(layer: int):
        def hook(pattern: Tensor, hook: Any) -> None:
            found[layer] = pattern[0].detach().float().clone()

        return hook

    ids = torch.tensor([prompt.token_ids])
    fwd = [(hooks.pattern(layer), keep(layer)) for layer in range(model.info.n_layers)]
    with torch.inference_mode(), model.bridge.hooks(fwd_hooks=fwd):
        model.bridge(ids, return_type=None)
    return torch.stack([found[layer] for layer in range(model.info.n_layers)])


def pattern_rows(stack: Float[Tensor, "layer head_index query_pos key_pos"]) -> pd.DataFrame:
    """The lower triangle (what a causal query can see) in long format."""
    n_layers, n_heads, n, _ = stack.shape
    q, k = np.tril_indices(n)
    values = stack[:, :, q, k].numpy()  # [L, H, n_pairs]
    return pd.DataFrame({
        "layer": np.repeat(np.arange(n_layers), n_heads * len(q)).astype(np.int16),
        "head": np.tile(np.repeat(np.arange(n_heads), len(q)), n_layers).astype(np.int16),
        "query": np.tile(q, n_layers * n_heads).astype(np.int16),
        "key": np.tile(k, n_layers * n_heads).astype(np.int16),
        "weight": values.reshape(-1).astype(np.float32),
    })


@dataclass
class Measured:
    """Everything measured on one model across its checkpoints."""

    curve: list[dict[str, Any]] = field(default_factory=list)
    scores: list[pd.DataFrame] = field(default_factory=list)
    patterns: list[pd.DataFrame] = field(default_factory=list)

    def add(self, tag: dict[str, Any], row: dict[str, Any], head_table: pd.DataFrame,
            pattern_table: pd.DataFrame) -> None:
        self.curve.append({**tag, **row})
        self.scores.append(head_table.assign(**tag))
        self.patterns.append(pattern_table.assign(**tag))


def measure(model: Model, probes: Probes, cfg: Config, train_loss: float) -> tuple[
        dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """One checkpoint: its curve row, head scores and display patterns."""
    table = head_scores(model, probes.repeated, cfg)
    best = table.groupby("metric").score.max()
    row = {"train_loss": train_loss, **heldout_metrics(model, probes.heldout, cfg),
           **heldout_metrics(model, probes.natural, cfg, prefix="natural_"),
           **copy_losses(model, probes.repeated, cfg.repeat_len),
           "max_induction": float(best["induction"]),
           "max_previous_token": float(best["previous_token"])}
    return row, table, pattern_rows(patterns(model, probes.display))


# ---- training one model --------------------------------------------------------------------

def train_one(n_layers: int, tokenizer: Any, probes: Probes, cfg: Config, workdir: Path,
              extra: dict[str, Any]) -> tuple[Model, Measured]:
    """Train one model, checkpointing and measuring it on the schedule."""
    spec = cfg.model_spec(n_layers, len(tokenizer))
    bridge = native.build_bridge(spec, tokenizer)
    model = native.as_model(bridge, tokenizer, spec, name=f"L{n_layers}")
    measured = Measured()

    def on_checkpoint(step: int, train_loss: float) -> None:
        tokens = cfg.tokens(step)
        checkpoints.save(workdir, bridge, spec, step=step, tokens=tokens, extra=extra)
        row, table, pats = measure(model, probes, cfg, train_loss)
        measured.add({"model": f"L{n_layers}", "n_layers": n_layers, "step": step,
                      "tokens": tokens}, row, table, pats)
        log.info("L%d step %d: heldout %.3f, icl %+.3f, max induction %.2f", n_layers, step,
                 row["heldout_loss"], row["icl_score"], row["max_induction"])

    data = training_data.batches(probes.stream, cfg.batch_size, cfg.n_ctx,
                                 bos_id=tokenizer.bos_token_id, seed=cfg.seed,
                                 repeat_fraction=cfg.repeat_fraction)
    loop.train(bridge, data, cfg.train_spec(), checkpoint_steps=cfg.checkpoint_steps(),
                   on_checkpoint=on_checkpoint, desc=f"training L{n_layers}")
    return model, measured


# ---- the phase change and K-composition ------------------------------------------------------

def detect(curve: pd.DataFrame, cfg: Config) -> dict[str, Any]:
    """The phase-change window, ICL jump and loss bump of one model's curve."""
    c = curve.sort_values("step")
    steps, tokens = c.step.tolist(), c.tokens.tolist()
    window = phase_change.rise_window(steps, c.max_induction.tolist(), min_rise=cfg.min_rise)
    icl_from, icl_to, icl_rate = phase_change.fastest_drop(steps, c.icl_score.tolist())
    row: dict[str, Any] = {
        "detected": window is not None, "icl_jump_start": icl_from, "icl_jump_end": icl_to,
        "icl_jump_per_1000_steps": icl_rate,
        "induction_initial": float(c.max_induction.iloc[0]),
        "induction_final": float(c.max_induction.iloc[-1]),
        "icl_initial": float(c.icl_score.iloc[0]), "icl_final": float(c.icl_score.iloc[-1]),
        "first_repeat_final": float(c.first_repeat_loss.iloc[-1]),
        "second_repeat_final": float(c.second_repeat_loss.iloc[-1]),
    }
    if window is None:
        return row
    lo, hi = window.widened(cfg.window_slack, steps)
    bump = phase_change.loss_bump(steps, tokens, c.heldout_loss.tolist(), lo, hi)
    at = c.set_index("step")
    row.update({
        "start_step": window.start_step, "end_step": window.end_step,
        "mid_step": window.mid_step, "start_tokens": cfg.tokens(window.start_step),
        "end_tokens": cfg.tokens(window.end_step), "mid_tokens": cfg.tokens(window.mid_step),
        "induction_before": window.base, "induction_after": window.peak,
        "icl_before": float(at.icl_score[lo]), "icl_after": float(at.icl_score[hi]),
        "icl_jump_in_window": lo <= icl_from and icl_to <= hi,
        "loss_bump": bump.present, "loss_bump_step": bump.step,
        "loss_rate_in_window": bump.rate_in, "loss_rate_before": bump.rate_before,
    })
    row["coincide"] = bool(row["icl_jump_in_window"] and bump.present
                           and lo <= bump.step <= hi)
    return row


def composition(model: Model, table: pd.DataFrame, prompts: Sequence[Prompt],
                cfg: Config) -> pd.DataFrame:
    """Zero-ablate each layer-0 head; the strongest induction head above layer 0 again."""
    ind = table[(table.metric == "induction") & (table.layer > 0)]
    best = ind.loc[ind.score.idxmax()]
    layer, head_, before = int(best["layer"]), int(best["head"]), float(best["score"])
    prev = table[(table.metric == "previous_token") & (table.layer == 0)].set_index("head")
    rows = []
    for head in range(model.info.n_heads):
        with applied(model, HeadMask.for_model(model).without([(0, head)])):
            after = head_scores(model, prompts, cfg)
        hit = after[(after.metric == "induction") & (after.layer == layer)
                    & (after["head"] == head_)].score.iloc[0]
        rows.append({"ablated_layer": 0, "ablated_head": head,
                     "ablated_previous_token": float(prev.score[head]),
                     "target_layer": layer, "target_head": head_,
                     "induction_before": before, "induction_after": float(hit)})
    return pd.DataFrame(rows)


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

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"training_curve": self.training_curve, "head_scores": self.head_scores,
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
    return (f"{r.model}: phase change at steps {r.start_step}-{r.end_step} "
            f"({r.start_tokens / 1e6:.2f}M-{r.end_tokens / 1e6:.2f}M tokens), max induction "
            f"{r.induction_before:.2f} -> {r.induction_after:.2f}; ICL jump at "
            f"{r.icl_jump_start}-{r.icl_jump_end} ({'in' if r.icl_jump_in_window else 'not in'}"
            f" window), loss bump {'yes' if r.loss_bump else 'no'}; "
            f"{'coincide' if r.coincide else 'do not coincide'}; {repeat}")


def _frames(measured: dict[int, Measured]) -> Iterator[tuple[str, pd.DataFrame]]:
    yield "training_curve", pd.DataFrame([row for m in measured.values() for row in m.curve])
    yield "head_scores", pd.concat([t for m in measured.values() for t in m.scores],
                                   ignore_index=True)
    yield "checkpoint_patterns", pd.concat([t for m in measured.values() for t in m.patterns],
                                           ignore_index=True)


def _order(df: pd.DataFrame, first: Sequence[str]) -> pd.DataFrame:
    return df[[*first, *(c for c in df.columns if c not in first)]]


@experiment("induction-formation", config=Config, tables=None, needs_model=False,
            demo={})
def run(model: Model | None, cfg: Config, ctx: Context | None = None) -> Result:
    """Train the models, measure every checkpoint, find each model's phase change."""
    import tempfile

    if model is not None:
        log.warning("induction-formation trains its own models; ignoring %s", model.info.name)
    workdir = Path((ctx and ctx.workdir) or tempfile.mkdtemp(prefix="induction-formation-"))
    corpus = training_data.build_corpus(cfg.sources, cfg.text_files)
    tokenizer = training_data.train_tokenizer(corpus.fit, cfg.vocab_size,
                                              workdir / checkpoints.TOKENIZER)
    # The random probe tokens depend only on the vocabulary, so a Model without weights
    # stands in for the models that are not trained yet.
    spec0 = cfg.model_spec(min(cfg.layers), len(tokenizer))
    stand_in = native.as_model(None, tokenizer, spec0, name="tokenizer")
    probes = make_probes(tokenizer, corpus, cfg, stand_in)
    extra = {"run_id": workdir.name, "experiment": "induction-formation",
             "corpus_sha256": corpus.sha256}
    trained: dict[int, Model] = {}
    measured: dict[int, Measured] = {}
    for n_layers in sorted(cfg.layers):
        trained[n_layers], measured[n_layers] = train_one(n_layers, tokenizer, probes, cfg,
                                                          workdir, extra)
    frames = dict(_frames(measured))
    curve = frames["training_curve"]
    phase = pd.DataFrame([{"model": f"L{n}", "n_layers": n,
                           **detect(curve[curve.n_layers == n], cfg)} for n in sorted(cfg.layers)])
    scores_ = frames["head_scores"]
    comp = [composition(trained[n], scores_[(scores_.n_layers == n) & (scores_.step == cfg.steps)],
                        probes.repeated, cfg).assign(model=f"L{n}", n_layers=n)
            for n in sorted(cfg.layers) if cfg.composition and n >= 2]
    return Result(
        training_curve=_order(curve, ["model", "n_layers", "step", "tokens"]),
        head_scores=_order(frames["head_scores"], ["model", "n_layers", "step", "tokens",
                                                   "layer", "head", "metric", "score"]),
        phase_change=phase,
        checkpoint_patterns=_order(frames["checkpoint_patterns"],
                                   ["model", "n_layers", "step", "tokens"]),
        pattern_tokens=pd.DataFrame({"position": range(len(probes.display.token_ids)),
                                     "token_id": probes.display.token_ids,
                                     "token": stand_in.str_tokens(list(
                                         probes.display.token_ids))}),
        checkpoints=_checkpoint_table(workdir),
        composition=pd.concat(comp, ignore_index=True) if comp else pd.DataFrame(),
        corpus=pd.DataFrame([{**corpus.describe(), "sources": ",".join(corpus.sources),
                              "fit_tokens": len(probes.stream), "vocab": len(tokenizer)}]),
    )


def _checkpoint_table(workdir: Path) -> pd.DataFrame:
    return pd.DataFrame([
        {"model": f"L{c.n_layers}", "n_layers": c.n_layers, "step": c.step,
         "name": checkpoints.checkpoint_name(workdir.name, c.n_layers, c.step),
         "path": str(c.path.relative_to(workdir))}
        for c in checkpoints.list_checkpoints(workdir)])


# ---- claim checks ----------------------------------------------------------------------------

def _phase(run: Run, n_layers: int) -> pd.Series:
    table = run.table("phase_change")
    rows = table[table.n_layers == n_layers]
    if rows.empty:
        from workbench.core.errors import WorkbenchError

        raise WorkbenchError(f"run {run.id} trained no {n_layers}-layer model")
    return rows.iloc[0]


@claim_check("formation_no_induction")
def no_induction_heads(run: Run, *, n_layers: int = 1, threshold: float = 0.2
                       ) -> Measurement:
    """No phase change, and every head's final induction score stays below ``threshold``."""
    r = _phase(run, n_layers)
    passed = (not r.detected) and r.induction_final < threshold
    return Measurement(
        f"L{n_layers}: max induction {r.induction_initial:.2f} -> {r.induction_final:.2f} "
        f"(threshold {threshold}), phase change {'found' if r.detected else 'not found'}; "
        f"second-repeat loss {r.second_repeat_final:.2f} vs first {r.first_repeat_final:.2f}",
        bool(passed), float(r.induction_final))


@claim_check("formation_induction_forms")
def induction_heads_form(run: Run, *, n_layers: int = 2, threshold: float = 0.4,
                         repeat_ratio: float = 0.5) -> Measurement:
    """A phase change is found, a head's final induction score reaches ``threshold``, and
    the second-repeat loss falls below ``repeat_ratio`` times the first-repeat loss."""
    r = _phase(run, n_layers)
    ratio = r.second_repeat_final / r.first_repeat_final
    passed = bool(r.detected) and r.induction_final >= threshold and ratio <= repeat_ratio
    where = (f"window steps {int(r.start_step)}-{int(r.end_step)}" if r.detected
             else "no phase change")
    return Measurement(
        f"L{n_layers}: max induction {r.induction_initial:.2f} -> {r.induction_final:.2f} "
        f"(threshold {threshold}), {where}; second/first repeat loss {ratio:.2f} "
        f"(needed <= {repeat_ratio})", passed, float(r.induction_final))


@claim_check("formation_coincide")
def bump_and_icl_jump_coincide(run: Run, *, n_layers: int = 2) -> Measurement:
    """The ICL jump and a loss bump fall in the induction phase-change window."""
    r = _phase(run, n_layers)
    if not r.detected:
        return Measurement(f"L{n_layers}: no phase change window to compare with", False)
    return Measurement(
        f"L{n_layers}: window steps {int(r.start_step)}-{int(r.end_step)}; ICL jump at "
        f"{r.icl_jump_start}-{r.icl_jump_end} ({'in' if r.icl_jump_in_window else 'outside'});"
        f" loss bump {'at ' + str(int(r.loss_bump_step)) if r.loss_bump else 'none'} (rate "
        f"{r.loss_rate_in_window:.2f} vs {r.loss_rate_before:.2f} before, nats per e-fold)",
        bool(r.coincide))


if __name__ == "__main__":
    import sys

    from workbench.cli import main

    main(["run", "induction-formation", *sys.argv[1:]])
