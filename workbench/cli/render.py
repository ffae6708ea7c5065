"""How the command line draws on the terminal: fixed-width tables, wrapped text, durations,
one-line messages, stdout lines, and the tqdm bars that draw :mod:`workbench.core.progress`
reports (the library reports progress; only the CLI draws it).

Stored text (a run's error and summary, names, table cells, claims) is shown inert, by
:func:`workbench.core.errors.printable`: every table cell and every field a command prints
goes through :func:`_cell`, so a newline in a stored string cannot forge a row, and
:func:`_out` escapes whatever control character is left in a line, so no escape sequence
from any source reaches the terminal."""

from __future__ import annotations

import contextlib
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from workbench.core import progress
from workbench.core.errors import printable


def _cell(value: Any) -> str:
    """A value as one inert line of text (``""`` for ``None``): newlines, carriage returns
    and escape sequences are written as escapes."""
    return "" if value is None else printable(str(value))


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain fixed-width table; every cell is :func:`_cell`, so each row is one line."""
    body = [[_cell(r.get(c)) for c in columns] for r in rows]
    cells = [[str(c) for c in columns], *body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _out(text: str = "") -> None:
    """Write ``text`` and a newline to stdout, each line inert (the newlines the renderer
    put there stay; any other control character is escaped)."""
    sys.stdout.write("\n".join(printable(line) for line in text.split("\n")) + "\n")
    sys.stdout.flush()


_WIDTH = 100
"""Help and listings wrap at this width."""


def _fill(text: str, width: int = _WIDTH, indent: str = "", hanging: str | None = None) -> str:
    """``text`` wrapped at spaces only, so ids and hyphenated words stay whole (and
    searchable)."""
    return textwrap.fill(text, width, initial_indent=indent,
                         subsequent_indent=indent if hanging is None else hanging,
                         break_on_hyphens=False, break_long_words=False)


def _wrapped_table(rows: Sequence[dict[str, Any]], columns: Sequence[str],
                   width: int = _WIDTH) -> str:
    """:func:`_table` whose last column (a description) wraps instead of running on; when
    the other columns leave it under 40 characters, it goes on the lines below its row."""
    cells = [[str(c) for c in columns], *[[_cell(r.get(c)) for c in columns] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns) - 1)]
    room = width - sum(widths) - 2 * len(widths)
    if room < 40:
        lines = _table([dict(zip(columns[:-1], row[:-1], strict=True)) for row in cells[1:]],
                       columns[:-1]).splitlines()
        out = lines[:2]
        for line, row in zip(lines[2:], cells[1:], strict=True):
            out += [line, *textwrap.wrap(row[-1], width, initial_indent="    ",
                                         subsequent_indent="    ", break_on_hyphens=False)]
        return "\n".join(out)
    lines = []
    for i, row in enumerate(cells):
        for k, part in enumerate(textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]):
            lead = row[:-1] if k == 0 else [""] * len(widths)
            lines.append("  ".join([*(v.ljust(w) for v, w in zip(lead, widths, strict=True)),
                                    part]).rstrip())
        if i == 0:
            longest = min(room, max(len(row[-1]) for row in cells))
            lines.append("  ".join("-" * w for w in [*widths, longest]))
    return "\n".join(lines)


def _one_line(text: str) -> str:
    """``text`` as one inert line: its lines joined by spaces, control characters escaped."""
    return printable(" ".join(line.strip() for line in text.splitlines() if line.strip()))


def _duration(seconds: float) -> str:
    if seconds < 1:  # run.json keeps whole seconds
        return "under 1 s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


class _TqdmBars:
    """Draws :mod:`workbench.core.progress` bars with tqdm on stderr, one line per open bar,
    nested by depth (``position=``). Only an outermost stages bar stays (``leave=``) to show
    how long the whole run took; the others are cleared when they end."""

    def __init__(self) -> None:
        self._bars: dict[int, Any] = {}

    @staticmethod
    def logging() -> contextlib.AbstractContextManager[None]:
        """Log lines written above the bars instead of through them."""
        from tqdm.contrib.logging import logging_redirect_tqdm

        return logging_redirect_tqdm()

    @staticmethod
    def _label(bar: progress.Bar) -> str:
        if bar.steps and not bar.stage:
            return f"{bar.desc} [{bar.total} steps]"
        if bar.steps:
            step = min(bar.finished + 1, bar.total or bar.finished + 1)
            return f"{bar.desc} [step {step}/{bar.total}: {bar.stage}]"
        return bar.desc if bar.total is None else f"{bar.desc} {bar.finished}/{bar.total}"

    def open(self, bar: progress.Bar) -> None:
        from tqdm import tqdm

        # a bar's n is fractional (its inner bar's share), so the counts are in the label
        fmt = None if bar.total is None else (
            "{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
        self._bars[id(bar)] = tqdm(
            total=bar.total, desc=self._label(bar), position=bar.depth, bar_format=fmt,
            leave=bar.steps and bar.depth == 0, dynamic_ncols=True, file=sys.stderr,
            # a whole-run average: steps differ too much in length for a recent rate
            smoothing=0 if bar.steps else 0.3)

    def update(self, bar: progress.Bar) -> None:
        shown = self._bars.get(id(bar))
        if shown is None:
            return
        if shown.total != bar.total:
            shown.total = bar.total
        label = self._label(bar)
        # a new step is drawn at once; counts may wait for tqdm's next refresh
        new_step = bar.steps and label != shown.desc
        shown.set_description_str(label, refresh=False)
        shown.update(bar.n - shown.n)
        if new_step:
            shown.refresh()

    def close(self, bar: progress.Bar) -> None:
        shown = self._bars.pop(id(bar), None)
        if shown is not None:
            shown.close()
