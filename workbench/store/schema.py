"""Declared tables: what every stored table holds, written once and checked on save.

An experiment declares each table it writes in its ``tables.py`` (which imports nothing but
this module): the table's name and meaning, and every column's name, kind and meaning.
The run store refuses a table that does not match its declaration (a missing or
undeclared column, a column of the wrong kind), and pages read columns by these names, so
the contract between an experiment and the pages that show it is written in one place.

Kinds: ``int`` (integer dtype), ``float`` (float or integer dtype; NaN allowed), ``str``
(strings, missing values allowed), ``bool`` (missing values allowed).

Values are checked too, on save and on every read through
:func:`workbench.harness.tables.read`: each column's range (a probability in [0, 1], a
count at least 0, a layer or head index of the run's model: :data:`BOUNDS`, or the
column's own ``bounds``), and the table's key columns, whose combination is unique.

Examples:
    >>> SINK_RATES = Table("sink_rates", "share of heads that are sinks, per input", (
    ...     Column("input", "str", "input kind, with or without BOS"),
    ...     Column("rate", "float", "percent of heads with alpha_1 > eps"),
    ... ))
    >>> SINK_RATES.names
    ['input', 'rate']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from workbench.core.errors import WorkbenchError

if TYPE_CHECKING:
    import pandas as pd

Kind = Literal["int", "float", "str", "bool"]


class SchemaError(WorkbenchError):
    """A table that does not match its declaration."""


Bound = tuple[float | None, float | str | None]
"""A column's inclusive range ``(low, high)``; a ``high`` of ``"n_layers"`` or ``"n_heads"``
is the run's model's count, which the index stays below, and ``"n_layers+1"`` lets it
reach the count (a layer boundary); ``None``: no bound."""

BOUNDS: dict[str, Bound] = {"p": (0, 1), "q": (0, 1), "fdr": (0, 1)}
"""The ranges of the columns every table names alike, declared once: the p-values,
q-values and rates of the head classes. An ``int`` column whose name starts ``n_`` is a
count, at least 0; the head keys (:data:`HEAD_KEYS`) index the run's model's heads."""


@dataclass(frozen=True)
class Column:
    """One column: its name, kind and a one-line meaning (units, range, definition), its
    range where it is not the one :data:`BOUNDS` gives its name, and, for a column added
    after runs were stored without it, the value such a run's rows hold."""

    name: str
    kind: Kind
    meaning: str
    bounds: Bound | None = None
    absent: str | float | None = None
    """What a run written before the column was declared holds in it (``None``: every
    stored table has the column)."""

    @property
    def range(self) -> Bound | None:
        """The inclusive range values of this column must fall in (``None``: any)."""
        if self.bounds is not None:
            return self.bounds
        if self.name in BOUNDS:
            return BOUNDS[self.name]
        if self.kind == "int" and self.name.startswith("n_"):
            return (0, None)
        return None


@dataclass(frozen=True)
class Table:
    """A declared table: name, one-line meaning, and its columns in order."""

    name: str
    meaning: str
    columns: tuple[Column, ...]
    keys: tuple[str, ...] = ()
    """Columns whose values together name one row: no two rows share them."""
    min_rows: int = 0
    """The fewest rows the table holds when it is written at all (1: never empty)."""

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name} declares a column twice: {names}")
        if not set(self.keys) <= set(names):
            raise ValueError(f"table {self.name}'s keys {self.keys} are not all its columns")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        """The declared column ``name``.

        Raises:
            SchemaError: no such column (the message lists the declared ones).
        """
        for c in self.columns:
            if c.name == name:
                return c
        raise SchemaError(f"table {self.name} has no column '{name}'; "
                          f"columns: {', '.join(self.names)}")

    def empty(self) -> pd.DataFrame:
        """A table with no rows whose columns already have their declared kinds (what an
        experiment stores when there is nothing to report, so it still matches)."""
        import pandas as pd

        dtypes = {"int": "int64", "float": "float64", "str": "object", "bool": "bool"}
        return pd.DataFrame({c.name: pd.Series(dtype=dtypes[c.kind]) for c in self.columns})

    def check(self, df: pd.DataFrame, sizes: Mapping[str, int] | None = None) -> None:
        """Raise :class:`SchemaError` unless ``df`` has exactly the declared columns, each of
        its declared kind, every value in its column's range and no two rows with the
        same keys.

        Args:
            df: the table.
            sizes: ``{"n_layers": ..., "n_heads": ...}`` of the run's model, the upper
                bounds of layer and head indices (``None``: unknown, not checked).
        """
        missing = [n for n in self.names if n not in df.columns]
        extra = [str(n) for n in df.columns if n not in self.names]
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"undeclared {', '.join(extra)}"] if extra else [])
            raise SchemaError(f"table {self.name}: {'; '.join(parts)}")
        for c in self.columns:
            if not _has_kind(df[c.name], c.kind):
                raise SchemaError(f"table {self.name}: column {c.name} is declared {c.kind} "
                                  f"but holds {df[c.name].dtype}")
            if c.range is not None and c.kind in ("int", "float"):
                _check_range(self.name, c, df[c.name], sizes or {})
        if len(df) < self.min_rows:
            raise SchemaError(f"table {self.name} holds {len(df)} rows; it is written with at "
                              f"least {self.min_rows}")
        if self.keys and len(df) and df.duplicated(list(self.keys)).any():
            row = df[df.duplicated(list(self.keys))].iloc[0]
            key = ", ".join(f"{k}={row[k]!r}" for k in self.keys)
            raise SchemaError(f"table {self.name}: two rows have the same {key}")


