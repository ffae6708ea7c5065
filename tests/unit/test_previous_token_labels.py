"""previous-token-heads labels its inputs by what was used, in the table and the progress bar."""

from __future__ import annotations

import pytest

from experiments.previous_token_heads import Config, run
from workbench.core import progress


class Descriptions:
    """A progress renderer that keeps the description of every bar opened."""

    def __init__(self) -> None:
        self.opened: list[str] = []

    def open(self, bar):
        self.opened.append(bar.desc)

    def update(self, bar):
        pass

    def close(self, bar):
        pass


@pytest.fixture
def bars():
    seen = Descriptions()
    progress.render_with(seen)
    yield seen.opened
    progress.render_with(None)


@pytest.mark.parametrize("text, label", [
    ("natural", "prompt set natural"),
    ("corpus", "natural text"),
])
def test_inputs_name_the_text_used(llama, bars, text, label):
    cfg = Config(prompt_set=text, n_prompts=2, n_tokens=16, n_repeated=2, seq_len=6, n_boot=10)
    scores = run(llama, cfg).head_scores
    inputs = scores.groupby("metric").inputs.unique()
    assert list(inputs["previous_token"]) == [label]
    assert list(inputs["duplicate_token"]) == ["repeated random tokens"]
    assert f"scoring {label}" in bars
