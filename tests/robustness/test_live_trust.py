"""The dashboard's trust boundary and the Live queue under several readers.

- Every request must name the server by a name it answers to (loopback, ``--host``,
  ``--allowed-hosts``), and a page's request must come from the dashboard's own origin:
  a DNS-rebinding page or a page elsewhere gets 403, and runs nothing.
- The Live page offers the bundled models and those given with ``--live-model``, never a
  model named in a stored ``run.json``.
- ``LiveQueue.submit`` checks its device as ``--device`` is checked, before a run exists.
- One model loads at a time, at most the cache's size are loading, loaded or in use, and
  a closed queue (the dashboard shut down) leaves failed runs that say why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from dashboards.app import create_app, foreign_request_problem, serve
from tests.dashboard_runs import callback_key, request_body
from tests.tiny import cli, fake_info
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.paths import REPO_ROOT
from workbench.harness import live
from workbench.harness.live import LiveQueue, ModelCache
from workbench.store.runs import RunStore

TIMEOUT = 600
"""A bound on a hang, never reached by a passing test."""
ATTACKER = "attacker.example"


@pytest.fixture
def live_app(tmp_path):
    return create_app(tmp_path / "runs", live=True)


def _submit_body(app) -> dict:
    """The Live page's Record click, for a model the queue does not offer (a request that
    gets through is answered by the queue's refusal: nothing loads)."""
    return request_body(app, callback_key(app, "live-job.data"),
                        {"live-submit.n_clicks": 1, "live-model.value": "no-such-model",
                         "live-text.value": "a prompt"})


# ---- the Host and Origin allow-list ----------------------------------------------------------

REFUSED_HOSTS = [ATTACKER, f"{ATTACKER}:8050", "localhost.attacker.example",
                 "127.0.0.1.nip.io", "evil", "192.168.1.5:8050", "0.0.0.0:8050", "",
                 "[::2]:8050"]


@pytest.mark.parametrize("host", REFUSED_HOSTS)
@pytest.mark.parametrize("path", ["/", "/live", "/_dash-layout", "/_dash-dependencies"])
def test_a_request_naming_another_host_is_refused(live_app, host, path):
    response = live_app.server.test_client().get(path, headers={"Host": host})
    assert response.status_code == 403
    text = response.get_data(as_text=True)
    assert text.startswith("refused: the server is not reached as") and text.count("\n") == 1
    assert "--allowed-hosts" in text


@pytest.mark.parametrize("host", ["127.0.0.1:8050", "localhost:8050", "LOCALHOST.:8050",
                                  "[::1]:8050", "127.0.0.2", "localhost"])
def test_a_request_naming_a_loopback_host_is_served(live_app, host):
    assert live_app.server.test_client().get("/", headers={"Host": host}).status_code == 200


def test_a_rebinding_page_cannot_run_a_live_job(live_app, tmp_path, monkeypatch):
    """The third trust round's case: Host and Origin both the attacker's, a Live job's
    callback posted; refused before Dash reads it, and no job exists."""
    client = live_app.server.test_client()
    assert client.get("/").status_code == 200  # registers the callbacks
    queue = live_app.server.extensions["workbench_live"]
    submitted = []
    monkeypatch.setattr(queue, "submit", lambda *a, **k: submitted.append(a))
    body = _submit_body(live_app)
    body["inputs"][0]["value"] = 1
    response = client.post("/_dash-update-component", json=body,
                           headers={"Host": ATTACKER, "Origin": f"http://{ATTACKER}"})
    assert response.status_code == 403
    assert submitted == [] and not (tmp_path / "runs").exists()
    # the same request from the dashboard's own page does reach the queue
    client.post("/_dash-update-component", json=body,
                headers={"Host": "127.0.0.1:8050", "Origin": "http://127.0.0.1:8050"})
    assert len(submitted) == 1


@pytest.mark.parametrize("origin", [f"http://{ATTACKER}", "http://localhost:3000",
                                    "http://127.0.0.1:8051", "null", "https://127.0.0.1:8050",
                                    "file://", "not a url"])
