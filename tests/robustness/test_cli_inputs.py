"""Bad input and faults at the command line.

Every case runs the CLI in-process and asserts the documented exit status (2 bad input,
1 runtime failure, 130 interrupted), a single ``error: ...`` line naming what was wrong,
no Python traceback, and that no run was created; a failure during work instead leaves
exactly one failed run whose ``error`` names the cause, and nothing complete.
Bad input is refused before any model loads (``no_model_load``).
"""

from __future__ import annotations

import errno
import importlib
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.tiny import cli
from workbench.recording import writer
from workbench.store.runs import RunStore


def stored(runs_dir: Path) -> list[Path]:
    """Every run folder in the store, complete or not."""
    if not runs_dir.is_dir():
        return []
    found = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    incomplete = runs_dir / ".incomplete"
    return found + (list(incomplete.iterdir()) if incomplete.is_dir() else [])


def check_refused(result: tuple[int, list[str], str], status: int, fragment: str,
                  runs_dir: Path) -> None:
    """Exit ``status``, stderr exactly one ``error:`` line holding ``fragment``, no run."""
    code, _, err = result
    assert code == status, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err, err
    assert "Traceback" not in err
    assert stored(runs_dir) == []


def check_failed_run(result: tuple[int, list[str], str], status: int, fragment: str,
                     cause: str, runs_dir: Path) -> None:
    """Exit ``status``, one ``error:`` line (the last) holding ``fragment``, no traceback,
    and exactly one run in the store: failed, its error naming ``cause``."""
    code, _, err = result
    assert code == status, err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert fragment in errors[0], err
    assert "Traceback" not in err
    runs = RunStore(runs_dir).runs()
    assert len(runs) == 1 and len(stored(runs_dir)) == 1
    assert runs[0].status == "failed", runs[0].meta
    assert cause in runs[0].meta.error, runs[0].meta.error


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a folder\n")
    return path


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a model is loaded: bad input must be refused before that."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    # Imported first: were it imported by the setattr below, it would bind the patched
    # loader, and monkeypatch would "restore" the fake after the test.
    importlib.import_module("workbench.harness.experiment")
    monkeypatch.setattr("workbench.models.load.load_model", refuse)
    monkeypatch.setattr("workbench.harness.experiment.load_model", refuse)


def fill(args: list[str], **values: object) -> list[str]:
    return [a.format(**values) for a in args]


# ---- options out of range and usage errors: exit 2, one line --------------------------------

RECORD = ["record", "{folder}", "--text", "the cat sat"]

COUNT = "expected a whole number in 1 .. 1048576"

USAGE = [
    pytest.param([*RECORD, "--limit", "0"], f"argument --limit: {COUNT}, got '0'",
                 id="limit-zero"),
    pytest.param([*RECORD, "--limit", "-1"], f"argument --limit: {COUNT}, got '-1'",
                 id="limit-negative"),
    pytest.param([*RECORD, "--limit", "ten"], f"--limit: {COUNT}, got 'ten'",
                 id="limit-not-a-number"),
    pytest.param([*RECORD, "--max-batch-tokens", "0"], f"argument --max-batch-tokens: {COUNT}, "
                 "got '0'", id="max-batch-tokens-zero"),
    pytest.param([*RECORD, "--max-batch-tokens", "-64"], f"--max-batch-tokens: {COUNT}, "
                 "got '-64'", id="max-batch-tokens-negative"),
    pytest.param([*RECORD, "--max-batch-tokens", "many"], f"--max-batch-tokens: {COUNT}, "
                 "got 'many'", id="max-batch-tokens-text"),
    pytest.param(["show", "x", "--rows", "0"], f"argument --rows: {COUNT}, got '0'",
                 id="rows-zero"),
    pytest.param(["show", "x", "--rows", "-5"], f"--rows: {COUNT}, got '-5'",
                 id="rows-negative"),
    pytest.param(["dashboard", "--port", "99999"], "argument --port: expected a whole number "
                 "in 1 .. 65535, got '99999'", id="port-too-high"),
    pytest.param(["dashboard", "--port", "0"], "expected a whole number in 1 .. 65535, got '0'",
                 id="port-zero"),
    pytest.param(["dashboard", "--port=-80"], "expected a whole number in 1 .. 65535, got '-80'",
                 id="port-negative"),
    pytest.param(["dashboard", "--port", "http"], "--port: expected a whole number in 1 .. "
                 "65535, got 'http'", id="port-not-a-number"),
    pytest.param(["record", "{folder}"], "one of the arguments --text --file --prompt-set is "
                 "required", id="record-without-prompts"),
    pytest.param([*RECORD, "--prompt-set", "natural"], "not allowed with argument",
                 id="record-two-sources"),
    pytest.param(["frobnicate"], "invalid choice: 'frobnicate'", id="unknown-command"),
    pytest.param([*RECORD, "--store-dtype", "int8"], "--store-dtype: invalid choice: 'int8'",
                 id="unknown-store-dtype"),
]


