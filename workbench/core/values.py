"""The one rule for a typed value from the command line, Python or JSON, torch-free.

A value is declared by a type (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
``tuple[X, ...]``, ``X | None``) and a :class:`Range`. :func:`parse_value` turns
command-line text into a value of the type; :func:`check_value` checks any value (text
already parsed, Python, JSON) against the type and the range and refuses, with a one-line
message naming the field and what it expects, a wrong type, a bool where a number is
declared, a NaN or infinity, a number out of range, a tuple of more than
:data:`MAX_ITEMS` items or a string of more than :data:`MAX_TEXT` characters.

Numbers from text are plain ASCII decimal syntax (:data:`INT_TEXT`, :data:`FLOAT_TEXT`):
Python's ``int()`` and ``float()`` also take other scripts' digits (``'٣'``, ``'１０'``)
and underscores (``'1_0'``), which no one types on purpose. Every number that can be
declared has a finite upper bound (:func:`check_declaration`, applied where configs,
prompt-set parameters and command-line options are declared), so no value that passes
can ask for more than the declaration allows.

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
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from workbench.core.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

INT_TEXT = re.compile(r"[+-]?[0-9]+")
"""A whole number as text: an optional sign and ASCII digits, nothing else."""
FLOAT_TEXT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                        r"|inf|infinity|nan)", re.IGNORECASE)
"""A number as text: ASCII decimal or scientific notation; ``nan`` and ``inf`` parse so
that :func:`check_value` can refuse them by name."""
MAX_NUMBER_TEXT = 400
"""Longer number text is refused unread (``int()`` of 4,300 digits raises; a bound of
any declared field has far fewer)."""


@dataclass(frozen=True)
class Range:
    """Bounds of a number (of each item, for a tuple): ``min`` and ``max`` inclusive,
    ``above`` exclusive (a learning rate is ``above=0``)."""

    min: float | None = None
    max: float | None = None
    above: float | None = None


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Every int lies in int64 whatever its declaration: torch, NumPy and Parquet hold no more."""
MAX_ITEMS = 1024
"""The most items a tuple value may have (layers, seeds, shifts: a few in practice)."""
MAX_TEXT = 4096
"""The most characters a string value may have (a path, a prompt-set name, a head list)."""

# Upper bounds of declarations that count the same kind of thing, so that a config field
# and the prompt-set parameter it is handed to agree. Each is far above what the papers
# reproduced here use and what a 2-core machine finishes, and low enough that no value
# within it asks for more memory than one forward pass of that size.
MAX_PROMPTS = 4096
"""Prompts, sequences or windows of one kind (the papers use 16 to a few hundred)."""
MAX_SEQUENCE = 1 << 16
"""Tokens of one sequence (above every bundled model's context, which is checked later)."""
MAX_TEXT_TOKENS = 1 << 20
"""Tokens of text streamed or split into windows (a megatoken)."""
MAX_REPEATS = 64
"""Times a random sequence is repeated in one prompt."""
MAX_DRAWS = 1000
"""Random draws, probes or timed repeats of one control."""
MAX_HEADS = 4096
"""Heads picked from a model (more than any bundled model has)."""

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

    Args:
        raw: the text (surrounding whitespace is ignored); numbers in ASCII decimal syntax
            (:data:`INT_TEXT`, :data:`FLOAT_TEXT`), a tuple comma-separated, ``none`` for
            ``None``.
        tp: the declared type.
        name: the field, for messages.

    Returns:
        The value, to be checked by :func:`check_value`.

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
        raise ConfigError(f"{name}: expected {describe_type(tp)}, got {shown(raw)}")
    if origin is Literal:
        for option in args:
            if str(option) == text:
                return option
        raise ConfigError(f"{name}: expected one of {describe_type(tp)}, got {shown(raw)}")
    if origin is tuple:
        items = [t for t in text.split(",") if t.strip()] if text else []
        if len(items) > MAX_ITEMS:
            raise ConfigError(f"{name}: expected at most {MAX_ITEMS} items, got {len(items)}")
        return tuple(parse_value(t, args[0], name) for t in items)
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(f"{name}: expected a boolean (true/false), got {shown(raw)}")
    if tp in (int, float):
        return _number(raw, text, tp, name)
    if tp is str:
        return text
    raise ConfigError(f"{name}: fields of type {describe_type(tp)} cannot be set from text")


def _number(raw: str, text: str, tp: type, name: str) -> int | float:
    """``text`` as an int or float if it is ASCII decimal syntax (see the module
    docstring), else a :class:`ConfigError` quoting ``raw``."""
    syntax = INT_TEXT if tp is int else FLOAT_TEXT
    if len(text) > MAX_NUMBER_TEXT or not syntax.fullmatch(text):
        raise ConfigError(f"{name}: expected {tp.__name__}, got {shown(raw)}")
    return tp(text)


