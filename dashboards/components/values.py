"""What a callback accepts from the client: each parameter's type, declared in its signature.

Anyone who can reach the dashboard's port can post any JSON to any callback, so every value
a callback receives is checked before its body runs. A callback annotates each parameter
with one of the types below (``Annotated`` aliases: a type checker sees the plain type);
:func:`~dashboards.components.messages.safe`, the decorator that already turns a failure
to read a run into a message, checks each value against its parameter's declaration and
answers one that does not fit with a one-line message in the page, such as
``layer: expected a whole number 0..2147483647, got 1.5``. A callback with a parameter
that declares none fails at import. Checks that need the data (a layer beyond the model's
layers, a metric the run does not have) use :func:`below` and :func:`among`, which answer
in the same words.

What a browser sends decides what is accepted. A control not yet set sends ``null``
(``None``: it passes, and the callback decides). JavaScript writes a whole number as a
JSON integer (10.0 is sent as ``10``) and a number input that fails its own min, max or
step sends ``null``, so a float is never a whole number here; a bool is never a number;
NaN and the infinities are never numbers; text is bounded and has no control characters;
Plotly's click and zoom events are objects of a known shape.

Examples:
    >>> @callback(Output("x-graph", "figure"), Input("x-run", "value"),
    ...           Input("x-layer", "value"))                          # doctest: +SKIP
    ... @safe
    ... def draw(run_id: RunId, layer: Layer):
    ...     rec = data.recording(run_id)
    ...     below("layer", layer, rec.n_layers, "layers in the recording")
"""

from __future__ import annotations

import inspect
import json
import math
import re
import typing
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import dash

from workbench.core.errors import WorkbenchError
from workbench.views.style import COLOUR_SCALES, ColourScale

MAX_INDEX = 2**31 - 1
"""The largest index any control takes: far beyond any layer, head, prompt or position,
and small enough that comparing it with a table's int64 column cannot overflow."""
MAX_CHARS = 200
"""The longest text a control sends (run ids, metric and model names)."""
MAX_COORDINATE = 1e9
"""The largest coordinate of a click or a zoom on a figure (token positions, cells)."""
SHOWN_CHARS = 60


class Refused(WorkbenchError):
    """A value from the client that its callback does not accept; the message is one line."""


class _Misfit(Exception):
    """A value that does not fit a spec (said as the spec's ``expects``)."""


def shown(value: Any) -> str:
    """``value`` as the client sent it (JSON), on one line, without markup, shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    # json.dumps escapes control characters; angle brackets would be markup in a figure
    text = text.replace("<", "\\u003c").replace(">", "\\u003e")
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Spec:
    """How one parameter's value is checked and read.

    Args:
        optional: ``None`` (a control not yet set) passes as ``None``.
    """

    optional: bool = field(default=True, kw_only=True)

    @property
    def expects(self) -> str:
        """What the spec accepts, as the message says it."""
        raise NotImplementedError

    def parse(self, value: Any) -> Any:
        """The value as the callback receives it.

        Raises:
            _Misfit: ``value`` does not fit.
        """
        raise NotImplementedError

    def check(self, label: str, value: Any) -> Any:
        """:meth:`parse`, with a misfit refused.

        Args:
            label: the value's name in the message.
            value: the value the client sent.

        Raises:
            Refused: ``value`` does not fit, said in one line.
        """
        if value is None and self.optional:
            return None
        try:
            return self.parse(value)
        except _Misfit:
            raise Refused(f"{label}: expected {self.expects}, got {shown(value)}") from None


@dataclass(frozen=True)
class Whole(Spec):
    """A whole number from ``low`` to ``high`` (never a bool or a float)."""

    low: int = 0
    high: int = MAX_INDEX

    @property
    def expects(self) -> str:
        return f"a whole number {self.low}..{self.high}"

    def parse(self, value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Misfit
        if not self.low <= value <= self.high:
            raise _Misfit
        return value


@dataclass(frozen=True)
class Real(Spec):
    """A finite number from ``low`` to ``high`` (a whole number too: JavaScript sends 1.0
    as ``1``), read as a float."""

    low: float
    high: float

    @property
    def expects(self) -> str:
        return f"a number from {self.low:g} to {self.high:g}"

    def parse(self, value: Any) -> float:
        if not _is_number(value) or not math.isfinite(value):
            raise _Misfit
        if not self.low <= value <= self.high:
            raise _Misfit
        return float(value)


NOT_IN_A_LINE = {"Cc", "Zl", "Zp"}
"""Unicode categories a line of text has none of: controls, line and paragraph separators."""


def _is_line(value: Any, max_chars: int) -> bool:
    return (isinstance(value, str) and len(value) <= max_chars
            and not any(unicodedata.category(c) in NOT_IN_A_LINE for c in value))


@dataclass(frozen=True)
class Text(Spec):
    """One line of text of at most ``max_chars`` characters, without control characters."""

    max_chars: int = MAX_CHARS

    @property
    def expects(self) -> str:
        return f"text of at most {self.max_chars} characters on one line"

    def parse(self, value: Any) -> str:
        if not _is_line(value, self.max_chars):
            raise _Misfit
        return value


@dataclass(frozen=True)
class RunText(Text):
    """A run's id as a run dropdown sends it: one line of text, like :class:`Text`. A
    callback with exactly one such parameter draws that run, so :func:`~.messages.safe`
    adds the run's interventions to the title of every figure it returns."""


