"""The notebook cards (``_repr_html_``) of runs, recordings and models: what each names, its
stored strings escaped, a failed or damaged run saying what is wrong, values off the
defaults marked, and links into the dashboard from the page map the pages register."""

from __future__ import annotations

import html
import json

import dash
import pandas as pd
import pytest

import workbench
from experiments.previous_token_heads import Config
from experiments.previous_token_heads.tables import HEAD_CLASSES, HEAD_SCORES
from workbench.figures import html as fhtml
from workbench.figures import pages
from workbench.harness import claims
from workbench.harness.experiment import get, run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording.record import Recording, record
from workbench.store.runs import RunStore

HOSTILE = "<script>alert(1)</script>"
SMALL = {"n_prompts": 2, "n_repeated": 2, "n_tokens": 16, "seq_len": 6, "n_boot": 20}


@pytest.fixture(autouse=True)
def no_dashboard(monkeypatch):
    monkeypatch.setenv(fhtml.DASHBOARD_ENV, "")


@pytest.fixture(scope="module")
def heads_run(llama, tmp_path_factory):
    workbench.RunStore  # noqa: B018  # what a notebook does first: wires in the cards' facts
    return run_experiment("previous-token-heads", llama, SMALL,
                          runs_dir=tmp_path_factory.mktemp("runs"))


def test_a_runs_card_names_its_id_model_config_and_every_table(heads_run):
    card = heads_run._repr_html_()
    assert heads_run.id in card and "previous-token-heads" in card and "tiny-llama" in card
    assert "complete" in card
    for name in heads_run.table_names():
        entry = heads_run.meta.tables[name]
        assert f">{name}<" in card and f">{entry.rows}<" in card
    assert html.escape(HEAD_SCORES.meaning) in card  # the declared meaning of the table
    assert ", ".join(heads_run.table("head_scores").columns) in card
    # values off the defaults are marked (n_boot and the others SMALL changed), others not
    default = get("previous-token-heads").config()
    off = 'title="' + html.escape("off the experiment's default") + '">'
    for key, value in SMALL.items():
        assert (getattr(default, key) != value) == (f"{off}{value}</b>" in card)
    assert off in card and f"{off}0</b>" not in card  # seed 0 is the default


def test_a_failed_run_says_why_and_escapes_what_it_stored(runs_dir):
    store = RunStore(runs_dir)
    with pytest.raises(RuntimeError), store.start("previous-token-heads", None,
                                                  {"note": HOSTILE}) as active:
        raise RuntimeError(f"broke on {HOSTILE}")
    card = store.get(active.id)._repr_html_()
    assert HOSTILE not in card and html.escape(HOSTILE) in card
    assert "failed: " in card and "broke on" in card


def test_a_damaged_run_names_its_problem(runs_dir):
    store = RunStore(runs_dir)
    with store.start("previous-token-heads", None, Config(), tables={
            HEAD_CLASSES.name: HEAD_CLASSES}) as active:
        active.save_table(HEAD_CLASSES.name, HEAD_CLASSES.empty())
    run = store.get(active.id)
    table = run.path / run.meta.tables[HEAD_CLASSES.name].file
    table.write_bytes(table.read_bytes() + b"changed")
    card = store.get(active.id)._repr_html_()
    assert "damaged: checksum mismatch" in card and table.name in card
    (run.path / "run.json").write_text(json.dumps({"experiment": "x", "status": 3}))
    card = store.get(active.id)._repr_html_()
    assert "damaged" in card and store.get(active.id).meta.error in html.unescape(card)


def test_a_reproduce_runs_card_lists_its_verdicts(runs_dir):
    store = RunStore(runs_dir)
    claim = claims.load_claims()[0]
    row = {**claims._row(claim, "tiny"), "verdict": "pass", "measured": f"0.9 {HOSTILE}"}
    with store.start("reproduce", None, {"claims": [claim.id]},
                     tables=claims.tables(claims.CLAIMS_TABLE)) as active:
        active.save_table("claims", pd.DataFrame([row], columns=claims.VERDICT_COLUMNS))
    card = store.get(active.id)._repr_html_()
    assert claim.id in card and "<code>pass</code>" in card
    assert html.escape(f"0.9 {HOSTILE}") in card and HOSTILE not in card


def test_links_open_the_runs_page_of_the_serving_dashboard(heads_run, monkeypatch):
    assert "open in the dashboard" not in heads_run._repr_html_()
    monkeypatch.setenv(fhtml.DASHBOARD_ENV, "http://example.org:8050/")
    card = heads_run._repr_html_()
    assert f'href="http://example.org:8050/heads?run={heads_run.id}"' in card
    monkeypatch.delenv(fhtml.DASHBOARD_ENV)
    monkeypatch.setattr(fhtml, "DEFAULT_DASHBOARD", "http://127.0.0.1:9")  # nothing listens
    fhtml._probed.clear()
    assert fhtml.dashboard_url() is None


def test_a_recordings_card_shows_each_prompt_as_escaped_tokens(llama, tmp_path):
    texts = ["<b>bold</b> & the cat", "a quick brown fox"]
    rec = record(llama, [Prompt(text=t, label=f"p{i} {HOSTILE}") for i, t in enumerate(texts)],
                 tmp_path / "rec", store_dtype="float32")
    card = Recording.open(tmp_path / "rec")._repr_html_()
    assert str(rec.root) in card and "tiny-llama" in card and HOSTILE not in card
    assert html.escape(f"p0 {HOSTILE}") in card
    for prompt in range(len(rec)):
        for token in rec.tokens(prompt):
            assert f">{html.escape(token)}</span>" in card
    assert "<b>bold" not in card and "&lt;b&gt;" in "".join(html.escape(t) for t in
                                                            rec.tokens(0))


def test_a_models_card_says_what_it_is(llama):
    card = llama._repr_html_()
    info = llama.info
    for fact in (info.name, info.architecture, str(info.n_layers), str(info.d_model),
                 f"{info.n_heads} / {info.n_kv_heads}", str(info.n_ctx)):
        assert html.escape(fact) in card


def test_the_pages_register_the_library_page_map(tmp_path):
    from dashboards.app import create_app
    from dashboards.components import links

    create_app(tmp_path)
    registered = {p["path"]: list(p.get("experiments", ())) for p in dash.page_registry.values()}
    assert registered == {p.path: list(p.experiments) for p in pages.PAGES}
    orders = {p["path"]: p.get("order") for p in dash.page_registry.values()}
    assert orders == {p.path: p.order for p in pages.PAGES}
    for experiment in {e for p in pages.PAGES for e in p.experiments} | {"unknown-kind"}:
        assert links.page_for(experiment) == pages.page_for(experiment)
