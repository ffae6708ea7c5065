"""The experiment registry, and running an experiment into the run store.

An experiment is one package in ``experiments/`` with a frozen dataclass ``Config``, a
``run(model, cfg, ctx) -> Result`` function decorated with :func:`experiment`, the
declarations of its tables (``tables.py``, see :mod:`workbench.store.schema`), and a
result whose ``tables()`` are long-format DataFrames matching them. Nothing else is
needed: the packages are discovered, so the CLI, ``workbench demo`` and the dashboard see
a new experiment at once. ``run`` receives a :class:`Context` (its run folder and store)
rather than guessing where it writes.

Examples:
    >>> from workbench.harness.experiment import run_experiment
    >>> run = run_experiment("head-overview", "smollm2", ["n_prompts=4"])  # doctest: +SKIP
    >>> run.table("head_scores").head()                                    # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import pandas as pd

from workbench.core import attention as run_attention
from workbench.core import paths
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.options import Ablation, AttentionPath, Dtype
from workbench.core.registry import Registry
from workbench.harness.config import (
    EXTRA_EXPERIMENTS,
    apply_overrides,
    check_config,
    check_declared,
    check_layers,
)
from workbench.inputs.prompts import Prompt
from workbench.interventions.masks import HeadMask, applied, check_pairing
from workbench.models import zoo
from workbench.models.base import Capabilities, Model, Tokenizing, require
from workbench.models.load import load_model, load_tokenizing
from workbench.scores import metrics
from workbench.store.records import Interventions, marked_summary
from workbench.store.runs import Run, RunStore
from workbench.store.schema import Table

log = logging.getLogger(__name__)

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
class Context:
    """Where a run writes: its folder (checkpoints, masks) and the store it belongs to
    (to find earlier runs on the same weights). Both are ``None`` when ``run`` is called
    directly, outside a store."""

    workdir: Path | None = None
    store: RunStore | None = None
    planned: Any = None
    """What the experiment's ``plan`` built before the run was created (``None``: it has
    no plan, or ``run`` was called directly and plans for itself)."""


Inputs = Callable[[Any, Tokenizing[Any]], Mapping[str, Sequence[Prompt]]]
"""An experiment's ``inputs(cfg, model)`` (:attr:`Experiment.inputs`)."""