@pytest.mark.parametrize("args, message", USAGE)
def test_option_out_of_range_is_one_line(capsys, runs_dir, llama_folder, no_model_load, args,
                                         message):
    result = cli(capsys, *fill(args, folder=llama_folder))
    check_refused(result, 2, message, runs_dir)
    assert "see `workbench" in result[2]  # the line says where the usage is


# ---- a run store that is not a folder or cannot be written: refused at once -----------------

STORE = [
    pytest.param(["runs", "--out", "{file}"], {}, "the run store {file} (--out) is not a folder",
                 id="runs-out-is-a-file"),
    pytest.param(["runs"], {"WORKBENCH_RUNS_DIR": "{file}"},
                 "the run store {file} (WORKBENCH_RUNS_DIR) is not a folder",
                 id="runs-env-is-a-file"),
    pytest.param([*RECORD, "--out", "{file}"], {}, "the run store {file} (--out) is not a folder",
                 id="record-out-is-a-file"),
    pytest.param(RECORD, {"WORKBENCH_RUNS_DIR": "{file}"},
                 "the run store {file} (WORKBENCH_RUNS_DIR) is not a folder",
                 id="record-env-is-a-file"),
    pytest.param(["run", "head-overview", "--model", "{folder}", "--out", "{file}/runs"], {},
                 "the run store {file}/runs (--out) is not a folder: {file} is a file",
                 id="run-out-inside-a-file"),
    pytest.param(["run", "head-overview", "--model", "{folder}"],
                 {"WORKBENCH_RUNS_DIR": "{file}/deeper/runs"},
                 "is not a folder: {file} is a file", id="run-env-inside-a-file"),
    pytest.param(["show", "x", "--out", "{file}"], {}, "the run store {file} (--out) is not a "
                 "folder", id="show-out-is-a-file"),
    pytest.param(["dashboard", "--runs", "{file}"], {}, "the run store {file} (--runs) is not a "
                 "folder", id="dashboard-runs-is-a-file"),
    pytest.param(["demo", "--out", "{file}"], {}, "the run store {file} (--out) is not a folder",
                 id="demo-out-is-a-file"),
    pytest.param(["reproduce", "--list", "--out", "{file}"], {}, "(--out) is not a folder",
                 id="reproduce-out-is-a-file"),
]


@pytest.mark.parametrize("args, env, message", STORE)
def test_store_that_is_not_a_folder_is_refused_at_once(capsys, monkeypatch, runs_dir, a_file,
                                                       llama_folder, no_model_load, args, env,
                                                       message):
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(file=a_file))
    result = cli(capsys, *fill(args, folder=llama_folder, file=a_file))
    check_refused(result, 2, message.format(file=a_file), runs_dir)
    assert a_file.read_text() == "not a folder\n"


