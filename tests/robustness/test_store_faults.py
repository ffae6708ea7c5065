"""Faults while a run is written: a kill at each step of finishing it, a full disk (ENOSPC)
and a read-only filesystem (EROFS), patched and real. Nothing complete-looking is left, a
failure records its cause where the disk allows, and no temporary file stays behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from tests.tiny import fake_info
from workbench.core import durable
from workbench.core.paths import REPO_ROOT
from workbench.store import provenance
from workbench.store.runs import INCOMPLETE, RESERVE, RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

MODEL = fake_info()
TABLES = tables(Table("t", "one integer column", columns(("a", "int", "a number"))),
                Table("big", "random floats", columns(("x", "float", "a number"))))
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
EROFS = OSError(errno.EROFS, os.strerror(errno.EROFS))


@pytest.fixture(autouse=True)
def quick_provenance(monkeypatch):
    monkeypatch.setattr(provenance, "collect",
                        lambda: {"versions": {}, "git": None, "machine": None})


def leftovers(root: Path) -> list[str]:
    """Temporary files left anywhere in the store."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp"))


def assert_nothing_complete(store: RunStore) -> None:
    assert store.runs(status="complete") == []
    assert store.latest() is None and store.find_matching("exp", MODEL, {"n": 3}) is None
    assert not [p for p in store.root.iterdir() if p.name != INCOMPLETE]  # nothing in place


# ---- a kill (os._exit) at each step of finishing a run --------------------------------------

KILLER = textwrap.dedent('''
    import os, sys
    import pandas as pd
    from workbench.core import durable
    from workbench.store import provenance
    from workbench.store.runs import RunStore
    from workbench.store.schema import Table, columns, tables
    from tests.tiny import fake_info

    provenance.collect = lambda: {"versions": {}, "git": None, "machine": None}
    MODEL = fake_info()
    root, step, failing = sys.argv[1], sys.argv[2], sys.argv[3] == "fail"
    TABLES = tables(Table("t", "one integer column", columns(("a", "int", "a number"))))
    real = {"write_atomic": durable.write_atomic, "write_bytes": durable._write_bytes,
            "fsync_file": durable.fsync_file, "replace": os.replace}
    seen = {"finishing": False, "flushed": 0}

    def die(at):
        if step == at:
            os._exit(9)

    def write_atomic(path, data):
        if b'"status": "complete"' in data or b'"status": "failed"' in data:
            die("before-status")
            seen["finishing"] = True
        real["write_atomic"](path, data)
        if seen["finishing"]:
            die("after-status")

    def write_bytes(fd, data):
        if b'"status": "complete"' in data and step == "mid-status":
            real["write_bytes"](fd, data[: len(data) // 2])
            os._exit(9)
        real["write_bytes"](fd, data)

    def fsync_file(path):
        if seen["finishing"]:
            seen["flushed"] += 1
            if seen["flushed"] == 2:
                die("during-fsync")
        real["fsync_file"](path)

    def replace(src, dst):
        if os.path.isdir(src):
            die("before-rename")
        real["replace"](src, dst)
        if os.path.isdir(dst):
            die("after-rename")

    durable.write_atomic, durable._write_bytes = write_atomic, write_bytes
    durable.fsync_file, os.replace = fsync_file, replace
    with RunStore(root).start("exp", MODEL, {"n": 3},
                              tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": range(3)}))
        (run.dir / "recording").mkdir()
        (run.dir / "recording" / "L000.bin").write_bytes(b"x" * 1000)
        if failing:
            raise RuntimeError("the experiment broke")
    os._exit(0)
''')

STEPS = [("before-status", "ok"), ("mid-status", "ok"), ("after-status", "ok"),
         ("during-fsync", "ok"), ("before-rename", "ok"),
         ("before-status", "fail"), ("after-status", "fail"), ("before-rename", "fail")]


