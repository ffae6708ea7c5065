"""Links between pages, ``?run=`` on every page, the Heads comparison on one colour scale,
the induction-heads and head-overview figures, and the figure and table exports, in
headless Chromium over runs made on the tiny models."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from tests.browser.conftest import as_array, download, figure, serve, stop
from workbench.harness.experiment import run_experiment
from workbench.inputs.prompts import Prompt
from workbench.recording.writer import record
from workbench.store.runs import RunStore

SMALL_HEADS = {"n_prompts": 4, "n_repeated": 4, "n_tokens": 32, "seq_len": 8, "n_boot": 50}
SMALL_INDUCTION = {"n_prompts": 4, "n_natural": 2, "n_random": 2, "icl_prompts": 2,
                   "copying_tokens": 20, "n_boot": 50, "seq_len": 8, "n_ablate": 1,
                   "n_track": 1}
# The page each kind of run opens in, written out here as docs/dashboard.md documents it.
PAGE_OF = {"record": "/recording", "head-overview": "/overview",
           "previous-token-heads": "/heads", "induction-heads": "/heads"}
# Every page that shows one kind of run, and the id prefix of its components.
PAGES = {"/recording": "recording", "/residual": "residual", "/heads": "heads",
         "/overview": "overview", "/sinks": "sinks", "/pruning": "pruning",
         "/formation": "formation", "/equivariance": "equivariance",
         "/long-context": "long-context", "/sweeps": "sweeps", "/why": "why"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, llama, bert):
    runs = tmp_path_factory.mktemp("runs")
    with RunStore(runs).start("record", llama.info, {"source": "test"}) as rec:
        record(llama, [Prompt(text="the cat sat on the mat")], rec.dir / "recording")
    made = {
        "record": RunStore(runs).get(rec.final),
        "head-overview": run_experiment("head-overview", llama, {"n_boot": 50}, runs_dir=runs),
        "previous-token-heads": run_experiment("previous-token-heads", llama, SMALL_HEADS,
                                               runs_dir=runs),
        "bert": run_experiment("previous-token-heads", bert, SMALL_HEADS, runs_dir=runs),
        "induction-heads": run_experiment("induction-heads", llama, SMALL_INDUCTION,
                                          runs_dir=runs),
    }
    proc, url = serve(runs)
    yield url, made
    stop(proc)


def server_errors(page) -> list[str]:
    """Collects every response of the page with an HTTP status of 500 or more."""
    errors: list[str] = []
    page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500
            else None)
    return errors


def grid(scores: pd.DataFrame, metric: str) -> np.ndarray:
    df = scores[scores.metric == metric]
    out = np.full((int(df.layer.max()) + 1, int(df["head"].max()) + 1), np.nan)
    out[df["layer"], df["head"]] = df["score"]
    return out


def test_every_run_row_opens_the_page_that_shows_it(page, served):
    url, made = served
    page.goto(url)
    page.wait_for_selector("#runs-table td")
    for key, run in made.items():
        kind = run.experiment
        row = page.locator("#runs-table tbody tr").filter(has_text=run.id)
        link = row.get_by_role("link", name="open")
        assert link.get_attribute("href") == f"{PAGE_OF[kind]}?run={run.id}", key
    run = made["head-overview"]
    page.locator("#runs-table tbody tr").filter(has_text=run.id).get_by_role(
        "link", name="open").click()
    page.wait_for_url(f"**/overview?run={run.id}")
    figure(page, "overview-heatmap", title_contains="normalized_entropy")
    assert run.id[-4:] in page.inner_text("#overview-run")


def test_the_runs_page_selects_the_run_in_its_url(page, served):
    url, made = served
    run = made["bert"]
    page.goto(f"{url}/?run={run.id}")
    page.wait_for_selector("#runs-detail h3")
    assert page.inner_text("#runs-detail h3") == run.id
    assert "open in Heads" in page.inner_text("#runs-detail")


@pytest.mark.parametrize("key", ["record", "head-overview", "previous-token-heads",
                                 "induction-heads"])
def test_every_page_of_a_run_opens_it_from_its_url(page, served, key):
    url, made = served
    run = made[key]
    older = {k: r for k, r in made.items() if r.experiment == run.experiment and k != key}
    page.goto(f"{url}{PAGE_OF[run.experiment]}?run={run.id}")
    prefix = PAGES[PAGE_OF[run.experiment]]
    page.wait_for_selector(f"#{prefix}-run")
    shown = page.inner_text(f"#{prefix}-run")
    assert run.id[-4:] in shown
    assert all(other.id[-4:] not in shown for other in older.values())


@pytest.mark.parametrize("path", list(PAGES))
def test_a_bad_run_in_the_url_says_so_on_every_page(page, served, path):
    url, made = served
    errors = server_errors(page)
    page.goto(f"{url}{path}?run=no-such-run")
    page.wait_for_selector("main .wb-error")
    assert "no such run 'no-such-run'" in page.inner_text("main .wb-error")
    assert page.locator("main .js-plotly-plot").count() == 0  # no empty axes
    assert not errors
    wrong = made["bert"] if path != "/heads" else made["head-overview"]
    page.goto(f"{url}{path}?run={wrong.id}")
    page.wait_for_selector("main .wb-error")
    text = page.inner_text("main .wb-error")
    assert f"is a {wrong.experiment} run; this page shows" in text, text
    assert page.locator("main .js-plotly-plot").count() == 0
    assert not errors


def test_a_bad_run_on_the_runs_page_says_so(page, served):
    url, _ = served
    page.goto(f"{url}/?run=no-such-run")
    page.wait_for_selector("#runs-error .wb-error")
    assert "no such run 'no-such-run'" in page.inner_text("#runs-error")


def test_compared_heatmaps_share_one_colour_scale_and_show_the_difference(page, served):
    url, made = served
    run, other = made["previous-token-heads"], made["bert"]
    page.goto(f"{url}/heads?run={run.id}&compare={other.id}")
    mine = figure(page, "heads-heatmap", title_contains="previous_token")["data"][0]
    theirs = figure(page, "heads-compare-heatmap", title_contains="(compared)")["data"][0]
    a, b = grid(run.table("head_scores"), "previous_token"), grid(
        other.table("head_scores"), "previous_token")
    low, high = min(np.nanmin(a), np.nanmin(b)), max(np.nanmax(a), np.nanmax(b))
    for trace in (mine, theirs):
        assert trace["zmin"] == pytest.approx(low) and trace["zmax"] == pytest.approx(high)
    diff = figure(page, "heads-difference", title_contains="minus")["data"][0]
    np.testing.assert_allclose(as_array(diff["z"]), a - b, atol=1e-9)
    assert diff["zmin"] == pytest.approx(-diff["zmax"])  # centred on no difference
    assert "different models (tiny-llama and tiny-bert)" in page.inner_text(
        "#heads-compare-note")


def test_comparing_a_metric_the_other_run_lacks_offers_the_shared_ones(page, served):
    url, made = served
    run, other = made["induction-heads"], made["bert"]
    page.goto(f"{url}/heads?run={run.id}&compare={other.id}")
    figure(page, "heads-heatmap", title_contains="induction ·")
    page.wait_for_selector("#heads-compare-note .wb-error")
    note = page.inner_text("#heads-compare-note")
    assert f"run {other.id} (previous-token-heads) has no induction" in note
    shared = sorted(set(run.table("head_scores").metric) & set(other.table("head_scores").metric))
    buttons = page.locator("#heads-compare-note button").all_inner_texts()
    assert sorted(buttons) == shared
    assert page.locator("#heads-compare-heatmap-panel").is_hidden()
    page.locator("#heads-compare-note button", has_text="previous_token").click()
    figure(page, "heads-heatmap", title_contains="previous_token ·")
    figure(page, "heads-compare-heatmap", title_contains="previous_token · tiny-bert")


def test_induction_runs_plot_repeat_loss_icl_and_ablation(page, served):
    url, made = served
    run = made["induction-heads"]
    page.set_viewport_size({"width": 1280, "height": 1100})  # a laptop's browser window
    page.goto(f"{url}/heads?run={run.id}")
    repeat = figure(page, "heads-repeat-loss", title_contains="loss on each repeat")
    table = run.table("repeat_loss").sort_values("repeat")
    np.testing.assert_allclose(as_array(repeat["data"][0]["y"]), table.loss, rtol=1e-6)
    icl = figure(page, "heads-icl", title_contains="in-context learning")
    title, plot = within(page, "heads-icl")  # the whole title is drawn inside the figure
    assert plot["left"] <= title["left"] and title["right"] <= plot["right"]
    assert plot["top"] <= title["top"]
    by_position = run.table("loss_by_position").sort_values("position")
    np.testing.assert_allclose(as_array(icl["data"][0]["y"]), by_position.loss, rtol=1e-6)
    exact = run.table("icl").set_index("metric").loc["icl_score"]
    np.testing.assert_allclose(as_array(icl["data"][1]["y"]),
                               [exact.loss_at_50, exact.loss_at_500], rtol=1e-6)
    ablation = figure(page, "heads-ablation", title_contains="K-composition")
    rows = run.table("ablation")
    random_zero = rows[(rows.condition == "random") & (rows.kind == "zero")]
    bar = next(t for t in ablation["data"] if t["name"] == "zero ablation"
               and t["xaxis"] == "x")
    assert list(bar["x"]) == ["previous-token", "random"]
    np.testing.assert_allclose(as_array(bar["y"])[1], random_zero.induction_tracked.mean(),
                               rtol=1e-6)


def test_the_path_patch_draws_each_path_and_lists_each_panels_traces(page, served):
    url, made = served
    run = made["induction-heads"]
    page.goto(f"{url}/heads?run={run.id}")
    # the previous-token heads out of only K, Q or V, against random draws
    patch = run.table("path_patch")
    drawn = figure(page, "heads-path-patch", title_contains="path patch")
    ours = next(t for t in drawn["data"] if t["name"] == "previous-token heads"
                and t["xaxis"] == "x")
    assert list(ours["x"]) == ["key", "query", "value"]
    want = patch[patch.condition == "previous-token"].set_index("path").induction_tracked
    np.testing.assert_allclose(as_array(ours["y"]), want.loc[["key", "query", "value"]],
                               rtol=1e-6)
    draws = patch[patch.condition == "random"].groupby("path").induction_tracked
    mean = next(t for t in drawn["data"] if t["name"].startswith("random") and
                t["xaxis"] == "x")
    np.testing.assert_allclose(as_array(mean["y"]), draws.mean().loc[list(mean["x"])],
                               rtol=1e-6)
    spread = as_array(mean["error_y"]["array"]) + as_array(mean["y"])
    np.testing.assert_allclose(spread, draws.max().loc[list(mean["x"])], rtol=1e-6)
    points = next(t for t in drawn["data"] if t["name"] == "one random draw"
                  and t["xaxis"] == "x")
    assert len(points["x"]) == int((patch.condition == "random").sum())
    # each panel lists what it draws in a legend of its own: the random draws' loss is
    # not measured, so the loss panel's legend names the previous-token heads alone
    assert patch[patch.condition == "random"].second_repeat_loss.isna().all()
    listed: dict[str, set[tuple[str, str]]] = {}
    for trace in drawn["data"]:
        if trace.get("showlegend", True):
            listed.setdefault(trace["xaxis"], set()).add(
                (trace.get("legend", "legend"), trace["name"]))
    assert {panel: {name for _, name in entries} for panel, entries in listed.items()} == {
        "x": {"previous-token heads", "random same-layer heads (mean)", "one random draw"},
        "x2": {"previous-token heads"}}
    legends = {panel: {legend for legend, _ in entries} for panel, entries in listed.items()}
    assert all(len(v) == 1 for v in legends.values()) and legends["x"] != legends["x2"]


def within(page, graph_id: str) -> tuple[dict, dict]:
    """The drawn boxes of ``graph_id``'s title and of its figure, in page pixels."""
    return page.evaluate("""(id) => {
        const box = (el) => { const r = el.getBoundingClientRect();
            return {left: r.left, right: r.right, top: r.top}; };
        const graph = document.querySelector(`#${id} .js-plotly-plot`);
        return [box(graph.querySelector('.gtitle')), box(graph.querySelector('.main-svg'))];
    }""", graph_id)


