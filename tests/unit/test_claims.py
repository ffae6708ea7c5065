"""The claims registry: parsing, selection, checks, and verdicts from real runs."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd
import pytest

from tests.tiny import cli
from workbench.core import paths
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.harness import claims
from workbench.harness.config import param
from workbench.harness.experiment import experiment
from workbench.store import schema
from workbench.store.runs import RunStore


def claim(**over):
    base = {"id": "c1", "kind": "reproduction", "paper": "Someone 2020", "where": "Table 1",
            "statement": "s", "published": "p", "applies_to": "any", "models": ["m"],
            "experiment": "head-overview", "config": {"n_boot": 20},
            "check": {"name": "max_score_at_least", "metric": "self_attention", "threshold": 0.0}}
    return {**base, **over}


def write(tmp_path, entries, name="a.json"):
    folder = tmp_path / "claims"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps(entries))
    return folder


def test_load_and_select(tmp_path):
    folder = write(tmp_path, [claim(), claim(id="c2", applies_to=["gpt2"])])
    loaded = claims.load_claims(folder)
    assert [c.id for c in loaded] == ["c1", "c2"] and loaded[1].applies_to == ("gpt2",)
    assert loaded[0].source == "Someone 2020, Table 1"
    assert [c.id for c in claims.select(loaded, ["c2"])] == ["c2"]
    with pytest.raises(UnknownNameError, match="known claims: c1, c2"):
        claims.select(loaded, ["c3"])


@pytest.mark.parametrize("entries, message", [
    ([claim(), claim()], "appears twice"),
    ([{"id": "x"}], "a.json has no '0.kind'"),
    ([claim(kind="theorem")], "a.json '0.kind': expected 'reproduction' or 'invariant', got "
                              '"theorem"'),
    ([claim(), claim(id="c2", chek={})], "a.json has an unknown field '1.chek'"),
    ([claim(check={"threshold": 1})], "a.json has no '0.check.name'"),
    ([claim(models="smollm2")], "a.json '0.models': expected a valid array, got \"smollm2\""),
    ({"id": "c1"}, "a.json: expected a valid array"),
    ([claim(check={"name": "heads_in_top_k", "metric": "sink", "heads": [], "k": 1})],
     r"a.json: claim c1: unknown head metric 'sink' \(the old name of 'first_token'\); "
     "known head metrics: copying, duplicate_token, "),
    ([claim(check={"name": "max_score_at_least", "metric": "previous", "threshold": 0})],
     "unknown head metric 'previous' .*known head metrics: "),
])
def test_malformed_claim_files(tmp_path, entries, message):
    with pytest.raises(WorkbenchError, match=message):
        claims.load_claims(write(tmp_path, entries))


IOI_INPUT = {"classes_from": {"experiment": "ioi", "config": "demo"}}


@pytest.mark.parametrize("inputs, config, message", [
    ({"classes_from": {"experiment": "no-such-experiment"}}, "demo",
     "a.json: claim c1: unknown experiment 'no-such-experiment'.*known experiments: .*ioi"),
    ({"classes_frm": {"experiment": "ioi"}}, "demo",
     "a.json: claim c1: run_inputs: experiment 'circuit' has no config field 'classes_frm' "
     r"\(did you mean 'classes_from'\?\)"),
    ({"classes_from": {"experiment": "ioi", "config": {"base": "tiny"}}}, "demo",
     "a.json: claim c1: experiment 'ioi' has no config 'tiny'"),
    ({"classes_from": {"experiment": "ioi", "config": {"n_prompts": 0}}}, "demo",
     "a.json: claim c1: .*n_prompts"),
    (IOI_INPUT, {"base": "demo", "classes_from": "some-run"},
     "'classes_from' is both pinned in the config and filled by run_inputs"),
    ({"classes_from": {"experiment": "ioi", "confg": "demo"}}, "demo",
     "unknown field '0.run_inputs.classes_from.confg'"),
])
def test_bad_run_inputs_are_refused_when_the_file_loads(tmp_path, inputs, config, message):
    entry = claim(experiment="circuit", config=config, run_inputs=inputs,
                  check={"name": "class_in_circuit", "head_class": "name mover"})
    with pytest.raises(WorkbenchError, match=message) as err:
        claims.load_claims(write(tmp_path, [entry]))
    assert "\n" not in str(err.value)


def test_run_inputs_run_first_on_the_same_model(tmp_path, llama_folder, monkeypatch):
    """The ioi run is made (or reused) first, on the claim's model, with its named config,
    and its id is the circuit run's classes_from."""
    from workbench.harness import experiment as harness

    entry = claim(experiment="circuit", config={"base": "demo", "n_prompts": 4},
                  models=[str(llama_folder)], run_inputs=IOI_INPUT,
                  check={"name": "class_in_circuit", "head_class": "name mover"})
    loaded = claims.load_claims(write(tmp_path, [entry]))
    calls = []

    @dataclass
    class Made:
        id: str

    def recorded(name, model, overrides, *, runs_dir, reuse):
        calls.append((name, model.info.name, dict(overrides), reuse))
        if name == "circuit":
            raise WorkbenchError("stopped before the circuit runs")
        return Made(f"{name}-run")

    monkeypatch.setattr(harness, "run_experiment", recorded)
    table = claims.reproduce(loaded, runs_dir=tmp_path / "runs")
    ioi, circuit = harness.get("ioi"), harness.get("circuit")
    assert calls == [
        ("ioi", str(llama_folder), ioi.named_config("demo"), True),
        ("circuit", str(llama_folder),
         {**circuit.named_config("demo"), "n_prompts": 4, "classes_from": "ioi-run"}, True)]
    assert table.verdict.tolist() == ["error"] and "stopped" in table.reason.iloc[0]
    calls.clear()
    claims.reproduce(loaded, runs_dir=tmp_path / "runs", fresh=True)
    assert [reuse for *_, reuse in calls] == [False, False]