class _ReadOnly:
    f_flag = os.ST_RDONLY


@pytest.mark.parametrize("command", [
    pytest.param(RECORD, id="record"),
    pytest.param(["run", "head-overview", "--model", "{folder}"], id="run"),
])
def test_read_only_store_is_refused_at_once(capsys, monkeypatch, runs_dir, llama_folder,
                                            no_model_load, command):
    monkeypatch.setattr(os, "statvfs", lambda path: _ReadOnly())
    result = cli(capsys, *fill(command, folder=llama_folder))
    check_refused(result, 2, f"cannot write the run store {runs_dir} (WORKBENCH_RUNS_DIR): ",
                  runs_dir)
    assert "is on a read-only file system" in result[2]


def test_store_without_write_permission_is_refused_at_once(capsys, monkeypatch, runs_dir,
                                                           llama_folder, no_model_load):
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: not mode & os.W_OK
                        and real_access(path, mode, **kw))
    result = cli(capsys, *fill(RECORD, folder=llama_folder))
    check_refused(result, 2, "cannot write the run store", runs_dir)
    assert "no permission to write in" in result[2]


def test_reading_commands_accept_a_read_only_store(capsys, monkeypatch, runs_dir):
    monkeypatch.setattr(os, "statvfs", lambda path: _ReadOnly())
    status, out, err = cli(capsys, "runs")
    assert status == 0 and out[0].startswith("no runs in") and err == ""


# ---- parameters of a generated prompt set: typed, named, before the model loads -------------

PROMPT_SET = ["record", "{folder}", "--prompt-set", "repeated-random"]

PROMPT_PARAMS = [
    pytest.param(["seq_len=-5"], "prompt set 'repeated-random': seq_len: expected at least 1, "
                 "got -5", id="seq-len-negative"),
    pytest.param(["n_prompts=0"], "prompt set 'repeated-random': n_prompts: expected at least "
                 "1, got 0", id="n-prompts-zero"),
    pytest.param(["repeats=0"], "repeats: expected at least 1, got 0", id="repeats-zero"),
    pytest.param(["seed=-1"], "seed: expected at least 0, got -1", id="seed-negative"),
    pytest.param(["seed=x"], "prompt set 'repeated-random': seed: expected int, got 'x'",
                 id="seed-not-a-number"),
    pytest.param(["n_prompts=2.5"], "n_prompts: expected int, got '2.5'", id="n-prompts-float"),
    pytest.param(["seq_len="], "seq_len: expected int, got ''", id="seq-len-empty"),
    pytest.param(["bogus=1"], "prompt set 'repeated-random' has no parameter 'bogus'; "
                 "parameters: n_prompts, seq_len, repeats, seed", id="unknown-parameter"),
    pytest.param(["seq_len"], "--set expects key=value, got 'seq_len'", id="set-without-value"),
    pytest.param(["n_prompts=4", "seq_len=0"], "seq_len: expected at least 1, got 0",
                 id="second-of-two-bad"),
]


@pytest.mark.parametrize("sets, message", PROMPT_PARAMS)
def test_prompt_set_parameters_are_typed(capsys, runs_dir, llama_folder, no_model_load, sets,
                                         message):
    args = fill(PROMPT_SET, folder=llama_folder)
    for item in sets:
        args += ["--set", item]
    check_refused(cli(capsys, *args), 2, message, runs_dir)


@pytest.mark.parametrize("args, message", [
    pytest.param(["record", "{folder}", "--prompt-set", "natural", "--set", "n_prompts=3"],
                 "prompt set 'natural' is a file and takes no parameters (got n_prompts)",
                 id="file-set-with-parameters"),
    pytest.param([*RECORD, "--set", "seq_len=3"], "--set sets parameters of a generated prompt "
                 "set; it needs --prompt-set NAME", id="set-without-prompt-set"),
    pytest.param(["record", "{folder}", "--prompt-set", "poems"], "unknown prompt set 'poems'; "
                 "known prompt sets: ", id="unknown-prompt-set"),
])
def test_prompt_set_misuse(capsys, runs_dir, llama_folder, no_model_load, args, message):
    check_refused(cli(capsys, *fill(args, folder=llama_folder)), 2, message, runs_dir)


