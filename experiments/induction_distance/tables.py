"""The tables of the induction-distance experiment."""

from __future__ import annotations

from workbench.store.schema import HEAD_KEYS, LAYER_TYPE, Table, columns, per_prompt, tables

DISTANCE_SCORES = Table(
    "distance_scores", "every head's Olsson induction score at each distance D between the "
    "two occurrences of a random sequence", (*HEAD_KEYS, LAYER_TYPE, *columns(
        ("distance", "int", "D: tokens from a token's first occurrence to its second"),
        ("score", "float", "mean weight from each token of the second occurrence on the "
                           "token after its first occurrence, D - 1 positions back"),
        ("ci_low", "float", "95% bootstrap interval of score over prompts, low end"),
        ("ci_high", "float", "95% bootstrap interval of score over prompts, high end"),
        ("n_prompts", "int", "prompts (random sequences, each with its own filler)"),
        ("null", "float", "the score of attention uniform over the keys each query sees "
                          "(on a sliding layer, over its window: 0 once D exceeds it)"),
    )), keys=("layer", "head", "distance"), min_rows=1)
DISTANCE_LOSSES = Table(
    "distance_losses", "the in-context loss drop at each distance D", columns(
        ("distance", "int", "D: tokens from a token's first occurrence to its second"),
        ("first_loss", "float", "mean next-token loss (nats) on the first occurrence, its "
                                "first token left out"),
        ("second_loss", "float", "the same on the second occurrence"),
        ("drop", "float", "first_loss - second_loss: how much the earlier copy helps"),
        ("ci_low", "float", "95% bootstrap interval of drop over prompts, low end"),
        ("ci_high", "float", "95% bootstrap interval of drop over prompts, high end"),
        ("n_prompts", "int", "prompts"),
    ), keys=("distance",), min_rows=1)

DISTANCE_LOSSES_BY_PROMPT = per_prompt(
    "distance_losses_by_prompt", "each prompt's losses at each distance D (what "
    "distance_losses averages; a prompt's filler differs with D, so its tokens do too)",
    columns(("distance", "int", "D: tokens from a token's first occurrence to its second")),
    columns(("first_loss", "float", "mean next-token loss (nats) on the first occurrence, "
                                    "its first token left out"),
            ("second_loss", "float", "the same on the second occurrence"),
            ("drop", "float", "first_loss - second_loss")))
DISTANCE_SCORES_BY_PROMPT = per_prompt(
    "distance_scores_by_prompt", "every head's induction score on each prompt at each "
    "distance D (what distance_scores averages)",
    (*columns(("distance", "int", "D: tokens from a token's first occurrence to its second")),
     *HEAD_KEYS),
    columns(("score", "float", "mean weight from each token of the prompt's second "
                               "occurrence on the token after its first occurrence")))

TABLES = tables(DISTANCE_SCORES, DISTANCE_LOSSES, DISTANCE_LOSSES_BY_PROMPT,
                DISTANCE_SCORES_BY_PROMPT)