def test_applies():
    c = claims.Claim.from_data(claim(applies_to="causal"), what="f")
    assert c.applies("x", causal=True) is None
    assert "causal language models" in c.applies("x", causal=False)
    encoder = claims.Claim.from_data(claim(applies_to="encoder"), what="f")
    assert "bidirectional" in encoder.applies("x", True)


def test_reproduce_verdicts_from_runs(tmp_path, llama_folder):
    folder = str(llama_folder)
    entries = [
        claim(id="passes", models=[folder]),
        claim(id="fails", models=[folder],
              check={"name": "max_score_at_least", "metric": "self_attention", "threshold": 2.0}),
        claim(id="encoder-only", models=[folder], applies_to="encoder"),
        claim(id="offline", models=["no-such-org/model-x9"]),
        claim(id="bad-check", models=[folder], check={"name": "no-such-check"}),
    ]
    loaded = claims.load_claims(write(tmp_path, entries))
    with pytest.raises(UnknownNameError, match="unknown check 'no-such-check'"):
        claims.reproduce(loaded, runs_dir=tmp_path / "runs")
    table = claims.reproduce(loaded[:4], runs_dir=tmp_path / "runs")
    verdicts = dict(zip(table.claim, table.verdict, strict=True))
    assert verdicts == {"passes": "pass", "fails": "fail", "encoder-only": "skipped",
                        "offline": "skipped"}
    row = table.set_index("claim").loc["fails"]
    assert "max self_attention = " in row.measured and "(threshold 2.0)" in row.measured
    # the stored row carries the interval and the threshold it was judged against
    assert row.threshold == 2.0 and row.ci_low <= row.value <= row.ci_high < 2.0
    assert set(table.kind) == {"reproduction"} and list(table.columns) == claims.VERDICT_COLUMNS
    assert table.set_index("claim").loc["offline", ["value", "threshold"]].isna().all()
    assert "model unavailable" in table.set_index("claim").loc["offline"].reason
    # the two head-overview claims with the same config share one run
    assert table.run[table.run != ""].nunique() == 1


# ---- claims about models an experiment trains itself ------------------------------------

@dataclass(frozen=True)
class _TrainsItsOwn:
    value: float = param(1.0, "the value the run reports", min=0, max=10)


@dataclass
class _Constant:
    value: float

    def tables(self):
        return {"head_scores": pd.DataFrame({"layer": [0, 1], "head": [2, 3],
                                             "metric": ["induction", "induction"],
                                             "score": [self.value, self.value / 2]})}

    def summary(self):
        return [f"value {self.value}"]


_TABLES = schema.tables(schema.Table("head_scores", "a constant score", schema.columns(
    ("layer", "int", "layer"), ("head", "int", "head"), ("metric", "str", "metric"),
    ("score", "float", "score"))))


@experiment("test-trains-its-own-models", config=_TrainsItsOwn, tables=_TABLES,
            needs_model=False)
def _run_model_free(model, cfg, ctx=None):
    assert model is None
    return _Constant(cfg.value)


