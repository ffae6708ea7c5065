"""``workbench demo --models``: limits everything that runs, not only the per-model loop."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
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

    def reproduce(store, chosen, *, model=None, fresh=False, device="cpu"):
        seen["claims"].append(([c.id for c in chosen], model))
        # the reproductions undecided, the invariants passed
        table = pd.DataFrame({"claim": [c.id for c in chosen], "model": model or "-",
                              "verdict": ["undecided" if c.kind == "reproduction" else "pass"
                                          for c in chosen]})
        return SimpleNamespace(meta=SimpleNamespace(summary=("checked",)), id="reproduce-run",
                               table=lambda name: table)

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
    assert lines[-2].startswith("claims on minilm: ")
    # the undecided claims are named, and said to rest on the demo config
    undecided = [f"{c} (minilm)" for c in chosen if by_id[c].kind == "reproduction"]
    assert undecided and all(by_id[c].base_config == "demo" for c in chosen)
    assert lines[-1] == ("  undecided on the demo config, which the default config's larger "
                         f"samples may decide: {', '.join(undecided)}")


def test_undecided_claims_are_told_apart_by_the_config_they_were_checked_on():
    loaded = {c.id: c for c in claims.load_claims()}
    on_demo = loaded["clark2019-attention-to-sep"]
    assert on_demo.config == "demo"
    on_default = on_demo.model_copy(update={"id": "on-default", "config": {"eps": 0.3}})
    other = on_demo.model_copy(update={"id": "decided", "config": "default"})
    table = pd.DataFrame({"claim": ["clark2019-attention-to-sep", "on-default", "decided"],
                          "model": ["minilm", "minilm", "minilm"],
                          "verdict": ["undecided", "undecided", "fail"]})
    assert claims.undecided_lines(table, [on_demo, on_default, other]) == [
        "undecided on the demo config, which the default config's larger samples may "
        "decide: clark2019-attention-to-sep (minilm)",
        "undecided on the default config: on-default (minilm)"]
    assert claims.undecided_lines(table.assign(verdict="pass"), [on_demo]) == []


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


def _stored(store, exp, name: str, seconds: int) -> str:
    """A complete run of ``exp``'s demo config on a model called ``name``, taking
    ``seconds`` (run.json is the record of its start and end)."""
    import json

    from tests.tiny import fake_info
    from workbench.harness.config import apply_overrides

    with store.start(exp.name, fake_info(name, "0" * 64),
                     apply_overrides(exp.config, dict(exp.demo))) as run:
        pass
    path = store.get(run.id).path / "run.json"
    meta = json.loads(path.read_text())
    meta.update(started_at="2026-12-01T10:00:00+00:00",
                ended_at=f"2026-12-01T10:{seconds // 60:02d}:{seconds % 60:02d}+00:00")
    path.write_text(json.dumps(meta))
    return run.id


def test_the_plan_names_every_step_and_says_when_it_has_no_estimate(runs_dir):
    from workbench.harness.experiment import get
    from workbench.store.runs import RunStore

    plan = demo.demo_plan(["minilm"], RunStore(runs_dir))
    experiments = [e.name for e in all_experiments() if e.needs_model
                   and "minilm" in e.demo_models]
    assert [s.label for s in plan] == ["record on minilm",
                                       *(f"{e} on minilm" for e in experiments),
                                       "claims on minilm"]
    from workbench.harness.sweeps.spec import bundled_refusal

    skipped = {s.name for s in plan if s.skip}
    assert "induction-heads" in skipped  # refused on an encoder: named, not run
    assert skipped == {e for e in experiments if bundled_refusal(get(e), "minilm")}
    lines = demo.plan_lines(plan)
    n = len(plan)
    assert lines[0] == f"plan: {n} steps"
    assert lines[1:-1] == [f"[{k}/{n}] {s.label}: " + (f"skipped ({s.skip})" if s.skip
                                                       else "no estimate")
                           for k, s in enumerate(plan, 1)]
    assert lines[-1] == (f"estimated: no estimate, {n - len(skipped)} of {n} steps have no "
                         "stored run to go by (loading the models not included)")


def test_a_stored_run_gives_the_estimate_or_is_reused(runs_dir, monkeypatch):
    from workbench.harness.experiment import get
    from workbench.store.runs import RunStore

    store = RunStore(runs_dir)
    exp = get("head-overview")
    run_id = _stored(store, exp, "minilm", 90)
    fresh = demo.demo_plan(["minilm"], store, fresh=True)
    step = next(s for s in fresh if s.name == "head-overview")
    assert (step.seconds, step.basis) == (90.0, f"about 1 min 30 s (run {run_id})")
    reused = next(s for s in demo.demo_plan(["minilm"], store) if s.name == "head-overview")
    assert (reused.seconds, reused.basis) == (0.0, f"reuses run {run_id} (which took "
                                                   "1 min 30 s)")
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    monkeypatch.setattr(demo, "_cores", lambda: 2)
    k = fresh.index(step) + 1
    first, warning = demo.start_line(fresh, k, 75.0)
    rest = sum(s.seconds is None for s in fresh[k:])  # the steps after it with no estimate
    assert first == (f"[{k}/{len(fresh)}] head-overview on minilm (1 min 15 s so far; left: "
                     f"about 1 min 30 s, not counting {rest} with no estimate; load 5.0 on 2 "
                     "cores)")
    assert warning.startswith("warning: the load average (5.0) is above the 2 cores")
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert len(demo.start_line(fresh, k, 75.0)) == 1


def test_each_step_is_announced_before_it_runs(calls, runs_dir, monkeypatch):
    monkeypatch.setattr(demo.os, "getloadavg", lambda: (0.5, 0.5, 0.5))  # no warning
    lines = list(demo.run_demo(["minilm"], runs_dir))
    n = int(lines[0].split()[1])
    starts = [i for i, line in enumerate(lines) if line.startswith("[") and " so far; " in line]
    assert len(starts) == n
    for k, i in enumerate(starts, 1):
        label = lines[k].split("] ", 1)[1].rsplit(": ", 1)[0]  # from the plan
        assert lines[i].startswith(f"[{k}/{n}] {label} (")
        assert lines[i + 1].startswith(label)  # its outcome follows
