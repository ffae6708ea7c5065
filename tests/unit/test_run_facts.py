"""What tells runs apart: the config values changed from the defaults, the sweep a run was
a cell of (named after its spec), its duration and the machine's load; ``workbench runs``
shows them all."""

from __future__ import annotations

from experiments.previous_token_heads import Config
from tests.tiny import cli
from workbench.harness import run_facts
from workbench.harness.experiment import run_experiment
from workbench.harness.sweeps import runner
from workbench.harness.sweeps.spec import expand, parse_spec
from workbench.store.runs import RunStore

SMALL = {"n_prompts": 2, "n_repeated": 2, "n_tokens": 16, "seq_len": 6, "n_boot": 20}


def test_varies_lists_only_the_values_off_the_defaults(runs_dir):
    store = RunStore(runs_dir)
    default = Config()
    with store.start("previous-token-heads", None, default) as plain:
        pass
    with store.start("previous-token-heads", None, Config(n_boot=50, seed=3)) as changed:
        pass
    with store.start("record", None, {"source": "text"}) as recording:
        pass
    assert run_facts.varies(store.get(plain.id)) == {}
    order = [f for f in Config.__dataclass_fields__ if f in ("n_boot", "seed")]
    values = {"n_boot": "n_boot=50", "seed": "seed=3"}  # in the config's order
    assert run_facts.varies_text(store.get(changed.id)) == ", ".join(values[f] for f in order)
    assert default.n_boot != 50 and default.seed != 3  # so both really differ
    assert run_facts.varies_text(store.get(recording.id)) == "-"  # no defaults to differ from


def test_durations_read_as_the_cli_prints_them():
    assert [run_facts.duration_text(s) for s in (None, 0.4, 42, 185)] == [
        "-", "under 1 s", "42 s", "3 min 05 s"]


def test_a_sweep_is_named_after_its_spec_and_its_cells_name_it(capsys, runs_dir,
                                                                llama_folder):
    spec = parse_spec({"name": "seeds of heads", "experiments": ["previous-token-heads"],
                       "models": [str(llama_folder)], "set": SMALL, "seeds": [0, 1]})
    cells = expand(spec)
    runs = [run_experiment("previous-token-heads", str(llama_folder), c.overrides,
                           runs_dir=runs_dir) for c in cells]
    swept = runner.run_sweep(spec, cells, runs_dir=runs_dir)  # every cell reused: no Ray
    assert "-sweep-seeds-of-heads-" in swept.id and "none" not in swept.id
    found = run_facts.parents(RunStore(runs_dir).runs())
    assert {run.id: found[run.id].id for run in runs} == {run.id: swept.id for run in runs}

    status, out, _ = cli(capsys, "runs")
    assert status == 0
    header = out[0].split()
    assert header == ["run", "experiment", "model", "status", "started", "duration", "load",
                      "varies", "sweep"]
    rows = {line.split()[0]: line for line in out[2:] if line[:1].isdigit()}
    assert Config().seed == 0  # so only the second cell's seed is off the default
    for run, seed in zip(runs, ("", "seed=1"), strict=True):
        line = rows[run.id]
        assert "n_boot=20" in line and "seq_len=6" in line and "seed=0" not in line
        assert seed in line
        assert f"seeds of heads ({swept.id[-4:]})" in line
    assert "seeds of heads" in rows[swept.id]  # the sweep's model column names its spec
