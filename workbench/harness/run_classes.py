"""The head classes stored runs found, read for another run on the same model.

Two kinds of run store head classes:

- a run that scores heads (``previous-token-heads``, ``induction-heads``, ``head-overview``,
  ``attention-sinks``) keeps its ``head_classes`` table: a head is in a class when its
  q-value is within the false-discovery rate the class was declared at
  (:func:`workbench.scores.classes.at_rate`);
- an ``ioi`` run keeps its ``classes`` table: Wang et al.'s classes (name mover, negative
  name mover, s-inhibition, duplicate-token, induction, previous-token), each head that met
  the class's criterion, counted only where the class is claimed (the model does the task
  above chance).

:func:`class_runs` checks, before a model loads, that each run named exists, is complete,
ran on the model at hand and stores head classes; :func:`run_classes` reads them.

Examples:
    >>> runs = class_runs(["20261206-prev"], "smollm2", store)      # doctest: +SKIP
    >>> run_classes(runs[0])                                        # doctest: +SKIP
    {'previous-token': ((2, 5), (3, 1))}
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.harness import tables
from workbench.harness.ablate import check_same_model, model_heads
from workbench.scores import classes
from workbench.store.runs import Run, RunStore

CLASS_TABLES = ("head_classes", "classes")
"""The tables a run keeps its head classes in: scored classes, and the IOI experiment's."""
Head = tuple[int, int]


def class_runs(refs: Sequence[str], model: str, shape: tuple[int, int] | None,
               store: RunStore, *, checksum: str | None = None) -> list[Run]:
    """The runs ``refs`` name, each checked: complete, on ``model``, with head classes.

    Args:
        refs: run ids, id prefixes or folders.
        model: the model argument of the run that reads them.
        shape: the model's layers and query heads, where known before it loads (``None``:
            a bundled model's entry or a folder's ``config.json`` says, else each run's).
        store: where the runs are looked up.
        checksum: the loaded model's weights checksum (``None``: not loaded yet). With it,
            each run's model must have the same name and, where both are known, the same
            checksum (before the load only a bundled model's name is compared, and a
            model's shape).

    Raises:
        WorkbenchError: one line: no such run, a run not complete, on another model, or
            without a table of head classes.
    """
    found = []
    for ref in refs:
        run = store.get(ref)
        if run.meta.model is None:
            raise WorkbenchError(f"run {run.id} ({run.experiment}) ran on no model: it has "
                                 "no head classes")
        check_same_model(run, model, shape or model_heads(model) or (
            run.meta.model.n_layers, run.meta.model.n_heads))
        ran_on = run.meta.model
        if checksum is not None and (ran_on.name != model or (
                checksum and ran_on.checksum and ran_on.checksum != checksum)):
            raise WorkbenchError(f"run {run.id} ran on {ran_on.name} (weights "
                                 f"{ran_on.checksum[:12] or 'unknown'}), not on {model} "
                                 f"(weights {checksum[:12] or 'unknown'}): its heads are not "
                                 "this model's")
        if not set(CLASS_TABLES) & set(run.table_names()):
            raise WorkbenchError(f"run {run.id} ({run.experiment}) stores no head classes "
                                 f"(no {' or '.join(CLASS_TABLES)} table); its tables: "
                                 f"{', '.join(run.table_names()) or 'none'}")
        found.append(run)
    return found


def run_classes(run: Run) -> dict[str, tuple[Head, ...]]:
    """Every head class the run stores, with its heads (``(layer, head)``, sorted); a class
    tested but empty has no heads, an IOI class not claimed is left out."""
    out: dict[str, set[Head]] = {}
    if "head_classes" in run.table_names():
        table = classes.at_rate(tables.read(run, "head_classes"))
        for name, rows in table.groupby("head_class", sort=True):
            out[str(name)] = _pairs(rows[rows.in_class])
    if "classes" in run.table_names():
        table = tables.read(run, "classes")
        for name, rows in table.groupby("head_class", sort=True):
            out.setdefault(str(name), set()).update(_pairs(rows[rows.claimed]))
    return {name: tuple(sorted(heads)) for name, heads in out.items()}


def _pairs(rows: pd.DataFrame) -> set[Head]:
    return set(zip(rows["layer"].astype(int).tolist(), rows["head"].astype(int).tolist(),
                   strict=True))
