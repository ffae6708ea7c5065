"""The tables of the previous-token-heads experiment."""

from __future__ import annotations

from workbench.store.schema import head_scores, tables

HEAD_SCORES = head_scores(
    "previous_token and next_token (encoders only) on natural text or the prompt set of "
    "`text` (the inputs column names which), duplicate_token on repeated random tokens, "
    "of every head")

TABLES = tables(HEAD_SCORES)