def test_a_post_from_a_page_of_another_origin_is_refused(live_app, origin):
    client = live_app.server.test_client()
    client.get("/", headers={"Host": "127.0.0.1:8050"})
    response = client.post("/_dash-update-component", json=_submit_body(live_app),
                           headers={"Host": "127.0.0.1:8050", "Origin": origin})
    assert response.status_code == 403
    assert "not from this dashboard, is refused" in response.get_data(as_text=True)
    assert live_app.server.extensions["workbench_live"]._jobs == {}


def test_the_dashboards_own_pages_and_tools_without_an_origin_are_served(live_app):
    client = live_app.server.test_client()
    headers = {"Host": "127.0.0.1:8050"}
    assert client.get("/", headers=headers).status_code == 200
    own = client.post("/_dash-update-component", json=_submit_body(live_app),
                      headers={**headers, "Origin": "http://127.0.0.1:8050"})
    assert own.status_code == 200  # the job is refused by the queue, not by the server
    assert client.get("/_dash-layout", headers=headers).status_code == 200  # curl, no Origin


@pytest.mark.parametrize(("host", "origin", "allowed", "refused"), [
    ("lab.example:8050", None, ["lab.example"], False),
    ("lab.example:8050", "http://lab.example:8050", ["lab.example"], False),
    ("127.0.0.1:8050", "https://lab.example", ["lab.example"], False),  # a proxy's Host
    ("other.example", None, ["lab.example"], True),
    ("127.0.0.1:8050", "https://other.example", ["lab.example"], True),
    ("10.1.2.3:8050", None, [], True),
])
def test_allowed_hosts_add_names_and_nothing_else(host, origin, allowed, refused):
    from dashboards.app import allowed_names

    problem = foreign_request_problem(host, origin, allowed_names("0.0.0.0", allowed),
                                      frozenset(allowed))
    assert (problem is not None) is refused, problem


def test_the_served_host_is_a_name_the_server_answers_to(tmp_path):
    app = create_app(tmp_path, host="10.1.2.3")
    assert app.server.test_client().get("/", headers={"Host": "10.1.2.3:8050"}
                                        ).status_code == 200
    every = create_app(tmp_path, host="0.0.0.0")  # every interface: no name of its own
    assert every.server.test_client().get("/", headers={"Host": "0.0.0.0:8050"}
                                          ).status_code == 403


@pytest.mark.parametrize("value", ["", "a b", "lab.example,", "0.0.0.0", "-x", "a/b",
                                   "host:80"])
def test_a_bad_allowed_host_is_refused_in_one_line(capsys, tmp_path, value):
    status, out, err = cli(capsys, "dashboard", "--out", str(tmp_path),
                           f"--allowed-hosts={value}")
    assert status == 2 and out == [] and err.count("\n") == 1
    assert "expected host names or addresses separated by commas" in err


def test_the_command_passes_allowed_hosts_and_live_models(capsys, tmp_path, monkeypatch,
                                                          llama_folder):
    import dashboards.app as app_module

    served = []
    monkeypatch.setattr(app_module, "serve", lambda app, *args, **kwargs: served.append(app))
    status, _, err = cli(capsys, "dashboard", "--out", str(tmp_path), "--allowed-hosts",
                         "lab.example,10.0.0.7", "--live-model", str(llama_folder))
    assert status == 0, err
    (app,) = served
    assert {"lab.example", "10.0.0.7"} <= app.server.config["WORKBENCH_ALLOWED_HOSTS"]
    models = app.server.extensions["workbench_live"].models()
    assert models[-1] == str(llama_folder) and "smollm2" in models


# ---- the Live page's models ------------------------------------------------------------------

