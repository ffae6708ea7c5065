"""Refusals before a run exists: an experiment's ``plan`` does every model-dependent check
and builds its inputs before the run is created, and the run store is checked before the
model loads. Each refused input exits 2 with one ``error:`` line and leaves no run, from
the command line and from the library alike."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from tests.robustness.test_cli_inputs import check_refused, stored
from tests.tiny import cli
from workbench.core.errors import WorkbenchError
from workbench.harness.experiment import EXPERIMENTS, get, run_experiment


@pytest.fixture(scope="module")
def short_folder(llama_folder, tmp_path_factory):
    """The tiny Llama with a context of 8 tokens: every prompt of a set is longer."""
    folder = tmp_path_factory.mktemp("short") / "llama8"
    shutil.copytree(llama_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8}))
    return folder


NAMES = "an,and,dog,on,sat"
"""Five words that are one token of the tiny tokenizer (it has six: these and ``the``)."""

PLANNED = [
    pytest.param("induction-distance", ["distances=600"], "needs 633 tokens; the model's "
                 "context is 512", id="distance-beyond-the-context"),
    pytest.param("induction-distance", ["max_tokens=65536"], "max_tokens 65536 is beyond",
                 id="max-tokens-beyond-the-context"),
    pytest.param("induction-distance", ["max_tokens=6"], "leaves no distance of at least",
                 id="max-tokens-leaving-no-distance"),
    pytest.param("induction-distance", ["seq_len=300"], "leaves no distance of at least "
                 "seq_len 300", id="seq-len-leaving-no-distance"),
    pytest.param("induction-distance", ["distances=4", "seq_len=8"], "distance 4 is below "
                 "seq_len 8", id="distance-below-seq-len"),
    pytest.param("ioi", ["names="], "IOI needs at least 5 names", id="names-empty"),
    pytest.param("ioi", [f"names={NAMES}", "places=the", "objects=,"],
                 "IOI needs at least 1 objects", id="objects-a-comma"),
    pytest.param("ioi", [f"names={NAMES}", "places= , ", "objects=the"],
                 "IOI needs at least 1 places", id="places-blank"),
    pytest.param("ioi", ["names=zzqx,qqzx"], "IOI needs at least 5 names",
                 id="names-too-few"),
]


@pytest.mark.parametrize(("experiment", "sets", "fragment"), PLANNED)
def test_a_model_dependent_refusal_leaves_no_run(capsys, runs_dir, llama_folder, experiment,
                                                 sets, fragment):
    args = [a for s in sets for a in ("--set", s)]
    result = cli(capsys, "run", experiment, "--model", str(llama_folder), *args)
    check_refused(result, 2, fragment, runs_dir)


@pytest.mark.parametrize(("experiment", "fragment"), [
    ("logit-lens", "has a context of 8"),
    ("induction-distance", "leaves no distance of at least seq_len"),
])
def test_prompts_longer_than_the_context_leave_no_run(capsys, runs_dir, short_folder,
                                                      experiment, fragment):
    result = cli(capsys, "run", experiment, "--model", str(short_folder), "--set",
                 "prompt_set=natural" if experiment == "logit-lens" else "n_prompts=2")
    check_refused(result, 2, fragment, runs_dir)


def test_the_library_refuses_in_the_plan_too(runs_dir, llama):
    with pytest.raises(WorkbenchError, match="max_tokens 65536 is beyond"):
        run_experiment("induction-distance", llama, {"max_tokens": 65536}, runs_dir=runs_dir)
    assert stored(runs_dir) == []


def test_the_plan_builds_what_the_run_uses(runs_dir, llama, monkeypatch):
    """run receives the plan's inputs, built once, before the run exists."""
    exp = get("logit-lens")
    planned = []
    original = exp.plan

    def watched(model, cfg):
        assert stored(runs_dir) == []  # no run yet
        planned.append(original(model, cfg))
        return planned[-1]

    seen = []
    run = exp.run

    def watched_run(model, cfg, ctx=None):
        seen.append(ctx.planned)
        return run(model, cfg, ctx)

    monkeypatch.setitem(EXPERIMENTS._items, "logit-lens",
                        dataclasses.replace(exp, plan=watched, run=watched_run))
    done = run_experiment("logit-lens", llama, {"prompt_set": "natural", "n_prompts": 2,
                                                "n_boot": 10}, runs_dir=runs_dir)
    assert done.status == "complete" and len(planned) == 1 and seen == planned


# ---- the run store, before the model loads -----------------------------------------------------

@pytest.fixture
def no_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the run store was checked")

    monkeypatch.setattr("workbench.harness.experiment.load_model", refuse)


@pytest.mark.usefixtures("no_load")
def test_a_store_that_is_a_file_is_refused_before_the_model_loads(tmp_path):
    store = tmp_path / "store"
    store.write_text("not a folder")
    with pytest.raises(WorkbenchError, match=f"the run store {store} is not a folder"):
        run_experiment("head-overview", "smollm2", runs_dir=store)
    with pytest.raises(WorkbenchError, match=f"{store} is a file"):
        run_experiment("head-overview", "smollm2", runs_dir=store / "inside")


@pytest.mark.usefixtures("no_load")
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_store_is_refused_before_the_model_loads(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    store.chmod(0o500)
    try:
        with pytest.raises(WorkbenchError, match="no permission to write"):
            run_experiment("head-overview", "smollm2", runs_dir=store)
    finally:
        store.chmod(0o700)


@pytest.mark.parametrize(("variable", "command"), [
    ("WORKBENCH_RUNS_DIR", "runs"), ("WORKBENCH_DATA_DIR", "prompts"),
    ("WORKBENCH_CACHE", "models")])
@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_folder_variable_is_refused_not_taken_as_the_default(capsys, monkeypatch,
                                                                      variable, command,
                                                                      value):
    monkeypatch.setenv(variable, value)
    status, out, err = cli(capsys, command)
    assert status == 2 and out == [] and err.count("\n") == 1, err
    assert f"{variable} is set but empty" in err


@pytest.mark.usefixtures("no_load")
def test_an_empty_store_variable_is_refused_by_the_library(monkeypatch):
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", "")
    with pytest.raises(WorkbenchError, match="WORKBENCH_RUNS_DIR is set but empty"):
        run_experiment("head-overview", "smollm2")


def test_a_loaded_model_is_planned_on_as_it_is(llama):
    """plan is a function of the model and config alone: the same inputs twice."""
    exp = get("induction-distance")
    cfg = exp.config(n_prompts=2, seq_len=4, distances=(4, 8))
    first, second = exp.plan(llama, cfg), exp.plan(llama, cfg)
    assert first.distances == second.distances == [4, 8]
    assert first.seqs.random == second.seqs.random
