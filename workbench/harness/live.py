"""Live recordings: a reader's own prompt, recorded while they wait.

The dashboard's Live page hands a prompt and a model to a :class:`LiveQueue`, which
records it with :func:`workbench.recording.writer.record` into an ordinary ``record`` run
of the store (its config says ``source: live``), through the store's run lifecycle, so the
run reopens on the Recording page and is shared by its id like any other. The queue:

- refuses, in one line and before anything runs, an empty prompt, one longer than
  :data:`MAX_TOKENS` tokens (counted at once when the model is loaded, else before its run
  starts), a model the store does not know (:func:`known_models`), and a job beyond
  :data:`MAX_WAITING` waiting ones;
- runs one job at a time per model (and device), in its order of arrival, on a worker
  thread per model, and tells each job its position in its model's line;
- cancels a waiting job at once (nothing is recorded), and a running one at the next
  layer its forward pass enters; a cancelled or failed job that had left the line leaves
  a failed run saying why;
- loads each model once and keeps the :data:`MODELS_KEPT` most recently used
  (:class:`ModelCache`).

:func:`pattern_scores` turns a recorded prompt into every pattern metric of
:mod:`workbench.scores.metrics` per head, and :func:`opening_head` picks the head a page
opens on.

Examples:
    >>> queue = LiveQueue("data/runs")                                   # doctest: +SKIP
    >>> job = queue.submit("smollm2", "When Mary and John went to the store")  # doctest: +SKIP
    >>> queue.wait(job.id, timeout=120).run_id                           # doctest: +SKIP
    '20260101-120000-record-smollm2-ab12'
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from workbench.core.devices import check_device
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.values import shown
from workbench.inputs.prompts import CHARS_PER_TOKEN, Prompt
from workbench.models import reference, zoo
from workbench.models.base import Model
from workbench.recording.reader import Recording
from workbench.recording.reductions import PatternContext
from workbench.recording.writer import record
from workbench.scores import metrics
from workbench.store.runs import RunStore

log = logging.getLogger(__name__)

MAX_TOKENS = 256
"""The longest prompt a live job records, in the model's tokens (its framing included)."""
MAX_WAITING = 16
"""Jobs that may wait at once, over every model; one more is refused."""
MODELS_KEPT = 2
"""Loaded models kept in memory; the least recently used one goes first."""
SOURCE = "live"
"""The ``source`` of a live run's config (``workbench record`` writes ``text``, ...)."""
DEFAULT_METRIC = "previous_token"
"""The metric whose best head a page opens on: every model has previous-token heads, on
any prompt (an induction head needs a repeat, a sink is in most heads)."""
CANCELLED = "cancelled by the reader"
KEPT_JOBS = 256
"""Finished jobs whose status is still answered; older ones are forgotten."""

JobState = Literal["queued", "running", "complete", "failed", "refused", "cancelled"]
Loader = Callable[..., Model]
"""``loader(name, device=..., runs_dir=...) -> Model``: :func:`load_model` by default."""


class Cancelled(Exception):
    """The reader cancelled the job while it ran."""


@dataclass(frozen=True)
class JobStatus:
    """What a reader is told of one job.

    Attributes:
        id: the job's id (unguessable: only its submitter learns it).
        model: the model reference it records with.
        state: ``queued``, ``running``, then ``complete``, ``failed`` (a run says why),
            ``refused`` (bad input found once the model was loaded; no run) or
            ``cancelled``.
        position: 1 for the next job of its model, 2 for the one after, ...; 0 while it
            runs; ``None`` once it ended.
        stage: what a running job is doing.
        run_id: its run, once one was started.
        error: why it failed, was refused or was cancelled (one line).
        seconds: from submission to its end (``None`` before).
    """

    id: str
    model: str
    state: JobState
    position: int | None
    stage: str = ""
    run_id: str | None = None
    error: str | None = None
    seconds: float | None = None

    @property
    def done(self) -> bool:
        return self.state not in ("queued", "running")


@dataclass(eq=False)
class _Job:
    id: str
    model: str
    device: str
    prompt: Prompt
    submitted: float
    state: JobState = "queued"
    stage: str = ""
    run_id: str | None = None
    error: str | None = None
    ended: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    why: str = CANCELLED
    """Why it was cancelled (the reader, or the queue closing)."""

    @property
    def key(self) -> tuple[str, str]:
        return self.model, self.device


