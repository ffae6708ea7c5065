"""The Ray side of a sweep: joining or starting Ray, checking the store from the workers, and
the task that runs one cell.

Each cell is a Ray **task** (not an actor method). A running task can be cancelled: Ray
raises ``KeyboardInterrupt`` inside it, so the run store marks the cell's run failed, which
an actor method cannot give (Ray does not interrupt a running actor task). Ray keeps its
worker processes between tasks, so each process caches the models it loaded
(:func:`_cached_model`, the last :data:`CACHED_MODELS` of them): a model loads once per
worker, not once per cell, and the driver submits cells grouped by model, so the worker
that frees up usually has the next cell's model loaded already. A worker that dies fails
only its cell; Ray starts another.

``ray`` is imported only here and only when a sweep runs, so the workbench works without
it (``pip install interp-workbench[ray]``).
"""

from __future__ import annotations

import logging
import os
import resource
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.core.errors import ModelCapabilityError, WorkbenchError
from workbench.harness.sweep_spec import Cell

log = logging.getLogger(__name__)

CACHED_MODELS = 2
"""Models a worker keeps loaded (the least recently used beyond this are dropped)."""
ENV_PASSED = ("WORKBENCH_RUNS_DIR", "WORKBENCH_CACHE", "WORKBENCH_DATA_DIR", "HF_HOME",
              "HF_HUB_OFFLINE")
"""Environment a cell needs to see as the driver does (set in each task)."""


def import_ray() -> Any:
    """``ray``, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise WorkbenchError("workbench sweep needs Ray: pip install interp-workbench[ray]"
                             ) from None
    return ray


@dataclass(frozen=True)
class Session:
    """A Ray connection: ``started`` when this process started the local Ray (and so shuts
    it down), and the CPU slots a cell of ``cpus`` CPUs fits in."""

    started: bool
    slots: int


def connect(address: str | None, *, cpus: int, gpus: float) -> Session:
    """Join Ray at ``address`` (``auto`` or ``ray://host:port``), use the Ray this process
    already runs, or start a local one sized to the machine.

    Args:
        address: ``None`` for a local Ray.
        cpus: CPUs each cell asks for (also its torch threads).
        gpus: GPUs each cell asks for.

    Raises:
        WorkbenchError: Ray is missing, or the cluster cannot be joined, or it has fewer
            CPUs or GPUs than one cell asks for.
    """
    if cpus < 1 or gpus < 0:
        raise WorkbenchError(f"a cell needs at least 1 CPU and no negative GPUs; got --cpus "
                             f"{cpus} --gpus {gpus:g}")
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or "a local Ray"
            raise WorkbenchError(f"cannot start or join {where}: "
                                 f"{str(exc).splitlines()[0]}") from None
        started = address is None
    have = ray.cluster_resources()
    slots = int(have.get("CPU", 0) // cpus)
    if slots < 1 or (gpus and have.get("GPU", 0) < gpus):
        if started:
            ray.shutdown()
        raise WorkbenchError(f"the Ray cluster has {have.get('CPU', 0):g} CPUs and "
                             f"{have.get('GPU', 0):g} GPUs; a cell asks for {cpus} CPUs and "
                             f"{gpus:g} GPUs (--cpus, --gpus)")
    if gpus:
        slots = min(slots, int(have.get("GPU", 0) // gpus))
    return Session(started=started, slots=slots)


def disconnect(session: Session) -> None:
    if session.started:
        import_ray().shutdown()


def probe_store(root: Path) -> str | None:
    """Write and remove a file in the run store ``root``; ``None``, or why it failed.

    Runs inside a worker (see :func:`check_workers_can_write`).
    """
    probe = root / f".sweep-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as exc:
        return f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
    return None


def check_workers_can_write(root: Path) -> None:
    """Run :func:`probe_store` on every node of the cluster, at once.

    Raises:
        WorkbenchError: a node's worker cannot write the store (the message names the node
            and the reason: the store must be a path every node sees and may write).
    """
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(probe_store)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = {n["NodeManagerAddress"]: task.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
    ).remote(root) for n in nodes}
    for node, ref in refs.items():
        problem = ray.get(ref, timeout=120)
        if problem is not None:
            raise WorkbenchError(f"a Ray worker on {node} cannot write the run store {root}: "
                                 f"{problem}; the store must be a folder every node sees and "
                                 "may write (--out)")


@dataclass(frozen=True)
class Outcome:
    """How a cell ended in its worker."""

    index: int
    status: str
    run_id: str = ""
    error: str = ""
    seconds: float = float("nan")
    pid: int = -1
    loaded: bool = False
    """Whether this cell loaded its model (``False``: the worker had it cached)."""
    peak_rss_mb: float = float("nan")
    """The worker process's peak resident memory so far."""


