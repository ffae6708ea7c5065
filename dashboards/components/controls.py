"""Labelled controls with ids prefixed by their page."""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from dashboards.components import data
from dashboards.components.messages import message, one_line
from dashboards.components.values import below
from workbench.core.errors import WorkbenchError
from workbench.recording.record import Recording
from workbench.store.runs import Run


def labelled(label: str, control: Any, width: str | None = None) -> html.Div:
    style = {"minWidth": width} if width else None
    return html.Div([html.Label(label), control], className="wb-control", style=style)


def run_label(run: Run) -> str:
    started = run.meta.started_at[:16].replace("T", " ")
    return f"{run.experiment} · {run.model_name or '-'} · {started} · {run.id[-4:]}"


def run_options(runs: list[Run]) -> list[dict[str, str]]:
    return [{"label": run_label(r), "value": r.id} for r in runs]


def run_dropdown(component_id: str, runs: list[Run], value: str | None) -> dcc.Dropdown:
    if value is None and runs:
        value = runs[0].id
    return dcc.Dropdown(id=component_id, options=run_options(runs), value=value,
                        clearable=False, placeholder="no runs yet")


def prompt_options(tokens_by_prompt: list[list[str]], labels: list[str]) -> list[dict]:
    opts = []
    for i, (toks, label) in enumerate(zip(tokens_by_prompt, labels, strict=True)):
        preview = "".join(toks[:12]).replace("\n", " ")
        opts.append({"label": f"{i}: {label} ({len(toks)} tok) {preview}…", "value": i})
    return opts


def recording_choices(run_id: str | None) -> tuple[list[dict], list[int], list[int]]:
    """The prompt, layer and head options of the recording of run ``run_id`` (all empty
    without a run).

    Raises:
        WorkbenchError: the run is not a readable complete recording.
    """
    if run_id is None:
        return [], [], []
    rec = data.recording(run_id)
    prompts = prompt_options([p.tokens for p in rec.prompts], [p.label for p in rec.prompts])
    return prompts, list(range(rec.n_layers)), list(range(rec.n_heads))


def recording_layout_choices(run_id: str | None
                             ) -> tuple[list[dict], list[int], list[int], Any]:
    """:func:`recording_choices` for a page's layout, and the message saying why they are
    empty when the run cannot be read (``None`` when it can).

    The layout fills the dropdowns with their options and values together: a Dash
    dropdown drops a value that is not among its options, so options filled in later by a
    callback race the first render and can leave the layer or head blank. A run that
    cannot be read leaves the run list, to pick another.
    """
    try:
        return *recording_choices(run_id), None
    except (WorkbenchError, OSError) as exc:
        return [], [], [], message(one_line(exc))


def check_choice(rec: Recording, prompt: int | None, layer: int | None,
                 head: int | None) -> None:
    """Refuse a prompt, layer or head the recording does not have (``None``: not chosen).

    Raises:
        Refused: the message names the first one beyond the recording.
    """
    for label, value, count, what in (("prompt", prompt, len(rec), "prompts in the recording"),
                                      ("layer", layer, rec.n_layers, "layers in the recording"),
                                      ("head", head, rec.n_heads, "heads in each layer")):
        if value is not None:
            below(label, value, count, what)