def test_a_model_named_in_a_stored_run_is_never_offered(tmp_path, llama_folder):
    """A run.json whose model is a folder outside the store put that folder on the list,
    and it loaded; now only the zoo and --live-model are offered."""
    runs = tmp_path / "runs"
    with RunStore(runs).start("record", fake_info(str(llama_folder)), {}):
        pass
    app = create_app(runs, live=True)
    queue = app.server.extensions["workbench_live"]
    assert queue.models() == list(live.zoo.MODELS.names())
    with pytest.raises(UnknownNameError, match="known models: "):
        queue.submit(str(llama_folder), "a prompt")
    assert [r.experiment for r in RunStore(runs).runs(status=None)] == ["record"]  # no new


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "nowhere", "nowhere"),
    (lambda tmp: tmp, "is not a model"),
    (lambda tmp: (tmp / "file.txt").write_text("x") and tmp / "file.txt", "file.txt"),
])
def test_a_live_model_that_is_not_one_is_refused_before_serving(capsys, tmp_path, monkeypatch,
                                                                make, message):
    import dashboards.app as app_module

    served = []
    monkeypatch.setattr(app_module, "serve", lambda app, *args, **kwargs: served.append(app))
    status, out, err = cli(capsys, "dashboard", "--out", str(tmp_path / "runs"),
                           "--live-model", str(make(tmp_path)))
    assert status == 2 and not served and out == [] and err.count("\n") == 1, err
    assert err.startswith("error: ")


# ---- the device of a library call ------------------------------------------------------------

