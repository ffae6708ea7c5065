"""The tables of a sweep run (``experiment = sweep``), importable without torch or ray.

``cells`` lists every cell and how it ended; ``scores`` joins the ``head_scores`` of every
complete cell with the cell's model, seed, step and varying config values, in one long
table that pandas and DuckDB read as it is::

    SELECT series, step, max(score) FROM 'scores.parquet'
    WHERE metric = 'induction' GROUP BY series, step ORDER BY series, step
"""

from __future__ import annotations

from workbench.store.schema import Table, columns, tables

CELL_KEYS = columns(
    ("cell", "int", "the cell's index in the sweep, from 0"),
    ("experiment", "str", "the experiment the cell ran"),
    ("model", "str", "the MODEL the cell ran on ('-' for experiments that train their own)"),
    ("series", "str", "the model without its step: <run-id>/L<n> for a checkpoint, else the "
     "model"),
    ("step", "int", "training step of a checkpoint model; -1 for any other model"),
    ("tokens", "int", "training tokens a checkpoint model had seen; -1 for any other model"),
    ("seed", "int", "the cell's config seed; -1 when its experiment has none"),
    ("grid", "str", "JSON of the config values that vary across the sweep (grid fields and "
     "seed), e.g. {\"n_prompts\": 16, \"seed\": 1}"),
    ("run_id", "str", "the cell's run in the store; '' when none was created"),
)
CELLS = Table("cells", "every cell of the sweep and how it ended", (
    *CELL_KEYS,
    *columns(
        ("status", "str", "complete (ran now), reused (a matching complete run existed), "
         "failed, skipped (the model cannot do the experiment), cancelled (Ctrl-C) or not "
         "run (stopped before it started)"),
        ("error", "str", "why a cell failed, was skipped or cancelled; '' otherwise"),
        ("seconds", "float", "wall time of the cell in its worker, model load included; "
         "NaN when it did not run now"),
        ("config", "str", "JSON of the cell's full config overrides"),
        ("worker", "int", "process id of the Ray worker that ran the cell; -1 if none did"),
        ("loaded_model", "bool", "whether the cell loaded its model (false: its worker had "
         "it loaded already, or it did not run now)"),
        ("peak_rss_mib", "float", "the worker's peak resident memory (MiB) when the cell "
         "ended; NaN when it did not run now"),
    ),
))
SCORES = Table("scores", "head_scores of every complete cell, joined with the cell", (
    *CELL_KEYS,
    *columns(
        ("layer", "int", "layer index, from 0"),
        ("head", "int", "query head index within the layer, from 0"),
        ("layer_type", "str", "the layer's attention span: sliding or global"),
        ("metric", "str", "which score: a head metric of workbench.scores.metrics"),
        ("score", "float", "mean over prompts"),
        ("ci_low", "float", "95% bootstrap interval over prompts, low end"),
        ("ci_high", "float", "95% bootstrap interval over prompts, high end"),
        ("n_prompts", "int", "prompts on which the score is defined"),
        ("null", "float", "the score of a uniform pattern on the same prompts; NaN when "
         "the experiment reports none"),
    ),
))

TABLES = tables(CELLS, SCORES)
