"""The tables of the previous-token-heads experiment."""

from __future__ import annotations

from workbench.store.schema import head_classes, head_scores, head_scores_by_prompt, tables

HEAD_SCORES = head_scores(
    "previous_token and next_token (encoders only) on natural text or the prompt set of "
    "`text` (the inputs column names which), duplicate_token on repeated random tokens, "
    "of every head")

HEAD_CLASSES = head_classes(
    "every head tested for the previous-token class (natural text; null: its own total "
    "weight on the tokens 2-4 back) and the duplicate-token class (repeated random "
    "tokens; null: the repeats replaced by fresh tokens), at the false-discovery rate fdr")

HEAD_SCORES_BY_PROMPT = head_scores_by_prompt(
    "every score of head_scores on each of its prompts (what head_scores averages)")

TABLES = tables(HEAD_SCORES, HEAD_CLASSES, HEAD_SCORES_BY_PROMPT)
