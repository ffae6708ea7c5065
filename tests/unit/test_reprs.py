"""The notebook cards of runs, recordings and models (:func:`workbench.views.cards.card`,
which ``import workbench`` registers with IPython's HTML formatter): what each names, its
stored strings escaped, a failed or damaged run saying what is wrong, values off the
defaults marked, and links into the dashboard from the page map the pages register."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from types import SimpleNamespace

import dash
import pandas as pd
import pytest
from IPython.core.formatters import DisplayFormatter

import workbench
from experiments.previous_token_heads import Config
from experiments.previous_token_heads.tables import HEAD_CLASSES, HEAD_SCORES
from workbench.harness import claims
from workbench.harness.experiment import get, run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore
from workbench.views import html as fhtml
from workbench.views import pages
from workbench.views.cards import card as card_of

HOSTILE = "<script>alert(1)</script>"
SMALL = {"n_prompts": 2, "n_repeated": 2, "n_tokens": 16, "seq_len": 6, "n_boot": 20}


@pytest.fixture(autouse=True)
def no_dashboard(monkeypatch):
    monkeypatch.setenv(fhtml.DASHBOARD_ENV, "")


@pytest.fixture(scope="module")
def heads_run(llama, tmp_path_factory):
    return run_experiment("previous-token-heads", llama, SMALL,
                          runs_dir=tmp_path_factory.mktemp("runs"))


def test_a_runs_card_names_its_id_model_config_and_every_table(heads_run):
    card = card_of(heads_run)
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
    card = card_of(store.get(active.id))
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
    card = card_of(store.get(active.id))
    assert "damaged: checksum mismatch" in card and table.name in card
    (run.path / "run.json").write_text(json.dumps({"experiment": "x", "status": 3}))
    card = card_of(store.get(active.id))
    assert "damaged" in card and store.get(active.id).meta.error in html.unescape(card)


def test_a_reproduce_runs_card_lists_its_verdicts(runs_dir):
    store = RunStore(runs_dir)
    claim = claims.load_claims()[0]
    row = {**claims._row(claim, "tiny"), "verdict": "pass", "measured": f"0.9 {HOSTILE}"}
    with store.start("reproduce", None, {"claims": [claim.id]},
                     tables=claims.tables(claims.CLAIMS_TABLE)) as active:
        active.save_table("claims", pd.DataFrame([row], columns=claims.VERDICT_COLUMNS))
    card = card_of(store.get(active.id))
    assert claim.id in card and "<code>pass</code>" in card
    assert html.escape(f"0.9 {HOSTILE}") in card and HOSTILE not in card


def test_links_open_the_runs_page_of_the_serving_dashboard(heads_run, monkeypatch):
    assert "open in the dashboard" not in card_of(heads_run)
    monkeypatch.setenv(fhtml.DASHBOARD_ENV, "http://example.org:8050/")
    card = card_of(heads_run)
    assert f'href="http://example.org:8050/heads?run={heads_run.id}"' in card
    monkeypatch.delenv(fhtml.DASHBOARD_ENV)
    monkeypatch.setattr(fhtml, "DEFAULT_DASHBOARD", "http://127.0.0.1:9")  # nothing listens
    fhtml._probed.clear()
    assert fhtml.dashboard_url() is None


def test_a_recordings_card_shows_each_prompt_as_escaped_tokens(llama, tmp_path):
    texts = ["<b>bold</b> & the cat", "a quick brown fox"]
    rec = record(llama, [Prompt(text=t, label=f"p{i} {HOSTILE}") for i, t in enumerate(texts)],
                 tmp_path / "rec", store_dtype="float32")
    card = card_of(Recording.open(tmp_path / "rec"))
    assert str(rec.root) in card and "tiny-llama" in card and HOSTILE not in card
    assert html.escape(f"p0 {HOSTILE}") in card
    for prompt in range(len(rec)):
        for token in rec.tokens(prompt):
            assert f">{html.escape(token)}</span>" in card
    assert "<b>bold" not in card and "&lt;b&gt;" in "".join(html.escape(t) for t in
                                                            rec.tokens(0))


def test_a_models_card_says_what_it_is(llama):
    card = card_of(llama)
    info = llama.info
    for fact in (info.name, info.architecture, str(info.n_layers), str(info.d_model),
                 f"{info.n_heads} / {info.n_kv_heads}", str(info.n_ctx)):
        assert html.escape(fact) in card


def test_the_pages_register_the_library_page_map(tmp_path):
    from dashboards.app import create_app
    from dashboards.components import links

    create_app(tmp_path)
    registered = {p["path"]: list(p.get("experiments", ())) for p in dash.page_registry.values()}
    # the Compare page is offered for every kind it compares, and is no run's own page
    assert registered == {p.path: list(p.experiments) for p in pages.PAGES} | {
        "/compare": pages.compared()}
    orders = {p["path"]: p.get("order") for p in dash.page_registry.values()}
    assert orders == {p.path: p.order for p in pages.PAGES}
    assert len(set(orders.values())) == len(orders)  # one nav position a page
    for experiment in {e for p in pages.PAGES for e in p.experiments} | {"unknown-kind"}:
        assert links.page_for(experiment) == pages.page_for(experiment)


def test_ipython_shows_the_cards_of_runs_recordings_and_models(heads_run, llama):
    shell = SimpleNamespace(display_formatter=DisplayFormatter())
    assert workbench.show_cards(shell)
    for obj in (heads_run, llama):
        data, _ = shell.display_formatter.format(obj)
        assert data["text/html"] == card_of(obj)
    assert "text/html" not in shell.display_formatter.format(object())[0]


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return done.stdout.strip()


def test_import_workbench_registers_the_cards_in_a_running_shell_only():
    """A shell started before the import gets the cards by type name (nothing heavy is
    imported); a script imports no IPython, and an environment without it is fine."""
    started = _python("from IPython.core.interactiveshell import InteractiveShell\n"
                      "shell = InteractiveShell.instance()\n"
                      "import sys, workbench\n"
                      "html = shell.display_formatter.formatters['text/html']\n"
                      "print(sorted(n for m, n in html.deferred_printers if m.startswith("
                      "'workbench')), 'workbench.store.runs' in sys.modules)")
    assert started == "['Model', 'Recording', 'Run'] False"
    assert _python("import sys, workbench; print('IPython' in sys.modules)") == "False"
    assert _python("import sys; sys.modules['IPython'] = None\n"
                   "import workbench; print(workbench.show_cards())") == "False"


def test_a_card_is_refused_for_anything_else():
    with pytest.raises(TypeError, match="cards show a Run, a Recording or a Model"):
        card_of(object())