def _check_range(table: str, column: Column, values: pd.Series,
                 sizes: Mapping[str, int]) -> None:
    """Raise :class:`SchemaError` for the first value of ``column`` outside its range
    (a missing value, NaN, is allowed: it says a score is undefined)."""
    import pandas as pd

    assert column.range is not None
    low, high = column.range
    if isinstance(high, str):  # "n_layers": an index below it; "n_layers+1": up to it
        name, _, more = high.partition("+")
        high = sizes[name] - 1 + int(more or 0) if name in sizes else None
    present = values.dropna()
    outside = pd.Series(False, index=present.index)
    if low is not None:
        outside |= present < low
    if high is not None:
        outside |= present > high
    if outside.any():
        shown = (f"{'-inf' if low is None else format(low, 'g')} .. "
                 f"{'inf' if high is None else format(high, 'g')}")
        raise SchemaError(f"table {table}: column {column.name} holds "
                          f"{present[outside].iloc[0]!r}, outside {shown}")


def _has_kind(series: pd.Series, kind: Kind) -> bool:
    from pandas.api import types

    if kind == "int":
        return types.is_integer_dtype(series) and not types.is_bool_dtype(series)
    if kind == "float":
        return types.is_numeric_dtype(series) and not types.is_bool_dtype(series)
    if kind == "bool":  # missing values allowed, as in a column of "n/a" verdicts
        return types.is_bool_dtype(series) or (
            types.is_object_dtype(series) and all(isinstance(v, bool) for v in series.dropna()))
    if types.is_string_dtype(series) or types.is_object_dtype(series):
        return all(isinstance(v, str) for v in series.dropna())
    return False


def tables(*declared: Table) -> dict[str, Table]:
    """``{name: table}`` of an experiment's tables (a duplicate name is an error)."""
    out: dict[str, Table] = {}
    for t in declared:
        if t.name in out:
            raise ValueError(f"table {t.name} is declared twice")
        out[t.name] = t
    return out


def columns(*specs: tuple[str, Kind, str] | tuple[str, Kind, str, Bound]) -> tuple[Column, ...]:
    """Columns from ``(name, kind, meaning)`` triples (or with their ``bounds`` fourth),
    for tables written compactly."""
    return tuple(Column(s[0], s[1], s[2], s[3] if len(s) == 4 else None) for s in specs)


HEAD_KEYS = (
    Column("layer", "int", "layer index, from 0", bounds=(0, "n_layers")),
    Column("head", "int", "query head index within the layer, from 0", bounds=(0, "n_heads")),
)
SCORE_COLUMNS = columns(
    ("metric", "str", "which score: a head metric of workbench.scores.metrics"),
    ("score", "float", "mean over prompts"),
    ("ci_low", "float", "95% bootstrap interval over prompts, low end"),
    ("ci_high", "float", "95% bootstrap interval over prompts, high end"),
    ("n_prompts", "int", "prompts on which the score is defined"),
)
LAYER_TYPE = Column("layer_type", "str", "the layer's attention span: sliding (its queries "
                                         "see only the last sliding_window keys) or global")