@pytest.mark.parametrize(("device", "message"), [
    ("cuda:99", "not available on this machine"), ("meta", "unknown device 'meta'"),
    ("bogus", "unknown device 'bogus'"), ("", "unknown device"), ("cuda:-1", "unknown device"),
])
def test_a_device_this_machine_lacks_is_refused_before_a_run_exists(tmp_path, device, message,
                                                                    monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loads = []
    queue = LiveQueue(tmp_path / "runs", loader=lambda *a, **k: loads.append(a),
                      models=lambda: ["tiny"])
    with pytest.raises(WorkbenchError, match=message) as info:
        queue.submit("tiny", "a prompt", device=device)
    assert "\n" not in str(info.value)
    assert loads == [] and queue._jobs == {} and not (tmp_path / "runs").exists()


# ---- several models and readers at once ------------------------------------------------------

class _Watched:
    """A loader whose loads take a while (so that two at once would overlap), counting the
    most that ever ran at once."""

    def __init__(self, models: dict) -> None:
        self.models = models
        self.loading = 0
        self.most_loading = 0
        self.lock = threading.Lock()

    def __call__(self, name, *, device, runs_dir):
        with self.lock:
            self.loading += 1
            self.most_loading = max(self.most_loading, self.loading)
        time.sleep(0.05)  # a load takes a while: a second one would overlap it
        with self.lock:
            self.loading -= 1
        return self.models[name]


def test_four_models_at_once_load_one_at_a_time_and_keep_at_most_two(tmp_path, llama, bert,
                                                                     monkeypatch):
    models = {"a": llama, "b": bert, "c": llama, "d": bert}
    loader = _Watched(models)
    queue = LiveQueue(tmp_path / "runs", loader=loader, models=lambda: list(models), kept=2)
    alive: list[int] = []
    record = live.record

    def watched(model, prompts, out, **kwargs):
        with queue.cache._changed:
            alive.append(len(queue.cache._models) + (queue.cache._loading is not None))
        return record(model, prompts, out, **kwargs)

    monkeypatch.setattr(live, "record", watched)
    jobs = [queue.submit(name, f"the prompt of reader {i}")
            for i, name in enumerate([*models, *models])]
    ended = [queue.wait(job.id, TIMEOUT) for job in jobs]
    assert queue.close(TIMEOUT)
    assert [status.state for status in ended] == ["complete"] * 8
    assert loader.most_loading == 1
    assert max(alive) <= 2


def test_a_cache_never_drops_a_model_in_use(llama, bert):
    cache = ModelCache(lambda name, **kw: {"a": llama, "b": bert}[name], size=1)
    taken = threading.Event()
    with cache.using("a", "cpu") as model:
        assert model is llama
        other = threading.Thread(target=lambda: (cache.get("b", "cpu"), taken.set()))
        other.start()
        assert not taken.wait(0.3)  # b waits: a is in use and the cache keeps one
        assert cache.peek("a", "cpu") is llama
    assert taken.wait(TIMEOUT)
    other.join(TIMEOUT)
    assert cache.peek("a", "cpu") is None and cache.peek("b", "cpu") is bert


def test_two_real_models_load_at_once_in_a_fresh_process(tmp_path, llama_folder, bert_hf,
                                                        bert_tokenizer):
    """The third trust round's case: a fresh dashboard process, a causal model's job and
    an encoder's at once; the first loads raced on transformers' lazy imports."""
    from tests.tiny import save_folder

    encoder = save_folder(bert_hf, bert_tokenizer, tmp_path / "bert")
    script = (
        "import json, sys\n"
        "from workbench.harness.live import LiveQueue\n"
        "folders = sys.argv[2:]\n"
        "queue = LiveQueue(sys.argv[1], models=lambda: folders)\n"
        "jobs = [queue.submit(f, 'the cat sat on the mat') for f in folders]\n"
        f"print(json.dumps([queue.wait(j.id, {TIMEOUT}).state for j in jobs]))\n"
        f"queue.close({TIMEOUT})\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "runs"),
                           str(llama_folder), str(encoder)], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["complete", "complete"]


# ---- shutting down ---------------------------------------------------------------------------

class _Held:
    """A loader whose load waits until the test lets it go."""

    def __init__(self, model) -> None:
        self.model, self.go, self.started = model, threading.Event(), threading.Event()

    def __call__(self, name, *, device, runs_dir):
        self.started.set()
        assert self.go.wait(TIMEOUT)
        return self.model


def test_a_closed_queue_refuses_jobs_and_its_running_run_says_why(tmp_path, llama):
    loader = _Held(llama)
    queue = LiveQueue(tmp_path / "runs", loader=loader, models=lambda: ["tiny"])
    running = queue.submit("tiny", "a prompt whose model is loading")
    waiting = queue.submit("tiny", "a prompt behind it")
    assert loader.started.wait(TIMEOUT)
    assert not queue.close(0.1, "the dashboard was shut down")
    loader.go.set()
    assert queue.close(TIMEOUT)
    ran, left = queue.status(running.id), queue.status(waiting.id)
    assert ran.state == left.state == "cancelled"
    assert ran.error == "the dashboard was shut down"
    assert left.error == "the dashboard was shut down before it started; nothing was recorded"
    with pytest.raises(WorkbenchError, match=r"the live queue is closed \(the dashboard was "
                                             r"shut down\)"):
        queue.submit("tiny", "one more")


def test_a_job_recording_when_the_queue_closes_leaves_a_failed_run_saying_why(tmp_path,
                                                                              llama,
                                                                              monkeypatch):
    queue = LiveQueue(tmp_path / "runs", loader=lambda *a, **k: llama,
                      models=lambda: ["tiny"])
    recording, record = threading.Event(), live.record

    def slow(model, prompts, out, **kwargs):
        recording.set()
        live_job = next(iter(queue._jobs.values()))
        assert live_job.cancel.wait(TIMEOUT)  # the forward pass starts after the close
        return record(model, prompts, out, **kwargs)

    monkeypatch.setattr(live, "record", slow)
    job = queue.submit("tiny", "a prompt")
    assert recording.wait(TIMEOUT)
    assert queue.close(TIMEOUT, "the dashboard was shut down")
    status = queue.status(job.id)
    assert status.state == "cancelled" and status.run_id
    run = RunStore(tmp_path / "runs").get(status.run_id)
    assert run.status == "failed" and "the dashboard was shut down" in run.meta.error


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit, RuntimeError])
def test_serving_closes_the_live_queue_on_every_way_out(tmp_path, monkeypatch, stop):
    app = create_app(tmp_path, live=True)
    queue = app.server.extensions["workbench_live"]
    monkeypatch.setattr(app, "run", lambda *a, **k: (_ for _ in ()).throw(stop()))
    with pytest.raises(stop):
        serve(app, "127.0.0.1", 8050)
    with pytest.raises(WorkbenchError, match="the live queue is closed"):
        queue.submit("smollm2", "a prompt")
