"""The experiment registry, and running an experiment into the run store.

An experiment is one module in ``experiments/`` with a frozen dataclass ``Config``, a
``run(model, cfg) -> Result`` function decorated with :func:`experiment`, and a result
whose ``tables()`` are long-format DataFrames. Nothing else is needed: the modules are
discovered, so the CLI, ``workbench demo`` and the dashboard see a new experiment at once.

Examples:
    >>> from workbench.harness.experiment import run_experiment
    >>> run = run_experiment("head-overview", "smollm2", ["n_prompts=4"])  # doctest: +SKIP
    >>> run.table("head_scores").head()                                    # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import pandas as pd

from workbench.core import paths
from workbench.core.errors import WorkbenchError
from workbench.core.registry import Registry
from workbench.harness.config import apply_overrides
from workbench.interventions.masks import HeadMask, applied
from workbench.models.base import Dtype, Model
from workbench.models.load import load_model
from workbench.store.runs import Run, RunStore

log = logging.getLogger(__name__)

HEAD_SCORE_COLUMNS = ("layer", "head", "metric", "score")
Requirement = Literal["any", "causal", "causal_lm"]


class Result(Protocol):
    """What an experiment returns."""

    def tables(self) -> dict[str, pd.DataFrame]:
        """Named long-format tables; ``head_scores`` has at least layer, head, metric, score."""
        ...

    def summary(self) -> list[str]:
        """A few lines for the terminal and ``run.json``."""
        ...


@dataclass(frozen=True)
class Experiment:
    """A registered experiment."""

    name: str
    run: Callable[..., Result]
    config: type
    description: str
    module: str
    needs_model: bool = True
    writes_files: bool = False
    """``run`` also takes ``workdir=`` (the run folder) to write files such as checkpoints."""
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Config overrides used by ``workbench demo`` (a quick but meaningful setting)."""
    demo_models: tuple[str, ...] = ("smollm2", "minilm")
    requires: Requirement = "any"
    """``causal``: refuse bidirectional models; ``causal_lm``: also need a trained LM head.
    Checked before a run is created, so a refusal leaves no failed run behind."""


EXPERIMENTS: Registry[Experiment] = Registry("experiment")


def experiment(name: str, *, config: type, needs_model: bool = True, writes_files: bool = False,
               demo: Mapping[str, Any] | None = None,
               demo_models: tuple[str, ...] = ("smollm2", "minilm"),
               requires: Requirement = "any",
               ) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Register the decorated ``run`` function as experiment ``name``."""

    def wrap(fn: Callable[..., Result]) -> Callable[..., Result]:
        if fn.__module__ == "__main__":
            return fn  # run as a script: discover() registers the importable module instead
        module = importlib.import_module(fn.__module__)
        doc = (module.__doc__ or "").strip().splitlines()
        EXPERIMENTS.register(name, Experiment(
            name=name, run=fn, config=config, description=doc[0] if doc else "",
            module=fn.__module__, needs_model=needs_model, writes_files=writes_files,
            demo=dict(demo or {}), demo_models=demo_models, requires=requires,
        ))
        return fn

    return wrap


_discovered = False


def discover() -> None:
    """Import every module of the ``experiments`` package so that each registers itself."""
    global _discovered
    if _discovered:
        return
    import experiments

    for info in pkgutil.iter_modules(experiments.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"experiments.{info.name}")
    _discovered = True


def get(name: str) -> Experiment:
    """A registered experiment (an unknown name lists the known ones)."""
    discover()
    return EXPERIMENTS.get(name)


def all_experiments() -> list[Experiment]:
    discover()
    return [exp for _, exp in EXPERIMENTS.items()]


def run_experiment(name: str, model: str | Model | None,
                   overrides: Iterable[str] | Mapping[str, Any] = (), *,
                   runs_dir: str | Path | None = None, dtype: Dtype = "float32",
                   reuse: bool = False, heads_mask: HeadMask | None = None) -> Run:
    """Run a registered experiment and store it as a run.

    The config is checked before the model loads, so a bad override fails at once.

    Args:
        name: registered experiment name.
        model: a model name for :func:`workbench.models.load_model`, a loaded
            :class:`Model`, or ``None`` for experiments that build their own models.
        overrides: ``["key=value", ...]`` or a dict, applied to the experiment's Config.
        runs_dir: the run store (``--out``); default :func:`workbench.core.paths.runs_dir`.
        dtype: dtype to load the model in.
        reuse: return an existing complete run with the same experiment, model, config,
            head mask and workbench version instead of running again.
        heads_mask: a :class:`~workbench.interventions.HeadMask` applied for the whole run.

    Returns:
        The finished run. If the experiment raises, the run is stored as failed (with the
        error) and the exception propagates.
    """
    exp = get(name)
    cfg = apply_overrides(exp.config, dict(overrides) if isinstance(overrides, Mapping)
                          else list(overrides))
    if exp.needs_model and model is None:
        raise WorkbenchError(f"experiment '{name}' needs --model")
    store = RunStore(paths.runs_dir(runs_dir))
    loaded = load_model(model, dtype=dtype) if isinstance(model, str) else model
    if loaded is not None and exp.requires != "any":
        loaded.require(causal=True, lm_head=exp.requires == "causal_lm",
                       what=f"experiment '{name}'")
    info = loaded.info.to_dict() if loaded is not None else None
    if heads_mask is not None:
        if loaded is None:
            raise WorkbenchError(f"experiment '{name}' takes no model, so no head mask")
        heads_mask.check(loaded)
    interventions = {"heads_mask": heads_mask.to_json()} if heads_mask is not None else None
    if reuse and (found := store.find_matching(name, info, cfg, interventions)) is not None:
        log.info("reusing run %s", found.id)
        return found
    with store.start(name, info, cfg, extra={"interventions": interventions}) as active:
        kwargs = {"workdir": active.dir} if exp.writes_files else {}
        with applied(loaded, heads_mask) if loaded is not None else nullcontext():
            result = exp.run(loaded, cfg, **kwargs)
        for table_name, df in result.tables().items():
            active.save_table(table_name, df)
        active.set("summary", result.summary())
    return store.get(active.final)