def test_previous_token_runs_hide_the_induction_section(page, served):
    url, made = served
    page.goto(f"{url}/heads?run={made['previous-token-heads'].id}")
    figure(page, "heads-heatmap", title_contains="previous_token")
    assert page.locator("#heads-induction").is_hidden()


def test_overview_page_draws_the_heatmap_and_the_layers(page, served):
    url, made = served
    run = made["head-overview"]
    page.goto(f"{url}/overview?run={run.id}")
    scores = run.table("head_scores")
    heatmap = figure(page, "overview-heatmap", title_contains="normalized_entropy")
    np.testing.assert_allclose(as_array(heatmap["data"][0]["z"]),
                               grid(scores, "normalized_entropy"), atol=1e-9)
    layers = figure(page, "overview-layers", title_contains="normalized_entropy by layer")
    mean = next(t for t in layers["data"] if t["name"] == "mean over heads")
    np.testing.assert_allclose(as_array(mean["y"]),
                               np.nanmean(grid(scores, "normalized_entropy"), axis=1),
                               rtol=1e-9)
    page.wait_for_selector("#overview-table td")
    n_heads = len(scores[scores.metric == "normalized_entropy"])
    assert page.locator("#overview-table tbody tr").count() == n_heads + 1  # and the header


def test_figures_export_as_png_and_svg_named_after_the_run(page, served):
    url, made = served
    run = made["head-overview"]
    page.goto(f"{url}/overview?run={run.id}")
    figure(page, "overview-heatmap", title_contains="normalized_entropy")
    box = "#overview-heatmap-panel .wb-export-button"
    name, body = download(page, f"{box}:text-is('SVG')")
    assert name == f"{run.id}-overview-heatmap.svg"
    assert body.lstrip().startswith(b"<svg") and b"normalized_entropy" in body
    name, body = download(page, f"{box}:text-is('PNG')")
    assert name == f"{run.id}-overview-heatmap.png"
    assert body[:8] == b"\x89PNG\r\n\x1a\n"
    # Plotly's own camera button saves under the same name
    config = page.evaluate("() => document.querySelector('#overview-heatmap .js-plotly-plot')"
                           "._context.toImageButtonOptions")
    assert config == {"format": "png", "filename": f"{run.id}-overview-heatmap", "scale": 2}


