"""The one way a stored file is typed: a pydantic model per file format, read and written
only through it.

Every file the workbench writes and reads back (``run.json``, a recording's
``index.json``, a cached model's ``manifest.json``, a checkpoint's ``checkpoint.json``)
and every file a user writes for it (claims, sweep specs) has exactly one
:class:`Record` subclass that declares its fields, their types and their ranges. Readers
use attributes (``run.meta.model.name``), never string keys, and a file that does not
match its model is refused with one line naming the field (:func:`problem`).

Why pydantic v2 rather than frozen dataclasses with a hand-written validator each: the
declaration *is* the validator (types, ``Literal`` options, ranges, nested records),
errors come with the location of the bad field, and a JSON Schema is generated from the
same declaration (:func:`json_schema`), so other tools can read the store without a
second description of it.

Conventions (:data:`STRICT`): no coercion (``"1"`` is not an int, ``true`` is not a
number, ``1.5`` is not an int), no NaN or infinity, frozen instances. JSON arrays are
declared as ``tuple[...]`` so that a record is immutable all the way down; files are
parsed with :meth:`Record.from_json`, which validates the bytes as JSON (strict JSON
mode takes arrays for tuples).

Examples:
    >>> class Point(Record):
    ...     x: Count
    >>> Point.from_json(b'{"x": -1}', what="point.json")
    Traceback (most recent call last):
    ...
    workbench.core.records.RecordError: point.json 'x': expected at least 0, got -1
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Generic, Self, TypeVar

import pydantic
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
)
from pydantic_core import CoreSchema, core_schema

from workbench.core.errors import WorkbenchError, printable
from workbench.core.registry import did_you_mean

__all__ = [
    "STRICT",
    "Count",
    "Hex64",
    "Json",
    "Matching",
    "PositiveInt",
    "Record",
    "RecordError",
    "RecordList",
    "RelPath",
    "json_schema",
    "problem",
    "schema_text",
]

STRICT = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False,
                    validate_default=False, ser_json_inf_nan="constants")
"""The configuration every stored record shares (see the module docstring)."""

INT_MAX = 2**63 - 1
"""The largest integer any stored count may hold (Parquet's and numpy's int64)."""

Count = Annotated[int, Field(ge=0, le=INT_MAX)]
"""A whole number of things (rows, bytes, tokens, a step)."""
PositiveInt = Annotated[int, Field(ge=1, le=INT_MAX)]


@dataclasses.dataclass(frozen=True)
class Matching:
    """Metadata that makes ``Annotated[str, Matching(regex, meaning)]`` a string type that
    must match ``regex``, refused as "expected ``meaning``"; the JSON Schema keeps the
    pattern and the length bound.

    A metadata object rather than a function returning ``Annotated[...]``, so that a type
    checker sees the alias as the ``str`` it is.
    """

    regex: str
    meaning: str
    max_length: int = 4096

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        compiled = re.compile(self.regex)

        def check(value: str) -> str:
            if not compiled.fullmatch(value):
                raise ValueError(f"expected {self.meaning}")
            return value

        return core_schema.no_info_after_validator_function(
            check, core_schema.str_schema(max_length=self.max_length))

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "pattern": f"^{self.regex}$"}


Hex64 = Annotated[str, Matching(r"[0-9a-f]{64}", "a SHA-256 (64 lower-case hex digits)")]
"""A SHA-256 digest in lower-case hex."""


def _relative(value: str) -> str:
    if not value or "\0" in value or "\\" in value:
        raise ValueError("expected a relative file name")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or value.startswith("~"):
        raise ValueError("expected a path inside its folder (no '/', '..' or '~' at the start)")
    return value


RelPath = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_relative)]
"""A path written in a stored file, relative to the folder that holds the file and staying
inside it by its text alone; whether it still does after symlinks is checked when it is
opened (:func:`workbench.store.validate.confined_file`)."""

Json = pydantic.JsonValue
"""Any JSON value (an experiment's config values, a claim check's parameters)."""


R = TypeVar("R", bound="Record")


class RecordError(WorkbenchError):
    """A stored or user-written file that does not match its record type (one line)."""


class Record(pydantic.BaseModel):
    """A typed stored file, or a typed part of one. Subclasses declare fields only."""

    model_config = STRICT

    @classmethod
    def from_json(cls, data: bytes | str, *, what: str) -> Self:
        """Parse and validate the text of a file.

        Args:
            data: the file's bytes (or text).
            what: the file, for the message (``run.json``, ``<folder>/index.json``).

        Raises:
            RecordError: not JSON, or not of this record's shape, naming the first field
                that fails and what it expects.
        """
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise RecordError(problem(exc, what, cls)) from None
        except RecursionError:
            raise RecordError(f"{what} is nested too deeply to be a {cls.__name__}") from None

    @classmethod
    def from_data(cls, data: Any, *, what: str) -> Self:
        """Validate already-parsed data (a TOML table, a JSON value, a dict from Python).

        Raises:
            RecordError: as :meth:`from_json`.
        """
        # Through JSON, so that lists are arrays (tuples) and nothing is coerced: the same
        # rule as a file read back.
        try:  # NaN and infinities pass here, to be refused with their field's name
            text = json.dumps(data, default=_not_json)
        except (TypeError, ValueError) as exc:
            raise RecordError(f"{what}: {exc}") from None
        except RecursionError:
            raise RecordError(f"{what} is nested too deeply to be a {cls.__name__}") from None
        return cls.from_json(text, what=what)

    def to_json(self) -> bytes:
        """The record as the bytes of its file: indented, sorted keys, a final newline."""
        data = self.model_dump(mode="json", exclude_none=False)
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()

    def to_data(self) -> dict[str, Any]:
        """The record as plain JSON values (lists for tuples)."""
        return self.model_dump(mode="json")

    def replace(self, **changes: Any) -> Self:
        """A copy with ``changes`` (lists for tuples, records or their dicts for records),
        validated like a file read back.

        Raises:
            RecordError: a field the record does not have, or a value of the wrong type.
        """
        return type(self).from_data({**self.to_data(), **changes}, what=type(self).__name__)


def _not_json(value: Any) -> Any:
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{_shown(value)} is not a JSON value (a {type(value).__name__})")


_SIMPLE = {
    "greater_than_equal": "expected at least {ge}",
    "less_than_equal": "expected at most {le}",
    "greater_than": "expected more than {gt}",
    "less_than": "expected less than {lt}",
    "literal_error": "expected {expected}",
    "string_pattern_mismatch": "expected text matching {pattern}",
    "too_short": "expected at least {min_length} item(s)",
    "too_long": "expected at most {max_length} item(s)",
    "string_too_long": "expected at most {max_length} characters",
    "string_too_short": "expected at least {min_length} characters",
}


def _where(loc: tuple[Any, ...]) -> str:
    skipped = ("function-", "tagged-union", "[key]")
    parts = [printable(str(p)) for p in loc
             if not (isinstance(p, str) and p.startswith(skipped))]
    # pydantic names the member a union tried ('int', 'list[str]'); the field is what counts
    keep = [p for p in parts if not re.fullmatch(r"[a-z_]+\[.*\]|int|str|float|bool|none|"
                                                 r"[A-Z]\w*", p)]
    return ".".join(keep or parts)


def _shown(value: Any) -> str:
    """A value as the file would spell it (JSON: ``null``, ``true``, ``"text"``), short."""
    try:
        text = printable(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        text = printable(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_at(root: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the record found by following ``loc`` from ``root`` (``[]`` when
    the path leads to something that is not a record)."""
    tp, parts = root, list(loc)
    while parts:
        tp = _container(tp)
        if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
            field = tp.model_fields.get(str(parts.pop(0)))
            if field is None:
                return []
            tp = field.annotation
        elif typing.get_origin(tp) in (dict, tuple, list):
            parts.pop(0)  # a key or an index
            tp = typing.get_args(tp)[-1 if typing.get_origin(tp) is dict else 0]
        else:
            return []
    tp = _container(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(
        tp, pydantic.BaseModel) else []


def _container(tp: Any) -> Any:
    """``tp`` without ``Annotated`` and ``| None``: the record or container inside it."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            inner = _container(arg)
            if typing.get_origin(inner) in (dict, tuple, list) or (
                    isinstance(inner, type) and issubclass(inner, pydantic.BaseModel)):
                return inner
    return tp


def problem(exc: ValidationError, what: str, root: Any = None) -> str:
    """One line for the first error of a validation: the file, the field, what it expects
    and what it holds (``run.json 'pid': expected at most 2147483647, got 4294967296``)."""
    what = printable(what)
    errors = exc.errors(include_url=False)
    if not errors:
        return f"{what} does not match its format"
    first = errors[0]
    kind, ctx = first.get("type", ""), first.get("ctx") or {}
    if kind == "json_invalid":
        return f"{what} is not valid JSON ({ctx.get('error', first.get('msg'))})"
    where = _where(tuple(first.get("loc", ())))
    field = f" '{where}'" if where else ""
    if kind == "missing":
        return f"{what} has no{field}" if field else f"{what} is missing a field"
    if kind == "extra_forbidden":
        known = _fields_at(root, tuple(first.get("loc", ()))[:-1])
        if not known:
            return f"{what} has an unknown field{field}"
        name = printable(str(first["loc"][-1]))
        return (f"{what} has an unknown field{field}{did_you_mean(name, known)}; "
                f"fields there: {', '.join(known)}")
    if kind == "value_error":  # a record's own check: its message says what it expects
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        value = first.get("input")
        got = "" if not field or isinstance(value, (dict, list)) else f", got {_shown(value)}"
        return f"{what}{field}: {message}{got}"
    template = _SIMPLE.get(kind)
    message = template.format(**ctx) if template else str(first.get("msg", "")).removeprefix(
        "Value error, ").replace("Input should be", "expected")
    return f"{what}{field}: {message}, got {_shown(first.get('input'))}"


class RecordList(Generic[R]):
    """A file whose JSON is a list of records (a claims file), parsed like a record."""

    def __init__(self, item: type[R]) -> None:
        self.item = item
        # a type built from a value, which a checker cannot follow
        self._adapter = pydantic.TypeAdapter(tuple[item, ...])  # pyright: ignore[reportInvalidTypeForm]

    def from_json(self, data: bytes | str, *, what: str) -> tuple[R, ...]:
        """Parse and validate a file's text (see :meth:`Record.from_json`).

        Raises:
            RecordError: naming the item and field that fail.
        """
        try:
            return self._adapter.validate_json(data, strict=True)
        except ValidationError as exc:
            raise RecordError(problem(exc, what, self.item)) from None
        except RecursionError:
            raise RecordError(f"{what} is nested too deeply") from None

    def json_schema(self) -> dict[str, Any]:
        return self._adapter.json_schema(mode="validation")


Schema = type[Record] | RecordList[Any]
"""Anything a JSON Schema is generated from: a record type, or a list of them."""


def json_schema(record: Schema, *, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a file format, as other tools read it."""
    schema = (record.json_schema() if isinstance(record, RecordList)
              else record.model_json_schema(mode="validation"))
    if title:
        schema["title"] = title
    return schema


def schema_text(record: Schema, *, title: str) -> str:
    """The JSON Schema of ``record`` as the text of its ``<title>.schema.json``."""
    return json.dumps(json_schema(record, title=title), indent=2, sort_keys=True) + "\n"


def write_schemas(records: Mapping[str, Schema], folder: str | os.PathLike[str]) -> None:
    """Write ``<name>.schema.json`` for every file format into ``folder``."""
    for name, record in records.items():
        with open(os.path.join(folder, f"{name}.schema.json"), "w", encoding="utf-8") as fh:
            fh.write(schema_text(record, title=name))
