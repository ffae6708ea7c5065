"""The command line end to end on the bundled models, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.recording.reader import Recording
from workbench.store.runs import RunStore


def workbench(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "workbench", "--quiet", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()


@pytest.mark.parametrize("model, prompt_set", [("smollm2", "natural"),
                                               ("minilm", "sentence-pairs")])
def test_record_and_run_from_the_command_line(model, prompt_set, runs_dir):
    out = workbench("record", model, "--prompt-set", prompt_set, "--limit", "3")
    rec = Recording.open(out[-1])
    assert len(rec) == 3 and rec.model.name == model
    out = workbench("run", "head-overview", "--model", model, "--set",
                    f"prompt_set={prompt_set}", "--set", "n_boot=100")
    run = RunStore(runs_dir).get(out[-1])
    assert run.status == "complete" and run.meta.model.checksum
    scores = run.table("head_scores")
    n_heads = rec.n_layers * rec.n_heads
    assert len(scores) == 4 * n_heads and scores.score.notna().all()
    entropy = scores[scores.metric == "normalized_entropy"].score
    assert ((entropy >= 0) & (entropy <= 1 + 1e-6)).all()
