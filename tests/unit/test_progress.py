"""Progress: the library reports, a renderer draws; outer bars over steps, inner bars nested."""

from __future__ import annotations

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
    # a quarter of the first step's inner bar done is a quarter of a step done outside
    assert 0.25 in positions and 0.5 in positions
    # the second step: one of two conditions, and a third of the next one's inner bar
    assert 1.5 in positions and pytest.approx(1.5 + 0.5 / 3) in positions
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
