"""The cards a notebook shows for a stored run, a recording and a model: IPython's HTML
formatters call :func:`card` for them once ``import workbench`` has registered it (see
:func:`workbench.show_cards`), so the data objects themselves know nothing of HTML.

A run's card holds its id, experiment, model, status (with why a run failed or what is
damaged), its config with the values off the experiment's defaults marked, its tables
(rows, columns and what each declared table holds), a ``reproduce`` run's verdicts, and a
link to the run's dashboard page when one is serving
(:func:`workbench.views.html.dashboard_url`). A recording's card holds its model, storage
and each prompt's tokens; a model's, what it is and where it came from.

Examples:
    >>> run = workbench.RunStore("data/runs").latest()      # doctest: +SKIP
    >>> run                                                  # doctest: +SKIP
    (in Jupyter: the run's card)
    >>> card(run)[:4]                                        # doctest: +SKIP
    '<div'
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import pyarrow

from workbench.core.errors import WorkbenchError
from workbench.harness import experiment, run_facts
from workbench.models.base import Model
from workbench.recording.reader import Recording
from workbench.store.runs import Run
from workbench.views import html, pages

VALUE_CHARS = 80
"""A config value longer than this is cut (with ``…``) in the card."""
MAX_ROWS = 40
"""Rows of a ``reproduce`` run's verdicts shown."""
REPR_PROMPTS = 20
"""A recording's card shows this many prompts' tokens."""


def declared_tables(kind: str) -> Mapping[str, Any] | None:
    """The table declarations of a registered experiment; ``None`` for another run kind."""
    try:
        return experiment.get(kind).tables
    except WorkbenchError:
        return None


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def config_rows(run: Run) -> list[list[Any]]:
    """``[key, value, default]`` of the run's config, a value off its default marked."""
    default = run_facts.defaults(run.experiment) or {}
    missing = object()
    rows = []
    for key, value in run.config.items():
        was = default.get(key, missing)
        shown: Any = _value(value)
        if was is not missing and was != value:
            shown = html.marked(shown, "off the experiment's default")
        rows.append([key, shown, "" if was is missing else _value(was)])
    return rows


def _columns(run: Run, name: str) -> str:
    """A stored table's columns, read from its Parquet footer (the rows are not read)."""
    try:
        return ", ".join(run.table_columns(name))
    except (OSError, ValueError, WorkbenchError, pyarrow.ArrowException):
        return "(unreadable)"


def table_rows(run: Run, link: str | None) -> list[list[Any]]:
    """``[name, rows, columns, meaning]`` of every stored table."""
    declared = declared_tables(run.experiment) or {}
    rows = []
    for name in run.table_names():
        table = declared.get(name)
        meaning = getattr(table, "meaning", "") if table is not None else ""
        shown: Any = html.link(link, name) if link else name
        rows.append([shown, run.meta.tables[name].rows, _columns(run, name), meaning])
    return rows


def problems(run: Run) -> list[html.Safe]:
    """What is wrong with the run: why it failed or was interrupted, what is damaged
    (``run.json`` itself, or a table that fails its SHA-256)."""
    found = []
    if run.status in ("failed", "interrupted", "damaged"):
        found.append(html.problem(f"{run.status}: {run.meta.error or 'no reason recorded'}"))
    if run.status != "damaged":
        try:
            run.verify()
        except WorkbenchError as exc:
            found.append(html.problem(f"damaged: {exc}"))
    return found


def verdicts(run: Run) -> html.Safe | None:
    """A ``reproduce`` run's verdicts (``None`` for any other run, or an unreadable
    table)."""
    if run.experiment != "reproduce" or "claims" not in run.meta.tables:
        return None
    with contextlib.suppress(WorkbenchError):
        table = run.table("claims")
        rows = [[r.claim, r.model, html.code(r.verdict), r.measured or r.reason]
                for r in table.head(MAX_ROWS).itertuples()]
        more = f" (first {MAX_ROWS} of {len(table)})" if len(table) > MAX_ROWS else ""
        return html.Safe(f"<div><b>verdicts</b>{more}</div>"
                         + html.rows_table(["claim", "model", "verdict", "measured"], rows))
    return None


