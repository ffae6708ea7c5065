"""The Live page's switch and inputs: off on a host that is not loopback unless
``--allow-live``, ``--out`` on ``dashboard``, and the prompt text a callback accepts."""

from __future__ import annotations

import pytest

from dashboards.app import check_host, create_app, live_allowed, live_off
from dashboards.components import data
from dashboards.components.values import Passage, Refused
from workbench.cli import build_parser
from workbench.core.errors import WorkbenchError
from workbench.harness.live import LiveQueue


@pytest.mark.parametrize(("host", "allow", "on"), [
    ("127.0.0.1", False, True), ("localhost", False, True), ("::1", False, True),
    ("0.0.0.0", False, False), ("192.168.1.5", False, False), ("0.0.0.0", True, True)])
def test_the_live_page_is_on_only_on_loopback_or_when_allowed(host, allow, on):
    assert live_allowed(host, allow) is on


def test_off_the_page_says_why_and_how_to_turn_it_on(tmp_path):
    app = create_app(tmp_path, live=False, host="0.0.0.0")
    with app.server.app_context(), pytest.raises(WorkbenchError) as info:
        data.live_queue()
    text = str(info.value)
    assert "0.0.0.0" in text and "--allow-live" in text and "run a model" in text
    assert "\n" not in text and "--allow-live" in live_off("10.0.0.1")


def test_on_the_app_holds_one_queue_over_its_store(tmp_path):
    app = create_app(tmp_path, live=True)
    with app.server.app_context():
        queue = data.live_queue()
        assert isinstance(queue, LiveQueue) and queue.store.root == tmp_path
        assert data.live_queue() is queue


def test_the_warning_off_loopback_says_what_allow_live_means():
    assert check_host("127.0.0.1", debug=False, allow_live=True) is None
    assert "Live page is off (--allow-live serves it)" in check_host("0.0.0.0", False)
    allowed = check_host("0.0.0.0", False, allow_live=True)
    assert "anyone who reaches it can also run models on this machine" in allowed


@pytest.mark.parametrize("option", ["--out", "--runs"])
def test_dashboard_takes_out_as_the_same_as_runs(option):
    args = build_parser().parse_args(["dashboard", option, "some/store"])
    assert args.runs == "some/store" and args.allow_live is False
    assert build_parser().parse_args(["dashboard", "--allow-live"]).allow_live is True


def test_a_prompt_may_span_lines_but_holds_no_other_control_character():
    spec = Passage(max_chars=20)
    assert spec.check("prompt", "two\nlines\tand\r\n") == "two\nlines\tand\r\n"
    for bad in ["a\x00b", "x" * 21, 5, ["a"]]:
        with pytest.raises(Refused, match="prompt: expected text of at most 20 characters"):
            spec.check("prompt", bad)


@pytest.mark.parametrize(("argv", "on"), [
    (["--host", "0.0.0.0"], False), (["--host", "0.0.0.0", "--allow-live"], True),
    ([], True)])
def test_the_command_serves_the_live_page_as_its_host_and_flag_say(capsys, tmp_path,
                                                                   monkeypatch, argv, on):
    import dashboards.app as app_module
    from tests.tiny import cli

    served = []
    monkeypatch.setattr(app_module, "serve", lambda app, *args, **kwargs: served.append(app))
    status, out, _ = cli(capsys, "dashboard", "--out", str(tmp_path), *argv)
    assert status == 0 and str(tmp_path) in out[0]
    (app,) = served
    assert app.server.config["WORKBENCH_RUNS_DIR"] == str(tmp_path)
    assert (app.server.config["WORKBENCH_LIVE_OFF"] is None) is on
    assert ("workbench_live" in app.server.extensions) is on
    assert app.server.config["WORKBENCH_LIVE_DEVICE"] == "cpu"


def test_the_live_page_loads_on_the_dashboards_device(capsys, tmp_path, monkeypatch):
    import torch

    import dashboards.app as app_module
    from tests.tiny import cli

    served = []
    monkeypatch.setattr(app_module, "serve", lambda app, *args, **kwargs: served.append(app))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    status, out, err = cli(capsys, "dashboard", "--out", str(tmp_path), "--device", "cuda")
    assert status == 2 and not served and out == [] and err.count("\n") == 1
    assert "cuda: not available on this machine" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORKBENCH_DEVICE", "cuda:1")
    status, _, _ = cli(capsys, "dashboard", "--out", str(tmp_path))
    (app,) = served
    assert status == 0 and app.server.config["WORKBENCH_LIVE_DEVICE"] == "cuda:1"
    with app.server.app_context():
        assert data.live_device() == "cuda:1"
