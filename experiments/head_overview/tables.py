"""The tables of the head-overview experiment."""

from __future__ import annotations

from workbench.store.schema import HEAD_KEYS, Column, Table, head_classes, head_scores, tables

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
), keys=("prompt", "layer", "head", "metric"))

HEAD_CLASSES = head_classes(
    "every head tested for the previous-token class (null: its own total weight on the "
    "tokens 2-4 back) and the sink class (alpha_1 above sink_eps), on the prompt set, at the "
    "false-discovery rate fdr")

TABLES = tables(HEAD_SCORES, PER_PROMPT_SCORES, HEAD_CLASSES)
