"""The live queue: order, positions, one job at a time per model, cancelling, the model
cache, the bounded prompt, failed runs; and the scores of a live recording, against
hand-computed ones."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.harness import live
from workbench.harness.live import LiveQueue, ModelCache
from workbench.recording.reader import Recording
from workbench.store.runs import RunStore

TIMEOUT = 60


class Loader:
    """Hands out the tiny models by name, counting loads; a load waits for ``gate``."""

    def __init__(self, models: dict, gate: threading.Event | None = None) -> None:
        self.models, self.gate = models, gate
        self.started = threading.Event()
        self.calls: list[tuple[str, str]] = []

    def __call__(self, name, *, device, runs_dir):
        self.calls.append((name, device))
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT)
        if name not in self.models:
            raise WorkbenchError(f"cannot load {name}: no such weights")
        return self.models[name]


@pytest.fixture
def models(llama, bert):
    return {"tiny-llama": llama, "tiny-bert": bert, "tiny-llama-again": llama}


OPEN: list[LiveQueue] = []
"""The queues a test made, closed when it ends."""


@pytest.fixture(autouse=True)
def _queues_end_with_their_test():
    """A job still running after its test would share the tiny models with the next test's
    passes: every queue's jobs are cancelled and its workers ended before the next test."""
    yield
    queues = OPEN[:]
    OPEN.clear()
    assert all(queue.close(TIMEOUT) for queue in queues), "a live worker did not end"


def queue_of(tmp_path, loader, **kwargs) -> LiveQueue:
    queue = LiveQueue(tmp_path / "runs", loader=loader,
                      models=lambda: ["tiny-llama", "tiny-bert", "tiny-llama-again",
                                      "missing"], **kwargs)
    OPEN.append(queue)
    return queue


@pytest.fixture
def observed(monkeypatch):
    """Every recording's prompt text in the order it started, and the most recordings of
    one model that ever ran at once."""
    seen = {"order": [], "most": 0, "now": {}}
    lock = threading.Lock()
    original = live.record

    def watched(model, prompts, out, **kwargs):
        with lock:
            seen["order"].append(prompts[0].text)
            now = seen["now"][model.info.name] = seen["now"].get(model.info.name, 0) + 1
            seen["most"] = max(seen["most"], now)
        try:
            return original(model, prompts, out, **kwargs)
        finally:
            with lock:
                seen["now"][model.info.name] -= 1

    monkeypatch.setattr(live, "record", watched)
    return seen


def test_jobs_of_one_model_run_in_order_one_at_a_time(tmp_path, models, observed):
    gate = threading.Event()
    queue = queue_of(tmp_path, Loader(models, gate))
    loader = queue.cache.loader
    jobs = [queue.submit("tiny-llama", "prompt number 0")]
    assert loader.started.wait(TIMEOUT)  # the worker took the first job, waits at the gate
    jobs += [queue.submit("tiny-llama", f"prompt number {i}") for i in (1, 2)]
    assert [queue.status(j.id).position for j in jobs] == [0, 1, 2]
    assert queue.status(jobs[0].id).state == "running"
    gate.set()
    ended = [queue.wait(j.id, TIMEOUT) for j in jobs]
    assert [s.state for s in ended] == ["complete"] * 3
    assert observed["order"] == [f"prompt number {i}" for i in range(3)]
    assert observed["most"] == 1
    assert all(s.position is None for s in ended)


def test_another_model_does_not_wait_for_a_running_one(tmp_path, models, monkeypatch):
    gate, recording = threading.Event(), threading.Event()
    original = live.record

    def held(model, prompts, out, **kwargs):
        if prompts[0].text.startswith("a prompt that waits"):
            recording.set()
            assert gate.wait(TIMEOUT)
        return original(model, prompts, out, **kwargs)

    monkeypatch.setattr(live, "record", held)
    queue = queue_of(tmp_path, Loader(models))
    slow = queue.submit("tiny-llama", "a prompt that waits while it records")
    assert recording.wait(TIMEOUT)
    other = queue.submit("tiny-bert", "a prompt for another model")
    assert other.position == 1  # first in its own line
    assert queue.wait(other.id, TIMEOUT).state == "complete"
    assert queue.status(slow.id).state == "running"
    gate.set()
    assert queue.wait(slow.id, TIMEOUT).state == "complete"


def test_a_load_waits_for_another_models_load(tmp_path, models):
    """One model loads at a time, whichever line asks: first loads at once raced on
    transformers' lazy imports."""
    gate = threading.Event()
    loader = Loader(models, gate)
    queue = queue_of(tmp_path, loader)
    slow = queue.submit("tiny-llama", "a prompt whose model loads slowly")
    assert loader.started.wait(TIMEOUT)
    other = queue.submit("tiny-bert", "a prompt for another model")
    assert queue.wait(other.id, 0.3).state == "running"  # its load waits its turn
    assert loader.calls == [("tiny-llama", "cpu")]
    gate.set()
    assert queue.wait(other.id, TIMEOUT).state == "complete"
    assert queue.wait(slow.id, TIMEOUT).state == "complete"
    assert loader.calls == [("tiny-llama", "cpu"), ("tiny-bert", "cpu")]