def _load_model(name: str, *, device: str, runs_dir: str | Path | None) -> Model:
    from workbench.models.load import load_model

    return load_model(name, device=device, runs_dir=runs_dir)


class ModelCache:
    """Loaded models by ``(reference, device)``, at most ``size`` of them loading, loaded or
    in use at any moment.

    One model loads at a time, whichever worker asks (two first loads at once race on
    transformers' lazy imports, and each load's peak memory is a model's), and a model in
    use is never dropped: a worker that needs another model while ``size`` are in use
    waits until one is free.

    Attributes:
        loads: every ``(reference, device)`` loaded, in order (a model loaded twice was
            dropped in between).
    """

    def __init__(self, loader: Loader = _load_model, size: int = MODELS_KEPT,
                 runs_dir: str | Path | None = None) -> None:
        if size < 1:
            raise WorkbenchError(f"a model cache keeps at least 1 model, got {size}")
        self.loader, self.size, self.runs_dir = loader, size, runs_dir
        self.loads: list[tuple[str, str]] = []
        self._models: collections.OrderedDict[tuple[str, str], Model] = \
            collections.OrderedDict()
        self._users: collections.Counter[tuple[str, str]] = collections.Counter()
        self._loading: tuple[str, str] | None = None
        self._changed = threading.Condition()

    def peek(self, name: str, device: str) -> Model | None:
        """The model if it is loaded, without loading it or changing the order."""
        with self._changed:
            return self._models.get((name, device))

    def get(self, name: str, device: str) -> Model:
        """The model, loaded now if it is not kept (not held in use: see :meth:`using`)."""
        with self.using(name, device) as model:
            return model

    @contextlib.contextmanager
    def using(self, name: str, device: str,
              cancel: threading.Event | None = None) -> Iterator[Model]:
        """The model, loaded now if it is not kept, and not dropped within the block.

        Raises:
            Cancelled: ``cancel`` was set while this waited for its turn to load.
        """
        key = (name, device)
        model = self._take(key, cancel)
        try:
            yield model
        finally:
            with self._changed:
                self._users[key] -= 1
                self._changed.notify_all()

    def _take(self, key: tuple[str, str], cancel: threading.Event | None) -> Model:
        with self._changed:
            while True:
                if key in self._models:
                    self._models.move_to_end(key)
                    self._users[key] += 1
                    return self._models[key]
                if self._loading is None and self._make_room():
                    self._loading = key
                    break
                if cancel is not None and cancel.is_set():
                    raise Cancelled(CANCELLED)
                self._changed.wait(0.1)  # another load, or every kept model in use
        try:
            model = self.loader(key[0], device=key[1], runs_dir=self.runs_dir)
        except BaseException:
            with self._changed:
                self._loading = None
                self._changed.notify_all()
            raise
        with self._changed:
            self._loading = None
            self.loads.append(key)
            self._models[key] = model
            self._users[key] += 1
            self._changed.notify_all()
        return model

    def _make_room(self) -> bool:
        """Drop idle models, least recently used first, until one more fits; whether it
        does (called with the lock held)."""
        while len(self._models) >= self.size:
            idle = next((k for k in self._models if self._users[k] <= 0), None)
            if idle is None:
                return False
            del self._models[idle]
            log.info("live: dropped %s on %s from memory", *idle)
        return True


def known_models(extra: Sequence[str] = ()) -> list[str]:
    """The models a live job may record with: the bundled ones, then ``extra``, the
    references the server was started with (``workbench dashboard --live-model``).

    Never the model names of stored runs: a ``run.json`` is data anyone with write access
    to the store may have written, and a name there is a path the server would load.

    Raises:
        WorkbenchError: an extra reference that is not a model (a checkpoint glob, a
            folder or file that does not exist, a hub id neither cached nor reachable).
    """
    names = list(zoo.MODELS.names())
    for name in extra:
        if name in names:
            continue
        ref = reference.parse_model(name)  # refuses a path that is not a model
        if isinstance(ref, reference.CheckpointGlob):
            raise WorkbenchError(f"--live-model {shown(name)}: a glob names many checkpoints; "
                                 "name one")
        if isinstance(ref, reference.Hub):
            reference.require_hub(ref)
        names.append(name)
    return names


