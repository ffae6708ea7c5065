"""Help that helps: ``run EXPERIMENT --help``, untruncated listings, ``reproduce --list``,
and refusals that come before any model is loaded."""

from __future__ import annotations

import dataclasses
import re
import typing

import pandas as pd
import pytest

from tests.tiny import cli
from workbench.harness import claims as claims_mod
from workbench.harness.experiment import all_experiments, get
from workbench.store.runs import RunStore
from workbench.store.schema import tables

WIDTH = 100


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _joined(lines: list[str]) -> str:
    return " ".join(" ".join(lines).split())


# ---- run EXPERIMENT --help -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["induction-heads", "attention-sinks", "induction-formation"])
def test_run_experiment_help_shows_every_field_and_the_demo(capsys, runs_dir, name):
    status, out, _ = cli(capsys, "run", name, "--help")
    assert status == 0
    exp = get(name)
    text = "\n".join(out)
    hints = typing.get_type_hints(exp.config)
    for f in dataclasses.fields(exp.config):
        row = next(line for line in out if line.split()[:1] == [f.name])
        # the type's name and the default as --set takes it (tuples comma-separated)
        default = (",".join(map(str, f.default)) or "(empty)") if isinstance(
            f.default, tuple) else (str(f.default).lower() if isinstance(f.default, bool)
                                    else str(f.default))
        assert default in row.split(), (f.name, row)
        assert getattr(hints[f.name], "__name__", "") in row or "|" in row or "[" in row
        if f.metadata.get("min") is not None:
            assert f">= {f.metadata['min']}" in row or f"{f.metadata['min']} .." in row
        assert f.metadata["help"] in _joined(out)
    for key in exp.demo:
        assert f"--set {key}=" in text
    assert exp.description in _joined(out)
    assert "wall time:" in text and "no complete run" in text  # the store is empty
    assert max(len(line) for line in out) <= WIDTH


def test_run_help_lists_every_experiment(capsys):
    status, out, _ = cli(capsys, "run", "--help")
    assert status == 0
    listed = {m.group(1) for line in out if (m := re.match(r"  (\S+): ", line))}
    assert listed == {exp.name for exp in all_experiments()}
    assert any("--reuse" in line for line in out)  # the ordinary option help is still there


def test_run_help_of_an_unknown_experiment_is_one_line(capsys):
    status, _, err = cli(capsys, "run", "induction-haeds", "--help")
    assert status == 2 and err.count("\n") == 1
    assert "did you mean 'induction-heads'" in err


def test_wall_time_comes_from_the_default_config_runs_only(capsys, runs_dir, llama_folder):
    status, out, _ = cli(capsys, "run", "head-overview", "--model", str(llama_folder))
    assert status == 0
    default_run = RunStore(runs_dir).get(out[-1])
    status, out, _ = cli(capsys, "run", "head-overview", "--model", str(llama_folder),
                         "--set", "n_boot=50")  # not the default config: never timed
    other_run = RunStore(runs_dir).get(out[-1])
    status, out, _ = cli(capsys, "run", "head-overview", "--help")
    text = _joined(out)
    assert status == 0 and default_run.id in text and other_run.id not in text
    seconds = (pd.Timestamp(default_run.meta.ended_at)
               - pd.Timestamp(default_run.meta.started_at)).total_seconds()
    shown = "under 1 s" if seconds < 1 else f"{seconds:.0f} s"  # run.json keeps whole seconds
    assert f"default on {llama_folder}: {shown}" in text


# ---- listings wrap instead of cutting ----------------------------------------------------------

def test_experiments_print_whole_descriptions(capsys):
    status, out, _ = cli(capsys, "experiments")
    assert status == 0
    text = _joined(out)
    for exp in all_experiments():
        module = __import__(exp.module, fromlist=["__doc__"])
        assert _first_paragraph(module.__doc__) in text, exp.name
    assert max(len(line) for line in out) <= WIDTH


def test_prompts_print_whole_descriptions(capsys):
    from workbench.inputs.prompts import GENERATORS

    status, out, _ = cli(capsys, "prompts")
    assert status == 0
    for _, fn in GENERATORS.items():
        assert _first_paragraph(fn.__doc__) in _joined(out)
    assert max(len(line) for line in out) <= WIDTH


