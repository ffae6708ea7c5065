"""Hostile sweep plans at the command line: identical cells, wrong types in ``[[cells]]``,
models that are not models, too many cells, a cluster that does not answer, impossible
``--cpus``/``--gpus``, and SIGTERM in the middle of a sweep.

Every refused plan exits with status 2 and one ``error: ...`` line naming the problem, no
Python traceback, no run in the store, and (for a real run, not ``--dry-run``) no Ray
started. SIGTERM ends a running sweep as Ctrl-C does: status 130, completed cells
recorded as complete, the cancelled ones as cancelled.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests import gated
from tests.robustness.test_cli_inputs import check_refused, stored
from tests.tiny import cli
from workbench.core.paths import REPO_ROOT
from workbench.harness.sweeps import spec as sweep_spec
from workbench.harness.sweeps.spec import MAX_CELLS
from workbench.models import reference
from workbench.store.runs import INCOMPLETE, RunStore

PTH = 'experiments = ["previous-token-heads"]\nmodels = ["minilm"]\n'
"""The start of most specs below: one fast experiment on a bundled model."""


def _cells(*entries: str) -> str:
    return PTH + "".join(f"[[cells]]\n{e}\n" for e in entries)


def _grid_keys(n_keys: int, n_values: int) -> str:
    """A grid of ``n_keys`` fields of previous-token-heads with ``n_values`` values each."""
    fields = ["n_prompts", "n_tokens", "n_repeated", "seq_len", "n_boot", "seed",
              "max_batch_tokens"]
    return PTH + "[grid]\n" + "".join(
        f"{name} = [{', '.join(str(v) for v in range(2, 2 + n_values))}]\n"
        for name in fields[:n_keys])


@pytest.fixture
def models_on_disk(tmp_path: Path, llama_folder: Path) -> dict[str, str]:
    """Paths a spec can name that are no models, and one that is (``folder``)."""
    def folder(name: str) -> Path:
        path = tmp_path / name
        shutil.copytree(llama_folder, path)
        return path

    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"garbage" * 20)
    old = tmp_path / "v9.gguf"
    old.write_bytes(b"GGUF" + struct.pack("<I", 9) + b"\0" * 16)
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    weights = folder("garbage-weights")
    (weights / "model.safetensors").write_bytes(b"garbage" * 20)
    truncated = folder("truncated-weights")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:1000])
    bin_only = folder("bin-garbage")
    (bin_only / "model.safetensors").unlink()
    (bin_only / "pytorch_model.bin").write_bytes(b"not a pickle")
    unknown = folder("unknown-type")
    cfg = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**cfg, "model_type": "foo"}))
    return {"garbage_gguf": str(garbage), "old_gguf": str(old), "text": str(text),
            "empty": str(empty), "weights": str(weights), "truncated": str(truncated),
            "bin": str(bin_only), "unknown": str(unknown), "folder": str(llama_folder)}


def _spec_file(tmp_path: Path, text: str, paths: dict[str, str]) -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(text.replace("{", "{{").replace("}", "}}").replace("<<", "{").replace(
        ">>", "}").format(**paths))
    return spec


def _ray_started() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


REFUSED = [
    # ---- identical cells, and fields given twice
    pytest.param(PTH + "[grid]\nn_tokens = [12, 12]\n",
                 "'grid.n_tokens': expected distinct values; 12 is listed twice", id="grid-twice"),
    pytest.param(PTH + "seeds = [0]\n[grid]\nseed = [1, 2, 3]\n",
                 "sets the field 'seed' twice, in [grid] and in seeds", id="seeds-and-grid-seed"),
    pytest.param(PTH + "seeds = [0]\n[set]\nseed = 4\n",
                 "sets the field 'seed' twice, in [set] and in seeds", id="seeds-and-set-seed"),
    pytest.param(PTH + "seeds = [0, 1, 0]\n", "'seeds': expected distinct values; 0 is listed "
                 "twice", id="seed-twice"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["minilm", "minilm"]\n',
                 "'models': expected distinct values; \"minilm\" is listed twice",
                 id="model-twice"),
    pytest.param('experiments = ["previous-token-heads", "previous-token-heads"]\n'
                 'models = ["minilm"]\n', "'experiments': expected distinct values",
                 id="experiment-twice"),
    pytest.param(PTH + "[set]\nn_boot = 100\n[grid]\nn_boot = [50, 60]\n",
                 "sets the field 'n_boot' twice, in [set] and in [grid]", id="set-and-grid"),
    pytest.param(PTH + "[set]\nn_boot = 100\n[by_experiment.previous-token-heads]\n"
                 "set = { n_boot = 50 }\n", "sets the field 'n_boot' twice, in [set] and in "
                 "[by_experiment.previous-token-heads] set", id="set-and-section-set"),
    pytest.param(PTH + "[grid]\nn_boot = [50, 60]\n[by_experiment.previous-token-heads]\n"
                 "grid = { n_boot = [70] }\n", "sets the field 'n_boot' twice, in [grid] and "
                 "in [by_experiment.previous-token-heads] grid", id="grid-and-section-grid"),
    pytest.param(PTH + "[grid]\nn_prompts = [8, \"8\"]\n", "two cells of the sweep are one run "
                 "(previous-token-heads on minilm, the same config): previous-token-heads on "
                 "'minilm' (n_prompts=8) and previous-token-heads on 'minilm' (n_prompts=\"8\")",
                 id="same-value-spelt-twice"),
    pytest.param(_cells('experiment = "previous-token-heads"\nmodel = "minilm"'),
                 "two cells of the sweep are one run (previous-token-heads on minilm, the same "
                 "config): previous-token-heads on 'minilm' and [[cells]] entry 0",
                 id="explicit-cell-repeats-the-product"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"',
                        'experiment = "head-overview"\nmodel = "minilm"\nset = { seed = 0 }'),
                 "[[cells]] entry 0 (head-overview on 'minilm') and [[cells]] entry 1",
                 id="two-explicit-cells-one-run"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<folder>>", '
                 '"<<folder>>/"]\n', "two cells of the sweep are one run",
                 id="one-folder-spelt-twice"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\nseed = 1\n'
                        'set = { seed = 2 }'),
                 "[[cells]] entry 0 sets the field 'seed' twice", id="cell-seed-twice"),
    # ---- wrong types in [[cells]] and nested set values
    pytest.param(_cells("experiment = 3"), "'cells.0.experiment': expected a valid string, "
                 "got 3", id="cell-experiment-a-number"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = 5'),
                 "'cells.0.model': expected a valid string, got 5", id="cell-model-a-number"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\nseed = -1'),
                 "'cells.0.seed': expected at least 0, got -1", id="cell-seed-negative"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\nseed = "1"'),
                 "'cells.0.seed': expected a valid integer, got \"1\"", id="cell-seed-text"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\nset = [1]'),
                 "'cells.0.set': expected an object, got [1]", id="cell-set-a-list"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        'set = { n_boot = "x" }'),
                 "the sweep's cell [[cells]] entry 0 (head-overview on 'minilm'): n_boot: "
                 "expected int, got 'x'", id="cell-set-text-for-an-int"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = { a = 1 } }"),
                 "n_boot: expected int, got {'a': 1}", id="cell-set-a-table"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = [8, 9] }"),
                 "n_boot: expected int, got [8, 9]", id="cell-set-a-list-for-an-int"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = 8.5 }"),
                 "n_boot: expected int, got 8.5", id="cell-set-a-float"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = true }"),
                 "n_boot: expected int, got True", id="cell-set-a-bool"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = 1979-05-27 }"),
                 "'cells.0.set.n_boot': expected a number, text, true/false or a list or "
                 "table of them, got the TOML date/time 1979-05-27", id="cell-set-a-date"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = 99999999999999999999 }"),
                 "'cells.0.set.n_boot': expected an integer of at most 64 bits",
                 id="cell-set-beyond-64-bits"),
    pytest.param(_cells('experiment = "head-overview"\nmodel = "minilm"\n'
                        "set = { n_boot = nan }"),
                 "n_boot: expected int, got nan", id="cell-set-nan"),
    pytest.param(PTH + "cells = { a = 1 }\n", "'cells': expected a valid array",
                 id="cells-a-table"),
    pytest.param(_cells('experiment = "head-overview"\nmodle = "minilm"'),
                 "unknown field 'cells.0.modle' (did you mean 'model'?)", id="cell-unknown-key"),
    pytest.param(_cells('experiment = "head-overveiw"\nmodel = "minilm"'),
                 "unknown experiment 'head-overveiw'", id="cell-unknown-experiment"),
    pytest.param(_cells('experiment = "induction-formation"\nmodel = "minilm"'),
                 "[[cells]] entry 0 names a model, but 'induction-formation' builds its own",
                 id="cell-model-for-a-trainer"),
    pytest.param(_cells('experiment = "head-overview"'),
                 "[[cells]] entry 0 ('head-overview') needs model = \"NAME\"",
                 id="cell-without-model"),
    pytest.param(PTH + "[by_experiment.previous-token-heads]\nset = { n_boot = \"many\" }\n",
                 "the sweep's cell previous-token-heads on 'minilm': n_boot: expected int, got "
                 "'many'", id="section-set-wrong-type"),
    pytest.param(PTH + "[grid]\nn_boot = [[1, 2]]\n", "n_boot: expected int, got [1, 2]",
                 id="grid-value-a-list"),
    # ---- models that are not models
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<garbage_gguf>>"]\n',
                 "is not a GGUF file (it does not start with the GGUF magic bytes)",
                 id="gguf-garbage"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<old_gguf>>"]\n',
                 "is not a GGUF file this workbench reads (format version 9",
                 id="gguf-unknown-version"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<text>>"]\n',
                 "is neither a Hugging Face model folder (with config.json) nor a .gguf file",
                 id="a-text-file"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<empty>>"]\n',
                 "it is a folder without config.json", id="an-empty-folder"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<weights>>"]\n',
                 "model.safetensors is not a weights file", id="weights-garbage"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<truncated>>"]\n',
                 "model.safetensors is not a weights file", id="weights-truncated"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<bin>>"]\n',
                 "pytorch_model.bin is not a weights file", id="bin-weights-garbage"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["<<unknown>>"]\n',
                 "could not be read as a Hugging Face model config", id="config-unknown-type"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["nobody/no-such-model"]\n',
                 "nor in the local Hugging Face cache, and the hub is unreachable",
                 id="hub-id-offline"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["no-such-run/L1:5"]\n',
                 "no run 'no-such-run'", id="checkpoint-of-no-run"),
    pytest.param('experiments = ["previous-token-heads"]\nmodels = ["smollm3"]\n',
                 "unknown model 'smollm3' (did you mean 'smollm2'?)", id="misspelt-bundled"),
    # ---- too many cells, counted before expanding
    pytest.param(_grid_keys(2, 101), f"the sweep has 10,201 cells; one sweep runs at most "
                 f"{MAX_CELLS:,}", id="just-over-the-bound"),
    pytest.param(_grid_keys(3, 100), "the sweep has 1,000,000 cells", id="a-million-cells"),
    pytest.param(PTH + "[grid]\n" + "".join(f"k{i} = [1, 2]\n" for i in range(60)),
                 "the sweep has more than 1,000,000,000,000,000 cells", id="astronomically-many"),
    pytest.param(PTH + 'seeds = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n[grid]\n'
                 f"n_boot = [{', '.join(str(v) for v in range(2, 1003))}]\n",
                 "the sweep has 10,010 cells", id="seeds-times-grid"),
    # ---- the spec file itself
    pytest.param("experiments = [", "is not valid TOML", id="not-toml"),
    pytest.param("a = " + "[" * 5000 + "]" * 5000, "is nested too deeply", id="nested-deeply"),
]


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize(("text", "fragment"), REFUSED)
def test_a_hostile_plan_is_refused_before_anything_runs(capsys, tmp_path, runs_dir,
                                                       monkeypatch, models_on_disk, text,
                                                       fragment, dry_run):
    monkeypatch.setattr(reference, "hub_reachable", lambda timeout=3.0: False)  # offline
    spec = _spec_file(tmp_path, text, models_on_disk)
    built = []  # a million cells are counted, not expanded: at most a sweep's worth is built
    real = sweep_spec._cell
    monkeypatch.setattr(sweep_spec, "_cell", lambda *a, **k: built.append(1) or real(*a, **k))
    result = cli(capsys, "sweep", str(spec), "--out", str(runs_dir),
                 *(["--dry-run"] if dry_run else []))
    check_refused(result, 2, fragment, runs_dir)
    assert not _ray_started()
    assert len(built) <= MAX_CELLS


def test_a_spec_that_is_not_a_file_is_refused(capsys, tmp_path, runs_dir):
    check_refused(cli(capsys, "sweep", str(tmp_path), "--dry-run", "--out", str(runs_dir)), 2,
                  f"the sweep spec {tmp_path} is not a regular file", runs_dir)
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)  # opening it would block until a writer came
    check_refused(cli(capsys, "sweep", str(fifo), "--out", str(runs_dir)), 2,
                  "is not a regular file", runs_dir)


# ---- the options of a real run ---------------------------------------------------------------

OPTIONS = [
    pytest.param(["--gpus", "nan"], "argument --gpus: expected a number of GPUs per cell, got "
                 "nan", id="gpus-nan"),
    pytest.param(["--gpus", "inf"], "expected a number of GPUs per cell, got inf",
                 id="gpus-inf"),
    pytest.param(["--gpus", "-1"], "expected 0..64 GPUs per cell, got -1", id="gpus-negative"),
    pytest.param(["--gpus", "1e9"], "expected 0..64 GPUs per cell, got 1e+09", id="gpus-huge"),
    pytest.param(["--gpus", "2.5"], "a fraction of one GPU (at least 0.0001) or whole GPUs",
                 id="gpus-fraction-above-one"),
    pytest.param(["--gpus", "0.00001"], "a fraction of one GPU (at least 0.0001)",
                 id="gpus-below-ray-precision"),
    pytest.param(["--gpus", "two"], "expected a number of GPUs per cell, got 'two'",
                 id="gpus-text"),
    pytest.param(["--cpus", "0"], "argument --cpus: expected a whole number of CPUs per cell "
                 "in 1..1024, got 0", id="cpus-zero"),
    pytest.param(["--cpus", "-3"], "in 1..1024, got -3", id="cpus-negative"),
    pytest.param(["--cpus", "1.5"], "in 1..1024, got '1.5'", id="cpus-fraction"),
    pytest.param(["--cpus", "100000"], "in 1..1024, got 100000", id="cpus-huge"),
    pytest.param(["--cpus", "nan"], "in 1..1024, got 'nan'", id="cpus-nan"),
    pytest.param(["--cpus", str((os.cpu_count() or 1) + 1)],
                 f"this machine has {os.cpu_count()} CPUs; a cell asks for "
                 f"{(os.cpu_count() or 1) + 1} (--cpus)", id="cpus-more-than-this-machine"),
    pytest.param(["--address", "127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1 "
                 "(--address): Connection refused", id="address-closed-port"),
    pytest.param(["--address", "ray://127.0.0.1:1"], "cannot reach the Ray cluster at "
                 "127.0.0.1:1 (--address)", id="address-ray-client-closed-port"),
    pytest.param(["--address", "somewhere"], "argument --address: expected auto, "
                 "ray://HOST:PORT or HOST:PORT", id="address-without-port"),
    pytest.param(["--address", "host:99999"], "(a port in 1..65535), got 'host:99999'",
                 id="address-port-out-of-range"),
]


@pytest.mark.parametrize(("args", "fragment"), OPTIONS)
def test_impossible_options_are_refused_before_ray_starts(capsys, tmp_path, runs_dir, args,
                                                         fragment):
    spec = tmp_path / "spec.toml"
    spec.write_text(PTH + "[set]\nn_prompts = 2\n")
    check_refused(cli(capsys, "sweep", str(spec), "--out", str(runs_dir), *args), 2,
                  fragment, runs_dir)
    assert not _ray_started()  # so none of Ray's minutes of retries either


def test_ray_address_from_the_environment_is_checked_too(capsys, tmp_path, runs_dir,
                                                         monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    spec = tmp_path / "spec.toml"
    spec.write_text(PTH)
    check_refused(cli(capsys, "sweep", str(spec), "--out", str(runs_dir)), 2,
                  "cannot reach the Ray cluster at 127.0.0.1:1 (RAY_ADDRESS)", runs_dir)
    assert not _ray_started()


# ---- the dry run shows what the run will skip ------------------------------------------------

def test_the_dry_run_shows_skipped_cells_with_the_runs_reason(capsys, tmp_path, runs_dir):
    spec = tmp_path / "spec.toml"
    spec.write_text('experiments = ["induction-heads", "previous-token-heads"]\n'
                    'models = ["minilm", "smollm2"]\n')
    status, out, err = cli(capsys, "sweep", str(spec), "--dry-run", "--out", str(runs_dir))
    assert status == 0, err
    rows = {(line.split()[1], line.split()[2]): line for line in out[2:6]}
    assert ("skip: experiment 'induction-heads' needs a causal model; minilm is "
            "bidirectional") in rows["induction-heads", "minilm"]
    for key in [("previous-token-heads", "minilm"), ("induction-heads", "smollm2"),
                ("previous-token-heads", "smollm2")]:
        assert " run " in rows[key]
    assert "spec: 4 cells, 0 reused, 1 skipped" in out
    assert stored(runs_dir) == []


# ---- SIGTERM ---------------------------------------------------------------------------------

def _sigterm_spec(folder: Path, path: Path, opened: Path, shut: Path) -> None:
    """Cell 0 passes its open gate at once; cells 1-3 hold at a gate never opened."""
    cells = [f'[[cells]]\nexperiment = "{gated.NAME}"\nmodel = "{folder}"\n'
             f'set = {{ gate = "{gate}", seed = {seed} }}\n'
             for seed, gate in enumerate([opened, shut, shut, shut])]
    path.write_text("\n".join(cells))


def test_sigterm_ends_a_sweep_as_ctrl_c_does(tmp_path, llama_folder):
    """A local Ray started by the CLI itself (whose ``ray.init`` installs its own SIGTERM
    handler); SIGTERM once a cell is complete and another holds, running."""
    pytest.importorskip("ray")
    runs = tmp_path / "runs"
    spec = tmp_path / "spec.toml"
    opened, shut = tmp_path / "opened", tmp_path / "shut"
    opened.mkdir()
    (opened / gated.OPEN).touch()
    _sigterm_spec(llama_folder, spec, opened, shut)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "WORKBENCH_RUNS_DIR": str(runs),
           **gated.ENV}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "--quiet", "sweep", str(spec),
                             "--out", str(runs)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def one_done_one_held() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the sweep ended first: {proc.communicate()[1]}")
            done = [p for p in runs.glob(f"*-{gated.NAME}-*") if p.is_dir()]
            return bool(done) and bool(gated.held(shut))

        gated.wait_until(one_done_one_held)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)  # a bound on a hang, not a speed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    # named SIGTERM also when the signal lands inside a Ray call (which re-raises it as a
    # plain KeyboardInterrupt)
    assert err.strip().splitlines()[-1] == "error: terminated (SIGTERM)", err
    assert "Traceback" not in err
    store = RunStore(runs)
    (swept,) = store.runs(experiment="sweep")
    assert swept.status == "failed"
    table = swept.table("cells").set_index("cell")
    assert set(table.status) <= {"complete", "cancelled", "not run"}, table.status
    assert table.status[0] == "complete"
    held = {int(p.name.split("-")[1]) for p in gated.held(shut)}
    assert held and all(table.status[seed] == "cancelled" for seed in held), table.status
    for row in table.itertuples():
        run = store.get(row.run_id) if row.run_id else None
        if row.status == "complete":  # a cell that completed says so, and its run is whole
            assert run is not None and run.status == "complete"
        elif row.status == "cancelled":  # its run (if it had one) never looks complete
            assert run is None or run.status == "failed"
            assert row.error.startswith("cancelled: the sweep was interrupted"), row.error
        else:
            assert run is None
    left = [p for p in (runs / INCOMPLETE).iterdir()] if (runs / INCOMPLETE).exists() else []
    assert all(RunStore(runs).get(p).status == "failed" for p in left)
