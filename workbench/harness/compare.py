"""Two runs of one experiment on one model, side by side: every table both runs have,
paired by its keys (and prompts), each scalar's difference ``B - A`` with an interval.

- A per-prompt table (``prompt`` among its keys:
  :func:`workbench.store.schema.per_prompt`) pairs the two runs' values prompt by prompt.
  Where both runs scored the same prompts (each prompt index holds the same ``tokens``
  digest in both), a difference gets a paired bootstrap interval and a two-sided sign-flip
  p-value (:func:`workbench.scores.paired.paired_differences`: 2,000 resamples, 10,000
  sign flips, seed 0); on different prompts an unpaired interval and no p-value.
- Any other table (an aggregate: a mean over prompts) pairs rows by its declared keys (or,
  with none declared, by its columns that are not floats) and gives the difference of
  each float column (its own interval columns left out), without an interval: a mean
  alone cannot say how sure a difference is.

A run stored before its experiment wrote per-prompt tables still compares on the tables
it has; :attr:`Comparison.notes` says what is missing.

Examples:
    >>> result = compare(store.get("A"), store.get("B"))    # doctest: +SKIP
    >>> result.differences.query("table == 'repeat_loss_by_prompt'")    # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from workbench.core.errors import WorkbenchError
from workbench.harness import tables
from workbench.scores import paired
from workbench.store import records
from workbench.store.records import RunMeta
from workbench.store.runs import Run
from workbench.store.schema import PROMPT_KEY, Table, is_per_prompt

Pairing = Literal["same prompts", "different prompts", "aggregate"]
DIFFERENCE_COLUMNS = ["table", "key", "column", "a", "b", "difference", "ci_low", "ci_high",
                      "p", "n_prompts", "pairing"]
"""The columns of :attr:`Comparison.differences`: one row a scalar of a table's row."""
INTERVAL_COLUMNS = frozenset({"ci_low", "ci_high"})
"""Float columns of an aggregate that are its own interval, not a scalar to compare."""


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` finds: the runs, the differences, configs and interventions."""

    a: Run
    b: Run
    differences: pd.DataFrame
    """:data:`DIFFERENCE_COLUMNS`, tables in their declared order."""
    config: pd.DataFrame
    """``field, a, b, differs``: both configs, every field of either."""
    interventions: tuple[str, str]
    """Each run's interventions in words (:func:`interventions_text`)."""
    notes: tuple[str, ...]
    """What could not be compared, and why (a table one run lacks, rows without partner)."""


def check_comparable(a: Run, b: Run) -> None:
    """Refuse, in one line, two runs that are not of one experiment on one model, or a
    run that is not complete.

    Raises:
        WorkbenchError: naming what differs.
    """
    for run in (a, b):
        if run.status != "complete":
            raise WorkbenchError(f"cannot compare: run {run.id} is {run.status}, not complete")
    differ = []
    if a.experiment != b.experiment:
        differ.append(f"experiment ({a.experiment} vs {b.experiment})")
    ma, mb = a.meta.model, b.meta.model
    if (ma and ma.name) != (mb and mb.name):
        differ.append(f"model ({a.model_name or '-'} vs {b.model_name or '-'})")
    elif ma is not None and mb is not None and ma.checksum != mb.checksum:
        differ.append(f"model weights (sha256 {ma.checksum[:12]} vs {mb.checksum[:12]})")
    if differ:
        raise WorkbenchError(f"cannot compare {a.id} and {b.id}: they differ in "
                             f"{'; '.join(differ)} (compare runs of one experiment on one "
                             "model)")


def compare(a: Run, b: Run, *, n_boot: int = paired.N_RESAMPLES,
            n_flips: int = paired.N_FLIPS, seed: int = paired.SEED,
            only: str | None = None) -> Comparison:
    """Compare run ``b`` with run ``a`` (differences are ``B - A``).

    Args:
        a, b: complete runs of one experiment on one model (:func:`check_comparable`).
        n_boot, n_flips, seed: of the intervals and p-values
            (:mod:`workbench.scores.paired`).
        only: compare this table alone (``None``: every table).

    Raises:
        WorkbenchError: the runs cannot be compared, or ``only`` is in neither.
    """
    check_comparable(a, b)
    declared = tables.declared(a.experiment)
    # the per-prompt tables (with intervals) first, then the aggregates
    ordered = sorted(declared, key=lambda n: not is_per_prompt(declared[n]))
    names = [n for n in (*ordered, *a.table_names(), *b.table_names())
             if only is None or n == only]
    names = list(dict.fromkeys(names))
    if only is not None and only not in (*a.table_names(), *b.table_names()):
        raise WorkbenchError(f"neither run has a table '{only}'; their tables: "
                             f"{', '.join(sorted({*a.table_names(), *b.table_names()}))}")
    frames, notes = [], list(_missing_per_prompt(a, b, declared))
    for name in names:
        frame, note = _table(a, b, name, declared.get(name), n_boot=n_boot, n_flips=n_flips,
                             seed=seed)
        frames.append(frame)
        notes += note
    differences = (pd.concat([f for f in frames if len(f)], ignore_index=True)
                   if any(len(f) for f in frames) else pd.DataFrame(columns=DIFFERENCE_COLUMNS))
    return Comparison(a, b, differences[DIFFERENCE_COLUMNS], config_table(a.config, b.config),
                      (interventions_text(a.meta), interventions_text(b.meta)), tuple(notes))


def _missing_per_prompt(a: Run, b: Run, declared: Mapping[str, Table]) -> list[str]:
    """What says an experiment, or a run, has no per-prompt values to pair."""
    wanted = [n for n, t in declared.items() if is_per_prompt(t)]
    if not wanted:
        return [f"{a.experiment} stores no per-prompt values: its differences are of "
                "aggregates, without intervals or p-values"]
    out = []
    for label, run in (("A", a), ("B", b)):
        lacking = [n for n in wanted if n not in run.table_names()]
        if lacking:
            out.append(f"run {label} ({run.id}) has no per-prompt tables {', '.join(lacking)} "
                       "(stored before per-prompt values, or a config that writes none): "
                       "those scalars compare as aggregates, without intervals")
    return out


def _table(a: Run, b: Run, name: str, table: Table | None, **stats: int
           ) -> tuple[pd.DataFrame, list[str]]:
    """One table's differences and notes."""
    here = [name in a.table_names(), name in b.table_names()]
    if not all(here):
        if not any(here):
            return pd.DataFrame(), []
        return pd.DataFrame(), [f"table {name}: only in run {'A' if here[0] else 'B'}"]
    if table is None:
        return pd.DataFrame(), [f"table {name}: not declared by {a.experiment}; not compared"]
    fa, fb = tables.read(a, name), tables.read(b, name)
    if is_per_prompt(table):
        # without token digests the prompts are known the same only from equal configs
        same = same_prompts(fa, fb) and ("tokens" in fa or a.config == b.config)
        return _per_prompt(name, table, fa, fb, same, **stats)
    return _aggregate(name, table, fa, fb)


def _value_columns(table: Table) -> list[str]:
    """The scalars of a table: its float columns, less its keys and its own intervals."""
    return [c.name for c in table.columns if c.kind == "float" and c.name not in table.keys
            and c.name not in INTERVAL_COLUMNS]


def _key_labels(index: pd.Index | pd.MultiIndex, names: list[str]) -> list[str]:
    """``"repeat=2"`` (``"metric=icl_score position=5"``) for each entry of ``index``."""
    if not names:
        return ["-"] * len(index)
    rows = index.tolist() if len(names) > 1 else [(v,) for v in index.tolist()]
    return [" ".join(f"{k}={v}" for k, v in zip(names, row, strict=True)) for row in rows]


def _wide(frame: pd.DataFrame, group: list[str], column: str) -> pd.DataFrame:
    """``[prompt, group]`` values of ``column`` (prompts as rows)."""
    if not group:
        return frame.set_index(PROMPT_KEY)[[column]]
    values = frame.set_index([PROMPT_KEY, *group])[column]
    return values.unstack(group if len(group) > 1 else group[0])


def same_prompts(fa: pd.DataFrame, fb: pd.DataFrame) -> bool:
    """Whether two per-prompt tables hold the same prompts: the same ``(prompt, tokens)``
    pairs (a table of several inputs numbers each from 0); the same prompt indices in a
    table that stores no ``tokens`` digest."""
    def pairs(frame: pd.DataFrame) -> set[tuple[int, str]]:
        digests = frame.tokens.astype(str) if "tokens" in frame else pd.Series("", frame.index)
        unique = pd.DataFrame({"p": frame[PROMPT_KEY].astype(int), "t": digests})
        return set(unique.drop_duplicates().itertuples(index=False, name=None))

    return pairs(fa) == pairs(fb)


def _buckets(frame: pd.DataFrame, group: list[str], keys: pd.Index) -> list[pd.Index]:
    """``keys`` (entries of ``group``) split by the prompts each holds rows for in
    ``frame``: each bucket is resampled over its own prompts only."""
    here = _wide(frame.assign(_here=1.0), group, "_here").reindex(columns=keys)
    patterns: dict[tuple[bool, ...], list[int]] = {}
    for i, column in enumerate(here.to_numpy().T):
        patterns.setdefault(tuple(~np.isnan(column)), []).append(i)
    return [keys[idx] for idx in patterns.values()]


def _per_prompt(name: str, table: Table, fa: pd.DataFrame, fb: pd.DataFrame, same: bool, *,
                n_boot: int, n_flips: int, seed: int) -> tuple[pd.DataFrame, list[str]]:
    """A per-prompt table's differences: paired where the prompts are ``same``."""
    group = [k for k in table.keys if k != PROMPT_KEY]
    frames, notes = [], []
    for column in _value_columns(table):
        wa, wb = _wide(fa, group, column), _wide(fb, group, column)
        keys = wa.columns.intersection(wb.columns, sort=False)
        if len(keys) < max(len(wa.columns), len(wb.columns)):
            notes.append(f"table {name}: {len(wa.columns) - len(keys)} keys of A and "
                         f"{len(wb.columns) - len(keys)} of B have no partner")
        for bucket in _buckets(fa, group, keys):
            out = _differences(wa[bucket], wb[bucket], same, n_boot=n_boot, n_flips=n_flips,
                               seed=seed)
            out.insert(0, "column", column)
            out.insert(0, "key", _key_labels(bucket, group))
            out.insert(0, "table", name)
            frames.append(out)
    if not same:
        notes.append(f"table {name}: the runs scored different prompts, so its differences "
                     "are unpaired (intervals from each run's prompts alone, no p-values)")
    elif "tokens" not in fa:
        notes.append(f"table {name} stores no token digests: its prompts are paired by "
                     "index (the two configs are equal, so the prompts are the same)")
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(), notes


def _differences(wa: pd.DataFrame, wb: pd.DataFrame, same: bool, **stats: int
                 ) -> pd.DataFrame:
    """The differences of one bucket of keys, over the prompts it has in either run."""
    wa, wb = wa.dropna(how="all"), wb.dropna(how="all")
    if same:
        rows = wa.index.union(wb.index)
        out = paired.paired_differences(wa.reindex(rows).to_numpy(float),
                                        wb.reindex(rows).to_numpy(float), **stats)
    else:
        out = paired.unpaired_differences(wa.to_numpy(float), wb.to_numpy(float),
                                          n_boot=stats["n_boot"], seed=stats["seed"])
    out["pairing"] = "same prompts" if same else "different prompts"
    return out


def _aggregate(name: str, table: Table, fa: pd.DataFrame, fb: pd.DataFrame
               ) -> tuple[pd.DataFrame, list[str]]:
    """An aggregate table's differences: rows paired by its keys, no intervals."""
    keys = list(table.keys) or [c.name for c in table.columns if c.kind != "float"
                                and not (c.kind == "int" and c.name.startswith("n_"))]
    values = _value_columns(Table(table.name, table.meaning, table.columns, tuple(keys)))
    if not values:
        return pd.DataFrame(), []
    if fa.duplicated(keys).any() or fb.duplicated(keys).any():
        return pd.DataFrame(), [f"table {name}: its rows are not named by {', '.join(keys)}; "
                                "not compared"]
    merged = fa[keys + values].merge(fb[keys + values], on=keys, suffixes=("_a", "_b"))
    notes = []
    if len(merged) < max(len(fa), len(fb)):
        notes.append(f"table {name}: {len(fa) - len(merged)} rows of A and "
                     f"{len(fb) - len(merged)} of B have no partner (their keys differ)")
    labels = _key_labels(pd.MultiIndex.from_frame(merged[keys]) if len(keys) > 1
                         else pd.Index(merged[keys[0]]), keys)
    frames = [pd.DataFrame({"table": name, "key": labels, "column": column,
                            "a": merged[f"{column}_a"].astype(float),
                            "b": merged[f"{column}_b"].astype(float)}) for column in values]
    out = pd.concat(frames, ignore_index=True)
    out["difference"] = out.b - out.a
    out[["ci_low", "ci_high", "p", "n_prompts"]] = np.nan
    out["pairing"] = "aggregate"
    return out, notes


def config_table(a: Mapping[str, object], b: Mapping[str, object]) -> pd.DataFrame:
    """``field, a, b, differs``: every field of either config, its values as JSON."""
    fields = list(dict.fromkeys([*a, *b]))

    def shown(config: Mapping[str, object], key: str) -> str:
        return json.dumps(config[key], sort_keys=True) if key in config else "-"

    rows = [{"field": f, "a": shown(a, f), "b": shown(b, f)} for f in fields]
    frame = pd.DataFrame(rows, columns=["field", "a", "b"])
    frame["differs"] = frame.a != frame.b
    return frame


def interventions_text(meta: RunMeta) -> str:
    """A run's interventions in the few words every view shows them in
    (:func:`workbench.store.records.interventions_text`), or ``none``."""
    return records.interventions_text(meta.interventions) or "none"
