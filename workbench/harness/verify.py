"""Re-hashing what the workbench stored: cached bundled models, runs and recordings.

``workbench verify`` answers "is everything I stored still what was written?". Every name
is resolved before any file is hashed, so a bad name fails at once; then each thing is
re-hashed in full, whatever its size and time stamps say:

- a **model** (a bundled name): every cached file against its ``manifest.json``
  (:func:`workbench.models.cache.verify_all`);
- a **run** (an id or unique id prefix in the store, or its folder there): every table
  against ``run.json`` (:meth:`workbench.store.runs.Run.verify`), and every recording and
  checkpoint it holds against its own manifest (:func:`stored_files`);
- a **recording** (a folder holding ``index.json``, or a folder holding ``recording/``
  with one, in or outside a store): every file, chunk by chunk, against its index.

A run still being written (``running``) or whose process died (``interrupted``) is
reported as such and not hashed: nothing in it is claimed finished. A ``failed`` run
recorded the checksums of what it wrote before failing, so that much is re-hashed.

Examples:
    >>> for check in verify(["minilm"]):                    # doctest: +SKIP
    ...     check.name, check.kind, check.status, check.detail
    ('minilm', 'model', 'ok', '13 files, 91.6 MB re-hashed')
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from workbench.core import paths, progress
from workbench.core.errors import UnknownNameError, WorkbenchError
from workbench.core.registry import did_you_mean
from workbench.harness.stored import StoredFiles, stored_files
from workbench.models import cache, zoo
from workbench.recording.index import INDEX
from workbench.recording.reader import Recording
from workbench.store.runs import RUN_JSON, Run, RunStore

log = logging.getLogger(__name__)

Kind = Literal["model", "run", "recording"]
CheckStatus = Literal["ok", "damaged", "not fetched", "failed", "running", "interrupted"]
"""``ok`` and ``damaged`` are verdicts; ``not fetched`` (a model not in the cache) and a
run's ``failed``, ``running`` and ``interrupted`` say why there was less, or nothing, to
hash; only ``damaged`` is a failure."""

_UNFINISHED = {
    "running": "still being written; not verified",
    "interrupted": "its process ended without finishing it; not verified (nothing in it is "
                   "claimed finished)",
}


@dataclass(frozen=True)
class Check:
    """The verdict on one thing verified.

    Attributes:
        name: the model name, run id, or recording folder as given.
        kind: what it is.
        status: the verdict (see :data:`CheckStatus`).
        detail: one line: what was hashed, or every problem found (each naming its file).
    """

    name: str
    kind: Kind
    status: CheckStatus
    detail: str


@dataclass(frozen=True)
class _Target:
    name: str
    kind: Kind
    run: Run | None = None
    path: Path | None = None


def verify(names: Sequence[str] | None = None, *,
           runs_dir: str | os.PathLike[str] | None = None) -> list[Check]:
    """Re-hash the named models, runs and recordings, or everything stored.

    Args:
        names: bundled model names, run ids (or unique id prefixes, or run folders in the
            store) and recording folders; default: every bundled model (``not fetched``
            when it is not cached) and every run in the store.
        runs_dir: the run store (default as :func:`workbench.core.paths.runs_dir`).

    Returns:
        One :class:`Check` per thing, in the order named (models, then runs oldest first,
        by default).

    Raises:
        UnknownNameError: a name is none of those (the message names the kinds and the
            closest model names and run ids); raised before anything is hashed.
        WorkbenchError: an ambiguous id prefix, or a run folder outside the store.
    """
    store = RunStore(paths.runs_dir(runs_dir))
    if names:
        targets = _resolve(names, store)
    else:
        targets = [_Target(n, "model") for n in zoo.MODELS.names()]
        targets += [_Target(r.id, "run", run=r) for r in store.runs()]
    return [_check(t) for t in progress.track(targets, desc="verifying")]


def _resolve(names: Sequence[str], store: RunStore) -> list[_Target]:
    """What each name refers to, duplicates dropped, checked before anything is hashed.

    A bundled model name wins over a run id prefix; a name with a path separator (or
    starting with ``.`` or ``~``) is a folder; any other name is a run id or unique id
    prefix, and failing that a folder in the working directory.

    Raises:
        UnknownNameError / WorkbenchError: as :func:`verify`.
    """
    runs = store.runs()
    targets = [_resolve_one(name, store, runs) for name in names]
    return list({(t.kind, t.name): t for t in targets}.values())  # an id and its prefix: once


def _resolve_one(name: str, store: RunStore, runs: list[Run]) -> _Target:
    if not name.strip() or "\0" in name:
        raise WorkbenchError(f"verify: {name!r} is not a name; give a bundled model, a run "
                             "id or a recording folder")
    if name in zoo.MODELS:
        return _Target(name, "model")
    if not _is_path(name) and any(r.id.startswith(name) for r in runs):
        run = store.get(name)  # the store's own resolution: exact id, else a unique prefix
        return _Target(run.id, "run", run=run)
    folder = Path(name).expanduser()
    if _is_path(name) or folder.is_dir():
        return _resolve_folder(name, folder, store)
    known = [*zoo.MODELS.names(), *(r.id for r in runs)]
    raise UnknownNameError(
        f"unknown name '{name}'{did_you_mean(name, known)}: not a bundled model "
        f"({', '.join(zoo.MODELS.names())}), a run id or id prefix in {store.root} "
        f"({len(runs)} runs), nor a recording folder (holding {INDEX})")


def _resolve_folder(name: str, folder: Path, store: RunStore) -> _Target:
    """A run folder in the store (confined by :meth:`RunStore.get`) or a recording folder."""
    holds_recording = (folder / INDEX).is_file() or (folder / "recording" / INDEX).is_file()
    if (folder / RUN_JSON).is_file():
        try:
            run = store.get(folder)
        except WorkbenchError:
            if not holds_recording:
                raise  # a run folder outside the store: the store's message says so
        else:
            return _Target(run.id, "run", run=run)
    if holds_recording:
        return _Target(name, "recording", path=folder)
    what = "" if folder.is_dir() else ": no such folder"
    raise WorkbenchError(f"no recording or run in {name}{what} (expected a folder holding "
                         f"{INDEX}, or a run folder in {store.root})")


def _is_path(name: str) -> bool:
    seps = {"/", os.sep, os.altsep} - {None}
    return any(sep in name for sep in seps) or name.startswith((".", "~"))


def _check(target: _Target) -> Check:
    if target.run is not None:
        return _check_run(target.run)
    if target.path is not None:
        return _check_recording(target.name, target.path)
    [(name, status, detail)] = cache.verify_all([target.name])
    return Check(name, "model", status, detail)


def _check_recording(name: str, path: Path) -> Check:
    try:
        rec = Recording.open(path)  # checks the index and every file's size
        rec.verify()
    except WorkbenchError as exc:  # ChecksumError included: both name the file
        return Check(name, "recording", "damaged", str(exc))
    except OSError as exc:
        return Check(name, "recording", "damaged",
                     f"cannot read {exc.filename or path} ({exc.strerror or exc})")
    return Check(name, "recording", "ok", f"{len(rec)} prompts, format {rec.format_version}, "
                                          "every file re-hashed")


def _check_run(run: Run) -> Check:
    if run.status == "running" or run.status == "interrupted":
        return Check(run.id, "run", run.status, _UNFINISHED[run.status])
    if run.status == "damaged":
        return Check(run.id, "run", "damaged", run.meta.error or "no reason recorded")
    held = stored_files(run.path)
    problems = [p for p in (_problem(run), *map(_problem, held)) if p]
    problems = problems or _table_problems(run)  # what the files hold, once they are whole
    if problems:
        return Check(run.id, "run", "damaged", "; ".join(problems))
    n_rec = sum(h.kind == "recording" for h in held)
    counts = {"table": len(run.table_names()), "recording": n_rec, "checkpoint": len(held) - n_rec}
    hashed = ", ".join(f"{n} {what}{'s' * (n != 1)}" for what, n in counts.items() if n)
    hashed = f"{hashed} re-hashed" if hashed else "nothing stored to re-hash"
    if run.status == "failed":
        error = ((run.meta.error or "").splitlines() or ["no reason recorded"])[0]
        return Check(run.id, "run", "failed", f"the run failed ({error}); what it wrote before "
                                              f"failing is intact: {hashed}")
    return Check(run.id, "run", "ok", hashed)


def _table_problems(run: Run) -> list[str]:
    """What each table of ``run`` holds against what its ``run.json`` states (its rows) and
    its declaration (columns, kinds, ranges, keys: :func:`workbench.harness.tables.read`)."""
    from workbench.harness import tables

    problems = []
    for name in run.table_names():
        try:
            tables.read(run, name)
        except WorkbenchError as exc:
            problems.append(str(exc))
    return problems


def _problem(thing: Run | StoredFiles) -> str | None:
    """What is wrong with a run's tables or a folder it holds, or ``None``."""
    try:
        thing.verify()
    except WorkbenchError as exc:  # ChecksumError included: both name the file
        log.info("verify: %s", exc)
        return str(exc)
    except OSError as exc:  # unreadable is as bad as changed: it cannot be vouched for
        return f"cannot read {exc.filename or thing.path} ({exc.strerror or exc})"
    return None


def damage_summary(checks: Sequence[Check]) -> str | None:
    """One line naming every damaged thing and how to repair each kind, or ``None``.

    Args:
        checks: the result of :func:`verify`.

    Returns:
        E.g. ``damaged: minilm (model), 2026...-record-... (run); run `workbench fetch
        minilm --force`; rerun the runs``; ``None`` when nothing is damaged.
    """
    damaged = [c for c in checks if c.status == "damaged"]
    if not damaged:
        return None
    models = [c.name for c in damaged if c.kind == "model"]
    fixes = [f"run `workbench fetch {' '.join(models)} --force`"] if models else []
    if any(c.kind == "run" for c in damaged):
        fixes.append("rerun the damaged runs (`workbench show RUN` says how each was made)")
    if any(c.kind == "recording" for c in damaged):
        fixes.append("record the damaged recordings again")
    named = ", ".join(f"{c.name} ({c.kind})" for c in damaged)
    return f"damaged: {named}; {'; '.join(fixes)}"