def test_a_table_downloads_as_csv_and_parquet(page, served):
    url, made = served
    run = made["head-overview"]
    first = run.table_names()[0]  # the first of the run's tables, chosen by default
    page.goto(f"{url}/overview?run={run.id}")
    page.wait_for_function(  # the run's tables have been listed, the first one chosen
        f"() => (document.querySelector('.wb-download')?.innerText || '').includes('{first}')")
    expected = run.table(first)
    name, body = download(page, ".wb-download button:text-is('CSV')")
    assert name == f"{run.id}-{first}.csv"
    pd.testing.assert_frame_equal(pd.read_csv(io.BytesIO(body)), expected,
                                  check_dtype=False, check_exact=False)
    name, body = download(page, ".wb-download button:text-is('Parquet')")
    assert name == f"{run.id}-{first}.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(io.BytesIO(body)), expected)


@pytest.mark.parametrize(("path", "key", "graphs"), [
    ("/residual", "record", 2), ("/overview", "head-overview", 2),
    ("/heads", "induction-heads", 8), ("/", "bert", 0)])
def test_every_page_offers_exports_and_downloads(page, served, path, key, graphs):
    url, made = served
    run = made[key]
    page.goto(f"{url}{path}?run={run.id}")
    page.wait_for_selector(".wb-download button:text-is('Parquet')")
    assert page.locator(".wb-figure .wb-export-button").count() == 2 * graphs  # PNG, SVG
    tables = run.table_names()
    want = tables[0] if tables else "this run has no tables"
    page.wait_for_function(
        f"() => (document.querySelector('.wb-download')?.innerText || '').includes('{want}')")
