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
- ``previous_token`` and ``induction`` head scores: exactly
  :func:`workbench.scores.patterns.previous_token` and
  :func:`workbench.scores.patterns.induction` (the definitions of the head-finding
  experiments), applied with :func:`workbench.scores.heads.score_heads` to
  ``n_repeat_prompts`` sequences of ``repeat_len`` random tokens (the middle 80% of the
  vocabulary) repeated twice after BOS (the ``repeated-random`` prompt set) and
  summarised with :func:`workbench.scores.stats.summarize` (mean, 95% bootstrap interval).
  ``null`` is the score of a uniform pattern on the same prompts.
- ``first_repeat_loss`` / ``second_repeat_loss``: the mean next-token loss on the first
  and second copy of those sequences, leaving out each copy's first token (nothing
  before it predicts it). Induction makes the second far lower than the first.

The phase change (:mod:`workbench.scores.phase_change`) is found from the data, per model:

- the *window* is where the largest ``induction`` score of any head rises fastest: from
  the last checkpoint at or below 20% of its rise to the first at or above 80% (after a
  running median of 3, so a one-checkpoint spike does not move it), found only when the
  rise is at least ``min_rise``;
- the *in-context-learning jump* is the checkpoint interval where ``icl_score`` falls
  fastest per step;
- the *loss bump* is the held-out loss departing, inside the window, from a quadratic fit
  in log tokens of the checkpoints around it by more than 3.5 times that fit's robust
  residual noise (a pause or dip held for 2 checkpoints, or a level shift across the
  window; :func:`workbench.scores.phase_change.loss_bump`, false-positive rate <= 3% on
  smooth noisy curves); the ICL jump and the bump are found on the repeated-passage
  held-out windows and on the plain held-out text (``natural_`` columns), and the
  coincidence claim is judged on the plain text;
- they *coincide* when the ICL jump and the bump both lie in the window widened by
  ``window_slack`` checkpoints on each side.

K-composition (optional, ``composition=true``): in each final model with two or more
layers, every layer-0 head is zero-ablated in turn (its ``hook_z`` output set to 0) and the
induction score of the strongest induction head above layer 0 is measured again; ablating
the previous-token head should destroy the stripe.

Checkpoints are saved in the run folder (``checkpoints/L{n}/step_{step:06d}/``) and load
anywhere a MODEL is accepted as ``<run-id>/L<n>:<step>`` (see
:mod:`workbench.models.checkpoints`); ``checkpoints`` lists them. Called outside a run
store (no run folder), the experiment keeps no file: the tokenizer lives in a scratch
folder for the run and no checkpoint is saved. ``checkpoint_patterns`` keeps every head's
attention on one repeated random sequence at every checkpoint for the dashboard
(:func:`workbench.recording.capture.head_patterns`).

Example:
    workbench run induction-formation
    workbench run induction-formation --set seed=1 --set steps=3000
    workbench record <run-id>/L2:1500 --prompt-set natural
    python -m experiments.induction_formation --set layers=1,2,3
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from experiments.induction_formation import checks  # noqa: F401 (registers the claim checks)
from experiments.induction_formation.measure import Result, make_probes, result, train_one
from experiments.induction_formation.tables import TABLES
from workbench.core import progress
from workbench.core.errors import WorkbenchError
from workbench.core.values import MAX_PROMPTS
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.models import checkpoints, native
from workbench.models.base import Model
from workbench.training import data as training_data
from workbench.training import loop

log = logging.getLogger(__name__)

Source = Literal["pydoc", "docstrings"]


