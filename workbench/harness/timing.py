"""How long an experiment's default and demo configs took, read from the runs stored here.

Every run records when it started and ended (``run.json``), so the wall time of the
default config (no ``--set``) and of the demo config (``workbench demo``) on each model is
the newest complete run with exactly that config. ``workbench run EXPERIMENT --help`` shows
these figures, each with whether the machine was busy (its load average, recorded at the
run's start and end, above its cores); nothing is estimated or extrapolated.

Examples:
    >>> from workbench.harness.experiment import get
    >>> from workbench.store.runs import RunStore
    >>> wall_times(get("head-overview"), RunStore("data/runs"))  # doctest: +SKIP
    [WallTime(config='default', model='smollm2', seconds=9.0, run_id='...', ...)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workbench.harness.config import apply_overrides
from workbench.harness.experiment import Experiment
from workbench.harness.run_facts import stored_form
from workbench.store.runs import RunStore

ConfigName = Literal["default", "demo"]


@dataclass(frozen=True)
class WallTime:
    """The wall time of one stored run of a named config."""

    config: ConfigName
    model: str
    """The model's name, or ``-`` for an experiment that trains its own."""
    seconds: float
    run_id: str
    ended_at: str
    cpu_count: int | None
    """CPU cores of the machine that ran it (``run.json``'s ``machine``)."""
    busy: bool | None = None
    """Whether the machine was busy (:attr:`RunMeta.busy`): the time is then not the
    run's own; ``None`` for a run that did not record its load."""
    load: str = "load not recorded"
    """The load in a few words (:attr:`RunMeta.load_note`)."""


def wall_times(exp: Experiment, store: RunStore) -> list[WallTime]:
    """The newest complete run of each named config (``default``, ``demo``) on each model
    (float32, no head mask), with how long it took.

    Args:
        exp: a registered experiment.
        store: the run store to read.

    Returns:
        One :class:`WallTime` per (config, model) that has such a run, default first.
    """
    newest: dict[tuple[ConfigName, str], WallTime] = {}
    for run in store.runs(experiment=exp.name, status="complete"):
        dtype = run.meta.model.dtype if run.meta.model else "float32"
        if run.meta.interventions or dtype != "float32" or (
                seconds := run.seconds) is None:
            continue
        for name, cfg in _named(exp, run.model_name).items():
            if run.config != cfg:
                continue
            model = run.model_name or "-"
            found = newest.get((name, model))
            ended = run.meta.ended_at or ""
            if found is None or ended > found.ended_at:
                cpus = run.meta.machine.cpu_count if run.meta.machine else None
                newest[(name, model)] = WallTime(name, model, seconds, run.id, ended, cpus,
                                                 run.meta.busy, run.meta.load_note)
    return sorted(newest.values(), key=lambda t: (t.config != "default", t.model))


def _named(exp: Experiment, model: str | None) -> dict[ConfigName, dict[str, Any]]:
    """The default and demo configs on ``model`` (its own defaults under both), as a run
    stores them; a demo that is the default is timed once, as the default."""
    default, demo = (stored_form(apply_overrides(exp.config, exp.named_config(name, model)))
                     for name in ("default", "demo"))
    named: dict[ConfigName, dict[str, Any]] = {"default": default}
    if demo != default:
        named["demo"] = demo
    return named
