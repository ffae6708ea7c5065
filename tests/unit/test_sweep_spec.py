"""Sweep specs without Ray: the cross product and each cell's config against configs built
by hand, checkpoint globs over a store, every bad input as one line before anything runs,
the cost estimate, and the sweep's tables joined from runs (read back by DuckDB)."""

from __future__ import annotations

import dataclasses
import json
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from experiments.previous_token_heads import Config as PreviousTokenConfig
from tests import tiny
from workbench.core.errors import ModelCapabilityError, UnknownNameError, WorkbenchError
from workbench.harness.config import param
from workbench.harness.experiment import experiment, run_experiment
from workbench.harness.sweeps import runner
from workbench.harness.sweeps.cluster import Outcome
from workbench.harness.sweeps.spec import SpecError, expand, load_spec, parse_spec, parse_text
from workbench.harness.sweeps.tables import CELLS, SCORES
from workbench.models import checkpoints, native
from workbench.store.runs import RunStore
from workbench.store.schema import head_scores, tables

SMALL = {"n_prompts": 2, "n_repeated": 2, "n_tokens": 16, "seq_len": 6, "n_boot": 20}


@dataclasses.dataclass(frozen=True)
class _NoSeed:
    n: int = param(1, "a number", min=1, max=10)


@experiment("test-sweep-no-seed", config=_NoSeed, tables=tables(head_scores("x")))
def _no_seed(model, cfg, ctx=None):  # never run: the spec is refused first
    raise AssertionError


def test_the_cells_are_the_cross_product_with_configs_built_by_hand(llama_folder):
    spec = parse_spec({"experiments": ["previous-token-heads"],
                       "models": [str(llama_folder), "smollm2"], "seeds": [0, 3],
                       "set": {"n_boot": 50}, "grid": {"n_prompts": [4, 8], "seq_len": [5]}})
    cells = expand(spec)
    assert len(cells) == 2 * 2 * 2
    assert [c.index for c in cells] == list(range(8))
    seen = set()
    for cell in cells:
        want = dataclasses.replace(PreviousTokenConfig(), n_boot=50, seq_len=5,
                                   n_prompts=cell.grid["n_prompts"], seed=cell.grid["seed"])
        assert cell.overrides == json.loads(json.dumps(dataclasses.asdict(want)))
        assert cell.seed == cell.grid["seed"] and set(cell.grid) == {"n_prompts", "seq_len",
                                                                     "seed"}
        seen.add((cell.model.name, cell.grid["n_prompts"], cell.seed))
    assert seen == {(m, n, s) for m in (str(llama_folder.resolve()), "smollm2")
                    for n in (4, 8) for s in (0, 3)}
    models = [c.model.name for c in cells]
    assert models == sorted(models)  # grouped by model, for the workers' model caches


def test_demo_base_explicit_cells_and_per_experiment_fields(llama_folder):
    spec = parse_text(f"""
experiments = ["previous-token-heads", "induction-heads"]
models = ["{llama_folder}"]
config = "demo"
[by_experiment.induction-heads]
set = {{ n_random = 2 }}
grid = {{ n_track = [1, 2] }}
[[cells]]
experiment = "head-overview"
model = "{llama_folder}"
set = {{ n_boot = 7 }}
""")
    cells = expand(spec)
    by_exp = {}
    for c in cells:
        by_exp.setdefault(c.experiment, []).append(c)
    assert len(by_exp["previous-token-heads"]) == 1
    assert by_exp["previous-token-heads"][0].overrides["n_prompts"] == 16  # its demo config
    assert sorted(c.overrides["n_track"] for c in by_exp["induction-heads"]) == [1, 2]
    assert {c.overrides["n_random"] for c in by_exp["induction-heads"]} == {2}
    assert [c.overrides["n_boot"] for c in by_exp["head-overview"]] == [7]