def test_limit_keeps_the_first_prompts(capsys, runs_dir, llama_folder):
    """--limit N >= 1 records exactly the first N prompts (-1 used to drop the last)."""
    args = fill(PROMPT_SET, folder=llama_folder)
    status, out, _ = cli(capsys, *args, "--set", "n_prompts=3", "--set", "seq_len=4",
                         "--limit", "2")
    assert status == 0 and out[0].startswith("recorded 2 prompts")


# ---- config values: range, type and layers, before a run exists ----------------------------

CONFIG = [
    pytest.param("head-overview", ["seed=-1"], "seed: expected at least 0, got -1",
                 id="head-overview-seed-negative"),
    pytest.param("induction-heads", ["seed=-1"], "seed: expected at least 0, got -1",
                 id="induction-heads-seed-negative"),
    pytest.param("previous-token-heads", ["seed=-7"], "seed: expected at least 0, got -7",
                 id="previous-token-heads-seed-negative"),
    pytest.param("head-pruning", ["seed=-1"], "seed: expected at least 0, got -1",
                 id="head-pruning-seed-negative"),
    pytest.param("attention-sinks", ["seed=-1"], "seed: expected at least 0, got -1",
                 id="attention-sinks-seed-negative"),
    pytest.param("permutation-equivariance", ["seeds=0,-1"], "seeds: expected at least 0, "
                 "got -1", id="permutation-seeds-negative"),
    pytest.param("head-overview", ["seed=1.5"], "seed: expected int, got '1.5'",
                 id="seed-float"),
    pytest.param("induction-formation", ["lr=nan"], "lr: expected a finite number, got nan",
                 id="lr-nan"),
    pytest.param("induction-formation", ["lr=inf"], "lr: expected a finite number, got inf",
                 id="lr-inf"),
    pytest.param("induction-formation", ["lr=-1"], "lr: expected more than 0, got -1.0",
                 id="lr-negative"),
    pytest.param("induction-formation", ["lr=0"], "lr: expected more than 0, got 0.0",
                 id="lr-zero"),
    pytest.param("induction-formation", ["lr=fast"], "lr: expected float, got 'fast'",
                 id="lr-not-a-number"),
    pytest.param("induction-formation", ["seed=-1"], "seed: expected at least 0, got -1",
                 id="formation-seed-negative"),
    pytest.param("induction-formation", ["layers=0"], "layers: expected at least 1, got 0",
                 id="formation-layers-zero"),
    pytest.param("induction-formation", ["sources=", "text_files=/no/such/corpus.txt"],
                 "text_files: cannot read training text /no/such/corpus.txt: No such file or "
                 "directory", id="missing-text-file"),
    pytest.param("attention-sinks", ["n_prompts=0"], "n_prompts: expected at least 2, got 0",
                 id="sinks-n-prompts-zero"),
    pytest.param("permutation-equivariance", ["n_prompts=0"], "n_prompts: expected at least 1, "
                 "got 0", id="permutation-n-prompts-zero"),
    pytest.param("induction-heads", ["n_prompts=0"], "n_prompts: expected at least 2, got 0",
                 id="induction-n-prompts-zero"),
    pytest.param("head-overview", ["n_boot=1"], "n_boot: expected at least 2, got 1",
                 id="n-boot-one"),
    pytest.param("head-pruning", ["seed=18446744073709551616"], "seed: expected at most "
                 "4294967295, got 18446744073709551616", id="seed-above-32-bits"),
    pytest.param("head-pruning", ["batch_tokens=512"], "no config field 'batch_tokens' "
                 "(did you mean 'max_batch_tokens'", id="old-batch-field"),
    pytest.param("head-pruning", ["max_fraction=2"], "max_fraction: expected at most 1, got 2.0",
                 id="fraction-above-one"),
    pytest.param("attention-sinks", ["eps=nan"], "eps: expected a finite number, got nan",
                 id="eps-nan"),
    pytest.param("permutation-equivariance", ["layers=-1"], "layers: expected at least 0, got -1",
                 id="layer-negative"),
    pytest.param("attention-sinks", ["n_sinks=300"], "every sink count must be in 1..window-1",
                 id="across-fields"),
]