@dataclass(frozen=True)
class Experiment:
    """A registered experiment."""

    name: str
    run: Callable[..., Result]
    config: type
    description: str
    module: str
    tables: Mapping[str, Table] = field(default_factory=dict)
    """The declarations of every table ``run`` may return (its ``tables.py``)."""
    needs_model: bool = True
    demo: Mapping[str, Any] = field(default_factory=dict)
    """Config overrides used by ``workbench demo`` (a quick but meaningful setting)."""
    demo_models: tuple[str, ...] = ("smollm2", "minilm")
    model_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """``{bundled model: config overrides}``: that model's own defaults, where the
    experiment's would take far longer on it. They sit under every other config (a named
    one, a sweep's, the user's ``--set``), and the run records the config it ran."""
    requires: Requirement = "any"
    """``causal``: refuse bidirectional models; ``causal_lm``: also need a trained LM head.
    Checked before a run is created, so a refusal leaves no failed run behind."""
    check_model: Callable[[Model], None] | None = None
    """A further fitness check of the loaded model (raises ``ModelCapabilityError`` with
    the reason), run with ``requires`` before a run is created."""
    bf16_safe: bool = False
    """Every number the run stores stays within the bounds of the bf16 table of
    docs/performance.md when the model runs in bfloat16 (``tests/integration/test_bf16.py``
    holds it there), so a run on CUDA loads the model in bfloat16 unless told otherwise
    (:func:`default_dtype`)."""
    plan: Callable[[Any, Any], Any] | None = None
    """``plan(model, cfg)``: every check that needs the model (a distance beyond its
    context, too few one-token names, a prompt longer than it takes), raising
    ``WorkbenchError``, and the inputs it builds; called before a run is created, so a
    refused input leaves no failed run. ``run`` finds what it returned in
    :attr:`Context.planned`."""
    ablations: tuple[Ablation, ...] = get_args(Ablation)
    """The ablations a head mask applied to its runs may have (``--heads-mask``,
    ``--ablate``); another is refused before the model loads."""
    preflight: Callable[[Any, str | Model | None, Path], None] | None = None
    """``preflight(cfg, model, runs_dir)``: the checks that need neither the model's
    weights nor a run (a tokenizer read alone, the stored runs a config names), raising
    ``WorkbenchError`` in one line; called before the model loads. ``model`` is the model
    argument (a name, or a model already loaded), ``runs_dir`` the run store."""
    inputs: Inputs | None = None
    """``inputs(cfg, model)``: ``{what: prompts}``, the prompt lists the run batches under
    its head mask, each batched on its own (``what`` names it in a message: ``"prompt set
    natural"``), built from a tokenizer alone (:class:`~workbench.models.base.Tokenizing`).
    A ``resample`` head mask is checked against their token lengths before the model loads
    (:func:`~workbench.interventions.masks.check_pairing`), so a prompt with no other of
    its length is refused in one line and leaves no run. An experiment that takes
    ``resample`` and batches prompts of varied lengths declares them here."""

    def defaults_for(self, model: str | None) -> dict[str, Any]:
        """The config overrides of ``model``'s own defaults (:attr:`model_defaults`; none
        for a model that is not bundled or has none)."""
        return dict(self.model_defaults.get(model or "", {}))

    def named_config(self, spec: str | Mapping[str, Any], model: str | None = None
                     ) -> dict[str, Any]:
        """The overrides a claim's ``"config"`` names: ``"default"`` or ``"demo"``, or a
        mapping whose ``"base"`` (default ``"default"``) names one of them and whose other
        keys pin fields, e.g. ``{"base": "demo", "eps": 0.3}``. With ``model``, that
        model's own defaults (:meth:`defaults_for`) sit under them.

        Raises:
            UnknownNameError: an unknown base (the message lists the known ones).
        """
        base, pins = (spec, {}) if isinstance(spec, str) else (
            spec.get("base", "default"), {k: v for k, v in spec.items() if k != "base"})
        own = self.defaults_for(model)
        named = {"default": own, "demo": {**own, **self.demo}}
        if base not in named:
            raise UnknownNameError(f"experiment '{self.name}' has no config '{base}'; "
                                   f"known configs: {', '.join(named)}")
        return {**named[base], **pins}

    def check_fit(self, facts: Capabilities) -> None:
        """Refuse a model ``requires`` excludes: the check a run makes once its model has
        loaded, and a sweep's plan makes from what it knows before loading.

        Args:
            facts: the loaded model's info, or what is known of it without loading it
                (an unknown fact refuses nothing).

        Raises:
            ModelCapabilityError: the reason (an encoder for a causal experiment).
        """
        if self.requires != "any":
            require(facts, causal=True, lm_head=self.requires == "causal_lm",
                    what=f"experiment '{self.name}'")


EXPERIMENTS: Registry[Experiment] = Registry("experiment")


