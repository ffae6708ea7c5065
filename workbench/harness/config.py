"""Experiment configs: frozen dataclasses, checked in one place whatever the values come from.

A config field declares its type, default, help and range with :func:`param`; the type
drives the checks (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``tuple[X, ...]``, ``X | None``). Values reach a config from the command line as text
(``--set n_prompts=16``, ``--set layers=1,2,3``, ``--set limit=none``), from Python as a
dict of values, or from a claim file as JSON (lists for tuples): :func:`apply_overrides`
takes all three and :func:`workbench.core.values.check_value` is the one rule for each
field (the same rule checks the parameters of generated prompt sets), so a wrong type,
a value out of range, a NaN or an unknown field is refused before anything runs, with a
message naming the field and what it expects. A field of layer indices
(``param(..., layer=True)``) is checked against the model by :func:`check_layers` once
the model is known, still before a run exists. Checks that relate several fields stay in
the config's ``__post_init__``. A field that several experiments have (``n_boot``,
``seed``, ``max_batch_tokens``) is declared once, in :data:`SHARED`, and each config takes
it with :func:`shared`, so it has one name, one help line and one range everywhere (and
``workbench sweep``'s ``set`` reaches every experiment that has it).

Examples:
    >>> @dataclass(frozen=True)
    ... class Config:
    ...     n_prompts: int = param(8, "prompts to score", min=1)
    >>> apply_overrides(Config, ["n_prompts=16"])
    Config(n_prompts=16)
    >>> apply_overrides(Config, {"n_prompts": 0})
    Traceback (most recent call last):
    ...
    workbench.core.errors.ConfigError: n_prompts: expected at least 1, got 0
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.core import values as value_rules
from workbench.core.errors import ConfigError
from workbench.core.options import Dtype
from workbench.core.registry import did_you_mean
from workbench.core.values import (
    SEED,
    Range,
    check_declaration,
    check_value,
    describe_type,
    literal_choices,
    parse_value,
    shown,
)

EXTRA_EXPERIMENTS = "WORKBENCH_EXPERIMENTS"
"""The environment variable naming more modules to import for their experiments
(comma-separated, importable module names): experiments kept outside ``experiments/``.
A sweep passes it to its Ray workers, so their cells see the same experiments."""

__all__ = ["SHARED", "FieldInfo", "Shared", "apply_overrides", "check_config",
           "check_declared", "check_layers", "check_value", "current_names", "describe_range",
           "describe_type", "fields", "literal_choices", "param", "parse_value", "shared",
           "split_overrides"]


MAX_LAYER = (1 << 16) - 1
"""The largest layer index any model may have (a model record holds at most 2**16
layers); the loaded model's own count is checked by :func:`check_layers`."""


def param(default: Any, help: str, *, min: float | None = None, max: float | None = None,
          above: float | None = None, layer: bool = False) -> Any:
    """A config field: its default, one line of help, and its range.

    Args:
        default: the default value.
        help: one line for ``workbench experiments``.
        min: inclusive lower bound of a number (for a tuple, of each item).
        max: inclusive upper bound.
        above: exclusive lower bound (a learning rate is ``above=0``).
        layer: the field holds layer indices of the model (an int or a tuple of them),
            checked against the model's layers by :func:`check_layers`; its ``max``
            defaults to the last layer any model may have (:data:`MAX_LAYER`).

    Returns:
        A dataclass field carrying the help and the range in its metadata.
    """
    if layer and max is None:
        max = MAX_LAYER
    metadata = {"help": help, "min": min, "max": max, "above": above, "layer": layer}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Shared:
    """A field several configs (and commands) have: its type, usual default, help and range."""

    type: Any
    default: Any
    help: str
    range: Range | None = None

    def __post_init__(self) -> None:
        check_declaration(self.type, f"shared field ({self.help})", self.range)


SHARED: dict[str, Shared] = {
    # an interval needs at least two resamples to have a spread; the bootstrap holds
    # n_boot x prompts x heads numbers at once, so the cap keeps it in memory
    "n_boot": Shared(int, 1000, "bootstrap resamples of the 95% intervals",
                     Range(min=2, max=10_000)),
    "seed": Shared(int, 0, "seed of everything random in the run", SEED),
    "max_batch_tokens": Shared(int, 2048, "tokens per forward batch", Range(min=1, max=1 << 20)),
    "dtype": Shared(Dtype, "float32", "parameter dtype the model is loaded in"),
    # the head classes (workbench.scores.classes): a rate above one half controls nothing
    # a reader would call a class, and below 1e-4 the draws' floor (1e-6 at the most
    # draws) is too close; the draws cost no forward pass, only a matrix product
    "fdr": Shared(float, 0.05, "false-discovery rate of the head classes (a head is in a "
                  "class when its Benjamini-Hochberg q <= fdr)", Range(min=1e-4, max=0.5)),
    "n_null_draws": Shared(int, 9999, "sign-flip draws of each head's null test (the "
                           "smallest p is 1 / (1 + n_null_draws), which must be below fdr)",
                           Range(min=19, max=1_000_000)),
}
"""The shared fields by name; ``dtype`` is an option of the commands that load a model."""


