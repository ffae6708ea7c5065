"""Inputs that used to pass the checks and fail later (or never finish), stored text that
used to reach the terminal raw, and exit statuses that used to be wrong.

Every refusal runs the CLI in-process and asserts the exit status, the one ``error:``
line with its specific message, no traceback and no run in the store (bad input is
refused before ``RunStore.start``; before the model loads where no model is needed to
judge it, ``no_model_load``). The printing cases assert what a terminal would show: one
line per row and no control character at all.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from transformers import PreTrainedTokenizerBase

from tests.robustness.test_cli_inputs import check_refused, no_model_load  # noqa: F401 (a fixture)
from tests.tiny import cli, fake_info
from workbench.store.runs import RUN_JSON, RunStore
from workbench.store.schema import Table, columns, tables

COUNT = "expected a whole number in 1 .. 1048576"


def _run_args(experiment: str, folder: Path, sets: list[str]) -> list[str]:
    args = ["run", experiment]
    if experiment != "induction-formation":  # it trains its own models
        args += ["--model", str(folder)]
    for item in sets:
        args += ["--set", item]
    return args


# ---- every number has an upper bound: huge values are refused before anything runs -------

HUGE = [
    pytest.param("head-overview", ["n_boot=10001"], "n_boot: expected at most 10000, got 10001",
                 id="n-boot-above-cap"),
    pytest.param("attention-sinks", ["n_prompts=1000000000"], "n_prompts: expected at most "
                 "4096, got 1000000000", id="sinks-n-prompts-a-billion"),
    pytest.param("induction-heads", ["seq_len=70000"], "seq_len: expected at most 65536, got "
                 "70000", id="induction-seq-len-beyond-any-context"),
    pytest.param("induction-heads", ["repeats=65"], "repeats: expected at most 64, got 65",
                 id="induction-repeats"),
    pytest.param("previous-token-heads", ["n_tokens=99999999999999999999"], "n_tokens: "
                 "expected at most 65536, got 99999999999999999999", id="beyond-int64"),
    pytest.param("permutation-equivariance", ["seeds=0,4294967296"], "seeds: expected at most "
                 "4294967295, got 4294967296", id="tuple-seed-above-32-bits"),
    pytest.param("permutation-equivariance", ["shifts=1,2000000"], "shifts: expected at most "
                 "1048576, got 2000000", id="position-shift"),
    pytest.param("permutation-equivariance", ["layers=70000"], "layers: expected at most "
                 "65535, got 70000", id="layer-index-beyond-any-model"),
    pytest.param("induction-formation", ["steps=10000000"], "steps: expected at most 1000000, "
                 "got 10000000", id="training-steps"),
    pytest.param("induction-formation", ["lr=2"], "lr: expected at most 1, got 2.0",
                 id="learning-rate-above-one"),
    pytest.param("induction-formation", ["d_model=1e9"], "d_model: expected int, got '1e9'",
                 id="int-in-scientific-notation"),
    pytest.param("head-pruning", ["n_random=101"], "n_random: expected at most 100, got 101",
                 id="pruning-orders"),
    pytest.param("qk-attribution", ["n_random=1001"], "n_random: expected at most 1000, got "
                 "1001", id="random-draws"),
    pytest.param("head-pruning", ["fit_tokens=2000000"], "fit_tokens: expected at most "
                 "1048576, got 2000000", id="text-tokens"),
    pytest.param("attention-sinks", ["eps=1e400"], "eps: expected a finite number, got inf",
                 id="float-overflowing-to-inf"),
    pytest.param("head-overview", ["seed=" + "9" * 5000], "seed: expected int, got "
                 f"'{'9' * 55}'... (5000 characters)", id="five-thousand-digits"),
    pytest.param("permutation-equivariance", ["seeds=" + ",".join(map(str, range(2000)))],
                 "seeds: expected at most 1024 items, got 2000", id="tuple-of-2000-items"),
    pytest.param("head-overview", ["prompt_set=" + "x" * 5000], "prompt_set: expected at most "
                 "4096 characters, got 5000", id="string-of-5000-characters"),
]


@pytest.mark.parametrize("experiment, sets, message", HUGE)
@pytest.mark.usefixtures("no_model_load")
def test_huge_numbers_are_refused_before_a_run(capsys, runs_dir, llama_folder, experiment, sets,
                                               message):
    check_refused(cli(capsys, *_run_args(experiment, llama_folder, sets)), 2, message,
                  runs_dir)


# ---- numbers from text are ASCII decimal syntax ---------------------------------------------

RECORD = ["record", "{folder}", "--text", "the cat sat"]
MODEL = ["--model", "{folder}"]
OVERVIEW = ["run", "head-overview", *MODEL, "--set"]

DIGITS = [
    pytest.param([*OVERVIEW, "seed=\u0663"], "seed: expected int, got '\u0663'",
                 id="arabic-indic-three"),
    pytest.param([*OVERVIEW, "seed=\uff11\uff10"], "seed: expected int, got '\uff11\uff10'",
                 id="fullwidth-ten"),
    pytest.param([*OVERVIEW, "seed=1_0"], "seed: expected int, got '1_0'",
                 id="underscore-in-int"),
    pytest.param([*OVERVIEW, "seed=0x10"], "seed: expected int, got '0x10'", id="hexadecimal"),
    pytest.param(["run", "induction-formation", "--set", "lr=\uff11e-3"], "lr: expected float, "
                 "got '\uff11e-3'", id="fullwidth-digit-in-float"),
    pytest.param(["run", "attention-sinks", *MODEL, "--set", "eps=0_5"], "eps: expected float, got "
                 "'0_5'", id="underscore-in-float"),
    pytest.param(["run", "permutation-equivariance", *MODEL, "--set", "seeds=0,\u0662"], "seeds: "
                 "expected int, got '\u0662'", id="arabic-indic-digit-in-a-tuple"),
    pytest.param([*RECORD, "--limit", "\u0663"], f"argument --limit: {COUNT}, got '\u0663'",
                 id="limit-arabic-indic"),
    pytest.param([*RECORD, "--topk", "1_6"], f"argument --topk: {COUNT}, got '1_6'",
                 id="topk-underscore"),
    pytest.param(["dashboard", "--port", "\uff18\uff10\uff15\uff10"], "argument --port: "
                 "expected a whole number in 1 .. 65535, got '\uff18\uff10\uff15\uff10'",
                 id="port-fullwidth"),
    pytest.param(["record", "{folder}", "--prompt-set", "repeated-random", "--set",
                  "seq_len=\u0664"], "prompt set 'repeated-random': seq_len: expected int, "
                 "got '\u0664'", id="prompt-set-parameter-arabic-indic"),
]


# ---- every numeric option has an upper bound ------------------------------------------------

OPTIONS = [
    pytest.param([*RECORD, "--topk", "1000000000"], f"argument --topk: {COUNT}, got "
                 "'1000000000'", id="topk-a-billion"),
    pytest.param([*RECORD, "--limit", "2000000"], f"argument --limit: {COUNT}, got '2000000'",
                 id="limit-two-million"),
    pytest.param(["show", "x", "--rows", "99999999"], f"argument --rows: {COUNT}, got "
                 "'99999999'", id="rows"),
    pytest.param([*RECORD, "--max-batch-tokens", "2000000"], f"argument --max-batch-tokens: "
                 f"{COUNT}, got '2000000'", id="max-batch-tokens"),
    pytest.param(["sweep", "spec.toml", "--cpus", "100000"], "argument --cpus: expected a whole "
                 "number of CPUs per cell in 1..1024, got 100000", id="sweep-cpus"),
    pytest.param(["sweep", "spec.toml", "--gpus", "-1"], "argument --gpus: expected 0..64 GPUs "
                 "per cell, got -1", id="sweep-gpus-negative"),
    pytest.param(["sweep", "spec.toml", "--gpus", "nan"], "argument --gpus: expected a number "
                 "of GPUs per cell, got nan", id="sweep-gpus-nan"),
    pytest.param(["record", "{folder}", "--prompt-set", "repeated-random", "--set",
                  "n_prompts=5000"], "prompt set 'repeated-random': n_prompts: expected at "
                 "most 4096, got 5000", id="prompt-set-n-prompts"),
]


@pytest.mark.parametrize("args, message", DIGITS + OPTIONS)
@pytest.mark.usefixtures("no_model_load")
def test_numbers_on_the_command_line(capsys, runs_dir, llama_folder, args, message):
    args = [a.format(folder=llama_folder) for a in args]
    check_refused(cli(capsys, *args), 2, message, runs_dir)


def test_topk_beyond_the_context_is_refused_before_a_run(capsys, runs_dir, llama_folder):
    """The tiny model's context is 512 tokens: a larger k is refused once it has loaded,
    before anything is allocated or stored."""
    result = cli(capsys, *[a.format(folder=llama_folder) for a in RECORD], "--topk", "1024")
    check_refused(result, 2, "--topk 1024: expected at most the context of", runs_dir)
    assert "(512 tokens)" in result[2]


# ---- prompt files: regular, bounded, UTF-8, checked whole before a run ----------------------

def _bytes(data: bytes):
    def make(path: Path) -> Path:
        path.write_bytes(data)
        return path
    return make


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _symlink(target: str):
    def make(path: Path) -> Path:
        path.symlink_to(target)
        return path
    return make


def _sparse(size: int):
    def make(path: Path) -> Path:
        with open(path, "wb") as fh:
            fh.truncate(size)  # a hole: no disk used, and all of it NULs
        return path
    return make


FILES = [
    pytest.param(_symlink("/dev/zero"), "prompt file {path} is not a regular file (a "
                 "character device)", id="dev-zero"),
    pytest.param(_fifo, "prompt file {path} is not a regular file (a FIFO)",
                 id="fifo"),
    pytest.param(lambda p: (p.mkdir(), p)[1], "prompt file {path} is not a regular file (a "
                 "directory)", id="directory"),
    pytest.param(_symlink("/no/such/target"), "cannot read prompt file {path}: No such file "
                 "or directory", id="broken-symlink"),
    pytest.param(_sparse((16 << 20) + 1), "prompt file {path} is larger than 16 MiB",
                 id="larger-than-16-mib"),
    pytest.param(_bytes("the cat sat\n".encode("utf-16-le")), "prompt file {path} is not UTF-8 "
                 "text: it holds NUL bytes (the first at byte 1) and looks like UTF-16 "
                 "little-endian text; save it as UTF-8", id="utf-16-le-without-bom"),
    pytest.param(_bytes("the cat sat\n".encode("utf-16-be")), "it holds NUL bytes (the first "
                 "at byte 0) and looks like UTF-16 big-endian text", id="utf-16-be-without-bom"),
    pytest.param(_bytes("the cat sat\n".encode("utf-16")), "prompt file {path} is not UTF-8 "
                 "text: it starts with the byte-order mark of UTF-16 little-endian",
                 id="utf-16-with-bom"),
    pytest.param(_bytes("the cat\n".encode("utf-32")), "it starts with the byte-order mark of "
                 "UTF-32 little-endian", id="utf-32-with-bom"),
    pytest.param(_bytes("the cat\n".encode("utf-32-le")), "looks like UTF-32 little-endian text",
                 id="utf-32-without-bom"),
    pytest.param(_bytes("caf\u00e9 au lait\n".encode("latin-1")), "prompt file {path} is not "
                 "UTF-8 text: byte 0xe9 at byte 3 is not valid UTF-8; it looks like Latin-1 or "
                 "Windows-1252 text", id="latin-1"),
    pytest.param(_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "holds NUL bytes (the first at "
                 "byte 8) and looks like binary data, not text", id="png"),
    pytest.param(_bytes(b"the cat\x00 sat\n"), "it holds NUL bytes (the first at byte 7)",
                 id="one-nul-in-ascii"),
    pytest.param(_bytes(b"\xed\xa0\x80 a surrogate\n"), "byte 0xed at byte 0 is not valid UTF-8",
                 id="encoded-surrogate"),
    pytest.param(_bytes(b"  \n\t\n \r\n\n"), "prompt file {path} is empty",
                 id="only-whitespace-lines"),
    pytest.param(_bytes(b""), "prompt file {path} is empty", id="empty"),
]


@pytest.mark.parametrize("make, message", FILES)
@pytest.mark.usefixtures("no_model_load")
def test_a_bad_prompt_file_is_refused_before_the_model_loads(capsys, runs_dir, llama_folder,
                                                             tmp_path, make, message):
    path = make(tmp_path / "prompts.txt")
    # /dev/zero and a FIFO are refused from their stat, never opened: reading the one would
    # not end, and opening the other would block until a writer came
    result = cli(capsys, "record", str(llama_folder), "--file", str(path))
    check_refused(result, 2, message.format(path=path), runs_dir)


def test_a_paragraph_far_beyond_the_context_is_refused_before_tokenizing(capsys, runs_dir,
                                                                         llama_folder, tmp_path,
                                                                         monkeypatch):
    """16 MiB of one paragraph: the tiny model's 512-token context holds at most 16,384
    characters (32 per token), so it is refused at once rather than tokenized."""
    path = tmp_path / "long.txt"
    path.write_text("word " * (3 << 20))
    tokenized = []
    real = PreTrainedTokenizerBase.__call__

    def spy(self, text=None, *args, **kwargs):
        tokenized.append(len(text or ""))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", spy)
    result = cli(capsys, "record", str(llama_folder), "--file", str(path))
    check_refused(result, 2, "prompt long[0] has 15728639 characters: too long for", runs_dir)
    assert "context of 512 tokens (at most 16384 characters, 32 per token, are tokenized)" \
        in result[2]
    assert all(n <= 16384 for n in tokenized), tokenized  # the paragraph never reached it


def test_whitespace_only_lines_separate_prompts(capsys, runs_dir, llama_folder, tmp_path):
    path = tmp_path / "three.txt"
    path.write_text("the cat sat\n   \nthe dog ran\n\t\r\non the mat\n")
    status, out, err = cli(capsys, "record", str(llama_folder), "--file", str(path))
    assert status == 0, err
    assert out[0].startswith(f"3 prompts from {path}")
    assert out[1].startswith("recorded 3 prompts")


# ---- prompt-set files are checked by content before a run, not only by name ----------------

@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """A copy of the data folder (prompt sets, claims) whose files a test may break."""
    import shutil

    from workbench.core import paths

    folder = tmp_path / "data"
    for part in ("prompts", "claims"):
        shutil.copytree(paths.data_dir() / part, folder / part)
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(folder))
    return folder


PROMPT_SETS = [
    pytest.param("bad.txt", "the cat sat\n".encode("utf-16-le"), "head-overview",
                 "prompt file {path} is not UTF-8 text: it holds NUL bytes", id="utf-16-set"),
    pytest.param("bad.tsv", b"a cat\ta dog\nno tab here\n", "head-overview",
                 "prompt file {path} line 2: expected 'sentence<TAB>sentence' (one tab between "
                 "two sentences), got 'no tab here'", id="tsv-line-without-tab"),
    pytest.param("bad.tsv", b"a\tb\tc\n", "permutation-equivariance",
                 "prompt file {path} line 1: expected 'sentence<TAB>sentence'",
                 id="tsv-line-with-two-tabs"),
    pytest.param("bad.tsv", b"a cat\t   \n", "head-overview", "line 1: expected "
                 "'sentence<TAB>sentence'", id="tsv-empty-second-sentence"),
    pytest.param("bad.txt", b" \n \n", "permutation-equivariance", "prompt file {path} is "
                 "empty", id="whitespace-set"),
    pytest.param("bad.txt", None, "previous-token-heads", "prompt file {path} is not a "
                 "regular file (a character device)", id="set-linked-to-dev-zero"),
]


@pytest.mark.parametrize("name, content, experiment, message", PROMPT_SETS)
@pytest.mark.usefixtures("no_model_load")
def test_a_malformed_prompt_set_file_is_refused_before_a_run(capsys, runs_dir, llama_folder,
                                                             data_dir, name, content, experiment,
                                                             message):
    path = data_dir / "prompts" / name
    if content is None:
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(content)
    field = "text" if experiment == "previous-token-heads" else "prompt_set"
    args = _run_args(experiment, llama_folder, [f"{field}=bad"])
    check_refused(cli(capsys, *args), 2, message.format(path=path), runs_dir)


@pytest.mark.usefixtures("no_model_load")
def test_record_refuses_a_malformed_prompt_set_file_before_the_model(capsys, runs_dir,
                                                                     llama_folder, data_dir):
    path = data_dir / "prompts" / "bad.txt"
    path.write_bytes(b"caf\xe9\n")
    result = cli(capsys, "record", str(llama_folder), "--prompt-set", "bad")
    check_refused(result, 2, f"prompt file {path} is not UTF-8 text: byte 0xe9 at byte 3",
                  runs_dir)


# ---- claims files: a binary or wrong-shaped file is one line and status 2 -----------------

CLAIMS = [
    pytest.param(bytes(range(256)) * 4, "bad.json is not valid JSON", id="binary"),
    pytest.param(b'["\xff"]', "bad.json is not valid JSON (invalid unicode code point",
                 id="invalid-utf-8-in-a-string"),
    pytest.param(b'{"a": 1}', 'bad.json: expected a valid array, got {"a": 1}',
                 id="object-not-list"),
    pytest.param(b"[1]", "bad.json '0': expected an object, got 1", id="list-of-numbers"),
    pytest.param(b'[{"id": "x"}]', "bad.json has no '0.kind'", id="claim-missing-fields"),
    pytest.param(b"[" * 200, "bad.json is not valid JSON", id="unterminated-nesting"),
    pytest.param("[]".encode("utf-16"), "bad.json is not valid JSON", id="utf-16"),
    pytest.param(None, "the claims file {path} is not a regular file (a FIFO)",
                 id="fifo"),
]


@pytest.mark.parametrize("listing", [True, False], ids=["list", "run"])
@pytest.mark.parametrize("content, message", CLAIMS)
@pytest.mark.usefixtures("no_model_load")
def test_a_bad_claims_file_is_one_line_and_status_2(capsys, runs_dir, data_dir, content, message,
                                                    listing):
    path = data_dir / "claims" / "bad.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    result = cli(capsys, "reproduce", *(["--list"] if listing else []))
    check_refused(result, 2, message.replace("{path}", str(path)), runs_dir)


# ---- stored text is printed inert -----------------------------------------------------------

ONE = Table("t", "one text column", columns(("a", "str", "some text")))
ESCAPE = "\x1b[2K\r"  # erase the line, back to its start: the next text overwrites it


def _run(store: RunStore, **changes) -> Path:
    """A complete run whose ``run.json`` then gets ``changes`` (as a hostile file would)."""
    with store.start("exp", fake_info(), {"n": 1}, tables=tables(ONE)) as run:
        run.save_table("t", pd.DataFrame({"a": [f"cell{ESCAPE}forged", "plain"]}))
    path = store.get(run.id).path
    meta = json.loads((path / RUN_JSON).read_text())
    meta.update(changes)
    (path / RUN_JSON).write_text(json.dumps(meta))
    return path


def _shown_inert(out: list[str]) -> None:
    for line in out:
        assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in line), repr(line)


@pytest.fixture
def no_provenance(monkeypatch):
    from workbench.store import provenance

    monkeypatch.setattr(provenance, "collect",
                        lambda: {"versions": {}, "git": None, "machine": None})


@pytest.mark.usefixtures("no_provenance")
def test_show_prints_a_forged_status_in_the_error_inert(capsys, runs_dir):
    path = _run(RunStore(runs_dir), status="failed",
                error=f"boom{ESCAPE}status     complete\nstatus     complete")
    status, out, err = cli(capsys, "show", path.name)
    assert status == 0, err
    _shown_inert(out)
    assert [line for line in out if line.startswith("status")] == [
        next(line for line in out if line.startswith("status     failed"))]
    assert "error      boom\\x1b[2K\\rstatus     complete\\nstatus     complete" in out


@pytest.mark.usefixtures("no_provenance")
def test_show_prints_summary_lines_and_table_cells_inert(capsys, runs_dir):
    path = _run(RunStore(runs_dir), summary=["fine", f"second{ESCAPE}\nthird"])
    status, out, err = cli(capsys, "show", path.name, "--table", "t")
    assert status == 0, err
    _shown_inert(out)
    assert [line for line in out if line.startswith("summary")] == [
        "summary    fine", "summary    second\\x1b[2K\\r\\nthird"]
    assert any("cell\\x1b[2K\\rforged" in line for line in out)


@pytest.mark.usefixtures("no_provenance")
def test_a_newline_in_a_folder_name_is_one_damaged_row(capsys, runs_dir):
    store = RunStore(runs_dir)
    real = _run(store)
    forged = runs_dir / f"{real.name}\n{real.name}  exp  tiny  complete  2026"
    forged.mkdir()
    (forged / RUN_JSON).write_bytes((real / RUN_JSON).read_bytes())
    status, out, err = cli(capsys, "runs")
    assert status == 0, err
    _shown_inert(out)
    rows = out[2:-2]  # header, rule, ..., blank, count
    assert len(rows) == 2 and out[-1].startswith("2 runs in")
    damaged = [row for row in rows if "\\n" in row]
    assert len(damaged) == 1 and "damaged" in damaged[0].split()


@pytest.mark.usefixtures("no_provenance")
def test_an_escape_in_a_stored_experiment_name_is_printed_inert(capsys, runs_dir):
    _run(RunStore(runs_dir), experiment=f"exp{ESCAPE}hidden")
    status, out, err = cli(capsys, "runs")
    assert status == 0, err
    _shown_inert(out)
    assert any("exp\\x1b[2K\\rhidden" in line for line in out)


# ---- exit statuses ---------------------------------------------------------------------------

def test_sigint_to_a_serving_dashboard_exits_130(capsys, monkeypatch, runs_dir):
    """Werkzeug stops cleanly on Ctrl-C and returns: the command still ends interrupted."""
    import dashboards.app

    def serve(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
        except KeyboardInterrupt:
            return  # what the server does
        raise AssertionError("SIGINT was not handled")

    before = signal.getsignal(signal.SIGINT)
    # Python's own handler, as a fresh process has it: whatever ran before in this process
    # left it so (tests/conftest.py puts it back after each test)
    assert before is signal.default_int_handler
    monkeypatch.setattr(dashboards.app, "serve", serve)
    status, _, err = cli(capsys, "dashboard", "--runs", str(runs_dir))
    assert status == 130 and err.strip().splitlines()[-1] == "error: interrupted"
    assert signal.getsignal(signal.SIGINT) is before  # main restores the handler
    assert cli(capsys, "experiments")[0] == 0
