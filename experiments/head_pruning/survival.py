"""Which kinds of heads survive head-pruning: the head scores of other experiments' runs on
the same weights, read from the run store, joined with a pruning order (definitions in the
package docstring)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from experiments.head_pruning.tables import KIND_EXPERIMENTS, SURVIVAL
from workbench.core.errors import WorkbenchError
from workbench.store.records import ModelInfo
from workbench.store.runs import RunStore

log = logging.getLogger(__name__)


def spearman(a: pd.Series, b: pd.Series) -> float:
    """Spearman's rank correlation (Pearson's on average ranks; no SciPy needed)."""
    return float(a.rank().corr(b.rank()))


def kind_scores(store: RunStore | None, model: ModelInfo) -> pd.DataFrame:
    """Head scores of the newest complete, unmasked run of each experiment of
    ``KIND_EXPERIMENTS`` on the same model weights (empty when there are none).

    Args:
        store: the run store to search (``None``: outside a store, nothing to join).
        model: the model whose weights the runs must share (name and checksum).
    """
    frames = []
    for name in KIND_EXPERIMENTS if store is not None else ():
        run = store.latest_on_weights(name, model)
        if run is None:
            continue
        try:
            scores = run.table("head_scores")
        except WorkbenchError as exc:
            log.warning("cannot read head scores of %s: %s", run.id, exc)
            continue
        frames.append(scores[["layer", "head", "metric", "score"]].assign(
            experiment=name, run=run.id))
    if not frames:
        return pd.DataFrame(columns=["layer", "head", "metric", "score", "experiment", "run"])
    return pd.concat(frames, ignore_index=True)


def survival_table(order: pd.DataFrame, kinds: pd.DataFrame, top_k: int) -> pd.DataFrame:
    """For every metric of the other experiments: do its top heads survive longer?

    Args:
        order: rows of :func:`order_table` for one order.
        kinds: :func:`kind_scores`.
        top_k: heads per metric.

    Returns:
        The ``survival`` table (see ``tables.SURVIVAL``): experiment, run, runs_read (every
        run of ``kinds``), metric, order, top_k, heads, top_mean_survival (1 = removed last,
        0.5 expected for heads unrelated to the order), z (its distance from 0.5 in
        standard errors of the mean of ``top_k`` positions drawn without replacement) and
        spearman (score against survival).
    """
    if kinds.empty or order.empty:
        return SURVIVAL.empty()
    n = len(order)
    read = ", ".join(dict.fromkeys(kinds.run))
    rows = []
    for (experiment_name, run_id, metric), group in kinds.groupby(
            ["experiment", "run", "metric"], sort=True):
        joined = group.merge(order[["layer", "head", "survival"]], on=["layer", "head"])
        joined = joined[np.isfinite(joined.score)]
        if len(joined) < 3:
            continue
        k = min(top_k, len(joined))
        top = joined.nlargest(k, "score")
        se = math.sqrt((1 / 12) / k * (n - k) / max(n - 1, 1)) if k < n else float("nan")
        rows.append({"experiment": experiment_name, "run": run_id, "runs_read": read,
                     "metric": metric, "order": order.order.iloc[0], "top_k": k,
                     "heads": ", ".join(f"L{r.layer}H{r.head}" for r in top.itertuples()),
                     "top_mean_survival": float(top.survival.mean()),
                     "z": float((top.survival.mean() - 0.5) / se) if se == se else np.nan,
                     "spearman": spearman(joined.score, joined.survival)})
    return pd.DataFrame(rows, columns=SURVIVAL.names) if rows else SURVIVAL.empty()