@pytest.mark.parametrize(("raw", "error", "text"), [
    ({"experiments": ["induction-head"], "models": ["smollm2"]}, UnknownNameError,
     "did you mean 'induction-heads'"),
    ({"experiments": ["previous-token-heads"], "models": ["smollm"]}, UnknownNameError,
     "unknown model 'smollm' (did you mean 'smollm2'"),
    ({"experiments": ["previous-token-heads"], "models": ["smollm2"], "set": {"n_promts": 2}},
     SpecError, "no config field 'n_promts' (did you mean 'n_prompts'"),
    ({"experiments": ["previous-token-heads"], "models": ["smollm2"], "grid": {"n_prompts": []}},
     SpecError, "'grid.n_prompts': expected at least 1 item(s), got []"),
    ({"experiments": ["previous-token-heads"], "models": ["smollm2"],
      "grid": {"n_prompts": [0]}}, SpecError, "the sweep's cell previous-token-heads on "
     "'smollm2' (n_prompts=0): n_prompts: expected at least 2, got 0"),
    ({"experiments": ["test-sweep-no-seed"], "models": ["smollm2"], "seeds": [1]}, SpecError,
     "experiment 'test-sweep-no-seed' has no seed field"),
    ({}, SpecError, "the sweep has no cells"),
    ({"experiment": ["x"]}, SpecError, "the sweep spec has an unknown field 'experiment' (did "
     "you mean 'experiments'"),
    ({"experiments": ["previous-token-heads"], "cells": [{"experiment": 3}]}, SpecError,
     "the sweep spec 'cells.0.experiment': expected a valid string, got 3"),
    ({"experiments": ["previous-token-heads"], "seeds": [0, "1"]}, SpecError,
     "the sweep spec 'seeds.1': expected a valid integer, got \"1\""),
    ({"experiments": ["previous-token-heads"], "by_experiment": {"x": {"grid": 1}}}, SpecError,
     "the sweep spec 'by_experiment.x.grid': expected an object, got 1"),
])
def test_bad_specs_are_one_line_errors(raw, error, text):
    with pytest.raises(error) as info:
        expand(parse_spec(raw))
    assert text in str(info.value) and "\n" not in str(info.value)


def _fake_checkpoints(store: RunStore, steps: dict[int, list[int]]) -> str:
    """A run folder holding checkpoint.json files (enough to expand globs; no weights)."""
    with store.start("induction-formation", None, {}) as run:
        for n_layers, layer_steps in steps.items():
            spec = native.ModelSpec(n_layers=n_layers, d_model=16, n_heads=2, n_ctx=32,
                                    d_vocab=50)
            for step in layer_steps:
                folder = checkpoints.step_dir(run.dir, n_layers, step)
                folder.mkdir(parents=True)
                meta = checkpoints.CheckpointMeta(
                    format=checkpoints.FORMAT, version=checkpoints.VERSION,
                    model=spec.to_dict(), step=step, tokens=step * 10,
                    tokenizer="../../../tokenizer",
                    sha256={checkpoints.WEIGHTS: f"{step:064x}"})
                (folder / checkpoints.META).write_bytes(meta.to_json())
    return run.id


def test_checkpoint_globs_expand_to_every_matching_checkpoint(runs_dir):
    run_id = _fake_checkpoints(RunStore(runs_dir), {1: [0, 50, 100, 200], 2: [0, 100, 150]})
    spec = parse_spec({"experiments": ["previous-token-heads"], "models": [f"{run_id}/L*:*"],
                       "steps_every": 100})
    got = [(c.model.name, c.model.series, c.model.step, c.model.tokens) for c in expand(spec)]
    assert got == [(f"{run_id}/L{n}:{s}", f"{run_id}/L{n}", s, 10 * s)
                   for n, s in [(1, 0), (1, 100), (1, 200), (2, 0), (2, 100)]]
    only = parse_spec({"experiments": ["previous-token-heads"], "models": [f"{run_id}/L2:1*"]})
    assert [c.model.step for c in expand(only)] == [100, 150]
    nothing = parse_spec({"experiments": ["previous-token-heads"],
                          "models": [f"{run_id}/L3:*"]})
    with pytest.raises(WorkbenchError, match=r"matches no checkpoint of run .*; it has L1 "
                       r"steps 0\.\.200, L2 steps 0\.\.150"):
        expand(nothing)


def test_the_cli_refuses_bad_specs_before_anything_runs(capsys, runs_dir, tmp_path):
    spec = tmp_path / "bad.toml"
    spec.write_text('experiments = ["previous-token-heads"]\nmodels = ["minilmm"]\n')
    status, _, err = tiny.cli(capsys, "sweep", str(spec), "--out", str(runs_dir))
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("error: unknown model 'minilmm' (did you mean 'minilm'?)")
    spec.write_text("experiments = [")
    status, _, err = tiny.cli(capsys, "sweep", str(spec), "--dry-run", "--out", str(runs_dir))
    assert status == 2 and "is not valid TOML" in err
    assert not runs_dir.exists() or not RunStore(runs_dir).runs()


