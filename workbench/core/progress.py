"""Progress reporting: the library says how far it is, and the CLI draws it.

Library code wraps its loops in :func:`track`, moves a bar by hand with :func:`counting`
where the work is reported from callbacks (a model's hooks), and groups a long run into
named steps with :func:`stages`; none of them prints anything. A renderer installed with
:func:`render_with` (the CLI installs tqdm bars on a terminal, plain lines otherwise) is
told when a bar opens, moves and closes; with none installed, :func:`track` is a plain
loop and :func:`counting` and :func:`stages` do nothing.

Bars nest: a bar opened while another is open sits one level under it (``depth``), and a
bar's position counts its finished items plus the share done of its current item, read from
the bars under it, so an outer bar moves smoothly and its time left is estimated from all
the work done so far. An item may run several inner bars one after another (a step that
computes means, then loops over conditions), and how many is known only once an item has
ended: so the ``k``-th inner bar of an item fills ``1 / (k + 1)`` of it, leaving room for
one more, until an item of the bar has ended; after that each item is expected to run as
many inner bars as the most any ended item ran (:func:`item_share`). A finished inner bar
never makes its item look finished while more work of the item may follow.

The steps of a run are rarely equal: one may take most of it. :func:`stages` takes each
step's expected share of the run (``weights=``, in the order the steps start, measured on
a demo run and written beside the steps), and the fraction done of a stages bar, which
:func:`time_left` extrapolates, counts each step by its share: half of a step that takes
80% of the run is 40% of it. Without weights, steps count equally.

Examples:
    >>> with stages("induction-heads", 2, weights=(1, 3)) as stage:
    ...     stage("head scores")
    ...     for batch in track(range(3), desc="scoring"):
    ...         pass
    ...     stage("ablation")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")


@dataclass(eq=False)  # bars are told apart by identity: two may hold equal numbers
class Bar:
    """One open bar, as a renderer sees it."""

    desc: str
    total: int | None
    """Items (or stages) expected; ``None`` when unknown."""
    depth: int
    """0 for a bar opened with no other open; one more than the bar it is nested under."""
    parent: Bar | None = None
    finished: int = 0
    """Items (or stages) done."""
    n: float = 0.0
    """``finished`` plus the fraction done of the current item's inner bar (never goes
    back)."""
    steps: bool = False
    """``True`` for a bar opened by :func:`stages` (it counts named steps, not items)."""
    stage: str = ""
    """The name of the current step, for a bar opened by :func:`stages`."""
    weights: tuple[float, ...] = ()
    """Each step's expected share of a stages bar's time (empty: equal steps)."""
    inner: int = 0
    """Inner bars opened during the current item (or step)."""
    per_item: int = 0
    """The most inner bars an ended item opened (0: none has ended, or a stages bar,
    whose steps differ)."""
    ordinal: int = 0
    """Which inner bar of its parent's current item this is (1 for the first)."""

    @property
    def fraction(self) -> float | None:
        """How much of the bar is done, 0 to 1 (``None`` when its total is unknown); the
        steps of a stages bar count by their ``weights`` when it has one per step."""
        if not self.total:
            return None
        if not self.weights or len(self.weights) != self.total:
            return min(self.n / self.total, 1.0)
        whole = min(int(self.n), self.total)
        done = sum(self.weights[:whole])
        if whole < self.total:
            done += self.weights[whole] * (self.n - whole)
        return min(done / sum(self.weights), 1.0)


def item_share(ordinal: int, done: float, per_item: int) -> float:
    """The share of an item done when its ``ordinal``-th inner bar is ``done`` (0 to 1)
    through: the bars before it are whole, and the item is expected to run ``per_item``
    inner bars, or one more than this one when that is unknown (``per_item`` 0) or
    already passed.

    Examples:
        >>> item_share(1, 1.0, 0)  # the first bar done: maybe more follow
        0.5
        >>> item_share(2, 0.5, 2)  # items run two bars: half of the second is 3/4
        0.75
    """
    expected = per_item if per_item >= ordinal else ordinal + 1
    return (ordinal - 1 + min(done, 1.0)) / expected


def time_left(bar: Bar, elapsed: float) -> float | None:
    """Seconds the rest of ``bar`` should take if it goes on at the pace it has had over
    the ``elapsed`` seconds since it opened (``None`` before anything is done, or when its
    total is unknown).

    Args:
        bar: an open bar.
        elapsed: seconds since it opened.

    Returns:
        ``elapsed * (1 - f) / f`` for the fraction ``f`` done, or ``None``.
    """
    done = bar.fraction
    if not done or elapsed <= 0:
        return None
    return elapsed * (1.0 - done) / done


