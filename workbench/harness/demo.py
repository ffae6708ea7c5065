"""``workbench demo``: a recording per bundled model and every experiment's demo run.

Each experiment registers a quick but meaningful configuration (``demo=`` in
:func:`workbench.harness.experiment.experiment`) and the models it suits (``demo_models``); this
runs them all, reusing matching complete runs, then checks every published claim.

Before anything runs, the demo is planned (:func:`demo_plan`): every step, each with its
wall time from the newest complete run of the same thing in the store, or "no estimate";
as each step starts, the time left overall and the load average are said with it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workbench.core import paths
from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.harness import claims
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import (
    Experiment,
    all_experiments,
    run_experiment,
    verify_stored_files,
)
from workbench.harness.experiment import get as get_experiment
from workbench.harness.sweeps.spec import bundled_refusal
from workbench.harness.timing import wall_times
from workbench.inputs.prompts import load_prompt_set
from workbench.models.base import Model
from workbench.models.load import load_model
from workbench.models.zoo import MODELS
from workbench.recording.writer import record
from workbench.store import provenance
from workbench.store.runs import Run, RunStore


def demo_recording(model: Model, store: RunStore, fresh: bool) -> str:
    """Record six prompts (natural text, or sentence pairs for encoders) unless done."""
    prompts = load_prompt_set("natural" if model.info.causal else "sentence-pairs")[:6]
    config = {"source": "demo", "n_prompts": len(prompts), "store_dtype": "float16",
              "max_batch_tokens": 2048, "dtype": model.info.dtype}
    found = None if fresh else store.find_matching("record", model.info, config,
                                                   check=verify_stored_files)
    if found is not None:
        return found.id
    with store.start("record", model.info, config) as run:
        record(model, prompts, run.dir / "recording")
        run.update(summary=[f"recorded {len(prompts)} demo prompts"])
    return run.id


DEMO_MODELS = ("smollm2", "minilm")
"""The bundled models a full demo runs on."""


def demo_models(models: Sequence[str] | None) -> tuple[tuple[str, ...], bool]:
    """The bundled models to run on, and whether this is the full demo (every bundled
    model, the experiments that train their own models and every claim).

    Raises:
        UnknownNameError: a name that is not a bundled model (listing them), before
            anything runs; WorkbenchError: an empty list.
    """
    if models is None:
        return DEMO_MODELS, True
    if not models:
        raise WorkbenchError(f"no model given; bundled models: {', '.join(MODELS.names())}")
    for name in models:
        MODELS.get(name)
    return tuple(dict.fromkeys(models)), False


@dataclass(frozen=True)
class DemoStep:
    """One step of the demo, planned before anything runs."""

    kind: Literal["record", "experiment", "training", "sweep", "claims"]
    name: str
    """The experiment's name, or ``record``, ``formation sweep``, ``claims``."""
    model: str | None
    """The bundled model it runs on (``None``: its own models, or every claim's)."""
    seconds: float | None = None
    """Its expected wall time, from the stored runs (``None``: no estimate)."""
    basis: str = "no estimate"
    """Where :attr:`seconds` comes from, said in the plan."""
    skip: str = ""
    """Why the experiment refuses the model, known before it loads (the step is then
    only named, not run)."""

    @property
    def label(self) -> str:
        return self.name if self.model is None else f"{self.name} on {self.model}"


def demo_plan(models: Sequence[str] | None, store: RunStore, *,
              fresh: bool = False) -> list[DemoStep]:
    """Every step :func:`run_demo` takes, in order, each with an estimate of its wall time
    from the newest complete run of the same thing in ``store`` (a step whose stored run
    will be reused is estimated at nothing), or none.

    Raises:
        UnknownNameError: a name that is not a bundled model.
    """
    names, full = demo_models(models)
    experiments = all_experiments()
    steps = []
    for name in names:
        steps.append(DemoStep("record", "record", name))
        steps += [DemoStep("experiment", exp.name, name, skip=bundled_refusal(exp, name))
                  for exp in experiments if exp.needs_model and name in exp.demo_models]
    if full:
        steps += [DemoStep("training", exp.name, None) for exp in experiments
                  if not exp.needs_model]
        steps += [DemoStep("sweep", "formation sweep", None), DemoStep("claims", "claims", None)]
    else:
        loaded = claims.load_claims()
        steps += [DemoStep("claims", "claims", name) for name in names
                  if any(name in c.models for c in loaded)]
    return [_estimated(step, store, fresh) for step in steps]