# ---- reproduce --list ----------------------------------------------------------------------

def _claim_rows(out: list[str]) -> dict[str, list[list[str]]]:
    """``{claim id: [[kind, model, verdict], ...]}`` (a row per model) from ``--list``."""
    ids = {c.id for c in claims_mod.load_claims()}
    rows: dict[str, list[list[str]]] = {}
    for line in out:
        if line.split()[:1] and line.split()[0] in ids:
            rows.setdefault(line.split()[0], []).append(line.split()[1:])
    return rows


def test_reproduce_list_is_narrow_with_the_statement_below(capsys, runs_dir):
    status, out, _ = cli(capsys, "reproduce", "--list")
    assert status == 0 and max(len(line) for line in out) <= WIDTH
    rows = _claim_rows(out)
    loaded = claims_mod.load_claims()
    assert set(rows) == {c.id for c in loaded}
    for c in loaded:
        # one row per default model, each: kind, model, verdict ('-': nothing checked yet)
        assert rows[c.id] == [[c.kind, m, "-"] for m in (c.models or ["-"])]
        start = next(i for i, line in enumerate(out) if line.startswith(c.id + " "))
        below = out[start + len(c.models or ["-"]):]
        assert _joined(below).startswith(" ".join(c.statement.split()))
    assert not any(line.strip().startswith("quote:") for line in out)


def test_reproduce_list_shows_the_newest_stored_verdict_and_wide_shows_all(capsys, runs_dir):
    claim = next(c for c in claims_mod.load_claims() if c.models)
    row = {col: "" for col in claims_mod.VERDICT_COLUMNS}
    row.update(claim=claim.id, kind=claim.kind, model=claim.models[0], verdict="undecided",
               measured="a hand-made measurement", value=0.5, ci_low=0.4, ci_high=0.6,
               threshold=0.5)
    store = RunStore(runs_dir)
    with store.start("reproduce", None, {"claims": [claim.id]},
                     tables=tables(claims_mod.CLAIMS_TABLE)) as run:
        run.save_table("claims", pd.DataFrame([row]).astype(
            {c: float for c in ("value", "ci_low", "ci_high", "threshold")}))
    status, out, _ = cli(capsys, "reproduce", "--list", claim.id)
    assert status == 0 and _claim_rows(out)[claim.id][0][2] == "undecided"
    status, out, _ = cli(capsys, "reproduce", "--list", "--wide", claim.id)
    text = _joined(out)
    assert status == 0 and max(len(line) for line in out) <= WIDTH
    assert f"experiment: {claim.experiment}" in text and "source: " in text
    assert "a hand-made measurement" in text and run.id in text


# ---- refusals before any model loads --------------------------------------------------------

