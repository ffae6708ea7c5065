"""The one rule for a typed value from the command line, Python or JSON, torch-free.

A value is declared by a type (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``tuple[X, ...]``, ``X | None``) and an optional :class:`Range`. :func:`parse_value`
turns command-line text into a value of the type; :func:`check_value` checks any value
(text already parsed, Python, JSON) against the type and the range and refuses, with a
message naming the field and what it expects, a wrong type, a bool where a number is
declared, a NaN or infinity, or a number out of range.

Experiment configs (:mod:`workbench.harness.config`) declare their fields with these
types and ranges; so do the parameters of generated prompt sets, as
``Annotated[int, Range(min=1)]`` in the generator's signature, checked by
:func:`check_keywords`.

Examples:
    >>> check_value(-1, int, "seed", Range(min=0))
    Traceback (most recent call last):
    ...
    workbench.core.errors.ConfigError: seed: expected at least 0, got -1
    >>> parse_value("1,2", tuple[int, ...], "layers")
    (1, 2)
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from workbench.core.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Range:
    """Bounds of a number (of each item, for a tuple): ``min`` and ``max`` inclusive,
    ``above`` exclusive (a learning rate is ``above=0``)."""

    min: float | None = None
    max: float | None = None
    above: float | None = None


SEED = Range(min=0, max=2**32 - 1)
"""The range of a seed: NumPy's legacy seeding (and much code that reseeds from a seed)
takes 32-bit unsigned integers, so a larger seed is refused before it can fail later."""

Bounds = Range | Mapping[str, Any] | None
"""A :class:`Range`, or a mapping with its keys (a dataclass field's metadata)."""


def _bounds(bounds: Bounds) -> dict[str, Any]:
    if bounds is None:
        return {}
    if isinstance(bounds, Range):
        return dataclasses.asdict(bounds)
    return dict(bounds)


def unannotated(tp: Any) -> tuple[Any, Range | None]:
    """``Annotated[X, Range(...)]`` as ``(X, Range(...))``; any other type as ``(tp, None)``."""
    if get_origin(tp) is Annotated:
        found = [m for m in tp.__metadata__ if isinstance(m, Range)]
        return tp.__origin__, found[0] if found else None
    return tp, None


def describe_type(tp: Any) -> str:
    """A readable type: ``int``, ``'zero' | 'mean'``, ``tuple[int, ...]``, ``float | None``."""
    tp, _ = unannotated(tp)
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


def describe_range(bounds: Bounds) -> str:
    """``">= 1"``, ``"<= 0.5"``, ``"0 .. 1"``, ``"> 0"`` or ``""``."""
    b = _bounds(bounds)
    low, high, above = b.get("min"), b.get("max"), b.get("above")
    parts = [f"> {above}"] if above is not None else []
    if low is not None and high is not None:
        return " and ".join([*parts, f"{low} .. {high}"])
    if low is not None:
        parts.append(f">= {low}")
    if high is not None:
        parts.append(f"<= {high}")
    return " and ".join(parts)


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
    tp, _ = unannotated(tp)
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


def check_value(value: Any, tp: Any, name: str, bounds: Bounds = None) -> Any:
    """``value`` as a value of type ``tp`` within ``bounds``, or a :class:`ConfigError`.

    The one rule every value passes, from text, Python or JSON: lists become tuples, ints
    become floats where a float is declared, and nothing else is converted; a bool is not
    an int, a float must be finite, and numbers must lie in the bounds (the ``Range`` of
    an ``Annotated`` type, else ``bounds``).
    """
    tp, declared = unannotated(tp)
    b = _bounds(declared if declared is not None else bounds)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return check_value(value, arg, name, b)
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
        return tuple(check_value(v, args[0], name, b) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected a boolean (true/false), got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected int, got {value!r}")
        return _in_range(value, name, b)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected float, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a finite number, got {value!r}")
        return _in_range(float(value), name, b)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name}: expected str, got {value!r}")
    raise ConfigError(f"{name}: fields of type {describe_type(tp)} are not supported")


def _in_range(value: float, name: str, b: Mapping[str, Any]) -> Any:
    low, high, above = b.get("min"), b.get("max"), b.get("above")
    if above is not None and not value > above:
        raise ConfigError(f"{name}: expected more than {above}, got {value}")
    if low is not None and value < low:
        raise ConfigError(f"{name}: expected at least {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{name}: expected at most {high}, got {value}")
    return value


def keyword_types(fn: Callable[..., Any], skip: int = 0) -> dict[str, Any]:
    """The keyword parameters of ``fn`` after the first ``skip``, by name, with their
    annotated types (``Annotated[X, Range(...)]`` kept)."""
    params = [p for p in list(inspect.signature(fn).parameters.values())[skip:]
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    # Resolve only these annotations: the skipped ones (a generator's ``model: Model``) may
    # name a type imported for type checking only.
    declared = {p.name: p.annotation for p in params if p.annotation is not p.empty}
    hints = typing.get_type_hints(types.SimpleNamespace(__annotations__=declared),
                                  globalns=getattr(fn, "__globals__", {}), include_extras=True)
    return {p.name: hints.get(p.name, Any) for p in params}


def check_keywords(fn: Callable[..., Any], values: Mapping[str, Any], *, what: str,
                   skip: int = 0) -> dict[str, Any]:
    """``values`` checked against the typed keyword parameters of ``fn``.

    Text (from ``--set``) is parsed by the parameter's type; every value then passes
    :func:`check_value`.

    Args:
        fn: a function whose parameters are annotated, e.g. ``seq_len: Annotated[int,
            Range(min=1)] = 32``.
        values: ``{name: value or text}``.
        what: what ``fn`` is, for messages (``"prompt set 'repeated-random'"``).
        skip: leading parameters that are not settable (a generator's ``model``).

    Raises:
        ConfigError: an unknown parameter (the message lists the known ones), or a value
            of the wrong type or out of range (the message names the parameter).
    """
    types_ = keyword_types(fn, skip)
    out = {}
    for key, value in values.items():
        if key not in types_:
            known = ", ".join(types_) or "none"
            raise ConfigError(f"{what} has no parameter '{key}'; parameters: {known}")
        tp = types_[key]
        try:
            raw = parse_value(value, tp, key) if isinstance(value, str) else value
            out[key] = check_value(raw, tp, key)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    return out