def test_a_live_run_is_an_ordinary_record_run(tmp_path, models, llama):
    queue = queue_of(tmp_path, Loader(models))
    status = queue.wait(queue.submit("tiny-llama", "the cat  sat\non the mat").id, TIMEOUT)
    assert status.state == "complete" and status.error is None and status.seconds > 0
    run = RunStore(tmp_path / "runs").get(status.run_id)
    assert (run.status, run.experiment, run.model_name) == ("complete", "record", "tiny-llama")
    assert run.config["source"] == "live" and run.config["device"] == "cpu"
    rec = Recording.open(run.path)
    ids, _ = llama.encode(live.Prompt(text="the cat sat on the mat"))
    assert list(rec.prompts[0].token_ids) == ids


def test_cancelling_a_waiting_job_takes_it_out_of_the_line(tmp_path, models):
    gate = threading.Event()
    loader = Loader(models, gate)
    queue = queue_of(tmp_path, loader)
    queue.submit("tiny-llama", "prompt 0")
    assert loader.started.wait(TIMEOUT)
    second, third = (queue.submit("tiny-llama", f"prompt {i}") for i in (1, 2))
    assert queue.status(third.id).position == 2
    cancelled = queue.cancel(second.id)
    assert (cancelled.state, cancelled.position) == ("cancelled", None)
    assert "nothing was recorded" in cancelled.error and cancelled.run_id is None
    assert queue.status(third.id).position == 1  # next, behind the running first job
    gate.set()
    assert queue.wait(third.id, TIMEOUT).state == "complete"
    runs = RunStore(tmp_path / "runs").runs(status=None)
    assert len(runs) == 2 and all(r.status == "complete" for r in runs)


def test_cancelling_a_running_job_leaves_a_failed_run_saying_so(tmp_path, models):
    gate = threading.Event()
    loader = Loader(models, gate)
    queue = queue_of(tmp_path, loader)
    job = queue.submit("tiny-llama", "a prompt cancelled while its model loads")
    assert loader.started.wait(TIMEOUT)
    assert queue.cancel(job.id).state == "running"  # it stops at its next check
    gate.set()
    status = queue.wait(job.id, TIMEOUT)
    assert (status.state, status.error) == ("cancelled", live.CANCELLED)
    run = RunStore(tmp_path / "runs").get(status.run_id)
    assert run.status == "failed" and live.CANCELLED in run.meta.error


def test_a_forward_pass_stops_at_its_next_layer_once_cancelled(llama):
    cancel = threading.Event()
    ids = torch.tensor([[1, 5, 6, 7]])
    with live.cancellable(llama, cancel):
        llama.bridge(ids, return_type=None)  # not cancelled: runs through
        cancel.set()
        with pytest.raises(live.Cancelled):
            llama.bridge(ids, return_type=None)
    llama.bridge(ids, return_type=None)  # the hooks are gone after the block


def test_a_job_whose_model_fails_to_load_leaves_a_failed_run(tmp_path, models):
    queue = queue_of(tmp_path, Loader(models))
    status = queue.wait(queue.submit("missing", "any prompt").id, TIMEOUT)
    assert status.state == "failed" and "no such weights" in status.error
    run = RunStore(tmp_path / "runs").get(status.run_id)
    assert (run.status, run.experiment) == ("failed", "record")
    assert "no such weights" in run.meta.error and run.config["source"] == "live"


def test_the_cache_loads_a_model_once_and_drops_the_least_recently_used(tmp_path, models):
    loader = Loader(models)
    queue = queue_of(tmp_path, loader, kept=2)
    for name in ["tiny-llama", "tiny-llama", "tiny-bert", "tiny-llama", "tiny-llama-again",
                 "tiny-bert", "tiny-llama"]:
        assert queue.wait(queue.submit(name, "a short prompt").id, TIMEOUT).state == "complete"
    # kept: [llama], [llama], [llama bert], [bert llama], [llama again] drops bert,
    # bert drops llama, llama drops again
    assert [name for name, _ in queue.cache.loads] == [
        "tiny-llama", "tiny-bert", "tiny-llama-again", "tiny-bert", "tiny-llama"]
    assert loader.calls == queue.cache.loads


def test_a_device_is_passed_to_the_loader_and_keys_the_cache(models):
    loader = Loader(models)
    cache = ModelCache(loader, size=2)
    cache.get("tiny-llama", "cpu")
    cache.get("tiny-llama", "cpu")
    cache.get("tiny-llama", "meta")
    assert loader.calls == [("tiny-llama", "cpu"), ("tiny-llama", "meta")]