@pytest.mark.parametrize("experiment, sets, message", CONFIG)
def test_config_values_are_checked_before_a_run(capsys, runs_dir, llama_folder, no_model_load,
                                                experiment, sets, message):
    args = ["run", experiment]
    if experiment != "induction-formation":  # it builds its own models
        args += ["--model", str(llama_folder)]
    for item in sets:
        args += ["--set", item]
    check_refused(cli(capsys, *args), 2, message, runs_dir)


@pytest.mark.parametrize("sets, message", [
    pytest.param(["layers=99"], "layers: layer 99 is out of range; ", id="layer-99"),
    pytest.param(["layers=0,2"], "layers: layer 2 is out of range; ", id="layer-just-beyond"),
    pytest.param(["layers=0", "view_layers=5"], "view_layers: layer 5 is out of range; ",
                 id="view-layer-beyond"),
])
def test_layers_beyond_the_model_are_refused_before_a_run(capsys, runs_dir, llama_folder, sets,
                                                          message):
    """Layer indices are checked against the loaded model (2 layers), before a run exists."""
    args = ["run", "permutation-equivariance", "--model", str(llama_folder)]
    for item in sets:
        args += ["--set", item]
    result = cli(capsys, *args)
    check_refused(result, 2, message, runs_dir)
    assert "has 2 layers (0 .. 1)" in result[2]


# ---- failures during work: exit 1, one line, exactly one failed run with its cause -----------

def _raise(exc: BaseException):
    def fail(*args, **kwargs):
        raise exc

    return fail


RUN = ["run", "head-overview", "--model", "{folder}", "--set", "n_boot=5"]

DISK = [
    pytest.param(OSError(errno.ENOSPC, "No space left on device"),
                 "cannot write the run store {runs}: [Errno 28] No space left on device",
                 "No space left on device", id="disk-full"),
    pytest.param(OSError(errno.EROFS, "Read-only file system"),
                 "cannot write the run store {runs}: [Errno 30] Read-only file system",
                 "Read-only file system", id="read-only"),
    pytest.param(OSError(errno.EDQUOT, "Disk quota exceeded"),
                 "cannot write the run store {runs}: [Errno 122] Disk quota exceeded",
                 "Disk quota exceeded", id="quota"),
    pytest.param(PermissionError(errno.EACCES, "Permission denied", "{runs}/x/t.parquet"),
                 "cannot use the run store {runs}: [Errno 13] Permission denied "
                 "({runs}/x/t.parquet)", "Permission denied", id="permission-in-store"),
    pytest.param(OSError(errno.EIO, "Input/output error"), "[Errno 5] Input/output error",
                 "Input/output error", id="io-error"),
]


@pytest.mark.parametrize("exc, message, cause", DISK)
def test_disk_failure_writing_a_table(capsys, monkeypatch, runs_dir, llama_folder, exc, message,
                                      cause):
    if exc.filename is not None:
        exc.filename = exc.filename.format(runs=runs_dir)
    monkeypatch.setattr(pd.DataFrame, "to_parquet", _raise(exc))
    result = cli(capsys, *fill(RUN, folder=llama_folder))
    check_failed_run(result, 1, message.format(runs=runs_dir), cause, runs_dir)
    assert RunStore(runs_dir).runs(status="complete") == []


