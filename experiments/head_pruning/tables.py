"""The tables of head-pruning (see the package docstring for every definition)."""

from __future__ import annotations

from workbench.store.schema import (
    HEAD_KEYS,
    Column,
    Table,
    columns,
    head_scores,
    head_scores_by_prompt,
    per_prompt,
    tables,
)

KIND_EXPERIMENTS = ("previous-token-heads", "induction-heads", "attention-sinks")
"""Experiments whose head scores the ``survival`` table joins with the pruning order."""

ORDER_KEYS = columns(
    ("order", "str", "pruning order: an importance kind, reverse-<kind>, or random"),
    ("importance", "str", "the importance kind that ranks heads in this order ('' if random)"),
    ("seed", "int", "seed of a random order (missing for the others)"),
)

HEAD_SCORES = head_scores(
    "importance of every head of the unpruned model, estimated on the fit text: "
    "importance_gradient (normalised per layer), importance_gradient_raw, importance_ablation",
    null=False)

# each fit text's importance, so that two runs pair prompt by prompt; importance_gradient
# (normalised per layer) is a ratio of means over texts, with no value per text: its
# texts' values are importance_gradient_raw's
HEAD_SCORES_BY_PROMPT = head_scores_by_prompt(
    "each fit text's importance of every head of the unpruned model (what head_scores "
    "averages): importance_gradient_raw (|dL/dxi| of the text; only with "
    "accumulate=example) on the fit text, importance_ablation on the ablation text "
    "(the first ablation_tokens of it); importance_gradient, normalised per layer, is "
    "not a mean over texts and has none")

PRUNING_CURVE = Table("pruning_curve", "evaluation metrics after every step of every order", (
    *ORDER_KEYS,
    *columns(
        ("step", "int", "pruning step, 0 = the unpruned model"),
        ("n_pruned", "int", "heads removed after this step"),
        ("fraction_pruned", "float", "n_pruned over all heads, in [0, 1]"),
        ("metric", "str", "heldout_loss, second_repeat_loss (nats) or cosine_similarity"),
        ("value", "float", "the metric's mean over held-out texts"),
        ("ci_low", "float", "95% bootstrap interval over texts, low end"),
        ("ci_high", "float", "95% bootstrap interval over texts, high end"),
        ("n_prompts", "int", "held-out texts the metric is averaged over"),
    ),
), min_rows=1)

# each text's values, so that two runs pair prompt by prompt (workbench compare); the
# prompts are numbered from 0 within each metric's texts
PRUNING_CURVE_BY_PROMPT = per_prompt(
    "pruning_curve_by_prompt", "each evaluation text's metric after every step of every "
    "order (what pruning_curve averages)",
    (*ORDER_KEYS, *columns(
        ("step", "int", "pruning step, 0 = the unpruned model"),
        ("metric", "str", "heldout_loss, second_repeat_loss (nats) or cosine_similarity; "
                          "each metric's texts are numbered from 0"),
    )),
    columns(
        ("n_pruned", "int", "heads removed after this step"),
        ("value", "float", "the metric on this text"),
    ))

PRUNING_ORDER = Table("pruning_order", "when each head was removed in each order", (
    *ORDER_KEYS,
    *HEAD_KEYS,
    *columns(
        ("position", "int", "removals before this head's, 0 = removed first (missing: never)"),
        ("step", "int", "the pruning step that removed it (missing: never removed)"),
        ("fraction_pruned", "float", "fraction of heads removed after that step (NaN: never)"),
        ("survival", "float", "position as a percentile in (0, 1), 1 = removed last; heads "
                              "never removed share the mean of the remaining positions"),
    ),
))

MASKS = Table("masks", "the first importance order's head masks at each budget", (
    *columns(
        ("order", "str", "the pruning order the mask comes from"),
        ("budget", "float", "the fraction of heads asked for (config budgets)"),
        ("fraction_pruned", "float", "fraction of heads the mask removes (nearest step)"),
    ),
    *HEAD_KEYS,
    *columns(("keep", "int", "1 = the head stays, 0 = removed")),
))

SURVIVAL = Table("survival", "do the top heads of other experiments' metrics (newest complete, "
                 f"unmasked runs of {', '.join(KIND_EXPERIMENTS)} on the same weights when "
                 "this run was made) survive longer in the first importance order?", (
    *columns(
        ("experiment", "str", "the experiment whose head scores are joined"),
        ("run", "str", "the id of its run"),
    ),
    Column("runs_read", "str", "the ids of every run whose head scores this run read from the "
           "store, comma-separated, the same on every row (a run read may give no row: a "
           "metric with fewer than 3 scored heads is left out); '' in a run written before "
           "this column, whose run column names the runs its rows come from", absent=""),
    *columns(
        ("metric", "str", "its head score"),
        ("order", "str", "the pruning order (the first importance kind)"),
        ("top_k", "int", "heads with the highest score taken"),
        ("heads", "str", "those heads, highest score first, as L<layer>H<head>"),
        ("top_mean_survival", "float", "their mean survival; 0.5 expected for unrelated heads"),
        ("z", "float", "its distance from 0.5 in standard errors of a mean of top_k positions "
                       "drawn without replacement (NaN when top_k is every head)"),
        ("spearman", "float", "Spearman correlation of score and survival over all heads"),
    ),
))

SPEEDUP = Table("speedup", "the model with heads removed from its weights against the full "
                "model, timed on one held-out batch (zero ablation only): the median and "
                "range of interleaved repeats, and the machine's load while they ran", columns(
    ("budget", "float", "the budget of the mask removed"),
    ("n_removed", "int", "heads removed from the weights"),
    ("params_full", "float", "parameters of the full model (NaN when skipped)"),
    ("params_removed", "float", "parameters with the heads removed (NaN when skipped)"),
    ("seconds_full", "float", "wall-clock seconds of the full model, median of the repeats"),
    ("seconds_full_low", "float", "the fastest of those repeats"),
    ("seconds_full_high", "float", "the slowest of those repeats"),
    ("seconds_removed", "float", "the same with the heads removed: median of the repeats"),
    ("seconds_removed_low", "float", "the fastest of those repeats"),
    ("seconds_removed_high", "float", "the slowest of those repeats"),
    ("speedup", "float", "median over the repeats of full / removed seconds, each repeat's "
                         "pair timed back to back"),
    ("speedup_low", "float", "the lowest of those ratios"),
    ("speedup_high", "float", "the highest of those ratios"),
    ("repeats", "int", "timed pairs (full, then removed) of the batch"),
    ("load_before", "float", "the machine's 1-minute load average before the timings"),
    ("load_after", "float", "the same after them"),
    ("busy", "bool", "the load was above the machine's cores before or after: the times "
                     "include waiting for the cores, and the speed-up is not the model's own"),
    ("max_abs_diff", "float", "largest |output removed - output masked| over real tokens "
                              "(logits, or mean-pooled embeddings)"),
    ("batch_tokens", "int", "real tokens in the timed batch"),
    ("skipped", "str", "why heads were not removed from this family's weights (the "
                       "measurements are then NaN); empty when they were"),
))

TABLES = tables(HEAD_SCORES, HEAD_SCORES_BY_PROMPT, PRUNING_CURVE, PRUNING_ORDER, MASKS,
                SURVIVAL, SPEEDUP, PRUNING_CURVE_BY_PROMPT)
