"""``workbench demo``: a recording per bundled model and every experiment's demo run.

Each experiment registers a quick but meaningful configuration (``demo=`` in
:func:`workbench.harness.experiment.experiment`) and the models it suits (``demo_models``); this
runs them all, reusing matching complete runs, then checks every published claim.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from workbench.core import paths
from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.harness import claims
from workbench.harness.experiment import (
    Experiment,
    all_experiments,
    run_experiment,
    verify_stored_files,
)
from workbench.inputs.prompts import load_prompt_set
from workbench.models.base import Model
from workbench.models.load import load_model
from workbench.models.zoo import MODELS
from workbench.recording.record import record
from workbench.store.runs import RunStore


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


def run_demo(models: Sequence[str] | None = None, runs_dir: str | Path | None = None, *,
             fresh: bool = False, device: str = "cpu") -> Iterator[str]:
    """Run the demo; yield one line of news per step (the CLI prints them).

    Args:
        models: limit the demo to these bundled models: their experiments, and the claims
            whose default models include them, checked on them; no training. ``None``:
            the full demo (every bundled model, training, every claim).
        runs_dir: the run store.
        fresh: run again instead of reusing matching complete runs.
        device: torch device the bundled models load on (the training stays on the CPU).

    Returns:
        An iterator of one line per step.
    """
    models, full = demo_models(models)
    store = RunStore(paths.runs_dir(runs_dir))
    experiments = all_experiments()
    for name in models:
        model = load_model(name, device=device)
        yield f"record on {name}: {demo_recording(model, store, fresh)}"
        for exp in experiments:
            if not exp.needs_model or name not in exp.demo_models:
                continue
            try:
                run = run_experiment(exp.name, model, exp.demo, runs_dir=runs_dir,
                                     reuse=not fresh)
            except ModelCapabilityError as exc:
                yield f"{exp.name} on {name}: skipped ({exc})"
                continue
            yield f"{exp.name} on {name}: {run.status} {run.id}"
    if full:
        yield from _model_free_and_claims(experiments, store, runs_dir, fresh, device)
        return
    for name in models:  # only the claims about the chosen models, checked on them
        chosen = [c for c in claims.load_claims() if name in c.models]
        if chosen:
            run = claims.reproduce_run(store, chosen, model=name, device=device)
            yield f"claims on {name}: {run.meta.summary[0]} ({run.id})"


def _model_free_and_claims(experiments: Sequence[Experiment], store: RunStore,
                           runs_dir: str | Path | None, fresh: bool,
                           device: str) -> Iterator[str]:
    """The experiments that train their own models, then every claim."""
    for exp in experiments:
        if not exp.needs_model:
            run = run_experiment(exp.name, None, exp.demo, runs_dir=runs_dir, reuse=not fresh)
            yield f"{exp.name}: {run.status} {run.id}"
    yield from demo_sweep(store, runs_dir)
    all_claims = claims.load_claims()
    if all_claims:
        run = claims.reproduce_run(store, all_claims, device=device)
        yield f"claims: {run.meta.summary[0]} ({run.id})"


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
    from workbench.harness import sweep, sweep_spec
    from workbench.harness.sweep_ray import import_ray

    formation = store.latest(experiment="induction-formation")
    if formation is None:
        return
    try:
        import_ray()
    except WorkbenchError as exc:
        yield f"formation sweep: skipped ({exc})"
        return
    spec = sweep_spec.parse_text(DEMO_SWEEP.format(run=formation.id), name="formation-demo")
    cells = sweep_spec.expand(spec, runs_dir)
    run = sweep.run_sweep(spec, cells, runs_dir=runs_dir, cpus=1)
    yield f"formation sweep: {run.meta.summary[0]} ({run.id})"
