"""The figures a stored run can draw, by name: ``workbench.figure(run, name, **options)``.

Each figure is the one its dashboard page draws, made by the same function from the same
tables, so a notebook and a page cannot disagree. A name no figure has, an option the
figure does not take or a value the run does not hold is refused in one line that lists
what there is.

A figure's title may carry a metric's meaning, as :mod:`workbench.scores.metrics` declares it.

Examples:
    >>> run = RunStore("data/runs").latest(experiment="induction-heads")  # doctest: +SKIP
    >>> figure(run, "head_scores", metric="induction")                    # doctest: +SKIP
    >>> figure(run, "qk_pair", head="L1H2", prompt=0, query=7)            # doctest: +SKIP
    >>> "head_scores" in FIGURES.names()
    True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pandas as pd
import plotly.graph_objects as go

from workbench.core.errors import WorkbenchError
from workbench.core.registry import Registry
from workbench.scores.metrics import meaning
from workbench.store.runs import Run
from workbench.views import curves, heads, qk, style

T = TypeVar("T")

Side = Literal["key", "query"]


@dataclass(frozen=True)
class RunFigure:
    """One named figure: ``draw(run, **options)``, what it shows, the page that draws it
    and the tables it reads."""

    draw: Callable[..., go.Figure]
    about: str
    page: str
    tables: tuple[str, ...]

    def options(self) -> list[str]:
        """The keyword options ``draw`` takes."""
        return [p.name for p in inspect.signature(self.draw).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY]


FIGURES: Registry[RunFigure] = Registry("figure")


def run_figure(name: str, about: str, page: str, tables: Sequence[str]
               ) -> Callable[[Callable[..., go.Figure]], Callable[..., go.Figure]]:
    """Register ``fn(run, *, option=...)`` as the figure ``name``."""
    def wrap(fn: Callable[..., go.Figure]) -> Callable[..., go.Figure]:
        FIGURES.register(name, RunFigure(fn, about, page, tuple(tables)))
        return fn
    return wrap


def figure(run: Run, name: str, **options: Any) -> go.Figure:
    """The figure ``name`` of ``run`` with ``options``, as its dashboard page draws it
    (``workbench.figure``).

    Examples:
        >>> figure(run, "head_scores", metric="induction")     # doctest: +SKIP
        >>> figure(run, "pruning_curve", metric="loss")          # doctest: +SKIP

    Raises:
        UnknownNameError: no such figure (the message lists the known ones).
        WorkbenchError: an option the figure does not take, a value the run does not hold,
            or a run without the tables the figure reads.
    """
    entry = FIGURES.get(name)
    taken = entry.options()
    unknown = [k for k in options if k not in taken]
    if unknown:
        raise WorkbenchError(
            f"figure '{name}' takes no option '{unknown[0]}'; its options: "
            f"{', '.join(taken) or 'none'} (known figures: {', '.join(FIGURES.names())})")
    missing = [t for t in entry.tables if t not in run.table_names()]
    if missing:
        raise WorkbenchError(f"figure '{name}' reads table '{missing[0]}', which run {run.id} "
                             f"({run.experiment}, {run.status}) does not have")
    return style.with_interventions(entry.draw(run, **options), run.interventions_text)


def choice(name: str, value: T | None, known: Sequence[T], what: str) -> T:
    """``value`` if it is one of ``known``, the first of them for ``None``.

    Raises:
        WorkbenchError: any other value, listing ``known``.
    """
    if value is None and known:
        return known[0]
    if value is None or value not in known:
        shown = ", ".join(str(k) for k in known[:20]) + (", ..." if len(known) > 20 else "")
        raise WorkbenchError(f"{name} {value!r} is not among {what}: {shown or 'none'}")
    return value


@run_figure("head_scores", "one metric's layer x head heatmap, each head's 95% interval on "
            "hover", "/heads", ["head_scores"])
def _head_scores(run: Run, *, metric: str | None = None) -> go.Figure:
    scores = run.table("head_scores")
    if "step" in scores.columns:  # one grid of heads a checkpoint: not one heatmap
        raise WorkbenchError(f"run {run.id} scores heads at every training step: its figure "
                             "is 'formation_heads'")
    metric = choice("metric", metric, list(dict.fromkeys(scores.metric)), "the run's metrics")
    return heads.head_scores_figure(scores, metric, run.model_name, run.experiment,
                                    meaning(metric))


@run_figure("pruning_curve", "a metric against the fraction of heads pruned, each order "
            "and the random band", "/pruning", ["pruning_curve"])
def _pruning_curve(run: Run, *, metric: str | None = None) -> go.Figure:
    curve = run.table("pruning_curve")
    metric = choice("metric", metric, list(dict.fromkeys(curve.metric)), "the run's metrics")
    return curves.pruning_curves(curve, metric, run.model_name or "")


def formation_model(phase: pd.DataFrame, model: str | None) -> tuple[str, pd.Series]:
    """The trained model a formation figure shows, with its ``phase_change`` row: by
    default the largest model whose phase change was found (else the largest)."""
    models = phase.sort_values("n_layers").model.tolist()
    detected = phase[phase.detected.astype(bool)].model.tolist()
    if model is None and models:
        model = (detected or models)[-1]
    model = choice("model", model, models, "the run's models")
    return model, phase[phase.model == model].iloc[0]


@run_figure("formation_curves", "loss and in-context learning against tokens seen, the "
            "phase change shaded", "/formation", ["training_curve", "phase_change"])
def _formation_curves(run: Run, *, model: str | None = None) -> go.Figure:
    model, phase = formation_model(run.table("phase_change"), model)
    return curves.formation_curves(run.table("training_curve"), phase, model)


@run_figure("formation_heads", "every head's induction and previous-token score over "
            "training", "/formation", ["head_scores", "phase_change"])
def _formation_heads(run: Run, *, model: str | None = None) -> go.Figure:
    model, phase = formation_model(run.table("phase_change"), model)
    return curves.formation_heads(run.table("head_scores"), phase, model)


def explained_heads(scores: pd.DataFrame) -> list[str]:
    """A qk-attribution run's explained heads (``L<layer>H<head>``), in layer order."""
    rows = scores[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"])
    return [qk.head_label(int(layer), int(head))
            for layer, head in zip(rows.layer, rows["head"], strict=True)]


def _layer_head(label: str) -> tuple[int, int]:
    layer, head = label[1:].split("H")
    return int(layer), int(head)


@run_figure("qk_attribution", "a head's score split over upstream components: the mean "
            "part over every prompt, with 95% intervals", "/why", ["scores", "attribution"])
def _qk_attribution(run: Run, *, head: str | None = None) -> go.Figure:
    head = choice("head", head, explained_heads(run.table("scores")), "the run's heads")
    layer, h = _layer_head(head)
    att = run.table("attribution")
    return qk.aggregate_figure(att[(att.layer == layer) & (att["head"] == h)], head)


def pair_rows(table: pd.DataFrame, head: tuple[int, int], prompt: int,
              query: int) -> pd.DataFrame:
    """The rows of a qk-attribution table of one head's one query on one prompt."""
    layer, h = head
    return table[(table.layer == layer) & (table["head"] == h) & (table.prompt == prompt)
                 & (table.query_pos == query)]


def prompt_tokens(run: Run, prompt: int) -> list[str]:
    tokens = run.table("tokens")
    return tokens[tokens.prompt == prompt].sort_values("position").token.tolist()


@run_figure("qk_pair", "each component's part of one query-key pair's score, key or query "
            "side", "/why", ["scores", "pair_contributions", "tokens"])
def _qk_pair(run: Run, *, head: str | None = None, prompt: int | None = None,
             query: int | None = None, side: Side = "key") -> go.Figure:
    scores = run.table("scores")
    head = choice("head", head, explained_heads(scores), "the run's heads")
    layer, h = _layer_head(head)
    mine = scores[(scores.layer == layer) & (scores["head"] == h)]
    prompt = choice("prompt", prompt, sorted(mine.prompt.unique().tolist()), "the run's prompts")
    mine = mine[mine.prompt == prompt]
    query = choice("query", query, list(dict.fromkeys(mine.query_pos.tolist())),
                   f"the queries of {head} on prompt {prompt}")
    side = choice("side", side, ["key", "query"], "the sides of a pair")
    tokens = prompt_tokens(run, prompt)
    keys = pair_rows(scores, (layer, h), prompt, query).key_pos.tolist()
    contrib = pair_rows(run.table("pair_contributions"), (layer, h), prompt, query)
    title = qk.pair_title(head, query, keys[0], tokens)
    return qk.bars_figure(contrib[contrib.side == side], f"{side} side: {title}")
