"""Progress: the library reports, a renderer draws; outer bars over steps, inner bars nested."""

from __future__ import annotations

import io
import logging
import re
import sys
import warnings

import pytest

from workbench.core import progress


class Recorder:
    """A renderer that keeps every event: (event, desc, depth, n, finished, stage)."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def _keep(self, event: str, bar: progress.Bar) -> None:
        self.events.append((event, bar.desc, bar.depth, bar.n, bar.finished, bar.stage))

    def open(self, bar):
        self._keep("open", bar)

    def update(self, bar):
        self._keep("update", bar)

    def close(self, bar):
        self._keep("close", bar)

    def of(self, desc: str) -> list[tuple]:
        return [e for e in self.events if e[1] == desc]


@pytest.fixture
def recorder():
    rec = Recorder()
    progress.render_with(rec)
    yield rec
    progress.render_with(None)


def test_without_a_renderer_nothing_is_reported_and_loops_are_plain(capsys):
    progress.render_with(None)
    with progress.stages("exp", 2) as stage:
        stage("a")
        assert list(progress.track(iter(range(4)), desc="inner")) == [0, 1, 2, 3]
    assert capsys.readouterr() == ("", "")


def test_inner_bars_nest_under_the_steps_of_an_outer_bar(recorder):
    with progress.stages("exp", 2) as stage:
        stage("first")
        for _ in progress.track(range(4), desc="inner"):
            pass
        stage("second")
        for _ in progress.track(range(2), desc="conditions"):
            for _ in progress.track(range(3), desc="deep"):
                pass
    assert {(e[1], e[2]) for e in recorder.events if e[0] == "open"} == {
        ("exp", 0), ("inner", 1), ("conditions", 1), ("deep", 2)}
    outer = recorder.of("exp")
    assert outer[0][0] == "open" and outer[-1][0] == "close"
    assert next(e[5] for e in outer if e[0] == "update") == "first"
    assert outer[-1][3] == 2.0 and outer[-1][4] == 2  # both steps done
    positions = [e[3] for e in outer]
    assert positions == sorted(positions)  # never goes back
    # the first step's one inner bar fills half of it (another bar may follow): a quarter
    # of the bar done is an eighth of the step
    assert list(dict.fromkeys(p for p in positions if p < 1)) == [0, 0.125, 0.25, 0.375, 0.5]
    # the second step: "conditions" fills half of it; its first condition ran one "deep"
    # bar, so the second condition's deep bar fills that condition: a third of it done is
    # 1 1/3 conditions of 2, a third of the step
    assert pytest.approx(1 + 1 / 3) in positions and 1.5 in positions
    assert [e[0] for e in recorder.of("deep")].count("open") == 2


def test_a_bar_closes_when_its_loop_raises_and_the_next_bar_is_not_nested(recorder):
    with pytest.raises(ValueError):
        for i in progress.track(range(5), desc="failing"):
            if i == 2:
                raise ValueError
    for _ in progress.track(range(1), desc="after"):
        pass
    assert recorder.of("failing")[-1][0] == "close"
    assert [e[2] for e in recorder.of("after")] == [0, 0, 0]


def test_more_steps_than_announced_grow_the_total(recorder):
    with progress.stages("exp", 1) as stage:
        stage("a")
        stage("b")
    assert recorder.of("exp")[-1][4] == 2


def test_the_cli_draws_nested_tqdm_bars_on_stderr(capsys):
    from workbench.cli import _TqdmBars

    progress.render_with(_TqdmBars())
    try:
        with progress.stages("exp", 2) as stage:
            stage("scoring")
            for _ in progress.track(range(3), desc="batches"):
                pass
            stage("ablation")
    finally:
        progress.render_with(None)
    out, err = capsys.readouterr()
    assert out == ""
    assert "exp [step 1/2: scoring]" in err and "exp [step 2/2: ablation]" in err
    assert "batches" in err


class FakeStream(io.StringIO):
    """stderr redirected to a file: not a terminal."""

    def isatty(self) -> bool:
        return False


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stderr_that_is_not_a_terminal_gets_plain_lines_no_redraws():
    from workbench.cli.render import _PlainBars, progress_renderer

    stream, clock = FakeStream(), Clock()
    assert isinstance(progress_renderer(stream), _PlainBars)
    progress.render_with(_PlainBars(stream, clock))
    try:
        with progress.stages("exp", 3) as stage:
            stage("first")
            for _ in progress.track(range(300), desc="batches"):
                clock.now += 1  # 300 items of a second: a line at 60, 120, ..., 300 s
            stage("second")
            stage("third")
            clock.now += 30
    finally:
        progress.render_with(None)
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 3 + 5 + 1  # each step, each minute of the inner bar, the end
    assert lines[0] == "exp [step 1/3: first] (under 1 s elapsed)"
    assert lines[1] == "  batches 60/300 20% (1 min 00 s elapsed, about 4 min 00 s left)"
    assert lines[5].startswith("  batches 300/300 100% (5 min 00 s elapsed")
    # two of three steps done in 300 s: the third should take half as long again
    assert lines[7] == "exp [step 3/3: third] (5 min 00 s elapsed, about 2 min 30 s left)"
    assert lines[8] == "exp: 3 of 3 steps in 5 min 30 s"


def test_a_quick_loop_writes_nothing_to_a_file():
    from workbench.cli.render import _PlainBars

    stream = FakeStream()
    progress.render_with(_PlainBars(stream, Clock()))
    try:
        for _ in progress.track(range(1000), desc="quick"):
            pass
    finally:
        progress.render_with(None)
    assert stream.getvalue() == ""


def test_log_lines_and_warnings_never_glue_onto_a_bar(capsys):
    from workbench.cli.render import _TqdmBars, log_lines

    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(console)
    bars = _TqdmBars()
    progress.render_with(bars)
    try:
        with log_lines(bars), progress.stages("exp", 2) as stage:
            stage("first")
            assert console not in root.handlers
            logging.getLogger("workbench.x").warning("loaded smollm2")
            with warnings.catch_warnings():  # pytest's own recording of warnings aside
                warnings.simplefilter("always")
                warnings.warn("a deprecated thing", UserWarning, stacklevel=1)
            stage("second")
    finally:
        progress.render_with(None)
        root.removeHandler(console)
    err = capsys.readouterr().err
    pieces = re.split(r"[\r\n]", err)
    assert "WARNING workbench.x: loaded smollm2" in pieces  # a line of its own
    assert any(p.startswith("WARNING py.warnings:") and p.rstrip().endswith(
        "a deprecated thing") for p in pieces)


def test_the_time_left_of_the_steps_counts_each_step_by_its_weight():
    from workbench.cli.render import _PlainBars, _TqdmBars

    stream, clock = FakeStream(), Clock()
    seen: list[tuple[float | None, float | None]] = []

    class Watch(_PlainBars):
        def update(self, bar):
            if bar.steps:  # (fraction done, seconds left) as the renderer works them out
                seen.append((bar.fraction, progress.time_left(bar, clock.now - 1000.0)))
                assert _TqdmBars._position(bar) == (1.0, bar.fraction)
            super().update(bar)

    progress.render_with(Watch(stream, clock))
    try:
        with progress.stages("exp", 3, weights=(1, 2, 1)) as stage:
            stage("short")
            clock.now += 100
            stage("long")  # a quarter done in 100 s: 300 s left (equal steps would say 200)
            for _ in progress.track(range(2), desc="halves"):
                clock.now += 100  # half of the long step: half the run in 200 s
            stage("last")
            clock.now += 100
    finally:
        progress.render_with(None)
    assert seen[0] == (0.0, None)
    # the long step's one inner bar fills half of it (another could follow): both halves
    # done at 300 s are half the run, not half of it at 200 s
    assert (0.25, 300.0) in seen and (0.5, 300.0) in seen and (0.75, 100.0) in seen
    assert seen[-1] == (1.0, 0.0)
    lines = stream.getvalue().splitlines()
    assert lines[1] == "exp [step 2/3: long] (1 min 40 s elapsed, about 5 min 00 s left)"
    assert lines[-2] == "exp [step 3/3: last] (5 min 00 s elapsed, about 1 min 40 s left)"


def test_without_weights_the_steps_count_equally_and_bad_weights_are_refused(recorder):
    bar = progress.Bar("exp", 4, depth=0, steps=True, n=1.5)
    assert bar.fraction == 1.5 / 4
    assert progress.time_left(bar, 30.0) == pytest.approx(30.0 * 2.5 / 1.5)
    assert progress.time_left(progress.Bar("x", None, depth=0, n=3), 30.0) is None
    with pytest.raises(ValueError, match="expected 2 positive step weights"), \
            progress.stages("exp", 2, weights=(1, 0)):
        pass
    with pytest.raises(ValueError, match="expected 2 positive step weights"), \
            progress.stages("exp", 2, weights=(1,)):
        pass


def test_a_sweeps_cells_are_plain_lines_on_a_file(monkeypatch):
    from types import SimpleNamespace

    from workbench.cli import sweep

    stream = FakeStream()
    monkeypatch.setattr(sys, "stderr", stream)
    with sweep._sweep_bar(3, quiet=False) as show:
        for done, running in [(0, 2), (0, 2), (1, 2), (1, 1), (2, 1), (3, 0)]:
            show(SimpleNamespace(done=done, failed=0, running=running))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert [line.split(" (")[0] for line in lines] == [
        "cells: 0/3 ended", "cells: 1/3 ended", "cells: 2/3 ended", "cells: 3/3 ended"]


def test_a_log_record_of_several_lines_stays_lines_and_inert():
    from workbench.cli.render import _PlainBars

    stream = FakeStream()
    _PlainBars(stream, Clock()).write("Dash is running\n")
    _PlainBars(stream, Clock()).write("Traceback:\n  line 1\x1b[2J\n")
    assert stream.getvalue() == "Dash is running\nTraceback:\n  line 1\\x1b[2J\n"


def test_a_bar_of_items_says_the_percent_of_its_count():
    """'conditions 4/8 62%' (the fifth condition under way) read as a contradiction: the
    percent beside a count is that count's."""
    from workbench.cli.render import _PlainBars

    stream, clock = FakeStream(), Clock()
    progress.render_with(_PlainBars(stream, clock))
    try:
        for _ in progress.track(range(8), desc="conditions"):
            for _ in progress.track(range(10), desc="passes"):
                clock.now += 7  # 70 s a condition: lines fall inside conditions
    finally:
        progress.render_with(None)
    counts = re.findall(r"^conditions (\d+)/(\d+) (\d+)%", stream.getvalue(), re.M)
    assert len(counts) == 8  # a line a minute (every 63 s: the first update past 60 s)
    for done, total, percent in counts:
        assert int(percent) == round(100 * int(done) / int(total))
    # 4 of 8 done after 280 s; the line at 315 s, half into the fifth, says 50%, not 56%
    assert ("4", "8", "50") in counts