def test_the_estimate_is_the_median_of_earlier_runs(runs_dir, llama_folder, llama):
    store = RunStore(runs_dir)
    spec = parse_spec({"experiments": ["previous-token-heads"], "models": [str(llama_folder)],
                       "set": SMALL, "seeds": [0, 1]})
    cells = expand(spec)
    assert runner.estimate(cells, store).seconds == {0: None, 1: None}
    durations = [3.0, 10.0, 4.0]
    name = str(llama_folder.resolve())
    for seconds in durations:  # three earlier runs of the same experiment and model
        with store.start("previous-token-heads", llama.info.model_copy(update={"name": name}),
                         {"seed": 9}) as active:
            pass
        path = store.get(active.id).path / "run.json"
        meta = json.loads(path.read_text())
        start = datetime(2026, 1, 1, tzinfo=UTC)
        meta["started_at"] = start.isoformat()
        meta["ended_at"] = (start + timedelta(seconds=seconds)).isoformat()
        path.write_text(json.dumps(meta))
    cost = runner.estimate(cells, store)
    assert cost.seconds == {0: statistics.median(durations), 1: statistics.median(durations)}
    assert cost.known == 2 * 4.0 and cost.unknown == 0


def test_the_sweep_tables_join_each_cells_head_scores(runs_dir, llama_folder):
    """The tables a sweep writes, from runs made here (no Ray): every complete cell's
    head_scores with the cell's columns, a failed cell listed but not joined."""
    store = RunStore(runs_dir)
    spec = parse_spec({"experiments": ["previous-token-heads"], "models": [str(llama_folder)],
                       "set": SMALL, "seeds": [0, 1]})
    cells = expand(spec)
    run = run_experiment("previous-token-heads", str(llama_folder), cells[0].overrides,
                         runs_dir=runs_dir)
    # the run answers its cell (same weights and config) and no other
    assert {i: r.id for i, r in runner.reusable(cells, store).items()} == {0: run.id}
    outcomes = {0: Outcome(0, "complete", run.id, seconds=1.5),
                1: Outcome(1, "failed", "", "RuntimeError: boom")}
    table = runner.cells_table(store, cells, outcomes, "2000-01-01T00:00:00")
    CELLS.check(table)
    assert table.status.tolist() == ["complete", "failed"] and table.run_id[0] == run.id
    scores = runner.scores_table(store, cells, table)
    SCORES.check(scores)
    want = run.table("head_scores")
    assert len(scores) == len(want) and set(scores.cell) == {0}
    pd.testing.assert_series_equal(scores.score, want.score, check_names=False)
    assert (scores.seed == 0).all() and (scores.grid == '{"seed": 0}').all()
    path = runs_dir / "scores.parquet"
    scores.to_parquet(path, index=False)
    best = duckdb.sql(f"SELECT metric, max(score) AS best FROM '{path}' "
                      "GROUP BY metric ORDER BY metric").df()
    assert best.set_index("metric").best.to_dict() == pytest.approx(
        want.groupby("metric").score.max().to_dict())
    assert spec.to_dict()["seeds"] == [0, 1]


def test_the_bundled_example_specs_parse():
    from workbench.core.paths import REPO_ROOT

    specs = sorted((REPO_ROOT / "data" / "sweeps").glob("*.toml"))
    assert specs
    for path in specs:
        assert load_spec(path).experiments


def test_the_demo_sweep_takes_every_100th_checkpoint_of_both_models(runs_dir):
    from workbench.harness.demo import DEMO_SWEEP

    steps = list(range(0, 201, 25))
    run_id = _fake_checkpoints(RunStore(runs_dir), {1: steps, 2: steps})
    cells = expand(parse_text(DEMO_SWEEP.format(run=run_id)), runs_dir)
    got = sorted((c.experiment, c.model.series, c.model.step) for c in cells)
    assert got == sorted((e, f"{run_id}/L{n}", s) for e in ("previous-token-heads",
                                                             "induction-heads")
                         for n in (1, 2) for s in (0, 100, 200))
    for cell in cells:  # the experiments' demo configs; one head ablated, one tracked
        assert cell.overrides["n_prompts"] == 16
        if cell.experiment == "induction-heads":
            assert (cell.overrides["n_ablate"], cell.overrides["n_track"]) == (1, 1)


@pytest.fixture(scope="module")
def bert_folder(bert_hf, bert_tokenizer, tmp_path_factory):
    """The tiny BERT (an encoder) saved as a local Hugging Face folder."""
    return tiny.save_folder(bert_hf, bert_tokenizer, tmp_path_factory.mktemp("tiny-bert"))