"""The column that tells a per-head row of a sliding-window layer from one of a global
layer (:data:`workbench.store.records.LayerType`), where the distinction changes what a
score means."""
NULL_COLUMNS = (
    Column("null", "float", "the same score of a pattern uniform over the keys the head's "
                            "layer sees (a sliding layer: its window); NaN: not measured",
           absent=float("nan")),
    Column("inputs", "str", "the inputs the score was measured on"),
)


def head_scores(meaning: str, extra: Iterable[Column] = (), *, null: bool = True) -> Table:
    """The long-format ``head_scores`` table every head-level experiment writes:
    ``layer, head, layer_type, metric, score, ci_low, ci_high, n_prompts`` (+ ``null,
    inputs``) + ``extra``. A run written before ``layer_type`` lacks that column; readers
    get it back with :func:`with_layer_types` and the run's model. Every head is scored, so
    the table is never empty."""
    cols = (*HEAD_KEYS, LAYER_TYPE, *SCORE_COLUMNS, *(NULL_COLUMNS if null else ()), *extra)
    return Table("head_scores", meaning, cols, keys=HEAD_SCORE_KEYS if null else
                 HEAD_SCORE_KEYS[:-1], min_rows=1)


HEAD_SCORE_KEYS = ("layer", "head", "metric", "inputs")
"""What names one row of ``head_scores``: a head's score of a metric on some inputs."""


PROMPT_COLUMNS = (
    Column("prompt", "int", "which prompt of the run's inputs, from 0", bounds=(0, None)),
    Column("tokens", "str", "SHA-256 of the prompt's token ids (first 16 hex digits): two "
                            "runs' rows of one prompt index hold the same prompt when it "
                            "agrees"),
)
"""The columns of a per-prompt table (declared once): what pairs two runs' values of one
prompt (:mod:`workbench.harness.compare`). A per-prompt table has ``prompt`` among its keys."""
PROMPT_KEY = "prompt"


def per_prompt(name: str, meaning: str, keys: Iterable[Column], values: Iterable[Column]
               ) -> Table:
    """A table of one value per prompt (and per ``keys``): ``prompt, tokens, *keys,
    *values``, keyed by ``prompt`` and ``keys``, never empty."""
    keys = tuple(keys)
    return Table(name, meaning, (*PROMPT_COLUMNS, *keys, *values),
                 keys=(PROMPT_KEY, *(c.name for c in keys)), min_rows=1)


def head_scores_by_prompt(meaning: str = "every head's score of each metric on each "
                                          "prompt (what head_scores averages)",
                          within: Iterable[Column] = ()) -> Table:
    """The per-prompt ``head_scores_by_prompt`` table of the experiments that score heads:
    ``prompt, tokens, *within, layer, head, metric, inputs, score``, one row a head's score
    of a metric on one prompt of some inputs.

    Args:
        meaning: what the table holds.
        within: keys that come before the head's, where one run scores heads of several
            models (induction-formation's checkpoints).
    """
    keys = (*within, *HEAD_KEYS, Column("metric", "str", "which score: a head metric of "
                                                         "workbench.scores.metrics"),
            Column("inputs", "str", "the inputs the score was measured on"))
    return per_prompt("head_scores_by_prompt", meaning, keys,
                      columns(("score", "float", "the score on this prompt; NaN where it "
                                                 "is not defined (nothing to score)")))


def is_per_prompt(table: Table) -> bool:
    """Whether ``table`` holds one value per prompt (``prompt`` is among its keys)."""
    return PROMPT_KEY in table.keys