def live_prompt(text: object, max_tokens: int = MAX_TOKENS) -> Prompt:
    """The reader's text as one prompt, whitespace collapsed.

    Raises:
        WorkbenchError: not text, empty, or so long that it cannot fit in ``max_tokens``
            tokens (more than :data:`CHARS_PER_TOKEN` characters per token).
    """
    if not isinstance(text, str):
        raise WorkbenchError(f"the prompt must be text, got {type(text).__name__}")
    if len(text) > CHARS_PER_TOKEN * max_tokens:
        raise WorkbenchError(f"the prompt has {len(text)} characters; the live page records "
                             f"at most {max_tokens} tokens (at most "
                             f"{CHARS_PER_TOKEN * max_tokens} characters are read)")
    words = " ".join(text.split())
    if not words:
        raise WorkbenchError("the prompt is empty; type or paste some text")
    return Prompt(text=words, label="live")


def check_tokens(model: Model, prompt: Prompt, max_tokens: int = MAX_TOKENS) -> int:
    """The prompt's length in ``model``'s tokens.

    Raises:
        WorkbenchError: more than ``max_tokens`` tokens, or more than the model's context.
    """
    ids, _ = model.encode(prompt)
    limit = min(max_tokens, model.info.n_ctx)
    if len(ids) > limit:
        raise WorkbenchError(f"the prompt is {len(ids)} tokens of {model.info.name}; the live "
                             f"page records at most {limit}: shorten it")
    return len(ids)


