"""Previous-token heads: which heads attend to the token before (or after) each position,
and which attend to earlier copies of the current token?

Previous-token heads are the first half of the induction circuit (Olsson et al. 2022, "In-
context Learning and Induction Heads", section 2; Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits"): an induction head's keys are composed with a
previous-token head's output (K-composition). Duplicate-token heads appear in Wang et al.
2022 ("Interpretability in the Wild", the IOI circuit). GPT-2 small's previous-token heads
4.11 and 2.2, and its duplicate-token heads 0.1, 0.10 and 3.0, are the classic reference.

Scores (per layer and query head; definitions in :mod:`workbench.scores.patterns`):

- ``previous_token``: mean over queries ``i >= 1`` of ``A[i, i-1]``, on natural text
  (Olsson et al. 2022; TransformerLens ``head_detector`` 'mul' semantics, whose score is
  the same sum divided by ``T`` instead of ``T - 1``).
- ``next_token`` (bidirectional models only; a causal mask makes it 0): mean over queries
  ``i <= T-2`` of ``A[i, i+1]``, on natural text.
- ``duplicate_token``: on random token sequences repeated twice, the weight each query
  puts on earlier occurrences of its own token, over queries that have one.

Natural text is ``n_prompts`` windows of ``n_tokens`` tokens of the Python documentation's
prose (the ``corpus`` prompt set, :mod:`workbench.inputs.corpus`), or any other named prompt
set (``--set prompt_set=NAME``; ``text=`` is its old name and still read); the
``inputs`` column says which (``natural text`` or ``prompt set NAME``), and so does the
progress bar. Each score has a 95% bootstrap interval over prompts and a null baseline
(``null``): its value for a head whose attention is uniform over the keys it can see, on
the same prompts.

Classes (``head_classes``, :mod:`workbench.scores.classes`): every head is tested for the
``previous-token`` class (its weight on the previous token against its total weight on
the tokens 2-4 back, on the natural text) and the ``duplicate-token`` class (against the
repeated prompts with every repeat after the first replaced by fresh tokens, batched with
the real ones and read at the real earlier copies), both also against uniform attention;
a head is in a class when its Benjamini-Hochberg q over the model's heads is at most
``fdr`` (``n_null_draws`` sign flips per test).

The run also stores ``example/``, the attention patterns of one natural and one repeated
prompt, which the dashboard's heads page shows.

Example:
    workbench run previous-token-heads --model smollm2
    workbench run previous-token-heads --model minilm --set n_prompts=16
    python -m experiments.previous_token_heads --model minilm
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from experiments.previous_token_heads.tables import TABLES
from workbench.core.values import MAX_PROMPTS, MAX_SEQUENCE
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.prompts import Prompt, check_prompt_set, load_prompt_set
from workbench.models.base import Model, Tokenizing
from workbench.recording.writer import record
from workbench.scores import classes, metrics
from workbench.scores.heads import score_and_classify, scores_by_prompt
from workbench.store.schema import with_layer_types


@dataclass(frozen=True)
class Config:
    prompt_set: str = param("corpus", "natural text: a prompt set ('corpus': Python docs prose)")
    n_prompts: int = param(32, "natural-text prompts (corpus)", min=2, max=MAX_PROMPTS)
    n_tokens: int = param(128, "tokens per corpus prompt", min=2, max=MAX_SEQUENCE)
    n_repeated: int = param(32, "repeated random sequences", min=2, max=MAX_PROMPTS)
    seq_len: int = param(40, "length of each random sequence", min=2, max=MAX_SEQUENCE)
    fdr: float = shared("fdr")
    n_null_draws: int = shared("n_null_draws")
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    # old field names still read (workbench.harness.config.current_names)
    RENAMED: ClassVar[Mapping[str, str]] = {"text": "prompt_set"}

    def __post_init__(self) -> None:
        check_prompt_set(self.prompt_set)
        testing(self)


def testing(cfg: Config) -> classes.Testing:
    """How the heads are tested for their classes (refuses draws that cannot reach fdr)."""
    return classes.Testing(fdr=cfg.fdr, n_draws=cfg.n_null_draws, seed=cfg.seed)


def text_label(cfg: Config) -> str:
    """What the positional scores were measured on, for the ``inputs`` column and the
    progress bar: the label names what was used, never a default it replaced."""
    return "natural text" if cfg.prompt_set == "corpus" else f"prompt set {cfg.prompt_set}"


def natural_prompts(model: Tokenizing, cfg: Config) -> list[Prompt]:
    """The natural text: corpus windows, or the named prompt set."""
    if cfg.prompt_set == "corpus":
        return load_prompt_set("corpus", model, n_prompts=cfg.n_prompts, n_tokens=cfg.n_tokens)
    return load_prompt_set(cfg.prompt_set, model)


def repeated_prompts(model: Tokenizing, cfg: Config) -> list[Prompt]:
    """The repeated random sequences the duplicate-token scores are read on."""
    return load_prompt_set("repeated-random", model, n_prompts=cfg.n_repeated,
                           seq_len=cfg.seq_len, repeats=2, seed=cfg.seed)


def inputs(cfg: Config, model: Tokenizing) -> Mapping[str, Sequence[Prompt]]:
    """The prompt lists the run batches, each on its own, for the check of a resample head
    mask before the model loads (:attr:`workbench.harness.experiment.Experiment.inputs`);
    the example recording pairs its prompts from them (:func:`example_prompts`)."""
    return {text_label(cfg): natural_prompts(model, cfg),
            "the repeated random tokens": repeated_prompts(model, cfg)}


def example_prompts(model: Model, natural: list[Prompt], repeated: list[Prompt]
                    ) -> list[Prompt]:
    """The prompts ``example/`` records: the first natural and the first repeated one, each
    with a partner of its token length where a resample head mask is applied (the
    recording's batches take a resampled head from another prompt of the same length)."""
    if not model.paired_batches:
        return [natural[0], repeated[0]]
    return [*_with_partner(model, natural), *_with_partner(model, repeated)]


def _with_partner(model: Model, prompts: list[Prompt]) -> list[Prompt]:
    """``prompts[0]`` and the first other prompt of its token length (checked to exist
    before the run: :func:`inputs`)."""
    first = len(model.encode(prompts[0])[0])
    partner = next((p for p in prompts[1:] if len(model.encode(p)[0]) == first), None)
    return [prompts[0]] if partner is None else [prompts[0], partner]


@dataclass
class Result:
    head_scores: pd.DataFrame
    causal: bool
    head_classes: pd.DataFrame
    untested: dict[str, str]
    """The classes whose null could not be made, each with the reason."""
    by_prompt: pd.DataFrame | None = None
    """The ``head_scores_by_prompt`` rows (``None``: not kept)."""

    def tables(self) -> dict[str, pd.DataFrame]:
        out = {"head_scores": self.head_scores, "head_classes": self.head_classes}
        if self.by_prompt is not None:
            out["head_scores_by_prompt"] = self.by_prompt
        return out

    def summary(self) -> list[str]:
        lines = []
        for metric in self.head_scores.metric.unique():
            df = self.head_scores[self.head_scores.metric == metric].nlargest(3, "score")
            heads = ", ".join(f"L{r.layer}H{r.head} {r.score:.2f} [{r.ci_low:.2f}, "
                              f"{r.ci_high:.2f}]" for r in df.itertuples())
            lines.append(f"top {metric} heads: {heads} (uniform null {df.null.iloc[0]:.3f})")
        lines += [classes.summary_line(self.head_classes, name)
                  for name in self.head_classes.head_class.unique()]
        lines += [f"{name} heads: not tested ({why})" for name, why in self.untested.items()]
        if self.causal:
            lines.append("next_token is not scored: a causal mask makes it 0 by construction")
        return lines


@experiment("previous-token-heads", config=Config, tables=TABLES,
            demo={"n_prompts": 16, "n_repeated": 16, "n_boot": 500}, inputs=inputs,
            bf16_safe=True)  # the bf16 table of docs/performance.md; tests/integration/test_bf16.py
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Score previous-token, next-token (encoders) and duplicate-token heads."""
    ctx = ctx or Context()
    natural = natural_prompts(model, cfg)
    positional = ("previous_token",) if model.info.causal else ("previous_token", "next_token")
    repeated = repeated_prompts(model, cfg)
    common = {"n_boot": cfg.n_boot, "seed": cfg.seed, "max_batch_tokens": cfg.max_batch_tokens,
              "testing": testing(cfg)}
    text = score_and_classify(model, natural, metrics.reductions(*positional),
                              inputs=text_label(cfg), **common)
    dup = score_and_classify(model, repeated, metrics.reductions("duplicate_token"),
                             inputs="repeated random tokens", repeats=(cfg.seq_len, 2),
                             **common)
    if ctx.workdir is not None:
        record(model, example_prompts(model, natural, repeated), ctx.workdir / "example",
               include_resid=False)
    return Result(with_layer_types(pd.concat([text.head_scores, dup.head_scores],
                                             ignore_index=True), model.info.layer_types),
                  model.info.causal,
                  pd.concat([text.head_classes, dup.head_classes], ignore_index=True),
                  text.untested | dup.untested,
                  pd.concat([scores_by_prompt(text.per_prompt, natural, text_label(cfg)),
                             scores_by_prompt(dup.per_prompt, repeated,
                                              "repeated random tokens")], ignore_index=True))