HEAD_CLASS_COLUMNS = columns(
    ("metric", "str", "the head metric tested (workbench.scores.metrics)"),
    ("head_class", "str", "the class tested: previous-token, duplicate-token, induction or "
                          "sink (workbench.scores.classes)"),
    ("score", "float", "the metric's mean over the real prompts (previous-token: over "
                       "queries 5 and later, the ones its test reads)"),
    ("ci_low", "float", "95% bootstrap interval of score over prompts, low end"),
    ("ci_high", "float", "95% bootstrap interval of score over prompts, high end"),
    ("null_mean", "float", "the mean of the null the score is tested against (see null)"),
    ("chance", "float", "the score of attention uniform over the keys each query of the "
                        "head's layer sees, on the same prompts (head_scores' null)"),
    ("p", "float", "one-sided paired sign-flip p-value of score > max(null, chance) over "
                   "prompts: (1 + #draws >= observed) / (1 + n_draws)"),
    ("q", "float", "Benjamini-Hochberg q-value over every head of the model, per class"),
    ("fdr", "float", "the declared false-discovery rate of the class"),
    ("in_class", "bool", "q <= fdr: the head is in the class"),
    ("n_prompts", "int", "real prompts on which the score is defined (each has a null)"),
    ("n_draws", "int", "sign-flip draws; the smallest reportable p is 1 / (1 + n_draws)"),
    ("inputs", "str", "the real inputs the score was measured on"),
    ("null", "str", "how the null was made"),
)


def head_classes(meaning: str = "every head tested for each class whose metric the run "
                 "scores, against the class's structured null, at a declared "
                 "false-discovery rate") -> Table:
    """The ``head_classes`` table of an experiment that scores heads (see
    :mod:`workbench.scores.classes`): one row per (head, class)."""
    return Table("head_classes", meaning, (*HEAD_KEYS, *HEAD_CLASS_COLUMNS),
                 keys=("layer", "head", "head_class", "metric"))
def with_layer_types(frame: pd.DataFrame, layer_types: Sequence[str]) -> pd.DataFrame:
    """``frame`` with its :data:`LAYER_TYPE` column: each row's layer type, read off its
    ``layer`` column, placed after ``head`` (or ``layer``).

    A run written before layer types were recorded has no such column; its model's
    ``layer_types`` (all ``global`` for such a run, :class:`~workbench.store.records.ModelInfo`)
    fill it the same way, so a reader of an old run sees the column too. A frame that
    already has the column is returned as it is.

    Args:
        frame: a table with an integer ``layer`` column of the model's layers.
        layer_types: the model's layer types, in layer order (``ModelInfo.layer_types``).
    """
    if LAYER_TYPE.name in frame.columns:
        return frame
    where = list(frame.columns).index("head" if "head" in frame.columns else "layer") + 1
    out = frame.copy()
    out.insert(where, LAYER_TYPE.name, [layer_types[int(layer)] for layer in frame.layer])
    return out


def with_legacy_columns(frame: pd.DataFrame, table: Table,
                        layer_types: Sequence[str] | None) -> pd.DataFrame:
    """``frame`` as ``table`` declares it: a run written before a column was declared lacks
    it, and its readers add it back (``layer_type`` from its model's ``layer_types``, any
    other column as its :attr:`Column.absent` value), so only those absences pass
    :meth:`Table.check`.

    Args:
        frame: a stored table.
        table: its declaration.
        layer_types: the run's model's layer types (``None``: the run names no model).
    """
    out = frame
    for column in table.columns:
        if column.absent is not None and column.name not in out.columns:
            out = out.assign(**{column.name: column.absent})
    if LAYER_TYPE.name in table.names and LAYER_TYPE.name not in out.columns \
            and layer_types is not None and "layer" in out.columns:
        try:
            out = with_layer_types(out, layer_types)
        except (ValueError, IndexError, TypeError):  # a layer that is not one: check says so
            out = out.assign(**{LAYER_TYPE.name: "global"})
    return out


LEGACY_METRIC_NAMES = {"sink": "first_token", "self": "self_attention"}
"""Metric names that runs written before the metric registry
(:mod:`workbench.scores.metrics`) stored, and the registered names they stand for."""


def current_metric_names(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the old metric names of its ``metric`` column (if it has one) replaced
    by the registered ones (:data:`LEGACY_METRIC_NAMES`), so that every reader of a stored
    table sees one name per metric; any other frame is returned as it is."""
    if "metric" not in frame.columns or not frame.metric.isin(LEGACY_METRIC_NAMES).any():
        return frame
    return frame.assign(metric=frame.metric.replace(LEGACY_METRIC_NAMES))


def describe(declared: Mapping[str, Table]) -> str:
    """The tables as plain text: one block per table, one line per column."""
    blocks = []
    for t in declared.values():
        lines = [f"{t.name}: {t.meaning}"]
        lines += [f"  {c.name} ({c.kind}): {c.meaning}" for c in t.columns]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
