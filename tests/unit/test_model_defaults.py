"""A bundled model's own defaults: under every other config, recorded in the run, the same
in a run, a sweep's cell and a claim's named config; a bad declaration fails at import."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.core.errors import ConfigError, UnknownNameError
from workbench.harness.config import param, shared
from workbench.harness.experiment import experiment, get, run_experiment
from workbench.harness.sweeps.spec import expand, parse_spec
from workbench.models.base import Model
from workbench.store.schema import head_scores, tables


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = param(1, "a number", min=1, max=10)
    m: int = param(2, "another", min=1, max=10)
    seed: int = shared("seed")


@experiment("test-model-defaults", config=_Cfg, tables=tables(head_scores("x")),
            demo={"m": 3}, model_defaults={"smollm2": {"n": 5, "m": 4}})
def _run(model, cfg, ctx=None):
    return _Empty()  # only the config the run records is read


class _Empty:
    def tables(self):
        return {}

    def summary(self):
        return []


def _as(model: Model, name: str) -> Model:
    return Model(model.bridge, model.tokenizer, model.info.model_copy(update={"name": name}))


def _config_of(runs_dir, model, overrides=()):
    """The config a run of the test experiment records."""
    return run_experiment("test-model-defaults", model, overrides, runs_dir=runs_dir).config


def test_a_bundled_models_defaults_sit_under_the_users_overrides(llama, runs_dir):
    as_smollm2 = _as(llama, "smollm2")
    got = _config_of(runs_dir, as_smollm2)
    assert (got["n"], got["m"]) == (5, 4)
    got = _config_of(runs_dir, as_smollm2, ["n=7"])
    assert (got["n"], got["m"]) == (7, 4)
    got = _config_of(runs_dir, as_smollm2, {"m": 9})
    assert (got["n"], got["m"]) == (5, 9)
    # another model keeps the experiment's own defaults
    got = _config_of(runs_dir, llama)
    assert (got["n"], got["m"]) == (1, 2)


def test_named_configs_and_sweep_cells_take_the_same_defaults():
    exp = get("test-model-defaults")
    assert exp.named_config("default", "smollm2") == {"n": 5, "m": 4}
    assert exp.named_config("demo", "smollm2") == {"n": 5, "m": 3}  # the demo's m wins
    assert exp.named_config("demo", "minilm") == exp.named_config("demo") == {"m": 3}
    assert exp.named_config({"base": "demo", "n": 8}, "smollm2") == {"n": 8, "m": 3}
    cells = expand(parse_spec({"experiments": ["test-model-defaults"],
                               "models": ["smollm2", "minilm"], "grid": {"seed": [0, 1]}}))
    by_model = {(c.model.name, c.overrides["n"], c.overrides["m"]) for c in cells}
    assert by_model == {("smollm2", 5, 4), ("minilm", 1, 2)}
    cells = expand(parse_spec({"experiments": ["test-model-defaults"], "models": ["smollm2"],
                               "set": {"n": 2}}))
    assert [(c.overrides["n"], c.overrides["m"]) for c in cells] == [(2, 4)]


def test_a_bad_declaration_fails_when_the_experiment_registers():
    with pytest.raises(UnknownNameError, match="gemma3, minilm, smollm2"):
        experiment("test-model-defaults-bad-model", config=_Cfg, tables={},
                   model_defaults={"gpt-5": {"n": 2}})(_run_elsewhere)
    with pytest.raises(ConfigError, match="n"):
        experiment("test-model-defaults-bad-value", config=_Cfg, tables={},
                   model_defaults={"smollm2": {"n": 11}})(_run_elsewhere)


def _run_elsewhere(model, cfg, ctx=None):
    raise AssertionError


def test_head_pruning_states_gemma3s_own_defaults_in_its_help(tmp_path):
    from workbench.cli.experiments import experiment_help, set_text

    text = " ".join(experiment_help("head-pruning", tmp_path).split())
    own = get("head-pruning").defaults_for("gemma3")
    assert own and "own defaults on gemma3 (" in text
    for key, value in own.items():
        assert f"--set {key}={set_text(value)}" in text


def test_a_run_of_a_models_own_defaults_is_timed_as_its_default(llama, runs_dir):
    from workbench.harness.timing import wall_times
    from workbench.store.runs import RunStore

    as_smollm2 = _as(llama, "smollm2")
    own = run_experiment("test-model-defaults", as_smollm2, runs_dir=runs_dir)
    run_experiment("test-model-defaults", as_smollm2, ["n=1", "m=2"], runs_dir=runs_dir)
    demo = run_experiment("test-model-defaults", as_smollm2, {"m": 3}, runs_dir=runs_dir)
    times = {(t.config, t.model): t.run_id
             for t in wall_times(get("test-model-defaults"), RunStore(runs_dir))}
    # the run with the experiment's global defaults is neither of smollm2's named configs
    assert times == {("default", "smollm2"): own.id, ("demo", "smollm2"): demo.id}
