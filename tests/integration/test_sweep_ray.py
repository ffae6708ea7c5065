"""Sweeps on a real local Ray with 2 CPUs, over the tiny test models saved as folders: the
same tables as the runs made one by one, a failing cell and a killed worker that leave the
other cells complete, a rerun that resumes, Ctrl-C, a store the workers cannot write, and a
cell skipped at plan time that never runs.

Adds about a minute to the suite (Ray start-up, and each worker importing torch once)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from tests import gated, tiny
from workbench.core.errors import WorkbenchError
from workbench.harness.experiment import run_experiment
from workbench.harness.sweeps import cluster, runner
from workbench.harness.sweeps.spec import expand, parse_spec
from workbench.models.load import load_model
from workbench.store.runs import RunStore

SMALL = {"n_prompts": 3, "n_repeated": 3, "n_tokens": 24, "seq_len": 6, "n_boot": 30}


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def folders(tokenizer, tmp_path_factory):
    """Two tiny Llamas (different weights) saved as local model folders."""
    root = tmp_path_factory.mktemp("sweep-models")
    return [tiny.save_folder(tiny.tiny_llama_hf(len(tokenizer), seed=s), tokenizer,
                             root / f"llama{s}") for s in (0, 1)]


def _spec(models, **more):
    return parse_spec({"experiments": ["previous-token-heads"],
                       "models": [str(m) for m in models], "set": SMALL, **more})


def test_a_sweep_gives_the_tables_of_the_runs_made_one_by_one(ray_local, folders, runs_dir):
    spec = _spec(folders, seeds=[0, 1])
    cells = expand(spec, runs_dir)
    result = runner.run_sweep(spec, cells, runs_dir=runs_dir)
    assert result.experiment == "sweep" and result.status == "complete"
    table = result.table("cells")
    assert table.status.tolist() == ["complete"] * 4
    assert list(result.meta.cells) == table.run_id.tolist()
    assert (result.path / runner.SPEC_FILE).is_file()
    # each worker loads each model it runs once, whatever the number of its cells
    loads = table.groupby(["worker", "model"]).loaded_model.sum()
    assert (loads == 1).all(), loads
    store = RunStore(runs_dir)
    joined = result.table("scores")
    for cell in cells:  # the same run, made here in this process
        by_hand = run_experiment("previous-token-heads", load_model(cell.model.name),
                                 dict(cell.overrides), runs_dir=runs_dir)
        cell_run = store.get(table.run_id[cell.index])
        assert cell_run.status == "complete" and cell_run.config == by_hand.config
        pd.testing.assert_frame_equal(cell_run.table("head_scores"),
                                      by_hand.table("head_scores"), rtol=1e-6)
        mine = joined[joined.cell == cell.index].reset_index(drop=True)
        want = by_hand.table("head_scores")
        pd.testing.assert_series_equal(mine.score, want.score, check_names=False, rtol=1e-6)
        assert (mine.model == cell.model.name).all() and (mine.seed == cell.seed).all()
    path = result.path / "scores.parquet"
    counts = duckdb.sql(f"SELECT seed, count(*) AS n FROM '{path}' GROUP BY seed "
                        "ORDER BY seed").df()
    assert counts.n.tolist() == [len(joined) // 2] * 2


def test_a_failing_cell_leaves_the_others_complete(ray_local, folders, runs_dir):
    # 2 x 300 repeated tokens + BOS do not fit the tiny model's 512 positions: the cell's
    # run starts, then fails inside the experiment
    spec = parse_spec({"experiments": ["previous-token-heads"], "models": [str(folders[0])],
                       "set": SMALL, "seeds": [0, 1],
                       "cells": [{"experiment": "previous-token-heads",
                                  "model": str(folders[1]), "set": {**SMALL, "seq_len": 300}}]})
    result = runner.run_sweep(spec, expand(spec, runs_dir), runs_dir=runs_dir)
    table = result.table("cells").set_index("model")
    failed = table.loc[str(folders[1].resolve())]
    assert failed.status == "failed" and failed.error
    failed_run = RunStore(runs_dir).get(failed.run_id)
    assert failed_run.status == "failed" and failed_run.meta.error in failed.error
    good = table.loc[[str(folders[0].resolve())]]
    assert good.status.tolist() == ["complete", "complete"]
    assert set(result.table("scores").cell) == set(good.cell)


def _kill_held_cell(gate: Path, stop: threading.Event, killed: list[int]) -> None:
    """Kill (SIGKILL) the worker running the held cell once it holds at its gate."""
    while not stop.is_set():
        for marker in gated.held(gate):
            pid = int(marker.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.02)


def test_a_killed_cell_fails_alone_and_a_rerun_resumes(ray_local, folders, runs_dir, tmp_path,
                                                       monkeypatch):
    # one cell held at a shut gate, so that it is certainly running when it is killed
    for name, value in gated.ENV.items():
        monkeypatch.setenv(name, value)
    gate = tmp_path / "gate"
    spec = _spec(folders, seeds=[0, 1], cells=[{
        "experiment": gated.NAME, "model": str(folders[0]), "set": {"gate": str(gate)}}])
    cells = expand(spec, runs_dir)
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_held_cell, args=(gate, stop, killed))
    watcher.start()
    try:
        first = runner.run_sweep(spec, cells, runs_dir=runs_dir)
    finally:
        stop.set()
        watcher.join()
    assert killed
    table = first.table("cells")
    dead = table[table.status == "failed"]
    assert dead.experiment.tolist() == [gated.NAME] and "died" in dead.error.iloc[0]
    assert (table.status == "complete").sum() == len(cells) - 1
    (gate / gated.OPEN).touch()  # the rerun's cell passes its gate
    again = runner.run_sweep(spec, cells, runs_dir=runs_dir).table("cells")
    assert again.status.value_counts().to_dict() == {"reused": len(cells) - 1, "complete": 1}
    assert again.loc[dead.index[0], "status"] == "complete"
    kept = table[table.status == "complete"].run_id
    assert again.run_id[kept.index].tolist() == kept.tolist()  # reused, not redone


def test_ctrl_c_cancels_running_cells_and_marks_them_failed(ray_local, folders, runs_dir,
                                                            tmp_path, monkeypatch, caplog):
    # three cells held at a gate the test never opens: two run (2 slots), one waits, and
    # Ctrl-C lands once both running cells hold, whatever the machine's speed
    for name, value in gated.ENV.items():
        monkeypatch.setenv(name, value)
    gate = tmp_path / "gate"
    spec = parse_spec({"experiments": [gated.NAME], "models": [str(folders[0])],
                       "seeds": [0, 1, 2], "set": {"gate": str(gate)}})
    cells = expand(spec, runs_dir)

    def interrupt(progress: runner.Progress) -> None:
        if progress.running == 2 and len(gated.held(gate)) == 2:
            raise KeyboardInterrupt

    with caplog.at_level("WARNING", logger=runner.__name__), pytest.raises(KeyboardInterrupt):
        runner.run_sweep(spec, cells, runs_dir=runs_dir, on_progress=interrupt)
    store = RunStore(runs_dir)
    (swept,) = store.runs(experiment="sweep")
    assert swept.status == "failed"
    table = swept.table("cells").set_index("seed")
    held = sorted(int(p.name.split("-")[1]) for p in gated.held(gate))
    assert table.status.to_dict() == {s: "cancelled" if s in held else "not run"
                                      for s in (0, 1, 2)}
    for seed in held:  # each cancelled cell's run is stored as failed, never complete
        run = store.get(table.run_id[seed])
        assert run.status == "failed" and run.config["seed"] == seed
    assert table.run_id[({0, 1, 2} - set(held)).pop()] == ""
    # the log says what happened to the running cells, as the table does
    assert "2 cells cancelled, 0 ended on their own first" in caplog.text


def test_a_store_the_workers_cannot_write_fails_at_once(ray_local, tmp_path):
    unwritable = Path("/proc/workbench-sweep-store")  # no process may create files here
    with pytest.raises(WorkbenchError, match=r"a Ray worker on .* cannot write the run store "
                       r"/proc/workbench-sweep-store"):
        cluster.check_workers_can_write(unwritable)
    cluster.check_workers_can_write(tmp_path / "store")  # a writable one passes
    assert not list((tmp_path / "store").iterdir())  # and the probe is gone


def test_the_cli_runs_a_sweep_and_resumes_it(ray_local, folders, runs_dir, capsys, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'experiments = ["previous-token-heads"]\nmodels = ["{folders[0]}"]\n'
                    f"seeds = [0, 1]\n[set]\n" + "".join(f"{k} = {v}\n" for k, v in SMALL.items()))
    status, out, _ = tiny.cli(capsys, "sweep", str(spec), "--out", str(runs_dir))
    assert status == 0 and out[-2] == "2 cells: 2 complete"
    status, out, _ = tiny.cli(capsys, "sweep", str(spec), "--dry-run", "--out", str(runs_dir))
    assert status == 0 and sum("reuse " in line for line in out) == 2
    status, out, _ = tiny.cli(capsys, "sweep", str(spec), "--out", str(runs_dir))
    assert status == 0 and out[-2] == "2 cells: 2 reused"


def test_a_cell_refused_at_plan_time_is_skipped_without_running(ray_local, runs_dir, bert_hf,
                                                               bert_tokenizer, tmp_path):
    encoder = tiny.save_folder(bert_hf, bert_tokenizer, tmp_path / "bert")
    spec = parse_spec({"experiments": ["induction-heads", "previous-token-heads"],
                       "models": [str(encoder)], "set": {"n_boot": 30}})
    cells = expand(spec, runs_dir)
    planned = {c.experiment: c.skip for c in cells}
    assert "is bidirectional" in planned["induction-heads"]
    result = runner.run_sweep(spec, cells, runs_dir=runs_dir)
    table = result.table("cells").set_index("experiment")
    assert table.loc["induction-heads", "status"] == "skipped"
    assert table.loc["induction-heads", "error"] == planned["induction-heads"]
    assert table.loc["induction-heads", "run_id"] == ""
    assert table.loc["previous-token-heads", "status"] == "complete"
    assert not RunStore(runs_dir).runs(experiment="induction-heads")  # never started
