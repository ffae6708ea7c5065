"""The notebook's figures are the pages' figures: ``workbench.figure(run, ...)``,
``workbench.show_pattern`` and ``workbench.show_long`` against what the page's own callback
returns for the same run and the same choices, compared as Plotly JSON; names and options
the figures do not know are refused in one line; the long-context overview reaches the
notebook pooled; the old method names still draw the same figures, with a warning."""

from __future__ import annotations

import json
import sys

import dash
import plotly.utils
import pytest
from transformers import LlamaConfig, LlamaForCausalLM

import workbench
from tests import tiny
from tests.dashboard_runs import CONFIGS, FORMATION, TEXT
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.harness.experiment import get, run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording.reader import Recording
from workbench.recording.writer import record
from workbench.store.runs import RunStore
from workbench.views import catalog
from workbench.views.catalog import figure
from workbench.views.patterns import show_long, show_pattern

EXPERIMENTS = ("induction-heads", "head-pruning", "qk-attribution")


@pytest.fixture(scope="module")
def runs(llama, tmp_path_factory):
    """One tiny run of each experiment whose figures a notebook draws, and a recording."""
    root = tmp_path_factory.mktemp("figure-runs")
    made = {name: run_experiment(name, llama, CONFIGS[name], runs_dir=root)
            for name in EXPERIMENTS}
    text = root / "text.txt"
    text.write_text("\n\n".join(f"{i}: {TEXT}" for i in range(40)))
    made["induction-formation"] = run_experiment(
        "induction-formation", None, {**FORMATION, "text_files": (str(text),)}, runs_dir=root)
    made["record"] = record_run(llama, RunStore(root), PROMPTS)
    return root, made


PROMPTS = ["the cat sat on the mat <b>bold</b> & dog", "a quick brown fox"]


def record_run(model, store, texts):
    """A ``record`` run of ``texts``, as ``workbench record`` writes one."""
    with store.start("record", model.info, {"source": "text", "n_prompts": len(texts)}) as run:
        record(model, [Prompt(text=t) for t in texts], run.dir / "recording",
               store_dtype="float32")
    return store.get(run.id)


@pytest.fixture(scope="module")
def app(runs):
    from dashboards.app import create_app

    return create_app(runs[0])


def page(path: str):
    """The page module as Dash imported it (importing it again would register it twice)."""
    (name,) = [p["module"] for p in dash.page_registry.values() if p["path"] == path]
    return sys.modules[name]


def same(a, b) -> bool:
    """Two figures (or their dicts) are the same Plotly JSON."""
    def text(fig) -> str:
        data = fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else fig
        return json.dumps(data, cls=plotly.utils.PlotlyJSONEncoder, sort_keys=True)
    return text(a) == text(b)


def test_head_scores_is_the_heads_pages_heatmap(runs, app):
    run = runs[1]["induction-heads"]
    heads = page("/heads")
    metrics = list(dict.fromkeys(run.table("head_scores").metric))
    with app.server.app_context():
        for metric in metrics:
            drawn = heads.draw_run(run.id, metric, 10, None, None, None)[0]
            assert same(figure(run, "head_scores", metric=metric), drawn)
    mine = figure(run, "head_scores", metric="induction")
    assert "induction" in mine.layout.title.text and run.model_name in mine.layout.title.text
    # each head's interval is on hover: the customdata holds ci_low, ci_high by hand
    scores = run.table("head_scores")
    row = scores[scores.metric == "induction"].iloc[0]
    cell = mine.data[0].customdata[int(row.layer)][int(row["head"])]
    assert list(cell) == pytest.approx([row.ci_low, row.ci_high])
    assert same(figure(run, "head_scores"), figure(run, "head_scores", metric=metrics[0]))


def test_pruning_curve_is_the_pruning_pages(runs, app):
    run = runs[1]["head-pruning"]
    pruning = page("/pruning")
    with app.server.app_context():
        for metric in dict.fromkeys(run.table("pruning_curve").metric):
            assert same(figure(run, "pruning_curve", metric=metric),
                        pruning.draw_curves(run.id, metric))


def test_formation_figures_are_the_formation_pages(runs, app):
    run = runs[1]["induction-formation"]
    formation = page("/formation")
    with app.server.app_context():
        for model in run.table("phase_change").model:
            assert same(figure(run, "formation_curves", model=model),
                        formation.draw_curves(run.id, model)[0])
            assert same(figure(run, "formation_heads", model=model),
                        formation.draw_heads(run.id, model))
        opened = formation.choose_run(run.id)[1]  # the model the page opens on
    assert same(figure(run, "formation_curves"), figure(run, "formation_curves", model=opened))


def test_the_why_pages_bars(runs, app):
    run = runs[1]["qk-attribution"]
    why = page("/why")
    scores = run.table("scores")
    first = scores.sort_values(["layer", "head"]).iloc[0]
    layer, head = int(first.layer), int(first["head"])
    label = f"L{layer}H{head}"
    prompt = int(scores[(scores.layer == layer) & (scores["head"] == head)].prompt.min())
    with app.server.app_context():
        queries = why.choose_query(run.id, label, prompt)[0]
        for query in [q["value"] for q in queries]:
            _, key, query_side, _ = why.draw_pair(run.id, label, prompt, query)
            assert same(figure(run, "qk_pair", head=label, prompt=prompt, query=query), key)
            assert same(figure(run, "qk_pair", head=label, prompt=prompt, query=query,
                                   side="query"), query_side)
        assert same(figure(run, "qk_attribution", head=label),
                    why.draw_aggregate(run.id, label))
    # each bar is a component's part: the bars add up to the pair's score (an invariant)
    bars = figure(run, "qk_pair", head=label, prompt=prompt, query=queries[0]["value"])
    pair = scores[(scores.layer == layer) & (scores["head"] == head)
                  & (scores.prompt == prompt) & (scores.query_pos == queries[0]["value"])]
    assert sum(bars.data[0].y) == pytest.approx(float(pair.score.mean()), rel=1e-3, abs=1e-4)


