"""Stored tables read through their declarations: what every reader of a run uses.

A table's checksum says the file is the one its run wrote, not that what the run wrote is
sane: a ``run.json`` and its checksums can be rewritten with the table. So a reader checks
the table against the declaration of the experiment that writes it (its columns and kinds,
each column's range, its key columns, its fewest rows:
:meth:`workbench.store.schema.Table.check`), with the run's model's layer and head counts
as the bounds of its indices. A table that fails is a one-line
:class:`~workbench.store.schema.SchemaError`, which a page shows and the CLI prints, never a
traceback. Every page, CLI command, claim check and experiment that reads a stored table
reads it here.

Examples:
    >>> scores = read(run, "head_scores")                 # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from workbench.core.errors import UnknownNameError
from workbench.harness.experiment import get
from workbench.harness.sweeps.tables import TABLES as SWEEP_TABLES
from workbench.store.runs import Run, model_sizes
from workbench.store.schema import SchemaError, Table, with_legacy_columns


def declared(kind: str) -> Mapping[str, Table]:
    """The tables a run of ``kind`` (an experiment, or ``sweep``) declares; none for a
    kind that declares none (``record``, ``reproduce``)."""
    if kind == "sweep":
        return SWEEP_TABLES
    try:
        return get(kind).tables
    except UnknownNameError:
        return {}


def read(run: Run, name: str) -> pd.DataFrame:
    """Table ``name`` of ``run``, checked against its declaration: with every declared
    column, those a run written before they were declared lacks added back as its readers
    expect them (:func:`~workbench.store.schema.with_legacy_columns`).

    Raises:
        WorkbenchError: no such table, or a damaged one (see :meth:`Run.table`).
        ChecksumError: the file changed since the run wrote it.
        SchemaError: the table does not hold what its declaration says, or not the rows its
            ``run.json`` states (one line, naming the run and the first problem).
    """
    frame = run.table(name)
    table = declared(run.experiment).get(name)
    if table is None:
        return frame
    model = run.meta.model
    frame = with_legacy_columns(frame, table, None if model is None else model.layer_types)
    try:
        table.check(frame, model_sizes(model))
    except SchemaError as exc:
        raise SchemaError(f"run {run.id}: {exc}") from None
    return frame
