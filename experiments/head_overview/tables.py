"""The tables of the head-overview experiment."""

from __future__ import annotations

from workbench.store.schema import HEAD_KEYS, Column, Table, head_scores, tables

HEAD_SCORES = head_scores(
    "entropy, normalized_entropy, mean_distance and self_attention of every head on the "
    "prompt set",
    null=False)
PER_PROMPT_SCORES = Table("per_prompt_scores", "the same scores on each prompt, before the "
                          "mean over prompts", (
    Column("prompt", "int", "index of the prompt in the prompt set, from 0"),
    *HEAD_KEYS,
    Column("metric", "str", "which score: a head metric of workbench.scores.metrics"),
    Column("score", "float", "the score on this prompt"),
))

TABLES = tables(HEAD_SCORES, PER_PROMPT_SCORES)