def test_show_pattern_is_the_recording_pages_heatmap(runs, app):
    run = runs[1]["record"]
    rec = Recording.open(run.path)
    recording, long_context = page("/recording"), page("/long-context")
    with app.server.app_context():
        for layer, head, scale in ((0, 0, "linear"), (1, 3, "log")):
            assert same(show_pattern(rec, 0, layer, head, scale=scale),
                        recording.draw_pattern(run.id, 0, layer, head, scale))
            assert same(show_long(rec, 1, layer, head, pooling="sum", scale=scale),
                        long_context.draw_overview(run.id, 1, layer, head, "sum", scale))
        assert same(show_long(rec, 0, 1, 2), long_context.draw_overview(run.id, 0, 1, 2, "max",
                                                                        "log"))
    fig = show_pattern(rec, 0, 1, 2)
    assert fig.data[0].z.shape == (rec.length(0), rec.length(0))
    assert [label.split(": ", 1)[1] for label in fig.data[0].x] == [repr(t)[:24 - len(
        f"{i}: ")] for i, t in enumerate(rec.tokens(0))]


def test_unknown_figures_and_options_are_refused_in_one_line_listing_the_known(runs):
    run = runs[1]["induction-heads"]
    known = catalog.FIGURES.names()
    with pytest.raises(UnknownNameError) as info:
        figure(run, "head_score")
    text = str(info.value)
    assert "\n" not in text and all(name in text for name in known)
    assert "did you mean 'head_scores'" in text
    with pytest.raises(WorkbenchError) as info:
        figure(run, "head_scores", metrc="induction")
    text = str(info.value)
    assert "\n" not in text and "'metrc'" in text and "its options: metric" in text
    assert all(name in text for name in known)
    with pytest.raises(WorkbenchError, match="metric 'nope' is not among the run's metrics: "):
        figure(run, "head_scores", metric="nope")
    with pytest.raises(WorkbenchError, match="reads table 'pruning_curve', which run"):
        figure(run, "pruning_curve")
    with pytest.raises(WorkbenchError, match="its figure is 'formation_heads'"):
        figure(runs[1]["induction-formation"], "head_scores")
    with pytest.raises(WorkbenchError, match="side 'both' is not among the sides"):
        figure(runs[1]["qk-attribution"], "qk_pair", side="both")


def test_the_catalog_reads_the_tables_its_experiments_declare():
    """The catalog names tables by their stored names: each is a declared table of every
    experiment whose page draws the figure (a renamed table fails here)."""
    shown_by = {"/heads": ["induction-heads", "previous-token-heads"],
                "/pruning": ["head-pruning"], "/formation": ["induction-formation"],
                "/why": ["qk-attribution"]}
    for name, entry in catalog.FIGURES.items():
        for experiment in shown_by[entry.page]:
            assert set(entry.tables) <= set(get(experiment).tables), (name, experiment)


def test_show_long_pools_a_long_recording_to_screen_resolution(tokenizer, tmp_path):
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=2048, bos_token_id=0, eos_token_id=1,
                      pad_token_id=3, attn_implementation="eager")
    model = tiny.wrap(LlamaForCausalLM(cfg).eval(), tokenizer, "tiny-long")
    n = 1500
    rec = record(model, [Prompt(token_ids=tuple(10 + i % 200 for i in range(n)))],
                 tmp_path / "rec", include_resid=False, patterns="topk", topk=8)
    fig = show_long(rec, 0, 0, 1, pooling="max")
    z = fig.data[0].z
    assert len(z) <= 512 and len(z[0]) <= 512 and len(z) * 512 >= n  # pooled, all of it
    assert len(fig.data[0].x) == len(z[0]) and len(fig.data[0].y) == len(z)
    small = show_long(rec, 0, 0, 1, pooling="sum", cells=64)
    assert max(len(small.data[0].z), len(small.data[0].z[0])) <= 64
    with pytest.raises(WorkbenchError, match="pooling must be max or sum, got 'mean'"):
        show_long(rec, 0, 0, 1, pooling="mean")
    with pytest.raises(WorkbenchError, match="colour scale must be one of linear, log, power"):
        show_pattern(rec, 0, 0, 1, scale="cubic")
    with pytest.raises(WorkbenchError, match=r"head 2 is out of range 0\.\.1"):
        show_pattern(rec, 0, 0, 2)
    with pytest.raises(WorkbenchError, match="layer must be a whole number, got '0'"):
        show_long(rec, 0, "0", 1)


def test_the_old_method_names_warn_and_draw_the_same_figures(runs):
    run = runs[1]["induction-heads"]
    assert workbench.figure is figure and workbench.show_pattern is show_pattern
    with pytest.warns(DeprecationWarning, match=r"use workbench\.figure\(run, name"):
        old = run.figure("head_scores", metric="induction")
    assert same(old, figure(run, "head_scores", metric="induction"))
    rec = Recording.open(runs[1]["record"].path)
    with pytest.warns(DeprecationWarning, match=r"use workbench\.show_pattern\(rec"):
        old = rec.show_pattern(0, 1, 2, scale="log")
    assert same(old, show_pattern(rec, 0, 1, 2, scale="log"))
    with pytest.warns(DeprecationWarning, match=r"use workbench\.show_long\(rec"):
        old = rec.show_long(0, 1, 2, "sum", scale="linear")
    assert same(old, show_long(rec, 0, 1, 2, "sum", scale="linear"))
