"""How the command line draws on the terminal: fixed-width tables, wrapped text, durations,
one-line messages, stdout lines, and the progress that :mod:`workbench.core.progress`
reports (the library reports progress; only the CLI draws it): tqdm bars on a terminal,
plain lines on a stderr that is a file or a pipe (:func:`progress_renderer`), and log lines
always on lines of their own (:func:`log_lines`).

Stored text (a run's error and summary, names, table cells, claims) is shown inert, by
:func:`workbench.core.errors.printable`: every table cell and every field a command prints
goes through :func:`_cell`, so a newline in a stored string cannot forge a row, and
:func:`_out` escapes whatever control character is left in a line, so no escape sequence
from any source reaches the terminal."""

from __future__ import annotations

import contextlib
import logging
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from workbench.core import progress
from workbench.core.errors import printable
from workbench.harness.run_facts import duration_text as _duration


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


def _inert_lines(text: str) -> str:
    """``text`` without its trailing line breaks, each of its lines inert (a control
    character other than the line breaks is escaped)."""
    return "\n".join(printable(line) for line in text.rstrip("\r\n").split("\n"))


def _gpu_note() -> str:
    """``peak GPU 12.3 GiB`` (``torch.cuda.max_memory_allocated`` of the run so far) where
    this process uses CUDA, else empty."""
    from workbench.store.provenance import peak_memory

    peak = peak_memory()["peak_gpu_mib"]
    return "" if peak is None else f"peak GPU {peak / 1024:.1f} GiB"


class _TqdmBars:
    """Draws :mod:`workbench.core.progress` bars with tqdm on stderr, one line per open bar,
    nested by depth (``position=``). Only an outermost stages bar stays (``leave=``) to show
    how long the whole run took; the others are cleared when they end."""

    def __init__(self) -> None:
        self._bars: dict[int, Any] = {}

    @staticmethod
    def write(line: str) -> None:
        """``line`` on a line of its own above the bars (they are cleared, then redrawn)."""
        from tqdm import tqdm

        tqdm.write(_inert_lines(line), file=sys.stderr)

    @staticmethod
    def _label(bar: progress.Bar) -> str:
        if bar.steps and not bar.stage:
            return f"{bar.desc} [{bar.total} steps]"
        if bar.steps:
            step = min(bar.finished + 1, bar.total or bar.finished + 1)
            return f"{bar.desc} [step {step}/{bar.total}: {bar.stage}]"
        if bar.total is None:
            return bar.desc
        # the percent of the count beside it: "4/8 62%" (the fifth item under way) read as
        # a contradiction; the bar's fill and its time left still count the part done
        return f"{bar.desc} {bar.finished}/{bar.total} {100 * bar.finished / bar.total:.0f}%"

    @staticmethod
    def _position(bar: progress.Bar) -> tuple[float | None, float]:
        """tqdm's total and n for ``bar``: a stages bar runs from 0 to 1 by its weighted
        fraction, so that tqdm's whole-run rate (``smoothing=0``) gives the weighted time
        left, :func:`workbench.core.progress.time_left`."""
        if bar.steps and bar.total:
            return 1.0, bar.fraction or 0.0
        return bar.total, bar.n

    def open(self, bar: progress.Bar) -> None:
        from tqdm import tqdm

        # a bar's n is fractional (its inner bar's share), so the counts are in the label,
        # with their own percent for a bar of items
        fmt = None if bar.total is None else (
            "{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]" if bar.steps else
            "{desc}|{bar}| [{elapsed}<{remaining}]")
        self._bars[id(bar)] = tqdm(
            total=self._position(bar)[0], desc=self._label(bar), position=bar.depth,
            bar_format=fmt, leave=bar.steps and bar.depth == 0, dynamic_ncols=True,
            file=sys.stderr,
            # a whole-run average: steps differ too much in length for a recent rate
            smoothing=0 if bar.steps else 0.3)

    def update(self, bar: progress.Bar) -> None:
        shown = self._bars.get(id(bar))
        if shown is None:
            return
        total, n = self._position(bar)
        if shown.total != total:
            shown.total = total
        label = self._label(bar)
        # a new step is drawn at once; counts may wait for tqdm's next refresh
        new_step = bar.steps and label != shown.desc
        shown.set_description_str(label, refresh=False)
        gpu = _gpu_note()
        if gpu:
            shown.set_postfix_str(gpu, refresh=False)
        shown.update(n - shown.n)
        if new_step:
            shown.refresh()

    def close(self, bar: progress.Bar) -> None:
        shown = self._bars.pop(id(bar), None)
        if shown is not None:
            shown.close()