def test_a_prompt_beyond_the_bound_is_refused_in_one_line(tmp_path, models, llama):
    queue = queue_of(tmp_path, Loader(models), max_tokens=8)
    with pytest.raises(WorkbenchError, match="at most 8 tokens") as info:
        queue.submit("tiny-llama", "x" * (live.CHARS_PER_TOKEN * 8 + 1))
    assert "\n" not in str(info.value)
    long = " ".join(["the cat sat"] * 6)
    n = len(llama.encode(live.Prompt(text=long))[0])
    assert n > 8
    # the model is not loaded yet: the job is refused once it is, with no run
    status = queue.wait(queue.submit("tiny-llama", long).id, TIMEOUT)
    assert status.state == "refused" and f"is {n} tokens" in status.error
    assert status.run_id is None and RunStore(tmp_path / "runs").runs(status=None) == []
    # now it is loaded: refused at once
    with pytest.raises(WorkbenchError, match=f"is {n} tokens of tiny-llama.*at most 8"):
        queue.submit("tiny-llama", long)
    assert queue.wait(queue.submit("tiny-llama", "the cat").id, TIMEOUT).state == "complete"


def test_unknown_models_empty_prompts_and_a_full_queue_are_refused(tmp_path, models):
    gate = threading.Event()
    loader = Loader(models, gate)
    queue = queue_of(tmp_path, loader, max_waiting=2)
    with pytest.raises(UnknownNameError, match="known models: tiny-llama, tiny-bert"):
        queue.submit("gpt-5", "a prompt")
    with pytest.raises(WorkbenchError, match="empty"):
        queue.submit("tiny-llama", " \n\t ")
    with pytest.raises(WorkbenchError, match="no such live job"):
        queue.status("0123456789abcdef")
    queue.submit("tiny-llama", "one")
    assert loader.started.wait(TIMEOUT)
    queue.submit("tiny-llama", "two")
    queue.submit("tiny-llama", "three")  # the first left the line: two wait
    with pytest.raises(WorkbenchError, match="queue is full"):
        queue.submit("tiny-bert", "four")
    gate.set()


def test_known_models_are_the_bundled_ones_and_those_given(tmp_path, llama_folder):
    store = RunStore(tmp_path / "runs")
    with store.start("record", {**_info(str(tmp_path / "stored"))}, {}):
        pass
    bundled = live.zoo.MODELS.names()
    assert {"smollm2", "minilm", "gemma3"} <= set(bundled)
    assert live.known_models() == bundled  # never a model named by a stored run
    assert live.known_models([str(llama_folder), "minilm"]) == [*bundled, str(llama_folder)]
    with pytest.raises(WorkbenchError, match="gone"):
        live.known_models([str(tmp_path / "gone")])


def _info(name: str) -> dict:
    from tests.tiny import fake_info

    return fake_info(name).to_data()


def test_scores_of_a_live_recording_are_the_hand_computed_ones(tmp_path, models):
    queue = queue_of(tmp_path, Loader(models))
    status = queue.wait(queue.submit("tiny-llama", "a b c a b c a b").id, TIMEOUT)
    rec = Recording.open(RunStore(tmp_path / "runs").get(status.run_id).path)
    scores = live.pattern_scores(rec)
    n = rec.length(0)
    assert set(scores.metric) == {name for name, m in live.metrics.METRICS.items()
                                  if m.kind == "pattern"}
    assert len(scores) == rec.n_layers * rec.n_heads * scores.metric.nunique()
    by = scores.set_index(["metric", "layer", "head"]).score
    for layer in range(rec.n_layers):
        pattern = rec.pattern(0, layer).astype(np.float64)  # (H, Q, K)
        for head in range(rec.n_heads):
            first = pattern[head, :, 0].mean()
            previous = np.mean([pattern[head, q, q - 1] for q in range(1, n)])
            diagonal = np.mean([pattern[head, q, q] for q in range(n)])
            assert by["first_token", layer, head] == pytest.approx(first, abs=1e-5)
            assert by["previous_token", layer, head] == pytest.approx(previous, abs=1e-5)
            assert by["self_attention", layer, head] == pytest.approx(diagonal, abs=1e-5)
    prev = scores[scores.metric == "previous_token"]
    best = prev.loc[prev.score.idxmax()]
    assert live.opening_head(scores) == (best.layer, best["head"])
    with pytest.raises(UnknownNameError, match="no scores of metric 'sink'"):
        live.opening_head(scores, "sink")


def test_an_encoder_stops_at_its_next_layer_once_cancelled(bert):
    cancel = threading.Event()
    cancel.set()
    assert len(bert.bridge.blocks) == bert.info.n_layers
    with live.cancellable(bert, cancel), pytest.raises(live.Cancelled):
        bert.bridge(torch.tensor([[2, 5, 6, 3]]), return_type=None)


def test_closing_a_queue_cancels_its_jobs_and_ends_its_workers(tmp_path, models):
    gate = threading.Event()
    loader = Loader(models, gate)
    queue = queue_of(tmp_path, loader)
    running = queue.submit("tiny-llama", "a prompt whose model is loading")
    waiting = queue.submit("tiny-llama", "a prompt behind it")
    assert loader.started.wait(TIMEOUT)
    assert not queue.close(0.2)  # both cancelled; the worker is still loading the model
    gate.set()  # the load ends, and the running job meets its cancel before it records
    assert queue.close(TIMEOUT)
    assert {queue.status(j.id).state for j in (running, waiting)} == {"cancelled"}
