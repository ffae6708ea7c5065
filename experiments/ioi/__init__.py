"""Indirect object identification: does the model complete "When Mary and John went to the
store, John gave a drink to" with the indirect object, and which heads write that answer?

Wang et al. 2022 ("Interpretability in the Wild: a Circuit for Indirect Object
Identification in GPT-2 small") found the circuit GPT-2 small uses: *name movers* attend
from the last token to the indirect object (IO) and copy it to the logits, *negative name
movers* do the same with the opposite sign, and *S-inhibition* heads, attending to the
subject's second occurrence (S2), keep the name movers' queries off the subject (S); they
were found by path patching. This experiment runs their protocol on any causal LM and
states what this model does.

Prompts (:mod:`workbench.inputs.ioi`): Wang et al.'s fifteen templates in ABBA and BABA
order (the first ``templates``), names, places and objects that are one token in the
model's tokenizer (filtered at run time from the lists there), each prompt ending just
before the answer; the corrupted prompt (their "ABC" distribution) has IO, S1 and S2
replaced by three other names.

Definitions (tables ``prompts``, ``behaviour``, ``direct_effects``, ``attention``):

- **logit difference**: ``logit(IO) - logit(S)`` at the last position (END), mean over
  prompts with a 95% bootstrap interval; ``above_chance`` when the interval is above 0.
  **Where it is not, no head class is claimed** (``classes.claimed`` is false and the
  summary says so).
- **direct effect** of a component (embedding, each head, each MLP, the biases): its part
  of the logit difference through the final norm, whose scale is frozen at its value on the
  prompt, and the unembedding (:mod:`workbench.scores.logit_attribution`); the parts sum to
  the logit difference (table ``checks``, ``dla_sum``).
- **attention** from END to IO, S1, S1+1 and S2, from S2 to S1 and S1+1, and from S1+1
  to S1, per head.

Classes (table ``classes``; thresholds ``min_effect`` and ``min_attention``, fixed before any
run):

- **name mover**: direct effect at least ``min_effect`` x the mean logit difference, its
  interval above 0, and attention END -> IO at least ``min_attention``;
- **negative name mover**: the same with the direct effect at most minus that, its
  interval below 0;
- **s-inhibition**: path-patched from the corrupted run into only the name movers' queries
  (:func:`workbench.interventions.paths.path_patched`: the direct path sender -> receiver
  query, the receivers' input norm frozen at its clean scale), the logit difference changes
  by ``mean(patched - clean) / mean(clean)``, whose whole interval is at most
  ``-min_effect``, and attention END -> S2 at least ``min_attention``. Without a name
  mover the receivers are the top ``n_receivers`` heads by direct effect (stated in
  ``path_patching.receivers``) and no S-inhibition head is classified;
- **duplicate-token** and **induction**: path-patched from the corrupted run into only
  the S-inhibition heads' keys and values at once (Wang et al. section 3.3), the relative
  change's whole interval at most ``-min_effect``, and attention S2 -> S1
  (duplicate-token) or S2 -> S1+1 (induction) at least ``min_attention``;
- **previous-token**: the same through only the induction heads' keys, attention S1+1 ->
  S1 at least ``min_attention``.

Upstream receivers (table ``upstream_paths``, ``receiver_kind``): the S-inhibition heads,
and then the induction heads, when there are any; otherwise the class's *candidates*, the
``n_receivers`` senders of the patch before whose attention (END -> S2; S2 -> S1+1) is at
least ``min_attention`` and whose effect is the most negative. Candidates are never
claimed as the class, and no head is classified through them: their rows are measured
and stated, and ``classes`` holds no duplicate-token, induction or previous-token head.

Activation patching (tables ``patch_positions`` and ``patch_heads``;
:mod:`workbench.interventions.patching`): on ``patch_prompts`` prompts of each of the ABBA
and BABA groups of the first ``patch_templates`` templates, every position of every layer
of each site in ``sites`` (``resid_pre`` always) and every head's output at every position,
patched from the clean run into the corrupted one; normalised ``(patched - corrupted) /
(clean - corrupted)`` of the mean logit difference (0 corrupted, 1 clean), with a bootstrap
interval over prompts. The checks (``checks``): every position of ``resid_pre`` patched is
1 at every layer (``patch_every``), nothing patched is 0 (``patch_nothing``).

Example:
    workbench run ioi --model smollm2
    workbench run ioi --model smollm2 --set sites=resid_pre,attn_out,mlp_out --set patch_templates=2
    python -m experiments.ioi --model smollm2 --set path_patch=false
    workbench run ioi --model smollm2 --set upstream=false --set n_receivers=2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pandas as pd

from experiments.ioi import checks  # noqa: F401 (registers the claim checks)
from experiments.ioi.measure import (
    attention_table,
    behaviour_table,
    check_rows,
    direct_table,
    groups_of,
    inhibition_rows,
    label,
    make_prompts,
    measure_prompts,
    mover_rows,
    patch_all,
    path_patch_table,
    prompts_table,
    receivers,
    upstream_class_rows,
    upstream_table,
)
from experiments.ioi.tables import TABLES
from workbench.core import progress
from workbench.core.values import MAX_HEADS, MAX_PROMPTS
from workbench.harness.config import param, shared
from workbench.harness.experiment import Context, experiment
from workbench.inputs.ioi import TEMPLATES, IOIPrompt
from workbench.models.base import Model
from workbench.scores.logit_attribution import require_direct

PositionSite = Literal["resid_pre", "attn_out", "mlp_out"]


@dataclass(frozen=True)
class Config:
    n_prompts: int = param(60, "prompts of the behaviour, direct effects and attention "
                           "(templates cycled, ABBA then BABA)", min=2, max=MAX_PROMPTS)
    templates: int = param(len(TEMPLATES), "templates used: the first N of "
                           "workbench.inputs.ioi.TEMPLATES", min=1, max=len(TEMPLATES))
    patch_templates: int = param(1, "templates whose ABBA and BABA groups are patched",
                                 min=1, max=len(TEMPLATES))
    patch_prompts: int = param(8, "prompts per patched group", min=2, max=MAX_PROMPTS)
    sites: tuple[PositionSite, ...] = param(("resid_pre",), "sites patched over layers x "
                                            "positions (resid_pre always, with the checks)")
    path_patch: bool = param(True, "path-patch every earlier head into the receivers' "
                             "queries (S-inhibition)")
    upstream: bool = param(True, "path-patch every head below into the S-inhibition heads' "
                           "keys and values, then into the induction heads' keys "
                           "(duplicate-token, induction, previous-token; their candidates "
                           "where no head is in the class)")
    n_receivers: int = param(3, "receivers when a class has no head: the top heads by "
                             "direct effect (no name mover), the candidates closest to "
                             "the criterion (no s-inhibition or induction head)",
                             min=1, max=MAX_HEADS)
    min_effect: float = param(0.1, "a class's least effect: a fraction of the mean logit "
                              "difference (name movers) or of its relative change (the "
                              "path-patched classes)", min=0.0, max=1.0)
    min_attention: float = param(0.1, "a class's least attention: END to IO (name movers), "
                                 "END to S2 (s-inhibition), S2 to S1 (duplicate-token), S2 "
                                 "to S1+1 (induction), S1+1 to S1 (previous-token)",
                                 min=0.0, max=1.0)
    names: str = param("auto", "candidate names ('auto': workbench.inputs.ioi.NAMES), "
                       "filtered to single tokens")
    places: str = param("auto", "candidate places ('auto': workbench.inputs.ioi.PLACES)")
    objects: str = param("auto", "candidate objects ('auto': workbench.inputs.ioi.OBJECTS)")
    n_boot: int = shared("n_boot")
    seed: int = shared("seed")
    max_batch_tokens: int = shared("max_batch_tokens")


@dataclass
class Result:
    tables_: dict[str, pd.DataFrame]
    receivers_from: str
    upstream_notes: list[str]

    def tables(self) -> dict[str, pd.DataFrame]:
        return self.tables_

    def summary(self) -> list[str]:
        t = self.tables_
        b = t["behaviour"].set_index("scope")
        row = b.loc["all"]
        lines = [f"logit difference IO - S at END: {row.logit_diff:+.3f} "
                 f"[{row.ci_low:+.3f}, {row.ci_high:+.3f}] over {int(row.n_prompts)} prompts "
                 f"(IO preferred on {row.prefers_io:.0%}; corrupted "
                 f"{row.corrupted_logit_diff:+.3f})"]
        if not row.above_chance:
            lines.append("the interval does not exclude 0: the model does not perform the "
                         "task above chance here, and no head class is claimed")
        classes = t["classes"]
        for name in ("name mover", "negative name mover", "s-inhibition", "duplicate-token",
                     "induction", "previous-token"):
            mine = classes[classes.head_class == name] if len(classes) else classes
            heads = ", ".join(f"L{r.layer}H{r.head} {r.effect:+.3f} [{r.ci_low:+.3f}, "
                              f"{r.ci_high:+.3f}]" for r in mine.itertuples()) or "none"
            verb = "" if row.above_chance else " (not claimed)"
            lines.append(f"{name}{verb}: {heads}")
        paths = t["path_patching"]
        if len(paths):
            lines.append(f"path patching into the queries of {paths.receivers.iloc[0]} "
                         f"({self.receivers_from})")
        for note in self.upstream_notes:
            lines.append(f"upstream path patching {note}")
        inv = t["checks"].set_index("invariant").value
        lines.append(f"checks: direct effects sum to the logit difference within "
                     f"{inv['dla_sum']:.1e}; every position patched {inv['patch_every']:.1e} "
                     f"from 1; nothing patched {inv['patch_nothing']:.1e} from 0")
        return lines


@dataclass(frozen=True)
class Plan:
    """The prompts of the behaviour and of the patching, drawn before a run exists."""

    prompts: list[IOIPrompt]
    patch_prompts: list[IOIPrompt]

    def lengths(self) -> dict[str, list[int]]:
        """The token lengths of the prompts batched together (a resample head mask pairs
        prompts of one length: :func:`workbench.harness.experiment.check_planned_pairing`)."""
        return {"ioi's prompts": [len(p.ids) for p in self.prompts],
                "ioi's patching prompts": [len(p.ids) for p in self.patch_prompts]}


def plan(model: Model, cfg: Config) -> Plan:
    """The prompts, drawn before a run exists: too few names, places or objects that are
    one token of the model (``WorkbenchError``) leave no failed run."""
    return Plan(make_prompts(model, cfg, cfg.n_prompts, range(cfg.templates), cfg.seed),
                make_prompts(model, cfg, 2 * cfg.patch_templates * cfg.patch_prompts,
                             range(cfg.patch_templates), cfg.seed + 1))


@experiment("ioi", config=Config, tables=TABLES, requires="causal_lm",
            check_model=require_direct, demo_models=("smollm2",),
            demo={"n_prompts": 40, "patch_prompts": 6, "n_boot": 500}, plan=plan)
def run(model: Model, cfg: Config, ctx: Context | None = None) -> Result:
    """The IOI behaviour, the direct effects and the head classes of Wang et al. 2022."""
    planned = ctx.planned if ctx is not None and ctx.planned is not None else plan(model, cfg)
    with progress.stages("ioi", 4) as stage:
        stage("behaviour and direct effects")
        prompts = planned.prompts
        measured = measure_prompts(model, prompts, cfg)
        behaviour = behaviour_table(prompts, measured, cfg)
        direct = direct_table(measured, cfg)
        attention = attention_table(measured, cfg)
        classes = mover_rows(direct, attention, behaviour, cfg)
        stage("activation patching")
        groups = groups_of(planned.patch_prompts)
        positions, heads, invariants = patch_all(model, groups, cfg)
        stage("path patching")
        paths, receivers_from = TABLES["path_patching"].empty(), "not run (path_patch=false)"
        if cfg.path_patch:
            targets, receivers_from = receivers(direct, classes, cfg)
            if max(layer for layer, _ in targets) > 0:
                paths = path_patch_table(model, groups, targets, attention, cfg)
            else:  # no head is below them
                receivers_from += (f"; not run: the receivers "
                                   f"({' '.join(map(label, targets))}) are in layer 0")
        movers = len(classes) and (classes.head_class == "name mover").any()
        inhibition = inhibition_rows(paths, behaviour, bool(movers), cfg)
        stage("upstream path patching")
        upstream, notes = TABLES["upstream_paths"].empty(), []
        if cfg.upstream and len(paths):
            found, notes = upstream_table(model, groups, paths, inhibition, attention,
                                          behaviour, cfg)
            upstream = found if len(found) else upstream
        elif len(paths):
            notes = ["not run (upstream=false)"]
        upstream_classes = upstream_class_rows(upstream, behaviour, cfg) if len(upstream) \
            else pd.DataFrame()
    classes = pd.concat([c for c in (classes, inhibition, upstream_classes) if len(c)] or
                        [TABLES["classes"].empty()], ignore_index=True)
    tables = {"prompts": prompts_table(prompts, measured), "behaviour": behaviour,
              "direct_effects": direct, "attention": attention, "classes": classes,
              "patch_positions": positions, "patch_heads": heads, "path_patching": paths,
              "upstream_paths": upstream, "checks": check_rows(measured, invariants)}
    return Result(tables, receivers_from, notes)
