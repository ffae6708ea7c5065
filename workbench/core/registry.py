"""A registry of named things (models, experiments, prompt sets).

Each kind of thing has exactly one registry; the CLI and the dashboard read their choices
from it, so there is never a second list to keep in step.

Examples:
    >>> widgets: Registry[int] = Registry("widget")
    >>> widgets.register("one", 1)
    1
    >>> widgets.get("two")
    Traceback (most recent call last):
    ...
    workbench.core.errors.UnknownNameError: unknown widget 'two'; known widgets: one
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from workbench.core.errors import UnknownNameError, printable

T = TypeVar("T")


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known names to a misspelt ``name``, or ``""``.

    Examples:
        >>> did_you_mean("minilmm", ["minilm", "smollm2"])
        " (did you mean 'minilm'?)"
    """
    close = difflib.get_close_matches(str(name), list(known), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Registry(Generic[T]):
    """Names mapped to items; a duplicate name raises, an unknown one lists the known ones."""

    def __init__(self, kind: str, plural: str | None = None) -> None:
        self.kind = kind
        self.plural = plural or f"{kind}s"
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        """Add ``item`` under ``name``.

        Raises:
            ValueError: if ``name`` is already registered (a programming error, not bad input).
        """
        if name in self._items:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._items[name] = item
        return item

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator("name")`` registers the decorated object."""

        def wrap(item: T) -> T:
            return self.register(name, item)

        return wrap

    def get(self, name: str) -> T:
        """The item registered as ``name``.

        Raises:
            UnknownNameError: listing the known names when ``name`` is not registered.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):  # TypeError: a list or a dict read from a file
            raise UnknownNameError(self.unknown_message(name)) from None

    def unknown_message(self, name: object) -> str:
        known = ", ".join(sorted(self._items)) or "(none)"
        if not isinstance(name, str):
            return f"a {self.kind} is named by a string, got {_shown(name)}; known " \
                   f"{self.plural}: {known}"
        return (f"unknown {self.kind} '{printable(name)}'{did_you_mean(name, self._items)}; "
                f"known {self.plural}: {known}")

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
