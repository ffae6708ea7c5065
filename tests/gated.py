"""A test-only experiment whose run holds until the test opens its gate, so that a test
interrupting work signals while the work is certainly running, on a fast machine and on a
slow one, instead of racing the work's speed.

The run announces itself by creating ``held-<seed>`` in its gate folder, then waits until
``open`` exists there. A run whose gate is never opened is the cell, job or command the
test interrupts; one whose gate is already open runs through at once. Importing this
module registers the experiment (``test-gate``); other processes (a CLI subprocess, Ray
workers) import it through ``WORKBENCH_EXPERIMENTS=tests.gated``, with the checkout on
their ``PYTHONPATH``.

Examples:
    >>> gate = tmp_path / "gate"                                           # doctest: +SKIP
    >>> run_experiment("test-gate", model, {"gate": str(gate)})            # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from workbench.harness.config import param, shared
from workbench.harness.experiment import experiment
from workbench.store.schema import head_scores, tables

NAME = "test-gate"
ENV = {"WORKBENCH_EXPERIMENTS": __name__}
"""What a process needs in its environment to see the experiment."""
OPEN = "open"


@dataclass(frozen=True)
class Config:
    gate: str = param("", "the gate folder: the run waits until OPEN exists in it (empty: "
                          "no wait)")
    max_wait_s: float = param(600.0, "the longest the run waits for its gate before failing "
                                     "(a guard against a test that never opens it)",
                              min=0, max=3600)
    seed: int = shared("seed")


@experiment(NAME, config=Config, tables=tables(head_scores("held")), demo={})
def run(model, cfg: Config, ctx=None) -> _Held:
    if cfg.gate:
        hold(Path(cfg.gate), f"held-{cfg.seed}", cfg.max_wait_s)
    return _Held()


def hold(gate: Path, marker: str, max_wait_s: float) -> None:
    """Create ``gate/marker`` (holding this process's id), then wait for ``gate/open``.

    Raises:
        TimeoutError: the gate stayed shut for ``max_wait_s`` seconds.
    """
    gate.mkdir(parents=True, exist_ok=True)
    (gate / marker).write_text(str(os.getpid()))
    deadline = time.monotonic() + max_wait_s
    while not (gate / OPEN).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {gate} was not opened within {max_wait_s:g} s")
        time.sleep(0.02)  # an interrupt lands here, between two looks at the gate


def held(gate: Path) -> list[Path]:
    """The runs holding at ``gate`` now (their markers)."""
    return sorted(gate.glob("held-*"))


def wait_until(condition, seconds: float = 600.0, every: float = 0.05) -> None:
    """Wait for ``condition()`` to hold: a state, not a time. ``seconds`` only bounds a
    test that would otherwise hang when the state never comes.

    Raises:
        AssertionError: it did not hold within ``seconds``.
    """
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{getattr(condition, '__name__', condition)} did not hold "
                                 f"within {seconds:g} s")
        time.sleep(every)


class _Held:
    """No tables: only the run's life is of interest."""

    def tables(self) -> dict:
        return {}

    def summary(self) -> list[str]:
        return ["held, then released"]
