"""Stored tables read through their declarations: what every page and CLI reader uses.

A table's checksum says the file is the one its run wrote, not that what the run wrote is
sane: a ``run.json`` and its checksums can be rewritten with the table. So a reader checks
the table against the declaration of the experiment that writes it (its columns and kinds,
each column's range, its key columns: :meth:`workbench.store.schema.Table.check`), with
the run's model's layer and head counts as the bounds of its indices. A table that fails
is a one-line :class:`~workbench.store.schema.SchemaError`, which a page shows and the CLI
prints, never a traceback.

Examples:
    >>> scores = read(run, "head_scores")                 # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from workbench.core.errors import UnknownNameError
from workbench.harness.experiment import get
from workbench.harness.sweep_tables import TABLES as SWEEP_TABLES
from workbench.store.runs import Run, model_sizes
from workbench.store.schema import LAYER_TYPE, SchemaError, Table, with_layer_types


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
    """Table ``name`` of ``run``, checked against its declaration.

    Raises:
        WorkbenchError: no such table, or a damaged one (see :meth:`Run.table`).
        ChecksumError: the file changed since the run wrote it.
        SchemaError: the table does not hold what its declaration says (one line, naming
            the run and the first problem).
    """
    frame = run.table(name)
    stated = run.meta.tables[name].rows
    if len(frame) != stated:
        raise SchemaError(f"run {run.id}: table {name} holds {len(frame)} rows; its run.json "
                          f"says {stated}")
    table = declared(run.experiment).get(name)
    if table is None:
        return frame
    try:
        table.check(_with_legacy_columns(frame, run, table), model_sizes(run.meta.model))
    except SchemaError as exc:
        raise SchemaError(f"run {run.id}: {exc}") from None
    return frame


def _with_legacy_columns(frame: pd.DataFrame, run: Run, table: Table) -> pd.DataFrame:
    """``frame`` as the declaration reads it: a run written before a column was declared
    lacks it, and its readers add it back (``layer_type`` from the run's model, ``null``
    as not measured), so only those absences pass."""
    out = frame
    if "null" in table.names and "null" not in out.columns:
        out = out.assign(null=float("nan"))
    if LAYER_TYPE.name in table.names and LAYER_TYPE.name not in out.columns \
            and run.meta.model is not None and "layer" in out.columns:
        try:
            out = with_layer_types(out, run.meta.model.layer_types)
        except (ValueError, IndexError, TypeError):  # a layer that is not one: said below
            out = out.assign(**{LAYER_TYPE.name: "global"})
    return out