def test_disk_full_writing_a_recording(capsys, monkeypatch, runs_dir, llama_folder):
    monkeypatch.setattr(writer._Writer, "_flush",
                        _raise(OSError(errno.ENOSPC, "No space left on device")))
    result = cli(capsys, *fill(RECORD, folder=llama_folder))
    check_failed_run(result, 1, f"cannot write the run store {runs_dir}: [Errno 28] No space "
                     "left on device", "No space left on device", runs_dir)



DURING_WORK = [
    pytest.param(RuntimeError("boom"), 1, "error: internal error: RuntimeError: boom (run with "
                 "-v for the traceback)", "RuntimeError: boom", id="internal-error"),
    pytest.param(ValueError("first line\nsecond line"), 1, "error: internal error: ValueError: "
                 "first line second line (run with -v", "first line", id="multi-line-message"),
    pytest.param(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 1,
                 "error: cannot decode text as utf-8: invalid start byte at byte 0",
                 "invalid start byte", id="decode-error"),
    pytest.param(MemoryError(), 1, "error: out of memory", "MemoryError", id="out-of-memory"),
    pytest.param(KeyboardInterrupt(), 130, "error: interrupted", "KeyboardInterrupt",
                 id="ctrl-c"),
]


@pytest.mark.parametrize("exc, status, message, cause", DURING_WORK)
def test_failure_during_work(capsys, monkeypatch, runs_dir, llama_folder, exc, status, message,
                             cause):
    monkeypatch.setattr(writer, "record", _raise(exc))
    result = cli(capsys, *fill(RECORD, folder=llama_folder))
    check_failed_run(result, status, message, cause, runs_dir)


def test_sigterm_exits_130_and_marks_the_run_failed(capsys, monkeypatch, runs_dir, llama_folder):
    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises here
        raise AssertionError("SIGTERM was not handled")

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(writer, "record", terminated)
    result = cli(capsys, *fill(RECORD, folder=llama_folder))
    check_failed_run(result, 130, "error: terminated (SIGTERM)", "Terminated", runs_dir)
    assert signal.getsignal(signal.SIGTERM) is before  # main restores the handler


def test_sigterm_swallowed_by_the_dashboard_server_still_exits_130(capsys, monkeypatch,
                                                                   runs_dir):
    """Werkzeug stops cleanly on the interrupt SIGTERM raises and returns: the command
    still ends as terminated, and the next command in the process is not affected."""
    import dashboards.app

    def serve(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        except KeyboardInterrupt:
            return  # what the server does
        raise AssertionError("SIGTERM was not handled")

    monkeypatch.setattr(dashboards.app, "serve", serve)
    status, _, err = cli(capsys, "dashboard", "--runs", str(runs_dir))
    assert status == 130 and err.strip().splitlines()[-1] == "error: terminated (SIGTERM)"
    assert cli(capsys, "experiments")[0] == 0


def test_verbose_adds_the_traceback(capsys, monkeypatch, runs_dir, llama_folder):
    monkeypatch.setattr(writer, "record", _raise(RuntimeError("boom")))
    status, _, err = cli(capsys, "-v", *fill(RECORD, folder=llama_folder))
    assert status == 1
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1] == "error: internal error: RuntimeError: boom"


BEFORE_A_RUN = [
    pytest.param(PermissionError(errno.EACCES, "Permission denied", "/models/x/model.bin"),
                 "error: cannot use /models/x/model.bin: [Errno 13] Permission denied",
                 id="permission-elsewhere"),
    pytest.param(OSError(errno.ENOSPC, "No space left on device", "{cache}/models/m/w.bin"),
                 "error: cannot write the model cache {cache}: [Errno 28] No space left on "
                 "device ({cache}/models/m/w.bin)", id="disk-full-in-the-cache"),
    pytest.param(OSError(errno.ENOSPC, "No space left on device", "/elsewhere/x"),
                 "error: cannot write /elsewhere/x: [Errno 28] No space left on device",
                 id="disk-full-elsewhere"),
    pytest.param(OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b"),
                 "error: cannot use /a -> /b: [Errno 18] Invalid cross-device link",
                 id="rename-across-devices"),
    pytest.param(UnicodeEncodeError("ascii", "\u00e9", 0, 1, "ordinal not in range(128)"),
                 "error: cannot encode text as ascii: ordinal not in range(128); set a UTF-8 "
                 "locale", id="encode-error"),
]