@pytest.fixture
def no_model_loads(monkeypatch):
    """Every way a model's weights are read fails the test if it is reached."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("workbench.models.load.boot_folder", refuse)
    monkeypatch.setattr("workbench.models.load._load_bundled", refuse)
    monkeypatch.setattr("workbench.models.checkpoints.load", refuse)
    return calls


@pytest.mark.parametrize("args, message", [
    (["record", "{folder}", "--text", "  "], "--text is empty"),
    (["record", "{folder}", "--prompt-set", "naturall"], "(did you mean 'natural'?)"),
    (["record", "{folder}", "--prompt-set", "repeated-random", "--set", "seq_len=0"],
     "seq_len"),
    (["record", "{folder}", "--heads-mask", "/no/such/mask.json", "--text", "hi"],
     "/no/such/mask.json"),
    (["record", "minilmm", "--text", "hi"], "(did you mean 'minilm'?)"),
    (["run", "head-overveiw", "--model", "{folder}"], "(did you mean 'head-overview'?)"),
    (["run", "head-overview", "--model", "{folder}", "--set", "n_bot=3"],
     "(did you mean 'n_boot'?)"),
    (["run", "previous-token-heads", "--model", "{folder}", "--set", "prompt_set=poems"],
     "unknown prompt set 'poems'"),
    # the field's old name is still read, and still checked
    (["run", "previous-token-heads", "--model", "{folder}", "--set", "text=poems"],
     "unknown prompt set 'poems'"),
    (["run", "head-overview", "--model", "{folder}", "--set", "n_boot=0"], "n_boot"),
    (["demo", "--models", "minilmm"], "(did you mean 'minilm'?)"),
    (["demo", "--models", ","], "no model given"),
    (["reproduce", "olsson2022-icl-scroe"], "did you mean"),
])
def test_refusals_come_before_any_model_loads(capsys, runs_dir, llama_folder, no_model_loads,
                                              args, message):
    args = [a.replace("{folder}", str(llama_folder)) for a in args]
    status, _, err = cli(capsys, *args)
    assert status == 2, err
    assert message in err and err.count("\n") == 1
    assert no_model_loads == []
    assert not list(runs_dir.glob("*/run.json"))


def test_the_load_spy_sees_a_command_that_does_load(capsys, runs_dir, llama_folder,
                                                    no_model_loads):
    """The control for the test above: good input reaches the loader, and the spy sees it."""
    status, _, err = cli(capsys, "record", str(llama_folder), "--text", "hi")
    assert status == 1 and "a model was loaded" in err
    assert len(no_model_loads) == 1


def test_show_an_unknown_table_suggests_the_closest_before_printing(capsys, runs_dir,
                                                                    llama_folder):
    status, out, _ = cli(capsys, "run", "head-overview", "--model", str(llama_folder),
                         "--set", "n_boot=10")
    status, out, err = cli(capsys, "show", out[-1], "--table", "head_scorez")
    assert status == 2 and out == [] and err.count("\n") == 1
    assert "(did you mean 'head_scores'" in err


def test_a_wall_time_says_whether_the_machine_was_busy(capsys, runs_dir, llama_folder,
                                                         monkeypatch):
    import os
    import shutil

    from workbench.store import provenance

    cores = os.cpu_count()
    monkeypatch.setattr(provenance, "load_average", lambda: [cores + 1.5, 1.0, 1.0])
    status, out, _ = cli(capsys, "run", "head-overview", "--model", str(llama_folder))
    assert status == 0
    run = RunStore(runs_dir).get(out[-1])
    assert run.meta.load_at_start == run.meta.load_at_end == (cores + 1.5, 1.0, 1.0)
    assert run.meta.busy is True
    status, out, _ = cli(capsys, "run", "head-overview", "--help")
    text = _joined(out)
    assert f"busy (load {cores + 1.5:.1f} at start, {cores + 1.5:.1f} at end, {cores} cores)" \
        in text
    assert "rerun it on an idle machine" in text

    # the busy run goes: runs that end within the same second would tie for the newest
    shutil.rmtree(run.path)
    monkeypatch.setattr(provenance, "load_average", lambda: [0.5, 0.5, 0.5])
    status, out, _ = cli(capsys, "run", "head-overview", "--model", str(llama_folder))
    status, out, _ = cli(capsys, "run", "head-overview", "--help")
    text = _joined(out)
    assert f"idle (load 0.5 at start, 0.5 at end, {cores} cores)" in text
    assert "rerun it on an idle machine" not in text


@pytest.mark.parametrize("name", ["qk-attribution", "induction-heads", "head-overview"])
def test_the_models_in_the_help_are_the_ones_the_checks_accept(capsys, runs_dir, name):
    from workbench.harness import matrix
    from workbench.harness.sweeps.spec import bundled_refusal
    from workbench.models.adapters import FAMILIES

    status, out, _ = cli(capsys, "run", name, "--help")
    assert status == 0
    text = _joined(out)
    exp = get(name)
    for _, adapter in FAMILIES.items():
        verdict = matrix.cell(adapter, exp)
        if not verdict.works:  # every refusal the runs make is in the help, with its reason
            assert f"refuses {adapter.family}: {' '.join(verdict.reason.split())}" in text
    works = [a.family for _, a in FAMILIES.items() if matrix.cell(a, exp).works]
    assert f"works on the families: {', '.join(works)}" in text
    demo_line = text.split("demo config (workbench demo, on ", 1)[1].split("):", 1)[0]
    taken = demo_line.split(";")[0].split(", ")
    assert taken == [m for m in exp.demo_models if not bundled_refusal(exp, m)]