def test_an_item_is_not_done_when_its_first_inner_bar_is(recorder):
    """"3/4 100%": the fourth item's first inner bar finished made the whole bar look done
    while the item's second bar still ran."""
    for _ in progress.track(range(4), desc="conditions"):
        for _ in progress.track(range(2), desc="score"):
            pass
        for _ in progress.track(range(2), desc="loss"):
            pass
    positions = list(dict.fromkeys(e[3] for e in recorder.of("conditions")))
    # the first item: each bar fills 1/(k+1) of it until it is known to run two; then each
    # of the two fills half of its item
    later = [i + q for i in (1, 2, 3) for q in (0.25, 0.5, 0.75, 1.0)]
    assert positions == pytest.approx([0, 0.25, 0.5, 2 / 3, 1.0, *later])
    # while the fourth item's second bar runs, the bar is below its end
    fourth = [e for e in recorder.of("conditions") if e[4] == 3]
    assert max(e[3] for e in fourth[:-1]) < 4


def test_a_step_is_not_done_when_its_first_inner_bar_is(recorder):
    """A step that computes means (100 s), then ablates conditions (100 s), before a last
    step (200 s): when the means are done, a quarter of the run is, and 300 s are left.
    Counting the whole step done there said 100 s left, far too low."""
    seen: list[progress.Bar] = []
    progress.render_with(type("Keep", (Recorder,), {
        "open": lambda self, bar: seen.append(bar)})())
    with progress.stages("exp", 2) as stage:
        stage("ablation")
        for _ in progress.track(range(2), desc="means"):
            pass
        outer = seen[0]
        assert progress.time_left(outer, 100.0) == pytest.approx(300.0)
        for _ in progress.track(range(4), desc="conditions"):
            pass
        stage("in-context learning")