def kill_at(root: Path, step: str, outcome: str) -> None:
    """Run a store in a subprocess that ``os._exit``s at ``step`` of finishing its run
    (``outcome``: the run succeeds, or its experiment raises)."""
    done = subprocess.run([sys.executable, "-c", KILLER, str(root), step, outcome],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 9, done.stderr  # it was killed where it was meant to be


@pytest.mark.parametrize("step, outcome", STEPS,
                         ids=[f"{outcome}-{step}" for step, outcome in STEPS])
def test_a_kill_while_finishing_leaves_nothing_complete_looking(tmp_path, step, outcome):
    kill_at(tmp_path / "runs", step, outcome)
    store = RunStore(tmp_path / "runs")
    [run] = store.runs()
    assert run.path.parent.name == INCOMPLETE
    if outcome == "fail" and step != "before-status":  # killed after it recorded its failure
        assert run.status == "failed" and run.meta.error == "RuntimeError: the experiment broke"
    else:
        assert run.status == "interrupted" and "without finishing" in run.meta.error
        assert len(store.remove_leftovers()) == 1 and store.runs() == []
    assert_nothing_complete(store)


def test_a_kill_after_the_rename_leaves_a_complete_run_whose_every_file_verifies(tmp_path):
    root = tmp_path / "runs"
    kill_at(root, "after-rename", "ok")
    [run] = RunStore(root).runs()
    assert run.status == "complete" and run.path == root / run.id
    run.verify()
    assert list(run.table("t").a) == [0, 1, 2]
    assert not list((root / INCOMPLETE).iterdir())


def test_every_file_and_folder_is_flushed_before_the_rename_and_the_parent_after(
        tmp_path, monkeypatch):
    events = []
    real_file, real_dir, real_replace = durable.fsync_file, durable.fsync_dir, os.replace
    monkeypatch.setattr(durable, "fsync_file",
                        lambda p: (events.append(("file", Path(p))), real_file(p)))
    monkeypatch.setattr(durable, "fsync_dir",
                        lambda p: (events.append(("dir", Path(p))), real_dir(p)))

    def replace(src, dst):
        if os.path.isdir(src):
            events.append(("rename", Path(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    store = RunStore(tmp_path / "runs")
    with store.start("exp", MODEL, {"n": 3}, tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": range(3)}))
        (run.dir / "recording" / "attn").mkdir(parents=True)
        (run.dir / "recording" / "attn" / "L000.bin").write_bytes(b"x" * 100)
        (run.dir / "recording" / "index.json").write_text("{}")
    rename = events.index(("rename", run.dir))
    flushed = {p.relative_to(run.dir) for kind, p in events[:rename]
               if kind == "file" and p.is_relative_to(run.dir)}
    on_disk = {p.relative_to(run.final) for p in run.final.rglob("*") if p.is_file()}
    assert on_disk == {Path("run.json"), Path("t.parquet"), Path("recording/index.json"),
                       Path("recording/attn/L000.bin")}
    assert on_disk <= flushed
    folders = {p for kind, p in events[:rename] if kind == "dir"}
    assert {run.dir, run.dir / "recording", run.dir / "recording" / "attn"} <= folders
    assert ("dir", store.root) in events[rename:]  # the rename itself is made durable


# ---- a full disk and a read-only filesystem (patched writers) --------------------------------

class Disk:
    """Patched writers: from ``fail`` on, every write of the kinds named raises ``error``."""

    def __init__(self, monkeypatch):
        self.error: OSError | None = None
        self.kinds: set[str] = set()
        real_bytes, real_parquet = durable._write_bytes, pd.DataFrame.to_parquet

        def write_bytes(fd, data):
            name = os.readlink(f"/proc/self/fd/{fd}")
            kind = "reserve" if name.endswith(RESERVE) else "json"
            if self.error is not None and kind in self.kinds:
                real_bytes(fd, data[: len(data) // 3])  # a partial write, then the error
                raise self.error
            real_bytes(fd, data)

        def to_parquet(df, path, **kwargs):
            if self.error is not None and "table" in self.kinds:
                Path(path).write_bytes(b"PAR1" + bytes(64))
                raise OSError(self.error.errno, self.error.strerror, str(path))
            real_parquet(df, path, **kwargs)

        monkeypatch.setattr(durable, "_write_bytes", write_bytes)
        monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)

    def fail(self, error: OSError, *kinds: str) -> None:
        self.error, self.kinds = error, set(kinds)


@pytest.fixture
def disk(monkeypatch):
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to tell the files written apart")
    return Disk(monkeypatch)


@pytest.mark.parametrize("error, kinds, where, cause", [
    (ENOSPC, ("table",), "table", "No space left on device"),
    (ENOSPC, ("table", "json"), "table", "No space left on device"),
    (ENOSPC, ("json",), "finish", "No space left on device"),
    (EROFS, ("table",), "table", "Read-only file system"),
], ids=["enospc-table", "enospc-table-and-run-json", "enospc-run-json-at-completion",
        "erofs-table"])
def test_a_full_or_read_only_disk_fails_the_run_with_its_cause(tmp_path, disk, caplog, error,
                                                               kinds, where, cause):
    store = RunStore(tmp_path / "runs")
    with pytest.raises(OSError) as caught, store.start("exp", MODEL, {"n": 3},
                                                       tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": range(3)}))
        disk.fail(error, *kinds)
        if where == "table":
            run.save_table("big", pd.DataFrame({"x": [0.5] * 10}))
    assert caught.value.errno == error.errno  # the error reaches the caller
    disk.fail(None)
    [failed] = store.runs()
    assert failed.status == "failed" and cause in failed.meta.error
    if where == "table":  # the cause recorded is the first error, not a later one
        assert ".big.parquet.tmp" in failed.meta.error
    assert ("using the reserved space" in caplog.text) == ("json" in kinds)
    assert failed.path == store.root / run.id  # a failed run is moved into place
    assert json.loads((failed.path / RUN_JSON).read_text())["status"] == "failed"
    assert "big" not in failed.table_names() and not (failed.path / "big.parquet").exists()
    assert leftovers(store.root) == [] and not (failed.path / RESERVE).exists()
    assert store.latest() is None


@pytest.mark.parametrize("kinds", [("reserve", "json"), ("json",)],
                         ids=["no-room-for-the-reserve", "no-room-for-run-json"])
def test_no_room_to_start_leaves_no_run(tmp_path, disk, kinds):
    store = RunStore(tmp_path / "runs")
    disk.fail(ENOSPC, *kinds)
    with pytest.raises(OSError, match="No space left"), store.start("exp", MODEL, {"n": 3}):
        pytest.fail("the run must not start")
    assert store.runs() == [] and not list((store.root / INCOMPLETE).iterdir())


def test_a_store_read_only_throughout_reports_the_error_and_never_looks_complete(
        tmp_path, disk, caplog):
    store = RunStore(tmp_path / "runs")
    with pytest.raises(OSError) as caught, store.start("exp", MODEL, {"n": 3},
                                                       tables=TABLES) as run:
        disk.fail(EROFS, "table", "json", "reserve")
        run.save_table("t", pd.DataFrame({"a": range(3)}))
    assert caught.value.errno == errno.EROFS
    assert "cannot be marked failed on disk" in caplog.text
    [stuck] = store.runs()
    assert stuck.status == "running"  # its process (this one) lives; interrupted after
    assert_nothing_complete(store)
    assert leftovers(store.root) == []


def test_a_flush_that_fails_at_completion_fails_the_run(tmp_path, monkeypatch):
    def broken(path):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    store = RunStore(tmp_path / "runs")
    with pytest.raises(OSError, match="Input/output error"), \
            store.start("exp", MODEL, {"n": 3}, tables=TABLES) as run:
        run.save_table("t", pd.DataFrame({"a": range(3)}))
        monkeypatch.setattr(durable, "fsync_file", broken)
    [failed] = store.runs()
    assert failed.status == "failed" and "Input/output error" in failed.meta.error
    assert failed.path.parent.name == INCOMPLETE  # could not be flushed, so not moved


# ---- a real tiny filesystem: full, and read-only ---------------------------------------------

def _namespaces() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


needs_tmpfs = pytest.mark.skipif(not _namespaces(),
                                 reason="needs unshare to mount a private tiny tmpfs")

REAL = textwrap.dedent('''
    import json, os, subprocess, sys
    from pathlib import Path
    import numpy as np, pandas as pd
    from workbench.store import provenance
    from workbench.store.runs import RunStore
    from workbench.store.schema import Table, columns, tables
    sys.path.insert(0, os.getcwd())  # the checkout, for the tests' fake model record
    from tests.tiny import fake_info

    provenance.collect = lambda: {"versions": {}, "git": None, "machine": None}
    MODEL = fake_info()
    root, mode = Path(sys.argv[1]), sys.argv[2]
    TABLES = tables(Table("t", "ints", columns(("a", "int", "a number"))),
                    Table("big", "floats", columns(("x", "float", "a number"))))
    store, result = RunStore(root / "runs"), {}
    try:
        with store.start("exp", MODEL, {"n": 3},
                         tables=TABLES) as run:
            run.save_table("t", pd.DataFrame({"a": range(3)}))
            if mode == "full":  # fill the disk to the last byte, then try to write more
                with open(run.dir / "filler", "wb", buffering=0) as fh:
                    try:
                        while True:
                            fh.write(b"\\0" * 4096)
                    except OSError:
                        pass
            else:
                subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
            run.save_table("big", pd.DataFrame({"x": np.random.rand(100_000)}))
    except OSError as exc:
        result["raised"] = str(exc)
    result["runs"] = [{"status": r.status, "error": r.meta.error, "path": str(r.path)}
                      for r in store.runs()]
    result["tmp"] = [str(p) for p in root.rglob("*.tmp")]
    print(json.dumps(result))
''')


def run_on_tmpfs(tmp_path: Path, mode: str) -> dict:
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = tmp_path / "script.py"
    script.write_text(REAL)
    shell = (f"mount -t tmpfs -o size=1m tmpfs {mount} && "
             f"exec {sys.executable} {script} {mount} {mode}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", shell], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_tmpfs
def test_a_really_full_disk_records_the_failure_in_the_reserved_space(tmp_path):
    result = run_on_tmpfs(tmp_path, "full")
    assert "No space left on device" in result["raised"]
    [run] = result["runs"]
    assert run["status"] == "failed" and "No space left on device" in run["error"]
    assert "/.incomplete/" not in run["path"] and result["tmp"] == []


@needs_tmpfs
def test_a_store_that_turns_read_only_is_never_complete_and_the_error_reaches_the_caller(
        tmp_path):
    result = run_on_tmpfs(tmp_path, "read-only")
    assert "Read-only file system" in result["raised"]
    [run] = result["runs"]
    assert run["status"] == "running" and "/.incomplete/" in run["path"]  # its process lives
    assert result["tmp"] == []