class _PlainBars:
    """Progress as plain lines, for a stderr that is a file or a pipe (``make demo > log
    2>&1``, CI): a line as each step of a :func:`~workbench.core.progress.stages` bar
    starts, at most one line a minute for any other bar, and a last line when an outermost
    stages bar ends. Never a carriage return or a cursor move, so the log holds only lines
    a reader wants."""

    EVERY = 60.0
    """Seconds between two lines of one bar that is not a stages bar."""

    def __init__(self, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream  # None: sys.stderr as it is when a line is written
        self._clock = clock
        self._opened: dict[int, float] = {}
        self._shown: dict[int, float] = {}
        self._label: dict[int, str] = {}

    def write(self, line: str) -> None:
        """``line`` (a log record may hold several, a traceback) and a newline."""
        stream = self._stream or sys.stderr
        stream.write(_inert_lines(line) + "\n")
        stream.flush()

    def _line(self, bar: progress.Bar, label: str, now: float) -> None:
        elapsed = now - self._opened[id(bar)]
        left = progress.time_left(bar, elapsed)
        about = "" if left is None else f", {'' if left < 1 else 'about '}{_duration(left)} left"
        gpu = _gpu_note()
        about += f", {gpu}" if gpu else ""
        self.write(f"{'  ' * bar.depth}{label} ({_duration(elapsed)} elapsed{about})")
        self._shown[id(bar)] = now

    def open(self, bar: progress.Bar) -> None:
        self._opened[id(bar)] = self._shown[id(bar)] = self._clock()

    def update(self, bar: progress.Bar) -> None:
        if id(bar) not in self._opened:
            return
        now = self._clock()
        if bar.steps:  # a line as a step starts (the end of the last one names no new step)
            label = _TqdmBars._label(bar)
            if bar.stage and self._label.get(id(bar)) != label:
                self._label[id(bar)] = label
                self._line(bar, label, now)
            return
        if now - self._shown[id(bar)] >= self.EVERY:
            self._line(bar, _TqdmBars._label(bar), now)

    def close(self, bar: progress.Bar) -> None:
        opened = self._opened.pop(id(bar), None)
        self._shown.pop(id(bar), None)
        self._label.pop(id(bar), None)
        if opened is not None and bar.steps and bar.depth == 0:
            took = _duration(self._clock() - opened)
            self.write(f"{bar.desc}: {bar.finished} of {bar.total} steps in {took}")


Bars = _TqdmBars | _PlainBars


def progress_renderer(stream: TextIO | None = None) -> Bars:
    """What draws progress on ``stream`` (default stderr): tqdm bars on a terminal, plain
    lines otherwise."""
    stream = stream or sys.stderr
    isatty = getattr(stream, "isatty", None)
    return _TqdmBars() if isatty is not None and isatty() else _PlainBars(stream)


class _LogLines(logging.Handler):
    """Writes log records through the progress renderer, so that a log line is always a
    line of its own (on a terminal, the bars are cleared above it and redrawn below)."""

    def __init__(self, bars: Bars) -> None:
        super().__init__()
        self._bars = bars

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._bars.write(self.format(record))
        except Exception:  # logging's own rule: a handler never raises
            self.handleError(record)


def _console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler) and handler.stream in (sys.stdout, sys.stderr)


@contextlib.contextmanager
def log_lines(bars: Bars) -> Iterator[None]:
    """While open, the root logger's console handlers write through ``bars`` (with their
    level and format), and Python warnings are logged the same way, so neither a log line
    nor a warning is glued onto a bar."""
    root = logging.getLogger()
    swapped = [h for h in root.handlers if _console(h)]
    for old in swapped:
        new = _LogLines(bars)
        new.setLevel(old.level)
        new.setFormatter(old.formatter)
        root.removeHandler(old)
        root.addHandler(new)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for handler in [h for h in root.handlers if isinstance(h, _LogLines)]:
            root.removeHandler(handler)
        for old in swapped:
            root.addHandler(old)