def _estimated(step: DemoStep, store: RunStore, fresh: bool) -> DemoStep:
    """``step`` with its estimate: the newest complete run of its demo config on its model
    (an experiment, or the recording), or ``step`` as it is (the sweep and the claims,
    whose time depends on what they find done)."""
    if step.skip:
        return dataclasses.replace(step, seconds=0.0, basis=f"skipped ({step.skip})")
    if not store.root.is_dir() or step.kind in ("sweep", "claims"):
        return step
    if step.kind == "record":
        found = [r for r in store.runs(experiment="record", model=step.model,
                                       status="complete")
                 if r.config.get("source") == "demo" and r.seconds is not None]
        if not found:
            return step
        newest = max(found, key=lambda r: r.meta.ended_at or "")
        return _timed(step, newest.seconds or 0.0, newest.id, reused=not fresh and (
            newest.meta.workbench_version == provenance.workbench_version()))
    exp = get_experiment(step.name)
    # wall_times names the demo config "default" when it is the default
    named = "demo" if _demo_differs(exp, step.model) else "default"
    time = next((t for t in wall_times(exp, store)
                 if t.config == named and t.model == (step.model or "-")), None)
    if time is None:
        return step
    version = store.get(time.run_id).meta.workbench_version
    return _timed(step, time.seconds, time.run_id,
                  reused=not fresh and version == provenance.workbench_version())


def _demo_differs(exp: Experiment, model: str | None) -> bool:
    """Whether the demo config differs from the default on ``model`` (whose own defaults
    sit under both)."""
    default, demo = (apply_overrides(exp.config, exp.named_config(name, model))
                     for name in ("default", "demo"))
    return bool(demo != default)


def _timed(step: DemoStep, seconds: float, run_id: str, *, reused: bool) -> DemoStep:
    if reused:  # a matching complete run is returned, not computed again
        return dataclasses.replace(step, seconds=0.0,
                                   basis=f"reuses run {run_id} (which took {_about(seconds)})")
    return dataclasses.replace(step, seconds=seconds,
                               basis=f"about {_about(seconds)} (run {run_id})")


def _about(seconds: float) -> str:
    """A wall time as the plan says it: ``under 1 s``, ``45 s``, ``2 min 30 s``."""
    if seconds < 1:  # run.json keeps whole seconds
        return "under 1 s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _time_left(steps: Sequence[DemoStep]) -> str:
    """The sum of the estimates of ``steps``, and how many have none."""
    timed = [s.seconds for s in steps if s.seconds is not None and not s.skip]
    unknown = sum(s.seconds is None for s in steps)
    if not timed and unknown:
        have = "has" if unknown == 1 else "have"
        return f"no estimate, {unknown} of {len(steps)} steps {have} no stored run to go by"
    none = f", not counting {unknown} with no estimate" if unknown else ""
    total = sum(timed)
    return f"{'about ' if total >= 1 else ''}{_about(total)}{none}"


def plan_lines(plan: Sequence[DemoStep]) -> list[str]:
    """The plan as printed before the demo starts: ``[k/N] experiment on model: estimate``
    for every step, then the total of the estimates."""
    n = len(plan)
    lines = [f"plan: {n} steps"]
    lines += [f"[{k}/{n}] {step.label}: {step.basis}" for k, step in enumerate(plan, 1)]
    lines.append(f"estimated: {_time_left(plan)} (loading the models not included)")
    return lines


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def start_line(plan: Sequence[DemoStep], k: int, elapsed: float) -> list[str]:
    """What is printed as step ``k`` (from 1) starts: the step, the time left overall
    (the estimates of this step and the ones after it; ``elapsed`` seconds so far), the
    load average, and a warning when the load is above the cores."""
    n = len(plan)
    load = os.getloadavg()[0]
    cores = _cores()
    lines = [f"[{k}/{n}] {plan[k - 1].label} ({_about(elapsed)} so far; left: "
             f"{_time_left(plan[k - 1:])}; load {load:.1f} on {cores} cores)"]
    if load > cores:
        lines.append(f"warning: the load average ({load:.1f}) is above the {cores} cores: "
                     "other work shares them, so steps take longer than estimated")
    return lines


