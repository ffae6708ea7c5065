"""``workbench demo --models``: limits everything that runs, not only the per-model loop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.tiny import cli
from workbench.harness import claims, demo
from workbench.harness.experiment import all_experiments


@pytest.fixture
def calls(monkeypatch):
    """Run the demo with every expensive step replaced by a note of what it was asked."""
    seen = {"loaded": [], "runs": [], "claims": []}

    def load(name, **kwargs):
        seen["loaded"].append(name)
        return SimpleNamespace(info=SimpleNamespace(name=name))

    def run(name, model, overrides, **kwargs):
        seen["runs"].append((name, None if model is None else model.info.name))
        return SimpleNamespace(status="complete", id=f"{name}-run")

    def reproduce(store, chosen, *, model=None, fresh=False):
        seen["claims"].append(([c.id for c in chosen], model))
        return SimpleNamespace(meta=SimpleNamespace(summary=("checked",)), id="reproduce-run")

    monkeypatch.setattr(demo, "load_model", load)
    monkeypatch.setattr(demo, "run_experiment", run)
    monkeypatch.setattr(demo, "demo_recording", lambda model, store, fresh: "record-run")
    monkeypatch.setattr(claims, "reproduce_run", reproduce)
    return seen


def test_models_limit_the_experiments_the_training_and_the_claims(calls, runs_dir):
    lines = list(demo.run_demo(["minilm"], runs_dir))
    assert calls["loaded"] == ["minilm"]
    assert calls["runs"] and all(model == "minilm" for _, model in calls["runs"])
    trains = {e.name for e in all_experiments() if not e.needs_model}
    assert trains and not trains & {name for name, _ in calls["runs"]}
    (chosen, model), = calls["claims"]
    assert model == "minilm" and chosen
    by_id = {c.id: c for c in claims.load_claims()}
    assert all("minilm" in by_id[c].models for c in chosen)
    # every claim about minilm is among them, and none about the other models alone
    assert set(chosen) == {c.id for c in by_id.values() if "minilm" in c.models}
    assert lines[-1].startswith("claims on minilm: ")


def test_the_full_demo_trains_and_checks_every_claim(calls, runs_dir):
    list(demo.run_demo(None, runs_dir))
    assert calls["loaded"] == list(demo.DEMO_MODELS)
    trains = {e.name for e in all_experiments() if not e.needs_model}
    assert {(name, None) for name in trains} <= set(calls["runs"])
    (chosen, model), = calls["claims"]
    assert model is None and set(chosen) == {c.id for c in claims.load_claims()}


def test_an_unknown_model_is_refused_before_anything_runs(capsys, calls, runs_dir):
    status, _, err = cli(capsys, "demo", "--models", "smollm2,minilmm")
    assert status == 2 and "did you mean 'minilm'" in err
    assert calls == {"loaded": [], "runs": [], "claims": []}
