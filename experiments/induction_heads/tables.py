"""The tables of the induction-heads experiment."""

from __future__ import annotations

from workbench.store.schema import (
    Column,
    Table,
    columns,
    head_classes,
    head_scores,
    head_scores_by_prompt,
    per_prompt,
    tables,
)

METRIC_MEANING = (
    "induction: Olsson et al.'s prefix-matching score, the mean weight from each query "
    "whose token occurred exactly once before (the second repeat) on the token after that "
    "occurrence, repeated random tokens; induction_pooled: over every query with an earlier "
    "occurrence (every repeat after the first), the total weight on all earlier successors, "
    "same prompts; copying: direct-path z-score of the attended token's own logit, random "
    "tokens (n_prompts counts tokens); previous_token: mean weight on the previous token, "
    "natural text")
_BASE = head_scores("")
HEAD_SCORES = Table(
    "head_scores", "induction, induction_pooled, copying and previous_token of every head",
    tuple(Column("metric", "str", METRIC_MEANING) if c.name == "metric" else c
          for c in _BASE.columns), keys=_BASE.keys, min_rows=_BASE.min_rows)
REPEAT_LOSS = Table("repeat_loss", "next-token loss on each repeat of the random sequences",
                    columns(
    ("repeat", "int", "which repeat, from 1 (the first occurrence)"),
    ("loss", "float", "mean next-token loss (nats), each repeat's first token left out"),
    ("ci_low", "float", "95% bootstrap interval over prompts, low end"),
    ("ci_high", "float", "95% bootstrap interval over prompts, high end"),
    ("n_prompts", "int", "repeated random sequences"),
), keys=("repeat",), min_rows=1)
LOSS_BY_POSITION = Table("loss_by_position", "mean next-token loss at every position of "
                         "the natural-text ICL windows", columns(
    ("position", "int", "position of the predicted token (0 is BOS, never predicted)"),
    ("loss", "float", "mean loss (nats) over the ICL windows"),
), keys=("position",))
ABLATION = Table("ablation", "K-composition: the tracked induction heads with "
                 "previous-token heads, or random same-layer heads, ablated", columns(
    ("condition", "str", "clean, previous-token (the chosen heads) or random (the control)"),
    ("kind", "str", "zero or mean ablation of the heads' output z; none when clean"),
    ("draw", "int", "which random draw, from 0; -1 for clean and previous-token"),
    ("heads", "str", "the ablated heads, e.g. 'L3H1 L4H0'; '-' when clean"),
    ("tracked", "str", "the top heads by induction (Olsson) whose score is measured"),
    ("induction_tracked", "float", "mean induction (Olsson, second repeat) score of the "
     "tracked heads"),
    ("first_repeat_loss", "float", "mean loss (nats) on the first repeat"),
    ("second_repeat_loss", "float", "mean loss (nats) on the second repeat"),
), keys=("condition", "kind", "draw"))
PATH_PATCH = Table("path_patch", "K-composition, path-specific: the previous-token heads "
                   "(or random same-layer heads) removed from only the key, query or value "
                   "input of the tracked induction heads", columns(
    ("condition", "str", "clean, previous-token (the ablation's heads) or random (the control)"),
    ("path", "str", "key, query or value: the one input of the tracked heads they are removed "
     "from (with grouped-query attention key and value are the kv group's); none when clean"),
    ("draw", "int", "which random draw, from 0; -1 for clean and previous-token"),
    ("heads", "str", "the removed heads, e.g. 'L3H1 L4H0'; '-' when clean"),
    ("tracked", "str", "the top heads by induction (Olsson) whose inputs are patched"),
    ("induction_tracked", "float", "mean induction (Olsson, second repeat) score of the "
     "tracked heads"),
    ("first_repeat_loss", "float", "mean loss (nats) on the first repeat; NaN for the random "
     "draws (their control is on the induction score)"),
    ("second_repeat_loss", "float", "mean loss (nats) on the second repeat; NaN for random"),
), keys=("condition", "path", "draw"))
ICL = Table("icl", "in-context learning score (Olsson et al. 2022): loss late in the "
            "context minus loss early, by two estimators", columns(
    ("metric", "str", "icl_score (single tokens) or icl_score_window (mean over a band)"),
    ("value", "float", "mean over windows (nats); negative means it learns in context"),
    ("ci_low", "float", "95% bootstrap interval over windows, low end"),
    ("ci_high", "float", "95% bootstrap interval over windows, high end"),
    ("loss_at_50", "float", "mean loss (nats) at position 50 (or the band around it)"),
    ("loss_at_500", "float", "mean loss (nats) at position 500 (or the band around it)"),
    ("n_prompts", "int", "natural-text windows"),
    ("definition", "str", "the estimator, in words; 'n/a: why' when the context is too "
                          "short for it (the values are then NaN)"),
), keys=("metric",))

# per-prompt values of the scalars above, so that two runs can be paired prompt by prompt
# (workbench compare); the aggregate tables stay as they were
REPEAT_LOSS_BY_PROMPT = per_prompt(
    "repeat_loss_by_prompt", "next-token loss on each repeat of each random sequence (the "
    "prompts and losses repeat_loss averages)",
    columns(("repeat", "int", "which repeat, from 1 (the first occurrence)")),
    columns(("loss", "float", "mean next-token loss (nats) over the repeat, its first token "
                              "left out")))
ICL_BY_PROMPT = per_prompt(
    "icl_by_prompt", "each natural-text window's in-context learning score (the windows "
    "icl averages)",
    columns(("metric", "str", "icl_score (single tokens) or icl_score_window (mean over a "
                              "band)")),
    columns(("value", "float", "loss late minus loss early in this window (nats); NaN when "
                               "the context is too short (see icl's definition)"),
            ("loss_at_50", "float", "loss (nats) at position 50 (or the band around it)"),
            ("loss_at_500", "float", "loss (nats) at position 500 (or the band around it)")))
LOSS_BY_PROMPT = per_prompt(
    "loss_by_prompt", "next-token loss at every position of every natural-text ICL window "
    "(what loss_by_position averages)",
    columns(("position", "int", "position of the predicted token (0 is BOS, never "
                                "predicted)")),
    columns(("loss", "float", "next-token loss (nats)")))
HEAD_SCORES_BY_PROMPT = head_scores_by_prompt(
    "induction and induction_pooled on each repeated random sequence, previous_token on "
    "each natural-text window, copying on each random token (its prompts are single "
    "tokens; what head_scores averages)")

HEAD_CLASSES = head_classes(
    "every head tested for the induction class (repeated random tokens; null: the repeats "
    "after the first shuffled, read at the real targets) and the previous-token class "
    "(natural text; null: its own total weight on the tokens 2-4 back), at the false-discovery "
    "rate fdr")

TABLES = tables(HEAD_SCORES, REPEAT_LOSS, LOSS_BY_POSITION, ABLATION, ICL, PATH_PATCH,
                HEAD_CLASSES, REPEAT_LOSS_BY_PROMPT, ICL_BY_PROMPT, LOSS_BY_PROMPT,
                HEAD_SCORES_BY_PROMPT)