@dataclass(frozen=True)
class Passage(Spec):
    """Text of at most ``max_chars`` characters over any number of lines (typed or pasted
    into a text area): line breaks and tabs, but no other control characters."""

    max_chars: int = MAX_CHARS

    @property
    def expects(self) -> str:
        return f"text of at most {self.max_chars} characters"

    def parse(self, value: Any) -> str:
        if not isinstance(value, str) or len(value) > self.max_chars or any(
                c not in "\n\r\t" and unicodedata.category(c) in NOT_IN_A_LINE
                for c in value):
            raise _Misfit
        return value


@dataclass(frozen=True)
class OneOf(Spec):
    """One of the strings ``choices``."""

    choices: tuple[str, ...]

    @property
    def expects(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)

    def parse(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise _Misfit
        return value


@dataclass(frozen=True)
class ListOf(Spec):
    """A list of at most ``max_items`` values, each fitting ``item``."""

    item: Spec
    max_items: int

    @property
    def expects(self) -> str:
        return f"a list of at most {self.max_items} of: {self.item.expects}"

    def parse(self, value: Any) -> list:
        if not isinstance(value, list) or len(value) > self.max_items:
            raise _Misfit
        try:
            return [self.item.check("item", v) for v in value]
        except Refused:
            raise _Misfit from None


@dataclass(frozen=True)
class Fields(Spec):
    """An object with the keys of ``fields``, each value fitting its spec.

    Args:
        fields: ``(key, spec)`` pairs; a missing key reads as ``None``.
        extra: other keys are allowed (and dropped), as in objects Dash itself makes.
    """

    fields: tuple[tuple[str, Spec], ...]
    extra: bool = False

    @property
    def expects(self) -> str:
        inner = ", ".join(f"{key}: {spec.expects}" for key, spec in self.fields)
        return f"an object {{{inner}}}"

    def parse(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _Misfit
        if not self.extra and not set(value) <= {key for key, _ in self.fields}:
            raise _Misfit
        try:
            return {key: spec.check(key, value.get(key)) for key, spec in self.fields}
        except Refused:
            raise _Misfit from None


@dataclass(frozen=True)
class Records(Spec):
    """A table's rows as the client holds them: a list of objects. Only the cells a
    callback reads are checked, when it reads them (:func:`check`)."""

    max_rows: int = 100_000

    @property
    def expects(self) -> str:
        return f"a list of at most {self.max_rows} row objects"

    def parse(self, value: Any) -> list[dict]:
        if not isinstance(value, list) or len(value) > self.max_rows:
            raise _Misfit
        if not all(isinstance(row, dict) for row in value):
            raise _Misfit
        return value


@dataclass(frozen=True)
class Click(Spec):
    """Plotly's ``clickData`` (``{"points": [{"x": ..., "y": ..., ...}, ...]}``), read
    from its first point by ``read``.

    Args:
        read: the point's meaning from the point (raises ``ValueError`` if it has none).
        what: what a click gives, for the message.
    """

    read: Callable[[dict], Any]
    what: str

    @property
    def expects(self) -> str:
        return self.what

    def parse(self, value: Any) -> Any:
        points = value.get("points") if isinstance(value, dict) else None
        if not isinstance(points, list) or not points or not isinstance(points[0], dict):
            raise _Misfit
        try:
            return self.read(points[0])
        except ValueError:
            raise _Misfit from None


def coordinate(value: Any) -> float:
    """A finite coordinate of a figure, at most :data:`MAX_COORDINATE` from 0.

    Raises:
        ValueError: anything else.
    """
    if not _is_number(value) or not math.isfinite(value) or abs(value) > MAX_COORDINATE:
        raise ValueError(value)
    return float(value)


def cell_of(point: dict) -> tuple[int, int]:
    """The ``(layer, head)`` of a click on a layer x head grid: heads across (``x``),
    layers down (``y``), in units of cells.

    Raises:
        ValueError: a coordinate that is not a number inside the grid's quadrant.
    """
    x, y = coordinate(point.get("x")), coordinate(point.get("y"))
    if x < 0 or y < 0:
        raise ValueError((x, y))
    return math.floor(y), math.floor(x)


ZOOM_KEYS = ("xaxis.range[0]", "xaxis.range[1]", "yaxis.range[0]", "yaxis.range[1]")
"""The keys of a box drawn on a figure (Plotly's zoom) in its ``relayoutData``."""


@dataclass(frozen=True)
class Zoom(Spec):
    """Plotly's ``relayoutData``: the box of a zoom, ``(x0, x1, y0, y1)``, or ``None``
    for any other change of the layout (an autosize, a reset, a pan without ranges)."""

    @property
    def expects(self) -> str:
        return "an object of layout changes whose axis ranges are numbers"

    def parse(self, value: Any) -> tuple[float, float, float, float] | None:
        if not isinstance(value, dict):
            raise _Misfit
        if not all(k in value for k in ZOOM_KEYS):
            return None
        try:
            x0, x1, y0, y1 = (coordinate(value[k]) for k in ZOOM_KEYS)
        except ValueError:
            raise _Misfit from None
        return x0, x1, y0, y1


_HEAD_LABEL = re.compile(r"L(\d{1,9})H(\d{1,9})")


@dataclass(frozen=True)
class HeadName(Spec):
    """A head named as the pages name it, ``L<layer>H<head>``, read as ``(layer, head)``."""

    @property
    def expects(self) -> str:
        return "a head such as 'L0H1'"

    def parse(self, value: Any) -> tuple[int, int]:
        match = _HEAD_LABEL.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise _Misfit
        return int(match[1]), int(match[2])


@dataclass(frozen=True)
class JsonPair(Spec):
    """Two strings sent as one JSON text ``["a", "b"]`` (a dropdown value that names two
    things), read as a pair."""

    max_chars: int = 2 * MAX_CHARS + 10

    @property
    def expects(self) -> str:
        return "a JSON pair of texts such as '[\"run\", \"table\"]'"

    def parse(self, value: Any) -> tuple[str, str]:
        if not _is_line(value, self.max_chars):
            raise _Misfit
        try:
            pair = json.loads(value)
        except ValueError:
            raise _Misfit from None
        if not (isinstance(pair, list) and len(pair) == 2
                and all(_is_line(p, MAX_CHARS) for p in pair)):
            raise _Misfit
        return pair[0], pair[1]


# ---- the types callbacks declare ---------------------------------------------------------

RunId = Annotated[str | None, RunText()]
"""A run dropdown's value (the store decides whether it names a run)."""
Index = Annotated[int | None, Whole()]
"""A prompt, a position, a seed, a checkpoint: a whole number from 0."""
Layer = Annotated[int | None, Whole()]
Head = Annotated[int | None, Whole()]
Name = Annotated[str | None, Text()]
"""A metric, a model, a condition, an input: the run's data decides which exist."""
Clicks = Annotated[int | None, Whole()]
"""A button's ``n_clicks``."""
ClickedHead = Annotated[tuple[int, int] | None,
                        Click(cell_of, "a click on a cell of a layer x head grid")]
"""A click on a layer x head heatmap, read as ``(layer, head)``."""
NamedHead = Annotated[tuple[int, int] | None, HeadName()]
"""A head dropdown's ``L<layer>H<head>``, read as ``(layer, head)``."""
Scale = Annotated[ColourScale | None, OneOf(COLOUR_SCALES)]
"""A colour-scale switch's value as a callback takes it: ``None`` (a switch not yet set,
or a request that leaves it out) is the linear scale."""


def check(label: str, spec: Spec | Any, value: Any) -> Any:
    """Check one value the callback read out of another (a cell of a row, a key of an
    object) as :func:`~dashboards.components.messages.safe` checks its parameters.

    Args:
        label: the value's name in the message.
        spec: a :class:`Spec`, or one of the declared types above.
        value: the value.

    Raises:
        Refused: it does not fit.
    """
    return _spec_of(spec, label).check(label, value)


def below(label: str, value: int, count: int, what: str) -> int:
    """``value`` if it indexes one of ``count`` things.

    Args:
        label: the value's name in the message.
        value: a whole number from 0 (already checked by its declaration).
        count: how many there are.
        what: what they are, e.g. ``"layers in the recording"``.

    Raises:
        Refused: ``value >= count``.
    """
    if value >= count:
        span = f"0..{count - 1}" if count else "nothing"
        raise Refused(f"{label}: expected {span} ({count} {what}), got {shown(value)}")
    return value


def among(label: str, value: Any, choices: Sequence[Any], what: str) -> Any:
    """``value`` if it is one of ``choices``.

    Args:
        label: the value's name in the message.
        value: the value (already checked by its declaration).
        choices: what the data offers.
        what: what they are, e.g. ``"the run's metrics"``.

    Raises:
        Refused: it is not among them.
    """
    if value not in choices:
        listed = ", ".join(shown(c) for c in list(choices)[:8])
        more = ", ..." if len(choices) > 8 else ""
        raise Refused(f"{label}: expected one of {what} ({listed or 'none'}{more}), "
                      f"got {shown(value)}")
    return value


def triggered() -> Any:
    """The id of the input that fired the callback, as the client names it (``None`` on
    the first call).

    Raises:
        Refused: the client named it in a form that is not an id.
    """
    try:
        return dash.ctx.triggered_id
    except ValueError:  # a pattern id that is not JSON
        prop = dash.ctx.triggered[0]["prop_id"]
        raise Refused(f"trigger: expected the id of one of the callback's inputs, got "
                      f"{shown(prop)}") from None


# ---- declarations --------------------------------------------------------------------

def _spec_of(hint: Any, where: str) -> Spec:
    if isinstance(hint, Spec):
        return hint
    specs = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Spec)]
    if len(specs) != 1:
        raise TypeError(f"{where}: declare its type with one of dashboards.components.values' "
                        "types (e.g. RunId, Layer, Annotated[int | None, Whole(1, 50)])")
    return specs[0]


def declared(fn: Callable[..., Any]) -> list[tuple[str, Spec]]:
    """The label and spec of each parameter of callback ``fn``, in order.

    Raises:
        TypeError: a parameter without a declared type, or ``*args`` / ``**kwargs``.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    found = []
    for name, param in inspect.signature(fn).parameters.items():
        where = f"callback {fn.__qualname__}, parameter {name!r}"
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{where}: a callback names each of its inputs")
        # the label in messages: ``top_k`` is "top k", ``input_`` (not the builtin) "input"
        found.append((name.strip("_").replace("_", " "), _spec_of(hints.get(name), where)))
    return found


def checked(specs: Sequence[tuple[str, Spec]], args: Sequence[Any]) -> list[Any]:
    """``args`` checked against ``specs`` (from :func:`declared`), as the callback reads
    them.

    Raises:
        Refused: a value does not fit (the first one), or the count does not match.
    """
    if len(args) != len(specs):
        raise Refused(f"expected {len(specs)} values, got {len(args)}")
    return [spec.check(label, value) for (label, spec), value in zip(specs, args, strict=True)]
