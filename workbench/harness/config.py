"""Experiment configs: frozen dataclasses, checked in one place whatever the values come from.

A config field declares its type, default, help and range with :func:`param`; the type
drives the checks (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``tuple[X, ...]``, ``X | None``). Values reach a config from the command line as text
(``--set n_prompts=16``, ``--set layers=1,2,3``, ``--set limit=none``), from Python as a
dict of values, or from a claim file as JSON (lists for tuples): :func:`apply_overrides`
takes all three and :func:`check_value` is the one rule for each field, so a wrong type,
a value out of range, a NaN or an unknown field is refused before anything runs, with a
message naming the field and what it expects. Checks that relate several fields stay in
the config's ``__post_init__``.

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
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from workbench.core.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def param(default: Any, help: str, *, min: float | None = None, max: float | None = None
          ) -> Any:
    """A config field: its default, one line of help, and an inclusive range for numbers
    (for a tuple, the range of each item)."""
    metadata = {"help": help, "min": min, "max": max}
    return dataclasses.field(default=default, metadata=metadata)


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


def describe_type(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(describe_type(a) for a in args)
    if origin is tuple:
        return f"tuple[{describe_type(args[0])}, ...]" if args else "tuple"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def describe_range(metadata: Mapping[str, Any]) -> str:
    """``">= 1"``, ``"<= 0.5"``, ``"0 .. 1"`` or ``""``."""
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None and high is not None:
        return f"{low} .. {high}"
    if low is not None:
        return f">= {low}"
    if high is not None:
        return f"<= {high}"
    return ""


def literal_choices(tp: Any) -> list[str]:
    """The options of a ``Literal`` type as strings (for command-line ``choices=``)."""
    if get_origin(tp) is not Literal:
        raise TypeError(f"{tp} is not a Literal type")
    return [str(a) for a in get_args(tp)]


def parse_value(raw: str, tp: Any, name: str) -> Any:
    """Parse command-line text ``raw`` as a value of type ``tp`` (not yet range-checked).

    Raises:
        ConfigError: saying which field expected which type.
    """
    origin, args = get_origin(tp), get_args(tp)
    text = raw.strip()
    if origin in (Union, types.UnionType):
        if type(None) in args and text.lower() in ("none", "null", ""):
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return parse_value(text, arg, name)
            except ConfigError:
                continue
        raise ConfigError(f"{name}: expected {describe_type(tp)}, got {raw!r}")
    if origin is Literal:
        for option in args:
            if str(option) == text:
                return option
        raise ConfigError(f"{name}: expected one of {describe_type(tp)}, got {raw!r}")
    if origin is tuple:
        items = [t for t in text.split(",") if t.strip()] if text else []
        return tuple(parse_value(t, args[0], name) for t in items)
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(f"{name}: expected a boolean (true/false), got {raw!r}")
    if tp in (int, float):
        try:
            return tp(text)
        except ValueError:
            raise ConfigError(f"{name}: expected {tp.__name__}, got {raw!r}") from None
    if tp is str:
        return text
    raise ConfigError(f"{name}: fields of type {describe_type(tp)} cannot be set from text")


def check_value(value: Any, tp: Any, name: str, metadata: Mapping[str, Any] | None = None
                ) -> Any:
    """``value`` as a value of field type ``tp``, or a :class:`ConfigError`.

    The one rule every value passes, from text, Python or JSON: lists become tuples, ints
    become floats where a float is declared, and nothing else is converted; a bool is not
    an int, a float must be finite, and numbers must lie in the field's ``min``/``max``.
    """
    metadata = metadata or {}
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_value(value, arg, name, metadata)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[-1] if len(errors) == 1 else
                          f"{name}: expected {describe_type(tp)}, got {value!r}")
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise ConfigError(f"{name}: expected one of {describe_type(tp)}, got {value!r}")
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list of {describe_type(args[0])}, "
                              f"got {value!r}")
        return tuple(check_value(v, args[0], name, metadata) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected a boolean (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected int, got {value!r}")
        return _in_range(value, name, metadata)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected float, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a finite number, got {value!r}")
        return _in_range(float(value), name, metadata)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected str, got {value!r}")
    raise ConfigError(f"{name}: fields of type {describe_type(tp)} are not supported")


def _in_range(value: float, name: str, metadata: Mapping[str, Any]) -> Any:
    low, high = metadata.get("min"), metadata.get("max")
    if low is not None and value < low:
        raise ConfigError(f"{name}: expected at least {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{name}: expected at most {high}, got {value}")
    return value


def split_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` to ``{"a": "1", "b": "x"}``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
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
    values = {}
    for key, value in pairs.items():
        if key not in by_name:
            raise ConfigError(f"{cls.__module__.split('.')[-1]} has no config field '{key}'; "
                              f"fields: {', '.join(by_name)}")
        tp, meta = hints[key], by_name[key].metadata
        raw = parse_value(value, tp, key) if isinstance(value, str) else value
        values[key] = check_value(raw, tp, key, meta)
    start = base if base is not None else cls()
    try:
        return dataclasses.replace(start, **values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


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
