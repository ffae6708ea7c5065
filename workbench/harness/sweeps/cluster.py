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

Before Ray starts, the resources a cell asks for are checked (:func:`cpus_problem`,
:func:`gpus_problem`; the parser uses the same checks) and so is the cluster's address: it
must accept a connection within :data:`REACH_TIMEOUT` seconds, where Ray would retry a dead
one for minutes. ``ray.init`` takes over SIGTERM; the handler the process had is put back,
so a terminated sweep cancels and records its cells as Ctrl-C does.

``ray`` is imported only here and only when a sweep runs, so the workbench works without
it (``pip install interp-workbench[ray]``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import resource
import secrets
import signal
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.core.errors import ModelCapabilityError, WorkbenchError

if TYPE_CHECKING:  # imported by the parser: nothing heavy at import time
    from workbench.core.options import Dtype
    from workbench.harness.sweeps.spec import Cell

log = logging.getLogger(__name__)

CACHED_MODELS = 2
"""Models a worker keeps loaded (the least recently used beyond this are dropped)."""
ENV_PASSED = ("WORKBENCH_RUNS_DIR", "WORKBENCH_CACHE", "WORKBENCH_DATA_DIR",
              "WORKBENCH_EXPERIMENTS", "HF_HOME", "HF_HUB_OFFLINE")
"""Environment a cell needs to see as the driver does (set in each task)."""
MAX_CELL_CPUS = 1024
MAX_CELL_GPUS = 64
"""The most CPUs and GPUs one cell may ask for: a Ray task runs on one node, and no node
has more."""
GPU_UNIT = 1e-4
"""The smallest fraction of a GPU Ray schedules (its resource precision)."""
REACH_TIMEOUT = 3.0
"""Seconds to wait for a TCP connection to a cluster's address before saying it is
unreachable (Ray itself retries a dead address for minutes)."""
_ADDRESS = re.compile(r"(?:ray://)?(?P<host>[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def import_ray() -> Any:
    """``ray``, or a one-line error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise WorkbenchError("workbench sweep needs Ray: pip install interp-workbench[ray]"
                             ) from None
    return ray


def cpus_problem(cpus: Any) -> str | None:
    """Why ``cpus`` is not a number of CPUs a cell can ask for (``None``: it is)."""
    if not isinstance(cpus, int) or isinstance(cpus, bool) or not 1 <= cpus <= MAX_CELL_CPUS:
        return f"expected a whole number of CPUs per cell in 1..{MAX_CELL_CPUS}, got {cpus!r}"
    return None


def gpus_problem(gpus: Any) -> str | None:
    """Why ``gpus`` is not a number of GPUs a cell can ask for (``None``: it is): finite,
    0..:data:`MAX_CELL_GPUS`, a fraction of one GPU (at least :data:`GPU_UNIT`) or whole
    GPUs, as Ray schedules them."""
    if isinstance(gpus, bool) or not isinstance(gpus, int | float) or not math.isfinite(gpus):
        return f"expected a number of GPUs per cell, got {gpus!r}"
    if not 0 <= gpus <= MAX_CELL_GPUS:
        return f"expected 0..{MAX_CELL_GPUS} GPUs per cell, got {gpus:g}"
    if 0 < gpus < GPU_UNIT or (gpus > 1 and gpus != int(gpus)):
        return (f"expected a fraction of one GPU (at least {GPU_UNIT:g}) or whole GPUs per "
                f"cell, got {gpus:g}")
    return None


def parse_address(text: str) -> tuple[str, int] | None:
    """The host and port of a cluster address (``ray://host:port`` or ``host:port``), or
    ``None`` for ``auto`` (the cluster Ray finds on this machine or in ``RAY_ADDRESS``).

    Raises:
        WorkbenchError: any other text, or a port outside 1..65535.
    """
    if text == "auto":
        return None
    match = _ADDRESS.fullmatch(text)
    if not match or not 1 <= int(match["port"]) <= 65535:
        raise WorkbenchError(f"expected auto, ray://HOST:PORT or HOST:PORT (a port in "
                             f"1..65535), got {text[:100]!r}")
    return match["host"].strip("[]"), int(match["port"])


@dataclass(frozen=True)
class Session:
    """A Ray connection: ``started`` when this process started the local Ray (and so shuts
    it down), and the CPU slots a cell of ``cpus`` CPUs fits in."""

    started: bool
    slots: int


def connect(address: str | None, *, cpus: int, gpus: float) -> Session:
    """Join Ray at ``address`` (``auto``, ``ray://host:port`` or ``host:port``), use the
    Ray this process already runs, or start a local one sized to the machine.

    A cluster's address is first checked to accept a connection within
    :data:`REACH_TIMEOUT` seconds. The SIGTERM handler this process had is put back once
    Ray is up: ``ray.init`` installs its own, which exits at once, so a terminated sweep
    would neither cancel its cells nor record them.

    Args:
        address: ``None`` for a local Ray (or ``RAY_ADDRESS``, which Ray reads).
        cpus: CPUs each cell asks for (also its torch threads).
        gpus: GPUs each cell asks for.

    Raises:
        WorkbenchError: Ray is missing, ``cpus`` or ``gpus`` is not a request Ray takes,
            the cluster is unreachable or cannot be joined, or it has fewer CPUs or GPUs
            than one cell asks for.
    """
    for problem in (cpus_problem(cpus), gpus_problem(gpus)):
        if problem:
            raise WorkbenchError(f"--cpus/--gpus: {problem}")
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        local = address is None and not os.environ.get("RAY_ADDRESS")
        if local and cpus > (os.cpu_count() or 1):  # before a local Ray starts, not after
            raise WorkbenchError(f"this machine has {os.cpu_count()} CPUs; a cell asks for "
                                 f"{cpus} (--cpus)")
        check_reachable(address)
        try:
            with _keeping_sigterm():
                ray.init(address=address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or os.environ.get("RAY_ADDRESS") or "a local Ray"
            raise WorkbenchError(f"cannot start or join {where}: "
                                 f"{_first_line(exc)}") from None
        started = address is None
    return Session(started=started, slots=_slots(ray, cpus, gpus, started))


def _slots(ray: Any, cpus: int, gpus: float, started: bool) -> int:
    """Cells at a time the cluster fits; refuses one that fits none (shutting down a Ray
    this process started)."""
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
    return slots


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_reachable(address: str | None, timeout: float = REACH_TIMEOUT) -> None:
    """Refuse the cluster ``ray.init(address)`` would join when it accepts no TCP
    connection within ``timeout`` seconds.

    That cluster is ``RAY_ADDRESS`` when it is set (Ray reads it first), else the address
    given, else (for ``None`` and ``auto``) the one Ray finds on this machine: the last
    ``ray start`` (and for ``auto`` any running one). ``None`` with none found starts a
    local Ray, which needs no check.

    Raises:
        WorkbenchError: the address is not one, or nothing answers there.
    """
    env = os.environ.get("RAY_ADDRESS")
    given = env or address
    if given == "local":
        return
    target = _found_address(given) if given in (None, "auto") else parse_address(given)
    if target is None:
        return  # a local Ray starts, or (auto) ray.init says at once that none runs
    host, port = target
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = (f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError)
                  else exc.strerror or type(exc).__name__)
        origin = ("RAY_ADDRESS" if env else "--address" if address not in (None, "auto")
                  else "the cluster Ray found on this machine")
        raise WorkbenchError(f"cannot reach the Ray cluster at {host}:{port} ({origin}): "
                             f"{reason}; start it, or check --address and RAY_ADDRESS"
                             ) from None


def _found_address(address: str | None) -> tuple[str, int] | None:
    """The cluster ``None`` or ``auto`` would join (Ray's own lookup), if any."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        # None asks Ray for the address it would join, which its annotation leaves out
        found = canonicalize_bootstrap_address(address)  # pyright: ignore[reportArgumentType]
    except (ConnectionError, ValueError):
        return None
    try:
        return parse_address(found) if found else None
    except WorkbenchError:
        return None  # a form this check does not read: ray.init reads it


@contextmanager
def _keeping_sigterm() -> Iterator[None]:
    """Put back the SIGTERM handler this process installed, after the block: ``ray.init``
    replaces it with one that exits at once, and a started Ray node with one that kills
    its processes and exits with status 1. (With no handler of its own, the process keeps
    Ray's, which at least stops the local Ray.)"""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)


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


def _cached_model(name: str, dtype: Dtype, runs_dir: str, device: str) -> tuple[Any, bool]:
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


def run_cell(cell: Cell, runs_dir: str, dtype: Dtype, threads: int,
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
    _interruptible()
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


def _interruptible() -> None:
    """Let Ray's cancel interrupt this worker: it raises ``KeyboardInterrupt`` through
    SIGINT, which a worker inherits ignored when the sweep was started with SIGINT ignored
    (a background job of a non-interactive shell, ``nohup``); the cell could then only be
    killed, leaving its run ``interrupted`` instead of ``failed``."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