_models: OrderedDict[tuple[str, str, str, str], Any] = OrderedDict()


def _cached_model(name: str, dtype: str, runs_dir: str, device: str) -> tuple[Any, bool]:
    """The model ``name``, loaded once per worker process; whether it was loaded now."""
    from workbench.models.load import load_model

    key = (name, dtype, runs_dir, device)
    if key in _models:
        _models.move_to_end(key)
        return _models[key], False
    while len(_models) >= CACHED_MODELS:
        _models.popitem(last=False)
    _models[key] = load_model(name, dtype=dtype, runs_dir=runs_dir, device=device)
    return _models[key], True


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_cell(cell: Cell, runs_dir: str, dtype: str, threads: int,
             env: Mapping[str, str], device: str = "cpu") -> Outcome:
    """Run one cell in this worker: the model from the worker's cache, then
    :func:`~workbench.harness.experiment.run_experiment` with ``reuse`` (a matching complete
    run is returned, not redone).

    Args:
        cell: the cell.
        runs_dir: the run store.
        dtype: model dtype.
        threads: torch threads (the CPUs the cell asked for).
        env: environment variables to set first (the driver's ``WORKBENCH_*``).
        device: torch device of the model (``cuda`` when the cell asked for GPUs).

    Returns:
        The outcome; an error of the cell (bad input or a bug) is caught and returned as
        ``failed`` with its cause (the run store has marked its run failed, if it had one).
        ``KeyboardInterrupt`` (Ray's cancel) is not caught: the run is marked failed and
        the task ends cancelled.
    """
    import torch

    from workbench.harness.experiment import run_experiment

    os.environ.update(env)
    torch.set_num_threads(threads)  # two workers on two cores must not fight over them
    start, wall_start, pid, loaded = time.perf_counter(), time.time(), os.getpid(), False
    try:
        model = None
        if cell.model is not None:
            model, loaded = _cached_model(cell.model.name, dtype, runs_dir, device)
        run = run_experiment(cell.experiment, model, dict(cell.overrides), runs_dir=runs_dir,
                             dtype=dtype, reuse=True)
        # made now (by this process, since the cell began; run.json has whole seconds)
        fresh = run.meta.pid == pid and _started(run.meta.started_at) >= wall_start - 1
        status = "complete" if fresh else "reused"
        return Outcome(cell.index, status, run.id, "", time.perf_counter() - start, pid,
                       loaded, _peak_rss_mb())
    except ModelCapabilityError as exc:
        return Outcome(cell.index, "skipped", "", str(exc), time.perf_counter() - start, pid,
                       loaded, _peak_rss_mb())
    except Exception as exc:  # the cell fails, the sweep goes on; the cause is kept
        log.warning("cell %d failed: %s", cell.index, exc)
        return Outcome(cell.index, "failed", "", f"{type(exc).__name__}: {exc}",
                       time.perf_counter() - start, pid, loaded, _peak_rss_mb())


def _started(started_at: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(started_at).timestamp()
    except ValueError:
        return 0.0


def remote_cell(cpus: int, gpus: float) -> Any:
    """:func:`run_cell` as a Ray task asking for ``cpus`` CPUs and ``gpus`` GPUs."""
    ray = import_ray()
    return ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=0)(run_cell)
