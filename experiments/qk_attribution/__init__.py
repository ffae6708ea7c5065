"""QK attribution: why does a head attend where it does? Which upstream components write the
key it matches, and which write what its query looks for?

The workbench's scores say *which* heads are induction, previous-token or sink heads, and
the induction-heads ablation that induction heads need previous-token heads. This
experiment explains a head's attention on each input: the pre-softmax score of a query on
a key is split exactly over the upstream components (token embedding, every earlier
head's output, every earlier MLP, the biases) that wrote the two residual streams, with
the layer's input-norm scale frozen at its value on the input and rotary applied as the
linear map it is (:mod:`workbench.scores.qk_attribution` states the method and its
assumptions). It is the QK half of Elhage et al. 2021 ("A Mathematical Framework for
Transformer Circuits": K- and Q-composition) made exact on one forward pass of a real
model, and the "QK attribution" circuit-tracer's issue 53 asks for; the K-composition it
tests is Olsson et al. 2022's ("In-context Learning and Induction Heads").

Definitions (tables ``attribution``, ``pair_contributions``, ``pair_matrix``):

- **key side**: ``score(i, j) = sum_c <q_i, k_j^(c)>`` with the query whole; with
  grouped-query attention ``k`` is the head's key-value group's (``kv_group``).
- **query side**: ``score(i, j) = sum_c <q_i^(c), k_j>`` with the key whole.
- **pairs**: ``<q_i^(a), k_j^(b)>`` for the top ``top`` components of each side plus an
  ``other`` row and column (each matrix sums to the score).
- **share**: ``contribution / sum_c |contribution_c|`` per pair (signed, in -1..1), then
  the mean over pairs and prompts, with a 95% bootstrap interval over prompts.

Positions (``positions=auto`` follows ``metric``): for ``induction``, every query of the
second repeat of ``repeated-random`` prompts with its induction target key (the token after
the query token's earlier occurrence); for ``previous_token``, every query with the token
before it; for ``first_token``, every query with the first token.

Heads (``heads=auto``): the top ``n_heads`` heads by ``metric`` in the newest complete run of
its head-finding experiment on the same weights (``induction-heads``, ``previous-token-
heads`` or ``attention-sinks``), else scored here on the prompts.

Groups (table ``groups``, the claims): the summed share of the previous-token heads the
induction-heads K-composition ablation removes (read from its newest run when it tracked
the same heads, else chosen as it chooses them), of ``n_random`` draws of as many random
same-layer heads, their difference (``excess``), and of the embedding (the current
token's own path).

Checks (table ``scores``: every pair's parts sum to the model's own score; ``path_check``:
each top component removed from only the head's key or query input, the pattern
recomputed, :func:`workbench.interventions.paths.path_removed`): the score drop equals the
linear part, and the weight drop is reported beside it. Pre-norm models only: a post-norm
encoder (minilm) is refused before any run is created, and so is a model with soft-capped
scores or whose scores the parts do not reproduce on a short probe
(:func:`workbench.scores.qk_attribution.require_linearisable`). Gemma 3's per-head q/k
norms and its norm on the attention output are frozen at their scales on the input, like
the first norm, so gemma3 is split exactly; a pair further apart than a sliding layer's
window (512 keys on gemma3) is refused, its key being masked.

Example:
    workbench run qk-attribution --model smollm2
    workbench run qk-attribution --model smollm2 --set heads="L4H0 L8H3" --set n_prompts=4
    python -m experiments.qk_attribution --model smollm2 --set metric=previous_token
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import pandas as pd

from experiments.qk_attribution import checks  # noqa: F401 (registers the claim checks)
from experiments.qk_attribution.measure import (
    METRIC_SOURCES,
    attribute_all,
    attribution_by_prompt,
    attribution_table,
    choose_heads,
    group_table,
    pair_tables,
    parse_heads,
    path_check_table,
    previous_token_heads,
    sources_table,
)
from experiments.qk_attribution.tables import TABLES
from workbench.core.options import FixedAblation
from workbench.core.values import MAX_DRAWS, MAX_HEADS, MAX_PROMPTS, MAX_REPEATS, MAX_SEQUENCE
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.prompts import check_prompt_set, load_prompt_set
from workbench.models.base import Model
from workbench.scores.qk_attribution import require_linearisable

Metric = Literal["induction", "previous_token", "first_token"]
"""The head kinds explained, each a registered head metric with a source in ``METRIC_SOURCES``."""
Positions = Literal["auto", "induction", "previous", "first"]


@dataclass(frozen=True)
class Config:
    heads: str = param("auto", "'auto' (top n_heads by metric) or heads like 'L5H1 L6H9'")
    metric: Metric = param("induction", "head kind: picks auto heads and auto positions")
    n_heads: int = param(3, "heads to explain when heads=auto", min=1, max=32)
    prompt_set: str = param("auto", "prompt set; auto: repeated-random for induction, "
                            "natural otherwise")
    n_prompts: int = param(16, "repeated-random prompts", min=1, max=MAX_PROMPTS)
    seq_len: int = param(40, "tokens per random sequence", min=2, max=MAX_SEQUENCE)
    repeats: int = param(2, "times each random sequence is repeated", min=2, max=MAX_REPEATS)
    positions: Positions = param("auto", "(query, key) rule; auto follows metric")
    top: int = param(5, "components of each side in the pair matrix", min=1, max=20)
    n_previous: int = param(3, "previous-token heads in the K-composition group",
                            min=1, max=MAX_HEADS)
    n_random: int = param(20, "random same-layer draws for the group control", min=1, max=MAX_DRAWS)
    n_patch: int = param(3, "top components path-patched per head and side", min=0, max=MAX_HEADS)
    patch_prompts: int = param(4, "prompts the path-patch check runs on", min=1, max=MAX_PROMPTS)
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")

    def __post_init__(self) -> None:
        if self.heads != "auto":
            parse_heads(self.heads)
        if self.prompt_set != "auto":
            check_prompt_set(self.prompt_set)

    @property
    def rule(self) -> str:
        return METRIC_SOURCES[self.metric][1] if self.positions == "auto" else self.positions


@dataclass
class Result:
    tables_: dict[str, pd.DataFrame]
    heads_from: str
    previous_from: str

    def tables(self) -> dict[str, pd.DataFrame]:
        return self.tables_

    def summary(self) -> list[str]:
        att, scores = self.tables_["attribution"], self.tables_["scores"]
        err = ((scores.key_sum - scores.score).abs().max()
               / max(scores.score.abs().max(), 1e-30))
        lines = [f"heads from {self.heads_from}; previous-token heads from "
                 f"{self.previous_from}; parts sum to the model's score within {err:.1e} "
                 "(relative); the key side is each head's kv group"]
        for (layer, head), mine in att.groupby(["layer", "head"]):
            parts = []
            for side in ("key", "query"):
                top = mine[mine.side == side].nlargest(3, "share")
                parts.append(f"{side}: " + ", ".join(
                    f"{r.component} {r.share:+.2f}" for r in top.itertuples()))
            lines.append(f"L{layer}H{head} " + "; ".join(parts))
        groups = self.tables_["groups"]
        excess = groups[(groups.group == "excess") & (groups.layer == -1)]
        for r in excess.itertuples():
            lines.append(f"{r.side} side, previous-token heads minus random same-layer heads "
                         f"(share): {r.share:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]")
        check = self.tables_["path_check"]
        if len(check):
            lines.append(f"path patch: score drop = linear part within "
                         f"{check.max_abs_diff.max():.1e}; sign agrees "
                         f"{int(check.sign_agrees.sum())}/{len(check)}; weight drop has the "
                         f"part's sign {int((check.weight_drop * check.contribution > 0).sum())}"
                         f"/{len(check)}")
        return lines


def _prompts(model: Model, cfg: Config):
    name = cfg.prompt_set
    if name == "auto":
        name = "repeated-random" if cfg.rule == "induction" else "natural"
    if name == "repeated-random":
        return load_prompt_set(name, model, n_prompts=cfg.n_prompts, seq_len=cfg.seq_len,
                               repeats=cfg.repeats, seed=cfg.seed)
    return load_prompt_set(name, model)


@experiment("qk-attribution", config=Config, tables=TABLES,
            check_model=require_linearisable, demo_models=("smollm2",),
            demo={"n_prompts": 8, "n_random": 20, "n_boot": 500, "patch_prompts": 2},
            # each prompt runs in a forward pass of its own: no other prompt to resample from
            ablations=get_args(FixedAblation))
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """Split the chosen heads' attention scores over upstream components."""
    ctx = ctx or Context()
    prompts = _prompts(model, cfg)
    heads, heads_from = choose_heads(model, cfg, ctx, prompts)
    previous, previous_from = previous_token_heads(model, cfg, ctx, heads)
    atts = attribute_all(model, prompts, heads, cfg.rule, cfg.top)
    tables = {"attribution": attribution_table(atts, cfg),
              "attribution_by_prompt": attribution_by_prompt(atts), **pair_tables(model, atts),
              "groups": group_table(model, atts, previous, cfg),
              "path_check": path_check_table(model, atts, cfg) if cfg.n_patch else
              TABLES["path_check"].empty(),
              "sources": sources_table(cfg, heads, heads_from, previous, previous_from)}
    return Result(tables, heads_from, previous_from)