@contextlib.contextmanager
def cancellable(model: Model, cancel: threading.Event,
                job: _Job | None = None) -> Iterator[None]:
    """Within the block, a forward pass of ``model`` raises :class:`Cancelled` when it
    enters a layer after ``cancel`` is set (the pass is stopped, not finished), saying why
    ``job`` was cancelled."""
    def check(module: Any, args: Any) -> None:
        if cancel.is_set():
            raise Cancelled(job.why if job is not None else CANCELLED)

    blocks = getattr(model.bridge, "blocks", None) or []
    handles = [block.register_forward_pre_hook(check) for block in blocks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class LiveQueue:
    """Live jobs over one run store: one line and one worker thread per model.

    Args:
        runs_dir: the run store the runs go to (and whose models :func:`known_models`
            lists).
        loader: loads a model (:func:`workbench.models.load.load_model` by default; tests
            pass their own).
        models: the model references a job may name (default :func:`known_models`: the
            bundled models).
        max_tokens: the longest prompt recorded, in tokens.
        kept: models kept loaded (:class:`ModelCache`).
        max_waiting: jobs that may wait at once.
    """

    def __init__(self, runs_dir: str | Path, *, loader: Loader = _load_model,
                 models: Callable[[], Sequence[str]] | None = None,
                 max_tokens: int = MAX_TOKENS, kept: int = MODELS_KEPT,
                 max_waiting: int = MAX_WAITING) -> None:
        self.store = RunStore(runs_dir)
        self.cache = ModelCache(loader, kept, runs_dir)
        self.models = models or known_models
        self.max_tokens, self.max_waiting = max_tokens, max_waiting
        self._jobs: collections.OrderedDict[str, _Job] = collections.OrderedDict()
        self._lines: dict[tuple[str, str], collections.deque[_Job]] = {}
        self._workers: dict[tuple[str, str], threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed: str | None = None

    def submit(self, model: str, text: str, *, device: str = "cpu") -> JobStatus:
        """Put a prompt in the line of its model.

        Args:
            model: a model reference among :attr:`models`.
            text: the prompt (whitespace collapsed).
            device: the torch device the model is loaded on (``cpu`` by default), checked
                as ``--device`` is (:func:`workbench.core.devices.check_device`).

        Raises:
            UnknownNameError: a model the queue does not offer (the message lists the known
                ones).
            WorkbenchError: an empty or too long prompt, a device this machine does not
                have, a full queue, or a closed one.
        """
        device = check_device(device)
        prompt = live_prompt(text, self.max_tokens)
        known = list(self.models())
        if model not in known:
            raise UnknownNameError(f"unknown model {shown(model)} for a live recording; "
                                   f"known models: {', '.join(known)}")
        loaded = self.cache.peek(model, device)
        if loaded is not None:
            # a tokenizer its worker is using may refuse a second caller ("Already
            # borrowed"); the worker counts the tokens again before the run starts
            with contextlib.suppress(RuntimeError):
                check_tokens(loaded, prompt, self.max_tokens)
        job = _Job(secrets.token_hex(8), model, device, prompt, time.perf_counter())
        with self._lock:
            if self._closed is not None:
                raise WorkbenchError(f"the live queue is closed ({self._closed})")
            waiting = sum(len(line) for line in self._lines.values())
            if waiting >= self.max_waiting:
                raise WorkbenchError(f"the live queue is full ({waiting} jobs waiting); "
                                     "try again when one has finished")
            self._jobs[job.id] = job
            self._lines.setdefault(job.key, collections.deque()).append(job)
            self._forget_old()
            worker = self._workers.get(job.key)
            if worker is None or not worker.is_alive():
                worker = threading.Thread(target=self._work, args=(job.key,), daemon=True,
                                          name=f"live-{model}-{device}")
                self._workers[job.key] = worker
                worker.start()
            return self._status(job)

    def status(self, job_id: object) -> JobStatus:
        """The job's state and position.

        Raises:
            WorkbenchError: no such job (or one finished long ago).
        """
        with self._lock:
            return self._status(self._job(job_id))

    def cancel(self, job_id: object, why: str = CANCELLED) -> JobStatus:
        """Cancel a job: a waiting one leaves the line at once, a running one stops at its
        next layer (its run is marked failed, saying ``why``); an ended one stays as it
        is."""
        with self._lock:
            job = self._job(job_id)
            if not job.cancel.is_set():  # the first reason stays
                job.why = why
            job.cancel.set()
            line = self._lines.get(job.key)
            if job.state == "queued" and line is not None and job in line:
                line.remove(job)
                self._end(job, "cancelled", f"{why} before it started; nothing was recorded")
            return self._status(job)

    def close(self, timeout: float, why: str = "the queue was closed") -> bool:
        """Refuse new jobs, cancel every job that has not ended (a running one stops at its
        next layer, and its run is stored as failed, saying ``why``), and wait up to
        ``timeout`` seconds for the workers to end; whether they all did."""
        with self._lock:
            self._closed = why = self._closed or why
            open_jobs = [j.id for j in self._jobs.values() if j.state in ("queued", "running")]
            workers = list(self._workers.values())
        for job_id in open_jobs:
            self.cancel(job_id, why)
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        return not any(worker.is_alive() for worker in workers)

    def wait(self, job_id: str, timeout: float) -> JobStatus:
        """The job's status once it has ended, or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not (status := self.status(job_id)).done and time.monotonic() < deadline:
            time.sleep(0.02)
        return status

    def _job(self, job_id: object) -> _Job:
        job = self._jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            raise WorkbenchError("no such live job (it may have ended long ago); submit the "
                                 "prompt again")
        return job

    def _status(self, job: _Job) -> JobStatus:
        position: int | None = None
        if job.state == "running":
            position = 0
        elif job.state == "queued":
            position = list(self._lines[job.key]).index(job) + 1
        seconds = None if job.ended is None else round(job.ended - job.submitted, 3)
        return JobStatus(job.id, job.model, job.state, position, job.stage, job.run_id,
                         job.error, seconds)

    def _end(self, job: _Job, state: JobState, error: str | None = None) -> None:
        job.state, job.error, job.stage, job.ended = state, error, "", time.perf_counter()

    def _forget_old(self) -> None:
        ended = [j.id for j in self._jobs.values() if j.ended is not None]
        for job_id in ended[:max(0, len(ended) - KEPT_JOBS)]:
            del self._jobs[job_id]

    def _work(self, key: tuple[str, str]) -> None:
        """Run the jobs of one model's line, oldest first, until it is empty."""
        while True:
            with self._lock:
                line = self._lines.get(key)
                if not line:
                    self._workers.pop(key, None)
                    return
                job = line.popleft()
                job.state, job.stage = "running", "loading the model"
            self._run(job)

    def _run(self, job: _Job) -> None:
        try:
            run_id = self._record(job)
        except Cancelled:
            self._end(job, "cancelled", job.why)
        except _Refused as exc:
            self._end(job, "refused", str(exc))
        except Exception as exc:  # any failure is the job's, said in its run
            log.warning("live job %s failed: %s", job.id, exc)
            self._end(job, "failed", " ".join(f"{type(exc).__name__}: {exc}".split()))
        else:
            job.run_id = run_id
            self._end(job, "complete")

    def _config(self, job: _Job) -> dict[str, Any]:
        return {"source": SOURCE, "n_prompts": 1, "device": job.device, "dtype": "float32",
                "patterns": "dense", "store_dtype": "float16", "resid": True,
                "max_tokens": self.max_tokens}

    def _record(self, job: _Job) -> str:
        """Load the model, check the prompt, record it into a new run; the run's id."""
        with contextlib.ExitStack() as held:
            try:  # the model is not dropped while this job records with it
                model = held.enter_context(self.cache.using(job.model, job.device,
                                                            job.cancel))
            except Cancelled:
                raise Cancelled(job.why) from None  # before its turn to load: no run
            except Exception as exc:
                self._failed_run(job, exc)
                raise
            try:
                check_tokens(model, job.prompt, self.max_tokens)
            except WorkbenchError as exc:
                raise _Refused(str(exc)) from None
            with self.store.start("record", model.info, self._config(job)) as run, \
                    cancellable(model, job.cancel, job):
                job.run_id, job.stage = run.id, "recording"
                if job.cancel.is_set():  # cancelled while the model loaded
                    raise Cancelled(job.why)
                rec = record(model, [job.prompt], run.dir / "recording", patterns="dense")
                run.update(summary=[f"recorded 1 live prompt, {rec.length(0)} tokens, "
                                    f"{rec.n_layers} layers x {rec.n_heads} heads, dense "
                                    "patterns"])
        return run.id

    def _failed_run(self, job: _Job, error: Exception) -> None:
        """A failed run for a job whose model could not be loaded: the store writes why."""
        with contextlib.suppress(type(error)), \
                self.store.start("record", None, self._config(job)) as run:
            job.run_id = run.id
            raise error


class _Refused(WorkbenchError):
    """A prompt found too long once its model was loaded: refused, no run."""


def pattern_scores(rec: Recording, prompt: int = 0,
                   names: Sequence[str] | None = None) -> pd.DataFrame:
    """Pattern metrics of :mod:`workbench.scores.metrics` on each head, from the dense
    patterns of one recorded prompt (the same reductions the experiments run during the
    forward pass, applied to the whole stored pattern).

    Args:
        rec: a recording with dense patterns.
        prompt: the prompt's index.
        names: the metrics (default: every pattern metric of the registry).

    Returns:
        ``layer, head, metric, score``, long format, in layer, metric, head order.

    Raises:
        WorkbenchError: the recording stores no dense patterns.
        UnknownNameError: a name that is not a registered metric.
        ValueError: a metric that is not a function of one pattern.
    """
    if rec.patterns != "dense":
        raise WorkbenchError(f"scores need dense patterns; this recording stores {rec.patterns}")
    if names is None:
        names = [name for name, m in metrics.METRICS.items() if m.kind == "pattern"]
    reductions = metrics.reductions(*names)
    ids = list(rec.prompts[prompt].token_ids)
    n = len(ids)
    ctx = PatternContext(input_ids=torch.tensor([ids]), lengths=torch.tensor([n]),
                         query_mask=torch.ones(1, n, dtype=torch.bool), layer=0,
                         causal=rec.model.causal)
    layers, metric, values = [], [], []
    for layer in range(rec.n_layers):
        pattern = torch.from_numpy(rec.pattern(prompt, layer).astype(np.float32))[None]
        at = dataclasses.replace(ctx, layer=layer)  # (1, H, Q, K)
        for name, fn in reductions.items():
            layers.append(layer)
            metric.append(name)
            values.append(fn(pattern, at)[0].double().numpy())
    heads = rec.n_heads
    return pd.DataFrame({"layer": np.repeat(layers, heads),
                         "head": np.tile(np.arange(heads), len(values)),
                         "metric": np.repeat(metric, heads),
                         "score": np.concatenate(values) if values else np.zeros(0)})


def opening_head(scores: pd.DataFrame, metric: str = DEFAULT_METRIC) -> tuple[int, int]:
    """The head with the largest ``metric`` score (the first in layer order on a tie).

    Raises:
        UnknownNameError: ``metric`` is not in the table (listing the ones it has).
    """
    rows = scores[scores.metric == metric].dropna(subset=["score"])
    if rows.empty:
        raise UnknownNameError(f"no scores of metric {metric!r}; the table has "
                               f"{', '.join(sorted(scores.metric.unique()))}")
    best = rows.sort_values(["score", "layer", "head"], ascending=[False, True, True]).iloc[0]
    return int(best.layer), int(best["head"])