@pytest.mark.parametrize("exc, message", BEFORE_A_RUN)
def test_failure_before_a_run_says_what_and_where(capsys, monkeypatch, tmp_path, runs_dir,
                                                  llama_folder, exc, message):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache))
    if isinstance(exc, OSError) and exc.filename is not None:
        exc.filename = exc.filename.format(cache=cache)
    monkeypatch.setattr("workbench.models.load.load_model", _raise(exc))
    result = cli(capsys, *fill(RECORD, folder=llama_folder))
    check_refused(result, 1, message.format(cache=cache), runs_dir)


def test_disk_full_while_fetching_names_the_cache(capsys, monkeypatch, tmp_path, runs_dir):
    cache = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_CACHE", str(cache))
    monkeypatch.setattr("workbench.models.cache.is_cached", lambda name: False)
    monkeypatch.setattr("workbench.models.cache.fetch",
                        _raise(OSError(errno.ENOSPC, "No space left on device")))
    result = cli(capsys, "fetch", "minilm")
    check_refused(result, 1, f"error: cannot write the model cache {cache}: [Errno 28] No "
                  "space left on device", runs_dir)


def test_a_workbench_error_during_work_is_bad_input(capsys, monkeypatch, runs_dir, llama_folder):
    from workbench.core.errors import WorkbenchError

    monkeypatch.setattr(writer, "record", _raise(WorkbenchError("the prompt is not usable")))
    result = cli(capsys, *fill(RECORD, folder=llama_folder))
    check_failed_run(result, 2, "error: the prompt is not usable", "the prompt is not usable",
                     runs_dir)


# ---- every config declares its ranges ------------------------------------------------------

def _numeric(tp) -> bool:
    import typing

    args = typing.get_args(tp)
    return tp in (int, float) or (typing.get_origin(tp) is tuple and args[0] in (int, float))


def test_every_numeric_config_field_declares_a_range():
    """Seeds >= 0, sizes >= 1, rates > 0...: a number without a declared range is a gap."""
    import dataclasses
    import typing

    from workbench.harness.experiment import all_experiments

    missing = []
    # (other tests register experiments of their own; only the experiments package counts)
    for exp in (e for e in all_experiments() if e.module.startswith("experiments.")):
        hints = typing.get_type_hints(exp.config)
        for f in dataclasses.fields(exp.config):
            bounds = [f.metadata.get(k) for k in ("min", "max", "above")]
            if _numeric(hints[f.name]) and all(b is None for b in bounds):
                missing.append(f"{exp.name}.{f.name}")
    assert missing == []


def test_experiments_lists_exclusive_and_layer_ranges(capsys):
    status, out, _ = cli(capsys, "experiments")
    assert status == 0
    assert any(line.split()[:1] == ["lr"] and "> 0" in line for line in out)
    assert any(line.split()[:1] == ["layers"] and "a layer of the model" in line for line in out)


def test_check_layers_names_the_field_and_the_model():
    from experiments.permutation_equivariance import Config
    from workbench.core.errors import ConfigError
    from workbench.harness.config import check_layers

    check_layers(Config(layers=(0, 1), view_layers=(1,)), 2, "tiny")  # fits
    with pytest.raises(ConfigError, match=r"^view_layers: layer 2 is out of range; tiny has 2 "
                       r"layers \(0 \.\. 1\)$"):
        check_layers(Config(layers=(), view_layers=(2,)), 2, "tiny")