@dataclass(frozen=True)
class Config:
    # The upper bounds keep the model and its batches to what a CPU trains: a 48-layer,
    # 4,096-wide model over 1,024 x 4,096-token batches is already far past what finishes
    # here. The learning rate and weight decay stop at 1: AdamW's decoupled decay
    # multiplies the weights by 1 - lr x weight_decay at every step.
    layers: tuple[int, ...] = param((1, 2), "train one model per entry, with this many layers",
                                    min=1, max=48)
    attn_only: bool = param(True, "attention-only models (false adds an MLP to every block)")
    d_model: int = param(256, "residual stream width", min=1, max=4096)
    n_heads: int = param(4, "attention heads per layer", min=1, max=64)
    d_mlp: int = param(256, "MLP width (only with attn_only=false)", min=1, max=16384)
    n_ctx: int = param(128, "context length in tokens (BOS included)", min=2, max=4096)
    positions: native.Positions = param("learned", "learned absolute positions or rotary")
    vocab_size: int = param(512, "byte-pair vocabulary size", min=300, max=65536)
    sources: tuple[Source, ...] = param(
        ("pydoc", "docstrings"),
        "built-in training text: pydoc (doc topics), docstrings (standard library)")
    text_files: tuple[str, ...] = param(
        (), "extra UTF-8 text files for the corpus (each paragraph a document)")
    repeat_fraction: float = param(
        1.0, "fraction of training windows in which one passage is repeated later on",
        min=0, max=1)
    steps: int = param(1000, "training steps (optimizer updates)", min=1, max=10**6)
    batch_size: int = param(32, "sequences per step", min=1, max=1024)
    lr: float = param(3e-3, "peak learning rate (AdamW)", above=0, max=1)
    warmup_steps: int = param(100, "linear warm-up steps", min=0, max=10**6)
    lr_schedule: loop.LrSchedule = param(
        "cosine", "cosine decay to min_lr_fraction after warm-up, or constant")
    min_lr_fraction: float = param(0.1, "final learning rate as a fraction of lr (cosine)",
                                   min=0, max=1)
    weight_decay: float = param(0.01, "AdamW weight decay", min=0, max=1)
    checkpoint_every: int = param(
        25, "save and measure a checkpoint every this many steps (and at step 0)", min=1, max=10**6)
    heldout_windows: int = param(
        256, "held-out windows for the held-out loss and the ICL score", min=1, max=MAX_PROMPTS)
    icl_early: int = param(13, "early position of the ICL score (Olsson: 50 of 512)",
                           min=1, max=4096)
    icl_late: int = param(122, "late position of the ICL score (Olsson: 500 of 512)",
                          min=1, max=4096)
    icl_band: int = param(
        5, "ICL positions are averaged over this many positions either side", min=0, max=4096)
    n_repeat_prompts: int = param(
        16, "repeated random sequences for head scores and repeat losses", min=1, max=MAX_PROMPTS)
    repeat_len: int = param(40, "random tokens per repeat", min=2, max=4096)
    pattern_len: int = param(
        16, "random tokens per repeat of the sequence whose patterns are stored", min=2, max=4096)
    min_rise: float = param(
        0.3, "smallest rise of the max induction score that counts as a phase change",
        min=0, max=1)
    window_slack: int = param(
        1, "checkpoints either side of the window still counted as in it", min=0, max=10**6)
    composition: bool = param(
        True, "K-composition check: ablate each layer-0 head of the final models")
    n_boot: int = shared("n_boot", 200)
    seed: int = shared("seed")  # of the weights, the data order and the probe sequences

    def __post_init__(self) -> None:
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ValueError("layers must be distinct positive layer counts, e.g. 1,2")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by n_heads "
                             f"{self.n_heads}")
        if not 1 <= self.icl_early - self.icl_band < self.icl_late + self.icl_band < self.n_ctx:
            raise ValueError(f"need 1 <= icl_early - icl_band < icl_late + icl_band < n_ctx "
                             f"({self.n_ctx})")
        if 1 + 2 * max(self.repeat_len, self.pattern_len) > self.n_ctx:
            raise ValueError(f"1 + 2 x repeat_len and 1 + 2 x pattern_len must fit in n_ctx "
                             f"({self.n_ctx})")
        if not self.sources and not self.text_files:
            raise ValueError("the corpus needs at least one source or text file")
        try:  # each file read and checked whole, before a run exists
            training_data.check_text_files(self.text_files)
        except WorkbenchError as exc:
            raise ValueError(f"text_files: {exc}") from None

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


@experiment("induction-formation", config=Config, tables=TABLES, needs_model=False, demo={})
def run(model: Model | None, cfg: Config, ctx: Context | None = None) -> Result:
    """Train the models, measure every checkpoint, find each model's phase change."""
    ctx = ctx or Context()
    if model is not None:
        log.warning("induction-formation trains its own models; ignoring %s", model.info.name)
    with contextlib.ExitStack() as stack:
        # the tokenizer needs a folder; outside a run store it is a scratch one
        folder = ctx.workdir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="induction-formation-")))
        stage = stack.enter_context(progress.stages("induction-formation",
                                                    len(cfg.layers) + 2))
        stage("corpus and tokenizer")
        corpus = training_data.build_corpus(cfg.sources, cfg.text_files)
        tokenizer = training_data.train_tokenizer(corpus.fit, cfg.vocab_size,
                                                  folder / checkpoints.TOKENIZER)
        probes = make_probes(tokenizer, corpus, cfg)
        extra = {"run_id": folder.name, "experiment": "induction-formation",
                 "corpus_sha256": corpus.sha256}
        trained, measured = {}, {}
        for n_layers in sorted(cfg.layers):
            stage(f"train the {n_layers}-layer model")
            trained[n_layers], measured[n_layers] = train_one(
                n_layers, tokenizer, probes, cfg, ctx.workdir, extra)
        stage("tables")
        return result(cfg, corpus, probes, trained, measured, ctx.workdir)
