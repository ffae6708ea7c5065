"""The run store: one folder per run, complete only once it is complete.

A run is written in ``RUNS_DIR/.incomplete/<run-id>/`` and renamed to ``RUNS_DIR/<run-id>/``
when it ends. ``run.json`` says what ran (experiment, model and its checksum, the full
config, the seed, library versions, the git revision) and how it ended: ``complete``, or
``failed`` with the error. A run killed outright stays in ``.incomplete`` and is listed as
``interrupted``; no reader mistakes it, or a failed run, for a finished one.

Tables are Parquet files whose SHA-256 is kept in ``run.json`` and checked on every read.
A run is started with the declarations of the tables it may write
(:mod:`workbench.store.schema`); a table that does not match its declaration is refused.

Examples:
    >>> store = RunStore("data/runs")                                 # doctest: +SKIP
    >>> with store.start("my-experiment", model.info, cfg, tables=TABLES) as run:  # doctest: +SKIP
    ...     run.save_table("head_scores", df)
    >>> store.latest(experiment="my-experiment").table("head_scores")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.core import checksums
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.options import Status
from workbench.store import provenance
from workbench.store.schema import SchemaError, Table

log = logging.getLogger(__name__)

RUN_JSON = "run.json"
INCOMPLETE = ".incomplete"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _slug(text: str) -> str:
    base = Path(text).name if ("/" in text or os.sep in text) else text
    return "".join(c if c.isalnum() or c in "-." else "-" for c in base)[:40].strip("-") or "x"


class Run:
    """A stored run, read-only."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta

    @classmethod
    def load(cls, path: Path) -> Run:
        try:
            meta = json.loads((path / RUN_JSON).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise WorkbenchError(f"{path} is not a readable run ({exc})") from None
        if meta.get("status") == "running" and not _alive(meta.get("pid")):
            meta["status"] = "interrupted"
            meta.setdefault("error", "the process ended without finishing the run")
        return cls(path, meta)

    def __repr__(self) -> str:
        return f"Run({self.id!r}, {self.status})"

    @property
    def id(self) -> str:
        return self.meta["run_id"]

    @property
    def experiment(self) -> str:
        return self.meta["experiment"]

    @property
    def status(self) -> Status:
        return self.meta["status"]

    @property
    def model_name(self) -> str | None:
        model = self.meta.get("model")
        return model["name"] if model else None

    @property
    def config(self) -> dict[str, Any]:
        return self.meta.get("config", {})

    def table_names(self) -> list[str]:
        return sorted(self.meta.get("tables", {}))

    def table(self, name: str) -> pd.DataFrame:
        """Read a table, checking its SHA-256.

        Raises:
            WorkbenchError: no such table (the message lists the run's tables).
            ChecksumError: the file changed since the run wrote it.
        """
        tables = self.meta.get("tables", {})
        if name not in tables:
            known = ", ".join(sorted(tables)) or "none"
            raise WorkbenchError(f"run {self.id} has no table '{name}'; its tables: {known}")
        path = self.path / tables[name]["file"]
        if checksums.sha256_file(path) != tables[name]["sha256"]:
            raise ChecksumError(f"checksum mismatch for {path}: the table was changed or damaged")
        return pd.read_parquet(path)


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ActiveRun:
    """A run being written. Use through :meth:`RunStore.start`."""

    def __init__(self, staging: Path, final: Path, meta: dict[str, Any],
                 tables: Mapping[str, Table]) -> None:
        self.dir = staging
        self.final = final
        self.meta = meta
        self.declared = dict(tables)

    @property
    def id(self) -> str:
        return self.meta["run_id"]

    def save_table(self, name: str, df: pd.DataFrame) -> None:
        """Check ``df`` against its declaration, write it as ``<name>.parquet`` and record
        its checksum.

        Raises:
            SchemaError: the run declares no table ``name``, or ``df`` does not match it.
        """
        if name not in self.declared:
            known = ", ".join(self.declared) or "none"
            raise SchemaError(f"run {self.id} declares no table '{name}'; declared: {known}")
        self.declared[name].check(df)
        path = self.dir / f"{name}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
        self.meta.setdefault("tables", {})[name] = {
            "file": path.name, "rows": len(df), "sha256": checksums.sha256_file(path),
        }

    def set(self, key: str, value: Any) -> None:
        """Record extra facts in ``run.json`` (e.g. a summary)."""
        self.meta[key] = value

    def _write(self) -> None:
        checksums.write_json_atomic(self.dir / RUN_JSON, self.meta)

    def _finish(self, status: Status, error: BaseException | None = None) -> Run:
        self.meta["status"] = status
        self.meta["ended_at"] = _now()
        self.meta.pop("pid", None)
        if error is not None:
            self.meta["error"] = f"{type(error).__name__}: {error}".rstrip(": ")
            self.meta["traceback"] = "".join(traceback.format_exception(error))[-8000:]
        self._write()
        os.replace(self.dir, self.final)
        return Run(self.final, self.meta)


class RunStore:
    """All runs under one folder (``--out``, ``WORKBENCH_RUNS_DIR`` or ``data/runs``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @contextmanager
    def start(self, experiment: str, model: dict[str, Any] | None, config: Any,
              *, tables: Mapping[str, Table] | None = None,
              extra: dict[str, Any] | None = None) -> Iterator[ActiveRun]:
        """Create a run; mark it complete when the block ends, failed if it raises.

        Args:
            experiment: the experiment's registered name (``record`` for recordings).
            model: ``ModelInfo.to_dict()`` of the model used, or ``None``.
            config: the experiment's config dataclass (or a dict).
            tables: the declarations of the tables the run may save (none by default).
            extra: more facts for ``run.json``.
        """
        cfg = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        model_part = _slug(model["name"]) if model else "none"
        run_id = f"{stamp}-{_slug(experiment)}-{model_part}-{secrets.token_hex(2)}"
        staging = self.root / INCOMPLETE / run_id
        staging.mkdir(parents=True)
        meta = {
            "run_id": run_id,
            "experiment": experiment,
            "model": model,
            "config": cfg,
            "seed": cfg.get("seed"),
            "workbench_version": provenance.workbench_version(),
            **provenance.collect(),
            "started_at": _now(),
            "status": "running",
            "pid": os.getpid(),
            **(extra or {}),
        }
        active = ActiveRun(staging, self.root / run_id, meta, tables or {})
        active._write()
        try:
            yield active
        except BaseException as exc:  # Ctrl-C and SystemExit too: never leave it "running"
            run = active._finish("failed", exc)
            log.error("run %s failed: %s", run.id, run.meta["error"])
            raise
        active._finish("complete")

    def runs(self, *, experiment: str | None = None, model: str | None = None,
             status: Status | None = None) -> list[Run]:
        """Stored runs, oldest first, optionally filtered."""
        if not self.root.is_dir():
            return []
        candidates = [p for p in self.root.iterdir() if (p / RUN_JSON).is_file()]
        incomplete = self.root / INCOMPLETE
        if incomplete.is_dir():
            candidates += [p for p in incomplete.iterdir() if (p / RUN_JSON).is_file()]
        found = []
        for path in candidates:
            try:
                run = Run.load(path)
            except WorkbenchError as exc:
                log.warning("skipping %s", exc)
                continue
            if experiment and run.experiment != experiment:
                continue
            if model and run.model_name != model:
                continue
            if status and run.status != status:
                continue
            found.append(run)
        return sorted(found, key=lambda r: (r.meta.get("started_at", ""), r.id))

    def get(self, ref: str | Path) -> Run:
        """A run by id, id prefix or folder path.

        Raises:
            WorkbenchError: no such run (the message lists the most recent ids).
        """
        path = Path(ref)
        if (path / RUN_JSON).is_file():
            return Run.load(path)
        runs = self.runs()
        matches = [r for r in runs if r.id == str(ref)] or [
            r for r in runs if r.id.startswith(str(ref))
        ]
        if len(matches) == 1:
            return matches[0]
        recent = ", ".join(r.id for r in runs[-5:]) or "none"
        if matches:
            raise WorkbenchError(f"run '{ref}' is ambiguous: {', '.join(r.id for r in matches)}")
        raise WorkbenchError(f"no run '{ref}' in {self.root}; most recent: {recent}")

    def latest(self, *, experiment: str | None = None, model: str | None = None) -> Run | None:
        """The newest complete run matching the filters, if any."""
        runs = self.runs(experiment=experiment, model=model, status="complete")
        return runs[-1] if runs else None

    def latest_on_weights(self, experiment: str, model: dict[str, Any], *,
                          unmasked: bool = True) -> Run | None:
        """The newest complete run of ``experiment`` on the same model weights (name and
        checksum of ``model``, a ``ModelInfo.to_dict()`` or a run's ``model`` record),
        without interventions unless ``unmasked`` is false; ``None`` if there is none."""
        want = (model.get("name"), model.get("checksum"))
        for run in reversed(self.runs(experiment=experiment, status="complete")):
            stored = run.meta.get("model") or {}
            if (stored.get("name"), stored.get("checksum")) != want:
                continue
            if unmasked and run.meta.get("interventions"):
                continue
            return run
        return None

    def find_matching(self, experiment: str, model: dict[str, Any] | None, config: Any,
                      interventions: dict[str, Any] | None = None) -> Run | None:
        """The newest complete run with the same experiment, model weights, config,
        interventions and workbench version, for reuse instead of a recomputation."""
        cfg = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
        cfg = json.loads(json.dumps(cfg, default=str))
        version = provenance.workbench_version()
        for run in reversed(self.runs(experiment=experiment, status="complete")):
            stored = run.meta.get("model") or {}
            if model is not None and (stored.get("name"), stored.get("checksum")) != (
                model["name"], model["checksum"]
            ):
                continue
            if (run.config == cfg and run.meta.get("workbench_version") == version
                    and run.meta.get("interventions") == interventions):
                return run
        return None

    def remove_incomplete(self) -> int:
        """Delete interrupted runs; return how many."""
        removed = 0
        for run in self.runs(status="interrupted"):
            shutil.rmtree(run.path)
            removed += 1
        return removed