def test_a_skipped_cell_has_the_reason_its_run_gives(bert_folder, llama_folder, runs_dir):
    spec = parse_spec({"experiments": ["induction-heads", "previous-token-heads"],
                       "models": [str(bert_folder), str(llama_folder)],
                       "set": {"n_boot": 20}})
    cells = {(c.experiment, Path(c.model.name).name): c for c in expand(spec)}
    skipped = cells["induction-heads", bert_folder.name]
    with pytest.raises(ModelCapabilityError) as refused:  # what the run says once loaded
        run_experiment("induction-heads", skipped.model.name, dict(skipped.overrides),
                       runs_dir=runs_dir)
    assert skipped.skip == str(refused.value) and "is bidirectional" in skipped.skip
    assert not RunStore(runs_dir).runs()  # refused before a run exists, as planned
    others = [c for key, c in cells.items() if key != ("induction-heads", bert_folder.name)]
    assert len(others) == 3 and not any(c.skip for c in others)


def test_layers_a_model_lacks_are_refused_at_plan_time(llama_folder):
    ok = {"experiments": ["permutation-equivariance"], "models": [str(llama_folder)]}
    assert [c.overrides["layers"] for c in expand(parse_spec({**ok, "set": {"layers": [1]}}))
            ] == [[1]]
    with pytest.raises(SpecError, match=r"layers: layer 2 is out of range; .* has 2 layers"):
        expand(parse_spec({**ok, "set": {"layers": [2]}}))


def test_the_cell_count_is_known_before_models_are_resolved(monkeypatch):
    from workbench.harness.sweeps import spec as sweep_spec

    def refuse(*args, **kwargs):
        raise AssertionError("a model was resolved before the sweep was counted")

    monkeypatch.setattr(sweep_spec, "resolve_model", refuse)
    spec = parse_spec({"experiments": ["previous-token-heads"], "models": ["minilm"],
                       "grid": {"n_prompts": list(range(2, 102)),
                                "n_boot": list(range(2, 103))}})
    with pytest.raises(SpecError, match=r"^the sweep has 10,100 cells; one sweep runs at most "
                       r"10,000"):
        expand(spec)


def test_a_cell_its_experiments_preflight_refuses_refuses_the_sweep(capsys, runs_dir,
                                                                    tmp_path, llama_folder):
    spec = tmp_path / "circuits.toml"
    spec.write_text('experiments = ["circuit"]\nmodels = ["smollm2"]\n'
                    '[set]\ntask = "retrieval"\n[grid]\ndoc_tokens = [512, 9000]\n')
    with pytest.raises(SpecError) as refused:
        expand(load_spec(spec), runs_dir)
    said = ("the sweep's cell circuit on 'smollm2' (doc_tokens=9000): doc_tokens=9000 is "
            "beyond smollm2's context of 8192 tokens; give at most 8192")
    assert str(refused.value) == said
    for dry in ([], ["--dry-run"]):  # refused before Ray starts or a run exists
        status, _, err = tiny.cli(capsys, "sweep", str(spec), *dry, "--out", str(runs_dir))
        assert (status, err) == (2, f"error: {said}\n")
    assert not runs_dir.exists() or not RunStore(runs_dir).runs()
    missing = parse_spec({"cells": [{"experiment": "circuit", "model": str(llama_folder),
                                     "set": {"classes_from": "20250101-000000-ioi-none-ab12"}}]})
    with pytest.raises(SpecError, match=r"^the sweep's cell \[\[cells\]\] entry 0 \(circuit on "
                       r".*\): .*20250101-000000-ioi-none-ab12"):
        expand(missing, runs_dir)


def test_cells_that_pass_their_experiments_preflight_plan_as_before(runs_dir, tmp_path):
    spec = tmp_path / "circuits.toml"
    spec.write_text('experiments = ["circuit"]\nmodels = ["smollm2", "minilm"]\n'
                    '[set]\ntask = "retrieval"\n[grid]\ndoc_tokens = [512, 8192]\n')
    cells = expand(load_spec(spec), runs_dir)
    got = sorted((c.model.name, c.overrides["doc_tokens"], bool(c.skip)) for c in cells)
    assert got == [("minilm", 512, True), ("minilm", 8192, True),  # an encoder: skipped
                   ("smollm2", 512, False), ("smollm2", 8192, False)]
    assert not runs_dir.exists() or not RunStore(runs_dir).runs()
