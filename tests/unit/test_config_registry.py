"""Configs parse by field type; registries refuse duplicates and list known names."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal

import pytest

from workbench.core.errors import ConfigError, UnknownNameError
from workbench.core.registry import Registry
from workbench.harness.config import SHARED, apply_overrides, fields, shared
from workbench.harness.experiment import all_experiments


@dataclass(frozen=True)
class Cfg:
    n: int = 3
    rate: float = 0.5
    mode: Literal["zero", "mean"] = "zero"
    layers: tuple[int, ...] = (1, 2)
    limit: int | None = None
    flag: bool = False
    name: str = field(default="x", metadata={"help": "a name"})

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")


def test_overrides_parse_by_type():
    cfg = apply_overrides(Cfg, ["n=4", "rate=1e-3", "mode=mean", "layers=3,4,5", "limit=none",
                                "flag=true", "name=hello world"])
    assert cfg == Cfg(4, 1e-3, "mean", (3, 4, 5), None, True, "hello world")
    assert apply_overrides(Cfg, ["limit=9"]).limit == 9
    assert apply_overrides(Cfg, {"n": 5, "mode": "mean"}) == Cfg(n=5, mode="mean")


@pytest.mark.parametrize("override, message", [
    ("nope=1", "no config field 'nope'; fields: n, rate, mode, layers, limit, flag, name"),
    ("n=abc", "n: expected int, got 'abc'"),
    ("mode=median", "mode: expected one of 'zero' | 'mean', got 'median'"),
    ("flag=maybe", "flag: expected a boolean"),
    ("n", "--set expects key=value"),
    ("n=-1", "n must be >= 0"),
    ("limit=x", "limit: expected int | None"),
])
def test_bad_overrides_say_what_was_expected(override, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
        apply_overrides(Cfg, [override])


def test_fields_describe_types_defaults_and_help():
    info = {f.name: f for f in fields(Cfg)}
    assert info["mode"].type == "'zero' | 'mean'"
    assert info["limit"].type == "int | None"
    assert info["layers"].default == (1, 2)
    assert info["name"].help == "a name"


def test_registry_refuses_duplicates_and_lists_known_names():
    reg: Registry[int] = Registry("widget")
    reg.register("b", 2)

    @reg.decorator("a")
    def one() -> int:
        return 1

    assert reg.names() == ["a", "b"] and "a" in reg and len(reg) == 2
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", 3)
    with pytest.raises(UnknownNameError, match="unknown widget 'c'; known widgets: a, b"):
        reg.get("c")


@pytest.mark.parametrize("name, known, hint", [
    ("minilmm", ["minilm", "smollm2"], " (did you mean 'minilm'?)"),
    ("smolm2", ["minilm", "smollm2"], " (did you mean 'smollm2'?)"),
    ("gpt5", ["minilm", "smollm2"], ""),
])
def test_unknown_names_suggest_the_closest_known_ones(name, known, hint):
    from workbench.core.registry import did_you_mean

    assert did_you_mean(name, known) == hint
    registry: Registry[int] = Registry("model")
    for n in known:
        registry.register(n, 0)
    assert registry.unknown_message(name) == (
        f"unknown model '{name}'{hint}; known models: {', '.join(known)}")


# ---- fields several experiments share ----------------------------------------------------

def _shared_fields() -> list[tuple[str, dataclasses.Field, object]]:
    """``(experiment, field, type)`` of every experiment config field named in SHARED."""
    out = []
    for exp in all_experiments():
        hints = typing.get_type_hints(exp.config)
        out += [(exp.name, f, hints[f.name]) for f in dataclasses.fields(exp.config)
                if f.name in SHARED]
    return out


def test_every_experiment_takes_a_shared_field_from_its_one_declaration():
    found = _shared_fields()
    assert {f.name for _, f, _ in found} == {"n_boot", "seed", "max_batch_tokens", "fdr",
                                             "n_null_draws"}
    for name, f, tp in found:
        decl = SHARED[f.name]
        assert tp is decl.type, (name, f.name)
        assert dict(f.metadata) == dict(shared(f.name).metadata), (name, f.name)
    every_field = {f.name for exp in all_experiments() for f in dataclasses.fields(exp.config)}
    assert "batch_tokens" not in every_field  # one name: max_batch_tokens


def test_a_shared_field_is_a_new_field_each_time_with_its_own_default():
    @dataclass(frozen=True)
    class A:
        n_boot: int = shared("n_boot")

    @dataclass(frozen=True)
    class B:
        n_boot: int = shared("n_boot", 200)

    assert (A().n_boot, B().n_boot) == (SHARED["n_boot"].default, 200)
    assert fields(A)[0].range == fields(B)[0].range == "2 .. 10000"


@pytest.mark.parametrize("exp", [e for e in all_experiments()
                                 if "seed" in {f.name for f in dataclasses.fields(e.config)}],
                         ids=lambda e: e.name)
def test_every_seed_is_a_32_bit_unsigned_integer(exp):
    assert apply_overrides(exp.config, {"seed": 2**32 - 1}).seed == 2**32 - 1
    for bad, message in ((2**64, "seed: expected at most 4294967295"),
                         (-1, "seed: expected at least 0")):
        with pytest.raises(ConfigError, match=message):
            apply_overrides(exp.config, {"seed": bad})


@pytest.mark.parametrize("name", [[], {}, None, 3, ["a"]])
def test_a_name_that_is_not_a_string_is_unknown_in_one_line(name):
    """A name read from a file may be any JSON value: a registry answers it as unknown,
    listing what it knows, never with a TypeError."""
    reg: Registry[int] = Registry("widget")
    reg.register("one", 1)
    assert name not in reg
    with pytest.raises(UnknownNameError, match=r"is named by a string, got .*known widgets: one"):
        reg.get(name)


def test_a_renamed_field_reads_under_its_old_name_with_a_warning():
    from experiments.previous_token_heads import Config

    with pytest.warns(DeprecationWarning, match="text is now named prompt_set"):
        cfg = apply_overrides(Config, ["text=natural"])
    assert cfg.prompt_set == "natural"
    assert apply_overrides(Config, {"prompt_set": "natural"}) == cfg


def test_every_experiment_names_its_text_source_prompt_set():
    """One name per idea: a config field that picks prompts from the prompt sets is
    ``prompt_set`` in every experiment, and its default is a prompt set."""
    from workbench.inputs.prompts import prompt_set_names

    known = prompt_set_names()
    for exp in all_experiments():
        names = {f.name for f in dataclasses.fields(exp.config)}
        assert not names & {"text", "text_source", "prompts_set", "source"}, exp.name
        if "prompt_set" in names:
            default = exp.config().prompt_set
            assert default in known or default == "auto", (exp.name, default)