def shared(name: str, default: Any = dataclasses.MISSING) -> Any:
    """The config field ``name`` of :data:`SHARED`: its help and range, and its default
    unless ``default`` is given. Each call makes a new field (a dataclass owns, and
    changes, the field object it is given).

    Args:
        name: a key of :data:`SHARED`; the config annotates the field with its ``type``.
        default: this config's default, when it differs from the usual one.

    Returns:
        A dataclass field, as :func:`param` makes it.

    Examples:
        >>> @dataclass(frozen=True)
        ... class Config:
        ...     n_boot: int = shared("n_boot", 200)
        >>> apply_overrides(Config, ["n_boot=1"])
        Traceback (most recent call last):
        ...
        workbench.core.errors.ConfigError: n_boot: expected at least 2, got 1

    Raises:
        KeyError: ``name`` is not a shared field (a programming error).
    """
    decl = SHARED[name]
    value = decl.default if default is dataclasses.MISSING else default
    r = decl.range or Range()
    return param(value, decl.help, min=r.min, max=r.max, above=r.above)


@dataclass(frozen=True)
class FieldInfo:
    name: str
    type: str
    default: Any
    help: str
    range: str


def fields(cls: type) -> list[FieldInfo]:
    """The config fields of ``cls`` with readable types, defaults, help and ranges."""
    hints = typing.get_type_hints(cls)
    return [
        FieldInfo(f.name, describe_type(hints[f.name]), _default(f), f.metadata.get("help", ""),
                  describe_range(f.metadata))
        for f in dataclasses.fields(cls)
    ]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def describe_range(metadata: Mapping[str, Any]) -> str:
    """``">= 1"``, ``"<= 0.5"``, ``"0 .. 1"``, ``"> 0"``, ``"a layer of the model"`` or ``""``."""
    if metadata.get("layer"):
        return "a layer of the model (0 .. n_layers - 1)"
    return value_rules.describe_range(metadata)


def check_declared(cls: type) -> None:
    """Raise unless every number field of config ``cls`` declares a finite upper bound
    (``param(..., max=)``); :func:`workbench.harness.experiment.experiment` calls it when
    an experiment registers, so an unbounded field never reaches a user.

    Raises:
        TypeError: naming the config and the field (a programming error).
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        check_declaration(hints[f.name], f"{cls.__module__}.{cls.__qualname__}.{f.name}",
                          f.metadata)


def split_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` to ``{"a": "1", "b": "x"}``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {shown(pair)}")
        out[key.strip()] = value
    return out


def apply_overrides(cls: type, overrides: Iterable[str] | Mapping[str, Any] = (),
                    base: Any = None) -> Any:
    """Build a config of type ``cls`` from ``base`` (or its defaults) plus ``overrides``.

    Args:
        cls: a dataclass type.
        overrides: ``["key=value", ...]`` (text, parsed by field type) or a mapping of
            values (Python or JSON: lists for tuples); either way every value is checked
            by :func:`check_value`.
        base: an existing config to start from.

    Raises:
        ConfigError: an unknown field (the message lists the fields), a wrong type, a value
            out of range, or a failed check across fields.
    """
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    pairs = overrides if isinstance(overrides, Mapping) else split_overrides(overrides)
    pairs = current_names(cls, pairs, warn=True)
    values = {}
    for key, value in pairs.items():
        if key not in by_name:
            raise ConfigError(f"{cls.__module__.split('.')[-1]} has no config field "
                              f"{shown(key)}{did_you_mean(key, by_name)}; fields: "
                              f"{', '.join(by_name)}")
        tp, meta = hints[key], by_name[key].metadata
        raw = parse_value(value, tp, key) if isinstance(value, str) else value
        values[key] = check_value(raw, tp, key, meta)
    start = base if base is not None else cls()
    try:
        return dataclasses.replace(start, **values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def current_names(cls: type, values: Mapping[str, Any], *, warn: bool = False) -> dict[str, Any]:
    """``values`` with each field's old name replaced by its name now, as the config class
    ``cls`` declares them in its ``RENAMED`` (``{old: new}``), so that an old ``--set``, a
    claim file or a stored run's config still reads.

    Args:
        warn: say so with a :class:`DeprecationWarning` (an old name given by a user).
    """
    renamed: Mapping[str, str] = getattr(cls, "RENAMED", {})
    out = {}
    for key, value in values.items():
        new = renamed.get(key)
        if new is not None and warn:
            warnings.warn(f"config field {key} is now named {new}; {key} stops being read "
                          "in a later release", DeprecationWarning, stacklevel=3)
        out[new or key] = value
    return out


def check_config(cfg: Any) -> Any:
    """Check every field of a config built in Python (``Config(...)``) by the same rule.

    Returns:
        ``cfg``, or an equal config with lists turned into tuples.

    Raises:
        ConfigError: the first field that fails.
    """
    hints = typing.get_type_hints(type(cfg))
    values = {f.name: check_value(getattr(cfg, f.name), hints[f.name], f.name, f.metadata)
              for f in dataclasses.fields(cfg)}
    changed = {k: v for k, v in values.items() if v is not getattr(cfg, k)}
    return dataclasses.replace(cfg, **changed) if changed else cfg


def check_layers(cfg: Any, n_layers: int, model: str = "the model") -> None:
    """Raise unless every layer index in ``cfg``'s ``layer=True`` fields is a layer of a
    model with ``n_layers`` layers. Call it once the model is known, before a run exists.

    Raises:
        ConfigError: naming the field, the layer and the model's layers.
    """
    for f in dataclasses.fields(cfg):
        if not f.metadata.get("layer"):
            continue
        value = getattr(cfg, f.name)
        for layer in value if isinstance(value, (tuple, list)) else (value,):
            if layer is not None and not 0 <= layer < n_layers:
                raise ConfigError(f"{f.name}: layer {layer} is out of range; {model} has "
                                  f"{n_layers} layers (0 .. {n_layers - 1})")
