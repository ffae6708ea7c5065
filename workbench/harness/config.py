"""Experiment configs: frozen dataclasses, overridden from the command line by ``key=value``.

Field types drive the parsing (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``tuple[int, ...]`` written as ``1,2,3``, and ``X | None`` written as ``none``), so a wrong
type or an unknown field is caught before anything runs, with a message that says what
was expected. A field's help text lives in ``field(metadata={"help": ...})``.

Examples:
    >>> @dataclass(frozen=True)
    ... class Config:
    ...     n_prompts: int = 8
    >>> apply_overrides(Config, ["n_prompts=16"])
    Config(n_prompts=16)
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from workbench.core.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class FieldInfo:
    name: str
    type: str
    default: Any
    help: str


def fields(cls: type) -> list[FieldInfo]:
    """The config fields of ``cls`` with readable types, defaults and help."""
    hints = typing.get_type_hints(cls)
    return [
        FieldInfo(f.name, describe_type(hints[f.name]), _default(f), f.metadata.get("help", ""))
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


def parse_value(raw: str, tp: Any, name: str) -> Any:
    """Parse ``raw`` as a value of type ``tp``.

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


def split_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` to ``{"a": "1", "b": "x"}``."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value
    return out


def apply_overrides(cls: type, overrides: Iterable[str] | dict[str, Any] = (),
                    base: Any = None) -> Any:
    """Build a config of type ``cls`` from ``base`` (or its defaults) plus ``overrides``.

    Args:
        cls: a dataclass type.
        overrides: ``["key=value", ...]`` (parsed by field type) or a dict of typed values.
        base: an existing config to start from.

    Raises:
        ConfigError: an unknown field (the message lists the fields) or a wrong type.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    pairs = overrides if isinstance(overrides, dict) else split_overrides(overrides)
    values = {}
    for key, value in pairs.items():
        _check_name(cls, key, names)
        values[key] = parse_value(value, hints[key], key) if isinstance(value, str) else value
    start = base if base is not None else cls()
    try:
        return dataclasses.replace(start, **values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def _check_name(cls: type, key: str, names: list[str]) -> None:
    if key not in names:
        raise ConfigError(
            f"{cls.__module__.split('.')[-1]} has no config field '{key}'; "
            f"fields: {', '.join(names)}"
        )