def check_value(value: Any, tp: Any, name: str, bounds: Bounds = None) -> Any:
    """``value`` as a value of type ``tp`` within ``bounds``, or a :class:`ConfigError`.

    The one rule every value passes, from text, Python or JSON: lists become tuples, ints
    become floats where a float is declared, and nothing else is converted; a bool is not
    an int, a float must be finite, numbers must lie in the bounds (the ``Range`` of an
    ``Annotated`` type, else ``bounds``) and an int in int64, a tuple holds at most
    :data:`MAX_ITEMS` items and a string at most :data:`MAX_TEXT` characters.

    Returns:
        The value, with lists as tuples and ints as floats where a float is declared.

    Raises:
        ConfigError: one line naming the field, what it expects and (shortened) what it got.
    """
    tp, declared = unannotated(tp)
    b = _bounds(declared if declared is not None else bounds)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return _check_union(value, tp, name, b)
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise ConfigError(f"{name}: expected one of {describe_type(tp)}, got {shown(value)}")
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list of {describe_type(args[0])}, "
                              f"got {shown(value)}")
        if len(value) > MAX_ITEMS:
            raise ConfigError(f"{name}: expected at most {MAX_ITEMS} items, got {len(value)}")
        return tuple(check_value(v, args[0], name, b) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected a boolean (true/false), got {shown(value)}")
    if tp in (int, float):
        return _check_number(value, tp, name, b)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected str, got {shown(value)}")
        if len(value) > MAX_TEXT:
            raise ConfigError(f"{name}: expected at most {MAX_TEXT} characters, got "
                              f"{len(value)}")
        return value
    raise ConfigError(f"{name}: fields of type {describe_type(tp)} are not supported")


def _check_union(value: Any, tp: Any, name: str, b: Mapping[str, Any]) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return check_value(value, arg, name, b)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[-1] if len(errors) == 1 else
                      f"{name}: expected {describe_type(tp)}, got {shown(value)}")


def _check_number(value: Any, tp: type, name: str, b: Mapping[str, Any]) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float) if tp is float else int):
        raise ConfigError(f"{name}: expected {tp.__name__}, got {shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: expected a finite number, got {shown(value)}")
    in_int64 = not isinstance(value, int) or INT64_MIN <= value <= INT64_MAX
    if tp is float and in_int64:
        value = float(value)
    _in_range(value, name, b)  # exact for an int of any size
    if not in_int64:  # beyond every declared bound; as a float it may not even convert
        raise ConfigError(f"{name}: expected a 64-bit integer, got {shown(value)}")
    return value


def _in_range(value: float, name: str, b: Mapping[str, Any]) -> None:
    low, high, above = b.get("min"), b.get("max"), b.get("above")
    if above is not None and not value > above:
        raise ConfigError(f"{name}: expected more than {above}, got {shown(value)}")
    if low is not None and value < low:
        raise ConfigError(f"{name}: expected at least {low}, got {shown(value)}")
    if high is not None and value > high:
        raise ConfigError(f"{name}: expected at most {high}, got {shown(value)}")


def shown(value: Any, limit: int = 60) -> str:
    """``value`` for a one-line message: its ``repr`` (which escapes newlines and control
    characters), shortened to about ``limit`` characters, with the full length said.

    Examples:
        >>> shown("a\\nb")
        "'a\\\\nb'"
        >>> shown("x" * 100, limit=20)
        "'xxxxxxxxxxxxxxx'... (100 characters)"
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"  # str() of 4,300 digits raises
    if isinstance(value, str) and len(value) > limit:
        return f"{value[: limit - 5]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_declaration(tp: Any, name: str, bounds: Bounds = None) -> None:
    """Raise unless every number ``tp`` can hold has a finite upper bound: an ``int`` or
    ``float`` (alone, in a tuple or optional) needs a finite ``max`` in its ``Range``.

    Called where values are declared (config fields, prompt-set parameters, command-line
    options), so a declaration without a bound fails when it is made, not when a huge
    value reaches it.

    Raises:
        TypeError: naming the declaration (a programming error, not bad input).
    """
    inner, declared = unannotated(tp)
    b = _bounds(declared if declared is not None else bounds)
    if not _holds_numbers(inner):
        return
    high = b.get("max")
    if high is None or isinstance(high, bool) or not math.isfinite(high):
        raise TypeError(f"{name}: a number of type {describe_type(inner)} needs a finite "
                        "upper bound (max=)")


def _holds_numbers(tp: Any) -> bool:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType, tuple):
        return any(_holds_numbers(unannotated(a)[0]) for a in args if a is not Ellipsis)
    return tp in (int, float)


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
            raise ConfigError(f"{what} has no parameter {shown(key)}; parameters: {known}")
        tp = types_[key]
        try:
            raw = parse_value(value, tp, key) if isinstance(value, str) else value
            out[key] = check_value(raw, tp, key)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    return out
