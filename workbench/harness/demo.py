"""``workbench demo``: a recording per bundled model and every experiment's demo run.

Each experiment registers a quick but meaningful configuration (``demo=`` in
:func:`workbench.harness.experiment.experiment`) and the models it suits (``demo_models``); this
runs them all, reusing matching complete runs, then checks every published claim.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from workbench.core import paths
from workbench.core.errors import ModelCapabilityError
from workbench.harness import claims
from workbench.harness.experiment import all_experiments, run_experiment, verify_stored_files
from workbench.inputs.prompts import load_prompt_set
from workbench.models.base import Model
from workbench.models.load import load_model
from workbench.recording.record import record
from workbench.store.runs import RunStore


def demo_recording(model: Model, store: RunStore, fresh: bool) -> str:
    """Record six prompts (natural text, or sentence pairs for encoders) unless done."""
    prompts = load_prompt_set("natural" if model.info.causal else "sentence-pairs")[:6]
    config = {"source": "demo", "n_prompts": len(prompts), "store_dtype": "float16",
              "max_batch_tokens": 2048, "dtype": model.info.dtype}
    found = None if fresh else store.find_matching("record", model.info.to_dict(), config,
                                                   check=verify_stored_files)
    if found is not None:
        return found.id
    with store.start("record", model.info.to_dict(), config) as run:
        record(model, prompts, run.dir / "recording")
        run.set("summary", [f"recorded {len(prompts)} demo prompts"])
    return run.id


def run_demo(models: Sequence[str], runs_dir: str | Path | None = None, *,
             fresh: bool = False) -> Iterator[str]:
    """Run the demo; yield one line of news per step (the CLI prints them)."""
    store = RunStore(paths.runs_dir(runs_dir))
    experiments = all_experiments()
    for name in models:
        model = load_model(name)
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
    for exp in experiments:
        if not exp.needs_model:
            run = run_experiment(exp.name, None, exp.demo, runs_dir=runs_dir, reuse=not fresh)
            yield f"{exp.name}: {run.status} {run.id}"
    all_claims = claims.load_claims()
    if all_claims:
        run = claims.reproduce_run(store, all_claims)
        yield f"claims: {run.meta['summary'][0]} ({run.id})"