def experiment(name: str, *, config: type, tables: Mapping[str, Table],
               needs_model: bool = True, demo: Mapping[str, Any] | None = None,
               demo_models: tuple[str, ...] = ("smollm2", "minilm"),
               model_defaults: Mapping[str, Mapping[str, Any]] | None = None,
               requires: Requirement = "any",
               check_model: Callable[[Model], None] | None = None,
               plan: Callable[[Any, Any], Any] | None = None, bf16_safe: bool = False,
               ablations: Iterable[Ablation] = get_args(Ablation),
               preflight: Callable[[Any, str | Model | None, Path], None] | None = None,
               inputs: Inputs | None = None,
               ) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Register the decorated ``run`` function as experiment ``name``.

    Args:
        name: the registered name (a duplicate raises).
        config: the frozen ``Config`` dataclass; every number field declares a finite
            ``max`` (:func:`workbench.harness.config.check_declared`).
        tables: ``{name: Table}`` of every table ``run``'s result may hold.
        needs_model: ``False`` for experiments that build their own models.
        demo: config overrides of a quick but meaningful run (``workbench demo``, and the
            config claims name as ``"demo"``); checked when the experiment registers.
        demo_models: bundled models the demo runs on.
        model_defaults: ``{bundled model: config overrides}``, that model's own defaults
            (see :attr:`Experiment.model_defaults`); checked when the experiment registers.
        requires: ``causal`` or ``causal_lm`` to refuse other models before a run exists.
        check_model: refuses a model the experiment cannot honestly run on (e.g. a
            post-norm model), before a run exists.
        plan: ``plan(model, cfg)``, the model-dependent checks and the inputs they build,
            before a run exists (:attr:`Experiment.plan`).
        bf16_safe: its stored numbers keep the bf16 table's bounds in bfloat16
            (:attr:`Experiment.bf16_safe`): the default dtype on CUDA.
        ablations: the ablations of the head masks its runs take
            (:attr:`Experiment.ablations`).
        preflight: ``preflight(cfg, model, runs_dir)``, the checks made before the model
            loads (:attr:`Experiment.preflight`).
        inputs: ``inputs(cfg, model)``, the prompt lists a resample head mask is checked
            against before the model loads (:attr:`Experiment.inputs`).
    """

    def wrap(fn: Callable[..., Result]) -> Callable[..., Result]:
        if fn.__module__ == "__main__":
            return fn  # run as a script: discover() registers the importable module instead
        module = importlib.import_module(fn.__module__)
        # the docstring's whole first paragraph: its first line may end mid-sentence
        doc = [" ".join((module.__doc__ or "").strip().split("\n\n")[0].split())]
        check_declared(config)  # a number field without an upper bound fails at import
        apply_overrides(config, dict(demo or {}))  # a broken demo config fails at import
        for model, overrides in (model_defaults or {}).items():
            zoo.MODELS.get(model)  # an unknown model fails at import, naming the bundled ones
            apply_overrides(config, dict(overrides))  # and so do its default
            apply_overrides(config, {**overrides, **dict(demo or {})})  # and its demo
        EXPERIMENTS.register(name, Experiment(
            name=name, run=fn, config=config, description=doc[0] if doc else "",
            module=fn.__module__, tables=dict(tables), needs_model=needs_model,
            demo=dict(demo or {}), demo_models=demo_models,
            model_defaults={m: dict(o) for m, o in (model_defaults or {}).items()},
            requires=requires,
            check_model=check_model,
            plan=plan,
            bf16_safe=bf16_safe,
            ablations=tuple(ablations),
            preflight=preflight,
            inputs=inputs,
        ))
        return fn

    return wrap


_discovered = False



def discover() -> None:
    """Import every experiment package in ``experiments/``, then every module named in
    ``WORKBENCH_EXPERIMENTS``, so that each registers itself.

    Raises:
        WorkbenchError: a module named in ``WORKBENCH_EXPERIMENTS`` cannot be imported.
    """
    global _discovered
    if not _discovered:
        import experiments

        for info in pkgutil.iter_modules(experiments.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"experiments.{info.name}")
        _discovered = True
    for module in filter(None, (m.strip() for m in os.environ.get(EXTRA_EXPERIMENTS, "")
                                .split(","))):
        try:
            importlib.import_module(module)  # imported once: later calls find it loaded
        except ImportError as exc:
            raise WorkbenchError(f"{EXTRA_EXPERIMENTS}: cannot import {module!r}: "
                                 f"{exc}") from None


OTHER_RUN_KINDS = ("record", "reproduce", "sweep")
"""Runs that are not experiments: written by ``workbench record``, ``workbench reproduce``
and ``workbench sweep``."""


def get(name: str) -> Experiment:
    """A registered experiment (an unknown name lists the known ones)."""
    discover()
    return EXPERIMENTS.get(name)


def all_experiments() -> list[Experiment]:
    discover()
    return [exp for _, exp in EXPERIMENTS.items()]


def default_dtype(exp: Experiment, device: str) -> Dtype:
    """The dtype a run loads its model in when none is asked for: bfloat16 on a CUDA
    device for an experiment that keeps its bounds in it (:attr:`Experiment.bf16_safe`),
    float32 otherwise.

    Examples:
        >>> default_dtype(get("previous-token-heads"), "cuda:0"), default_dtype(
        ...     get("previous-token-heads"), "cpu"), default_dtype(get("ioi"), "cuda")
        ('bfloat16', 'float32', 'float32')
    """
    return "bfloat16" if exp.bf16_safe and device.split(":")[0] == "cuda" else "float32"


def run_experiment(name: str, model: str | Model | None,
                   overrides: Iterable[str] | Mapping[str, Any] = (), *,
                   runs_dir: str | Path | None = None, dtype: Dtype | None = None,
                   reuse: bool = False, heads_mask: HeadMask | None = None,
                   device: str = "cpu", attention: AttentionPath = "auto") -> Run:
    """Run a registered experiment and store it as a run.

    The config is checked before the model loads, so a bad override fails at once.

    Args:
        name: registered experiment name.
        model: a model name for :func:`workbench.models.load_model`, a loaded
            :class:`Model`, or ``None`` for experiments that build their own models.
        overrides: ``["key=value", ...]`` or a dict, applied to the experiment's Config
            (over the bundled model's own defaults, when it has some:
            :attr:`Experiment.model_defaults`).
        runs_dir: the run store (``--out``); default :func:`workbench.core.paths.runs_dir`.
        dtype: dtype to load the model in (``None``: :func:`default_dtype`, bfloat16 on
            CUDA where the experiment is safe in it, else float32).
        reuse: return an existing complete run with the same experiment, model, config,
            head mask and workbench version instead of running again.
        heads_mask: a :class:`~workbench.interventions.HeadMask` applied for the whole run.
        device: torch device to load a model named by ``model`` on (checked by
            :func:`workbench.core.devices.check_device`); a loaded model stays where it is.
        attention: the path of the run's head-score scans (``fused`` forces the kernel
            where it serves a scan: :mod:`workbench.recording.fused_scan`); ``run.json``
            records the path taken.

    Returns:
        The finished run. If the experiment raises, the run is stored as failed (with the
        error) and the exception propagates.
    """
    exp = get(name)
    _check_attention(attention)
    model_name = model if isinstance(model, str) else model.info.name if model else None
    cfg = _built_config(exp, model_name, overrides)
    if exp.needs_model and model is None:
        raise WorkbenchError(f"experiment '{name}' needs --model")
    if heads_mask is not None and heads_mask.ablation not in exp.ablations:
        raise WorkbenchError(f"experiment '{name}' takes a head mask of "
                             f"{' or '.join(exp.ablations)} ablation, not "
                             f"{heads_mask.ablation}")
    root = paths.runs_dir(runs_dir)
    paths.check_store(root, write=True)  # a store that cannot take the run: before the load
    store = RunStore(root)
    if exp.preflight is not None:  # refusals that need no weights: before the load
        exp.preflight(cfg, model, root)
    checked = check_resample_inputs(exp, cfg, model, heads_mask)
    loaded = _fit_model(exp, model, cfg, heads_mask, device=device, runs_dir=runs_dir,
                        dtype=dtype or default_dtype(exp, device))
    if not checked:  # a tokenizer known only once its model loads (a GGUF file, a hub name)
        check_resample_inputs(exp, cfg, loaded, heads_mask)
    info = loaded.info if loaded is not None else None
    interventions = Interventions(heads_mask=heads_mask.to_record()) if heads_mask else None
    if reuse and (found := store.find_matching(name, info, cfg, interventions,
                                               check=verify_stored_files)) is not None:
        log.info("reusing run %s", found.id)
        return found
    planned = exp.plan(loaded, cfg) if exp.plan is not None else None  # refusals: no run
    check_planned_pairing(planned, heads_mask)
    with store.start(name, info, cfg, tables=exp.tables,
                     extra={"interventions": interventions}) as active:
        with applied(loaded, heads_mask) if loaded is not None else nullcontext(), \
                run_attention.preferring(attention):
            result = exp.run(loaded, cfg, Context(workdir=active.dir, store=store,
                                                  planned=planned))
        for table_name, df in result.tables().items():
            metrics.check_table(df)
            active.save_table(table_name, df)
        active.update(summary=marked_summary(result.summary(), interventions))
    return store.get(active.final)


def check_resample_inputs(exp: Experiment, cfg: Any, model: str | Model | None,
                          heads_mask: HeadMask | None) -> bool:
    """Refuse, before the model loads, a ``resample`` head mask on inputs in which some
    prompt has no other of its token length (:attr:`Experiment.inputs`), read with the
    model's tokenizer alone; a model whose tokenizer is not known before it loads is
    checked once it has loaded, before a run exists (:func:`run_experiment` calls this
    again with the loaded model).

    Returns:
        False where the tokenizer of a model named by ``model`` could not be read without
        its weights, so nothing was checked; True otherwise.

    Raises:
        WorkbenchError: one line naming the prompts and the lengths left alone.
    """
    if heads_mask is None or heads_mask.ablation != "resample" or exp.inputs is None \
            or model is None:
        return True
    tokenizing = load_tokenizing(model) if isinstance(model, str) else model
    if tokenizing is None:
        return False
    for what, prompts in exp.inputs(cfg, tokenizing).items():
        check_pairing([len(tokenizing.encode(p)[0]) for p in prompts], what)
    return True


@runtime_checkable
class PairedPlan(Protocol):
    """A plan that says the token lengths of the prompts its run batches together."""

    def lengths(self) -> dict[str, list[int]]:
        """``{what: each prompt's token length}``, one entry per set of prompts batched
        together (``what`` names them for a message)."""
        ...


def check_planned_pairing(planned: object, heads_mask: HeadMask | None) -> None:
    """Refuse, before a run exists, a ``resample`` head mask on planned prompts in which
    some prompt has no other of its token length, where the plan says their lengths
    (:class:`PairedPlan`): for the experiments whose prompts are drawn with the loaded
    model (IOI's names are the model's one-token words), after
    :func:`check_resample_inputs` could not see them.

    Raises:
        WorkbenchError: one line naming the prompts and the lengths left alone.
    """
    if heads_mask is None or heads_mask.ablation != "resample" \
            or not isinstance(planned, PairedPlan):
        return
    for what, got in planned.lengths().items():
        check_pairing(got, what)


def _check_attention(attention: str) -> None:
    if attention not in get_args(AttentionPath):
        raise WorkbenchError(f"attention must be one of {', '.join(get_args(AttentionPath))}, "
                             f"got {attention!r}")


def _built_config(exp: Experiment, model_name: str | None,
                  overrides: Iterable[str] | Mapping[str, Any]) -> Any:
    """The run's config, checked: the experiment's defaults, the bundled model's own
    defaults over them (:attr:`Experiment.model_defaults`), then ``overrides``.

    Raises:
        ConfigError: an override or a value that the config refuses.
    """
    own = exp.defaults_for(model_name)
    cfg = check_config(apply_overrides(exp.config, dict(overrides) if isinstance(
        overrides, Mapping) else list(overrides), base=apply_overrides(exp.config, own)))
    if own:
        log.info("%s's own defaults for %s: %s", model_name, exp.name,
                 ", ".join(f"{k}={v}" for k, v in own.items()))
    return cfg


def _fit_model(exp: Experiment, model: str | Model | None, cfg: Any,
               heads_mask: HeadMask | None, *, dtype: Dtype, device: str,
               runs_dir: str | Path | None) -> Model | None:
    """The run's model, loaded if it is named, and refused before a run exists where it
    does not fit: the experiment's requirements and its model check, the config's layer
    fields, the head mask.

    Raises:
        ModelCapabilityError: a model the experiment cannot run on.
        ConfigError: a layer field naming a layer the model does not have.
        WorkbenchError: a model that does not load, or a head mask without a model or
            that does not fit it.
    """
    loaded = (load_model(model, dtype=dtype, device=device, runs_dir=runs_dir)
              if isinstance(model, str) else model)
    if loaded is not None:
        exp.check_fit(loaded.info)
    if loaded is not None and exp.check_model is not None:
        exp.check_model(loaded)
    if loaded is not None:  # layer fields must name layers this model has
        check_layers(cfg, loaded.info.n_layers, loaded.info.name)
    if heads_mask is not None:
        if loaded is None:
            raise WorkbenchError(f"experiment '{exp.name}' takes no model, so no head mask")
        heads_mask.check(loaded)
    return loaded


def verify_stored_files(run: Run) -> None:
    """Re-hash the recordings and checkpoints a run holds, as ``--reuse`` does before it
    returns the run (the store itself re-hashes its tables).

    Raises:
        WorkbenchError / ChecksumError: the first file that fails its check.
    """
    from workbench.harness.stored import stored_files

    for held in stored_files(run.path):
        held.verify()