def test_model_free_claims_run_once_without_a_model(tmp_path):
    entries = [
        claim(id="free-pass", applies_to="none", models=[],
              experiment="test-trains-its-own-models", config={"value": 0.7},
              check={"name": "max_score_at_least", "metric": "induction", "threshold": 0.5}),
        claim(id="free-fail", applies_to="none", models=[],
              experiment="test-trains-its-own-models", config={"value": 0.2},
              check={"name": "max_score_at_least", "metric": "induction", "threshold": 0.5}),
    ]
    loaded = claims.load_claims(write(tmp_path, entries))
    assert all(c.model_free for c in loaded)
    table = claims.reproduce(loaded, runs_dir=tmp_path / "runs")
    assert dict(zip(table.claim, table.verdict, strict=True)) == {"free-pass": "pass",
                                                                "free-fail": "fail"}
    assert set(table.model) == {"-"} and (table.run != "").all()
    assert ("induction = 0.700 (no interval in the table) at L0H2 (threshold 0.5)"
            in table.measured.iloc[0])
    assert (table.value.iloc[0], table.ci_low.iloc[0], table.ci_high.iloc[0]) == (0.7, 0.7, 0.7)
    run = RunStore(tmp_path / "runs").get(table.run.iloc[0])
    assert run.meta.model is None and run.config == {"value": 0.7}
    # a second reproduce reuses the runs; naming a model skips the model-free claims
    again = claims.reproduce(loaded, runs_dir=tmp_path / "runs")
    assert list(again.run) == list(table.run)
    skipped = claims.reproduce(loaded, model="smollm2", runs_dir=tmp_path / "runs")
    assert set(skipped.verdict) == {"skipped"}
    assert "trains its own models" in skipped.reason.iloc[0]


def test_model_free_claims_name_no_models(tmp_path):
    bad = claim(id="x", applies_to="none", models=["smollm2"])
    with pytest.raises(WorkbenchError, match='goes with "models": \\[\\]'):
        claims.load_claims(write(tmp_path, [bad]))


@pytest.mark.parametrize("low, high, side, verdict", [
    (0.6, 0.7, "above", "pass"), (0.4, 0.45, "above", "fail"), (0.45, 0.55, "above", "undecided"),
    (0.5, 0.6, "above", "pass"),  # the threshold itself counts as reached
    (0.2, 0.3, "below", "pass"), (0.6, 0.7, "below", "fail"), (0.4, 0.6, "below", "undecided"),
    (float("nan"), 0.7, "above", "undecided"), (0.7, 0.6, "above", "undecided"),
])
def test_an_interval_is_judged_against_the_threshold(low, high, side, verdict):
    assert claims.judge(low, high, 0.5, side) == verdict
    m = claims.Measurement.compare("x", (low + high) / 2, low, high, 0.5, side)
    assert m.outcome == verdict and m.threshold == 0.5 and m.ci_high == high


def test_summary_counts_each_kind_apart():
    table = pd.DataFrame({"kind": ["reproduction", "reproduction", "invariant", "reproduction"],
                          "verdict": ["pass", "undecided", "pass", "pass"]})
    assert claims.summary(table) == ("reproductions: 2 pass, 1 undecided; "
                                     "invariants: 1 pass")
    assert claims.counts(table.verdict[table.kind == "none"]) == "none"


def test_an_invariant_is_parsed_with_its_kind_and_quote(tmp_path):
    entries = [claim(kind="invariant", quote="exact words")]
    loaded = claims.load_claims(write(tmp_path, entries))[0]
    assert (loaded.kind, loaded.quote) == ("invariant", "exact words")


def test_reproduce_prints_reproductions_and_invariants_apart(tmp_path, monkeypatch, capsys):
    free = {"applies_to": "none", "models": [], "experiment": "test-trains-its-own-models",
            "check": {"name": "max_score_at_least", "metric": "induction", "threshold": 0.5}}
    write(tmp_path, [claim(id="finding", config={"value": 0.7}, **free),
                     claim(id="theorem", kind="invariant", config={"value": 0.2}, **free)])
    (tmp_path / "prompts").symlink_to(paths.data_dir() / "prompts")
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path))
    status, out, _ = cli(capsys, "reproduce", "--out", str(tmp_path / "runs"))
    assert status == 0
    head = out.index("== Reproductions (a paper's findings) ==")
    tail = out.index("== Invariants (mathematical properties, not counted as findings) ==")
    assert head < out.index("PASS      finding  [-]") < out.index("Reproductions: 1 pass") < tail
    assert tail < out.index("FAIL      theorem  [-]") < out.index("Invariants: 1 fail")
    stored = RunStore(tmp_path / "runs").get(out[-1].split("/")[-1])
    assert stored.meta.summary == ("reproductions: 1 pass; invariants: 1 fail",)
    assert dict(zip(stored.table("claims").claim, stored.table("claims").kind,
                    strict=True)) == {"finding": "reproduction", "theorem": "invariant"}