def run_demo(models: Sequence[str] | None = None, runs_dir: str | Path | None = None, *,
             fresh: bool = False, device: str = "cpu") -> Iterator[str]:
    """Run the demo; yield its plan, then a line as each step starts and one as it ends
    (the CLI prints them).

    Args:
        models: limit the demo to these bundled models: their experiments, and the claims
            whose default models include them, checked on them; no training. ``None``:
            the full demo (every bundled model, training, every claim).
        runs_dir: the run store.
        fresh: run again instead of reusing matching complete runs.
        device: torch device the bundled models load on (the training stays on the CPU).

    Returns:
        An iterator of lines: the plan (:func:`plan_lines`), then for each step its
        :func:`start_line` and its outcome.
    """
    store = RunStore(paths.runs_dir(runs_dir))
    plan = demo_plan(models, store, fresh=fresh)
    yield from plan_lines(plan)
    started = time.monotonic()
    loaded: Model | None = None
    for k, step in enumerate(plan, 1):
        yield from start_line(plan, k, time.monotonic() - started)
        if step.model is not None and step.kind != "claims" and (
                loaded is None or loaded.info.name != step.model):
            loaded = load_model(step.model, device=device)
        yield from _run_step(step, loaded, store, runs_dir, fresh, device)


def _run_step(step: DemoStep, model: Model | None, store: RunStore,
              runs_dir: str | Path | None, fresh: bool, device: str) -> Iterator[str]:
    """Take one step of the plan; yield its outcome."""
    if step.kind == "record":
        assert model is not None
        yield f"record on {step.model}: {demo_recording(model, store, fresh)}"
    elif step.kind == "experiment" and step.skip:
        yield f"{step.label}: skipped ({step.skip})"
    elif step.kind == "experiment":
        exp = get_experiment(step.name)
        try:
            run = run_experiment(exp.name, model, exp.demo, runs_dir=runs_dir,
                                 reuse=not fresh)
        except ModelCapabilityError as exc:
            yield f"{step.label}: skipped ({exc})"
            return
        yield f"{step.label}: {run.status} {run.id}"
    elif step.kind == "training":
        exp = get_experiment(step.name)
        run = run_experiment(exp.name, None, exp.demo, runs_dir=runs_dir, reuse=not fresh)
        yield f"{exp.name}: {run.status} {run.id}"
    elif step.kind == "sweep":
        yield from demo_sweep(store, runs_dir)
    elif step.model is None:
        chosen = claims.load_claims()
        run = claims.reproduce_run(store, chosen, device=device)
        yield f"claims: {run.meta.summary[0]} ({run.id})"
        yield from _undecided(run, chosen)
    else:  # only the claims about the chosen model, checked on it
        chosen = [c for c in claims.load_claims() if step.model in c.models]
        run = claims.reproduce_run(store, chosen, model=step.model, device=device)
        yield f"claims on {step.model}: {run.meta.summary[0]} ({run.id})"
        yield from _undecided(run, chosen)


def _undecided(run: Run, chosen: Sequence[claims.Claim]) -> Iterator[str]:
    """The undecided claims of a claims run, named, each group on a line of its own
    under the counts, and which of them rest on the demo config."""
    for line in claims.undecided_lines(run.table("claims"), chosen):
        yield f"  {line}"


DEMO_SWEEP = """\
name = "formation checkpoints"
experiments = ["previous-token-heads", "induction-heads"]
models = ["{run}/L*:*"]
config = "demo"
steps_every = 100

[by_experiment.induction-heads]
# the random same-layer control needs heads of layer 0 that are neither ablated nor
# tracked: with one of each, two of its four are left
set = {{ n_ablate = 1, n_track = 1 }}
"""
"""The demo's sweep spec, over the checkpoints of formation run ``{run}``."""


def demo_sweep(store: RunStore, runs_dir: str | Path | None) -> Iterator[str]:
    """The demo's sweep: previous-token and induction heads (demo configs) at every 100th
    step of both models of the newest formation run, on a local Ray; reuses done cells."""
    from workbench.harness.sweeps import runner
    from workbench.harness.sweeps.cluster import import_ray
    from workbench.harness.sweeps.spec import expand, parse_text

    formation = store.latest(experiment="induction-formation")
    if formation is None:
        return
    try:
        import_ray()
    except WorkbenchError as exc:
        yield f"formation sweep: skipped ({exc})"
        return
    spec = parse_text(DEMO_SWEEP.format(run=formation.id), name="formation-demo")
    cells = expand(spec, runs_dir)
    run = runner.run_sweep(spec, cells, runs_dir=runs_dir, cpus=1)
    yield f"formation sweep: {run.meta.summary[0]} ({run.id})"
