"""Logit lens and direct logit attribution: at which layer does the answer appear, and which
components write it?

For any prompt set, the answer of a position is the token after it: with ``read=answer``
the position before each prompt's last token (the last token is the answer, as in the
``ioi`` prompt set, whose prompts end with the indirect object), with ``read=all`` every
position. Method: :mod:`workbench.scores.logit_attribution`.

Definitions (tables ``lens``, ``lens_layers``, ``direct_effects``, ``direct_per_prompt``):

- **logit lens** (nostalgebraist 2020, "interpreting GPT: the logit lens"): the residual
  stream at every layer boundary read through the model's own final norm and unembedding;
  per boundary, the answer's logit, probability and rank and the top token. The final
  norm's ``scale`` is stated in ``lens_layers.scale``: ``frozen`` (default) divides every
  boundary's stream by the scale the final norm computed on the final stream at that
  position, so the lens is linear and its logit at boundary ``l`` is the sum of the direct
  effects of the parts written below ``l`` (TransformerLens' ``accumulated_resid(apply_ln=
  True)``); ``recomputed`` applies the norm to each boundary's own stream. At the last
  boundary both are the model's logits (``checks``: ``lens_output``).
- **direct effect** of a component (embedding, each head, each MLP, the biases) on the
  answer's *centred* logit (its logit minus the mean logit over the vocabulary, which the
  softmax does not see): its part through the final norm, the scale frozen at its value on
  the prompt, and the unembedding; the parts sum to it (``checks``: ``dla_sum``). Means
  over prompts (each prompt's read positions averaged first) with 95% bootstrap intervals
  over prompts.

Example:
    workbench run logit-lens --model smollm2
    workbench run logit-lens --model smollm2 --set prompt_set=natural --set read=all
    python -m experiments.logit_lens --model smollm2 --set scale=recomputed
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd

from experiments.logit_lens.measure import (
    batches_of,
    check_table,
    direct_tables,
    lens_layers_table,
    lens_table,
    read_all,
    tokens_table,
)
from experiments.logit_lens.tables import TABLES
from workbench.core import progress
from workbench.core.options import AttentionPath
from workbench.core.values import MAX_PROMPTS
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.batching import Batch
from workbench.inputs.prompts import check_prompt_set, load_prompt_set
from workbench.models.base import Model
from workbench.scores.logit_attribution import LensScale, require_direct

Read = Literal["answer", "all"]


@dataclass(frozen=True)
class Config:
    prompt_set: str = param("ioi", "prompt set; each prompt's last token is the answer of "
                            "the position before it")
    n_prompts: int = param(32, "prompts read: the first N of the set", min=1, max=MAX_PROMPTS)
    read: Read = param("answer", "positions read: the one before the last token, or all")
    scale: LensScale = param("frozen", "the final norm's scale in the lens: frozen at the "
                             "final stream's (linear) or recomputed per boundary")
    attention: AttentionPath = param("auto", "attention path (blocked: memory linear in "
                                     "the prompt's length)")
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")

    def __post_init__(self) -> None:
        check_prompt_set(self.prompt_set)


@dataclass
class Result:
    tables_: dict[str, pd.DataFrame]

    def tables(self) -> dict[str, pd.DataFrame]:
        return self.tables_

    def summary(self) -> list[str]:
        t = self.tables_
        layers = t["lens_layers"]
        last = layers.iloc[-1]
        first_top = layers[layers.answer_top >= 0.5]
        where = (f"the answer is the top token at half the read positions from boundary "
                 f"{int(first_top.layer.iloc[0])} on" if len(first_top) else
                 "the answer is never the top token at half the read positions")
        direct = t["direct_effects"]
        top = direct.reindex(direct.effect.abs().sort_values(ascending=False).index).head(5)
        checks_ = t["checks"].set_index("invariant").value
        return [f"answer probability at the output {last.answer_prob:.3f} "
                f"[{last.ci_low:.3f}, {last.ci_high:.3f}] over {int(last.n_prompts)} prompts; "
                f"{where} (lens scale {last.scale})",
                "largest direct effects on the centred answer logit: " + ", ".join(
                    f"{r.component} {r.effect:+.3g}" for r in top.itertuples()),
                f"checks: direct effects sum to the centred logit within "
                f"{checks_['dla_sum']:.1e}; the lens at the last boundary is the output "
                f"within {checks_['lens_output']:.1e}"]


def plan(model: Model, cfg: Config) -> list[Batch]:
    """The prompt set encoded into batches before a run exists: a prompt longer than the
    model's context, or none of two tokens, is refused (``WorkbenchError``) with no run."""
    return batches_of(model, load_prompt_set(cfg.prompt_set, model, limit=cfg.n_prompts), cfg)


@experiment("logit-lens", config=Config, tables=TABLES, requires="causal_lm",
            check_model=require_direct, demo_models=("smollm2",),
            demo={"n_prompts": 16, "n_boot": 500}, plan=plan)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """The logit lens of the answer at every layer and each component's direct effect."""
    batches = ctx.planned if ctx is not None and ctx.planned is not None else plan(model, cfg)
    with progress.stages("logit-lens", 2) as stage:
        stage("lens and direct effects")
        read = read_all(model, batches, cfg)
        stage("tables")
        direct, per_prompt = direct_tables(read, cfg)
        tables = {"lens": lens_table(model, read), "lens_layers": lens_layers_table(read, cfg),
                  "direct_effects": direct, "direct_per_prompt": per_prompt,
                  "tokens": tokens_table(model, read), "checks": check_table(read)}
    return Result(tables)