class Renderer(Protocol):
    """What draws the bars (the CLI's tqdm renderer)."""

    def open(self, bar: Bar) -> None:
        """A bar was opened."""

    def update(self, bar: Bar) -> None:
        """``bar.n``, ``bar.finished`` or ``bar.stage`` changed."""

    def close(self, bar: Bar) -> None:
        """A bar ended (its loop finished, broke off or raised)."""


_renderer: Renderer | None = None
_open: list[Bar] = []


def render_with(renderer: Renderer | None) -> None:
    """Draw progress with ``renderer`` from now on (``None``: report nothing)."""
    global _renderer
    _renderer = renderer
    _open.clear()


def _push(desc: str, total: int | None, *, steps: bool = False,
          weights: tuple[float, ...] = ()) -> Bar:
    parent = _open[-1] if _open else None
    bar = Bar(desc, total, depth=len(_open), parent=parent, steps=steps, weights=weights)
    if parent is not None:
        parent.inner += 1
        bar.ordinal = parent.inner
    _open.append(bar)
    if _renderer is not None:
        _renderer.open(bar)
    return bar


def _pop(bar: Bar) -> None:
    if bar in _open:  # a loop abandoned early may be closed after a later one
        _open.remove(bar)
    if _renderer is not None:
        _renderer.close(bar)


def _moved(bar: Bar) -> None:
    """Tell the renderer about ``bar``, then carry its fraction up to the bars above."""
    while bar is not None and _renderer is not None:
        _renderer.update(bar)
        parent = bar.parent
        if parent is None or not bar.total or parent.total is None:
            return
        position = parent.finished + item_share(bar.ordinal, bar.n / bar.total,
                                                parent.per_item)
        if position <= parent.n:
            return
        parent.n = position
        bar = parent


def _next_item(bar: Bar, finished: int) -> None:
    """``bar``'s items up to ``finished`` have ended: what their inner bars were is
    learned (not for a stages bar: its steps differ), and the next item starts with
    none."""
    if finished > bar.finished:
        if not bar.steps:
            bar.per_item = max(bar.per_item, bar.inner)
        bar.inner = 0
    bar.finished = finished


def _finish(bar: Bar, finished: int) -> None:
    _next_item(bar, finished)
    bar.n = max(bar.n, float(finished))
    _moved(bar)


def track(items: Iterable[T], *, total: int | None = None, desc: str = "") -> Iterator[T]:
    """Iterate over ``items``, reporting each one done to the renderer (if any).

    Args:
        items: what to iterate over.
        total: how many items there are (default ``len(items)`` when it has one).
        desc: what the loop does, e.g. ``"scoring natural text"``.

    Returns:
        An iterator over ``items``.
    """
    if _renderer is None:
        yield from items
        return
    if total is None and isinstance(items, Sized):
        total = len(items)
    bar = _push(desc, total)
    try:
        for done, item in enumerate(items, 1):
            yield item
            _finish(bar, done)
    finally:
        _pop(bar)


@contextmanager
def counting(total: int, *, desc: str = "") -> Iterator[Callable[[int], None]]:
    """A bar moved by hand, for work reported from callbacks (a model's hooks, layer by
    layer) rather than done in a loop.

    Args:
        total: units of work expected.
        desc: what is counted, e.g. ``"recording (layers x query rows)"``.

    Returns:
        A context manager yielding ``advance(units)``: that many more units are done.
    """
    if _renderer is None:
        yield lambda units: None
        return
    bar = _push(desc, total)
    done = 0

    def advance(units: int) -> None:
        nonlocal done
        done += units
        _finish(bar, done)

    try:
        yield advance
    finally:
        _pop(bar)


@contextmanager
def stages(desc: str, total: int,
           weights: Sequence[float] = ()) -> Iterator[Callable[[str], None]]:
    """An outer bar over the named steps of a long run; the bars of each step nest under it.

    Args:
        desc: what runs, e.g. the experiment's name.
        total: how many steps (each call of the yielded function starts the next one).
        weights: each step's expected share of the run's time, in the order they start
            (any positive numbers: they are normalised); empty, the steps count equally.

    Returns:
        A context manager yielding ``stage(name)``, which ends the current step and
        starts the one called ``name``.

    Raises:
        ValueError: ``weights`` that are not one positive number per step.
    """
    if weights and (len(weights) != total or min(weights) <= 0):
        raise ValueError(f"expected {total} positive step weights, got {tuple(weights)}")
    if _renderer is None:
        yield lambda name: None
        return
    bar = _push(desc, total, steps=True, weights=tuple(float(w) for w in weights))
    started = 0

    def stage(name: str) -> None:
        nonlocal started
        if started:
            _next_item(bar, started)
            bar.n = max(bar.n, float(started))
        started += 1
        if bar.total is not None and started > bar.total:
            bar.total = started
        bar.stage = name
        _moved(bar)

    try:
        yield stage
        _finish(bar, started)
    finally:
        _pop(bar)