def run_html(run: Run) -> str:
    """The run's card (see the module docstring)."""
    base = html.dashboard_url()
    link = pages.run_link(base, run.id, run.experiment) if base else None
    model = run.model_name or "no model"
    title = html.Safe(f"<b>Run</b> {html.code(run.id)} · {html.cell(run.experiment)} · "
                      f"{html.cell(model)} · {html.code(run.status)}"
                      + (f" · {html.link(link, 'open in the dashboard')}" if link else ""))
    parts: list[html.Safe | str] = [*problems(run)]
    if run.interventions_text:
        parts.append(html.Safe(f"<div><b>interventions</b> "
                               f"{html.cell(run.interventions_text)}</div>"))
    if run.seconds is not None:
        parts.append(f"started {run.meta.started_at}, took {run.seconds:.0f} s")
    parts += [html.Safe(f'<div style="color:#334155">{html.cell(line)}</div>')
              for line in run.meta.summary]
    if run.config:
        parts.append(html.Safe("<div><b>config</b> (values off the defaults in amber)</div>"
                               + html.rows_table(["key", "value", "default"],
                                                 config_rows(run))))
    if run.meta.tables:
        parts.append(html.Safe("<div><b>tables</b> (<code>run.table(name)</code>; "
                               "<code>workbench.figure(run, name)</code> draws them)</div>"
                               + html.rows_table(["table", "rows", "columns", "meaning"],
                                                 table_rows(run, link))))
    if (shown := verdicts(run)) is not None:
        parts.append(shown)
    if run.meta.recordings:
        names = ", ".join(sorted(run.meta.recordings))
        parts.append(f"recordings: {names} (Recording.open(run.path / name))")
    return html.block(title, *parts)


def recording_html(rec: Recording) -> str:
    """The recording's card: its model and storage, then each prompt (the first
    :data:`REPR_PROMPTS`) as a strip of its tokens, each in a box."""
    m = rec.model
    title = html.Safe(f"<b>Recording</b> {html.code(rec.root)} · "
                      f"{html.cell(m.name)} · {m.n_layers} layers x {m.n_heads} heads")
    storage = (f"patterns: {rec.patterns}" + (f" (top {rec.topk} a query row)"
                                              if rec.patterns == "topk" else "")
               + f"; residual stream: {'yes' if rec.has_resid else 'no'}; "
               f"{len(rec.prompts)} prompts; format {rec.format_version}")
    parts: list[html.Safe | str] = [storage]
    for i, prompt in enumerate(rec.prompts[:REPR_PROMPTS]):
        head = html.Safe(f"<div><b>prompt {i}</b> {html.cell(prompt.label)} "
                         f"({len(prompt.token_ids)} tokens)</div>")
        parts.append(html.Safe(head + html.token_strip(list(prompt.tokens))))
    if len(rec.prompts) > REPR_PROMPTS:
        parts.append(f"… {len(rec.prompts) - REPR_PROMPTS} more prompts")
    parts.append(html.Safe("<div><code>workbench.show_pattern(rec, prompt, layer, head)</code>, "
                           "<code>workbench.show_long(rec, prompt, layer, head)</code></div>"))
    return html.block(title, *parts)


def model_html(model: Model) -> str:
    """The model's card: what it is and where it came from."""
    i = model.info
    kinds = sorted(set(i.layer_types))
    layers = ", ".join(kinds) + (f" (window {i.sliding_window})" if i.sliding_window else "")
    rows = [["architecture", i.architecture], ["source", i.source], ["layers", i.n_layers],
            ["heads (query / key-value)", f"{i.n_heads} / {i.n_kv_heads}"],
            ["d_model / d_head", f"{i.d_model} / {i.d_head}"], ["context", i.n_ctx],
            ["vocabulary", i.d_vocab], ["positions", i.positions],
            ["causal", i.causal], ["LM head", i.has_lm_head], ["dtype", i.dtype],
            ["layer types", layers], ["weights SHA-256", i.checksum or "unknown"]]
    title = html.Safe(f"<b>Model</b> {html.code(i.name)}")
    return html.block(title, html.rows_table(["", ""], rows))


def card(obj: Run | Recording | Model) -> str:
    """The notebook card of a run, a recording or a model (the HTML IPython shows).

    Raises:
        TypeError: any other object.
    """
    if isinstance(obj, Run):
        return run_html(obj)
    if isinstance(obj, Recording):
        return recording_html(obj)
    if isinstance(obj, Model):
        return model_html(obj)
    raise TypeError(f"no notebook card for a {type(obj).__name__}; cards show a Run, a "
                    "Recording or a Model")
