"""The command line: one-line errors with exit status 2, and runs printed as the last line."""

from __future__ import annotations

import pytest

from tests.tiny import cli
from workbench.recording.reader import Recording
from workbench.store.runs import RunStore


@pytest.mark.parametrize("args, message", [
    (["run", "nope", "--model", "x"], "unknown experiment 'nope'; known experiments: "),
    (["run", "head-overview", "--model", "{folder}", "--set", "bogus=1"],
     "no config field 'bogus'; fields: prompt_set"),
    (["run", "head-overview", "--model", "{folder}", "--set", "n_boot=many"],
     "n_boot: expected int, got 'many'"),
    (["run", "head-overview", "--model", "{folder}", "--set", "prompt_set=poems"],
     "unknown prompt set 'poems'"),
    (["record", "{folder}", "--text", "  "], "--text is empty"),
    (["record", "{folder}", "--text", "the cat sat " * 200], "has a context of 512"),
    (["record", "{folder}", "--file", "/no/such/file.txt"],
     "cannot read prompt file /no/such/file.txt: No such file"),
    (["record", "no-such-model-name", "--text", "hi"],
     "unknown model 'no-such-model-name': not a bundled model (gemma3, minilm, smollm2)"),
    (["fetch", "gpt5"], "unknown model 'gpt5'; known models: gemma3, minilm, smollm2"),
    (["show", "nothing-here"], "no run 'nothing-here'"),
    (["run", "head-overveiw", "--model", "x"], "unknown experiment 'head-overveiw' (did you mean "
     "'head-overview'?)"),
    (["run", "head-overview", "--model", "{folder}", "--set", "n_bot=3"],
     "no config field 'n_bot' (did you mean 'n_boot'?)"),
    (["record", "minilmm", "--text", "hi"], "model 'minilmm' (did you mean 'minilm'?): not a"),
    (["record", "{folder}", "--prompt-set", "naturall"], "(did you mean 'natural'?)"),
    (["runs", "--experiment", "nope"], "unknown experiment 'nope'; runs are of: "),
    (["reproduce", "gu2024-sink-rate-natrual"], "(did you mean 'gu2024-sink-rate-natural' or"),
])
def test_bad_input_is_one_clear_line(capsys, runs_dir, llama_folder, args, message):
    args = [a.replace("{folder}", str(llama_folder)) for a in args]
    status, _, err = cli(capsys, *args)
    assert status == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not list(runs_dir.glob("*/run.json"))  # bad input creates no run


def test_record_show_and_runs(capsys, runs_dir, llama_folder):
    status, out, _ = cli(capsys, "record", str(llama_folder), "--text",
                         "the cat sat\n\nbread is made from flour")
    assert status == 0
    rec = Recording.open(out[-1])
    assert len(rec) == 2 and rec.tokens(1)[0] == "<bos>"
    run = RunStore(runs_dir).get(out[-1].split("/")[-1])
    status, out, _ = cli(capsys, "show", run.id)
    assert status == 0 and any(line.startswith("status     complete") for line in out)
    wall = next(line for line in out if line.startswith("wall time  "))
    assert wall.endswith(f"({run.meta.load_note})") and run.meta.load_at_end is not None
    status, out, _ = cli(capsys, "runs")
    assert "record" in out[2] and "complete" in out[2]


def test_record_file_is_split_at_blank_lines_unless_whole(capsys, runs_dir, llama_folder,
                                                            tmp_path):
    text = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    (tmp_path / "code.txt").write_text(text)
    status, out, _ = cli(capsys, "record", str(llama_folder), "--file",
                         str(tmp_path / "code.txt"))
    assert status == 0 and out[0].startswith(f"2 prompts from {tmp_path / 'code.txt'} "
                                             "(blank lines separate prompts; --whole")
    assert len(Recording.open(out[-1])) == 2
    status, out, _ = cli(capsys, "record", str(llama_folder), "--file",
                         str(tmp_path / "code.txt"), "--whole")
    assert status == 0 and out[0] == f"1 prompt from {tmp_path / 'code.txt'} (the whole file)"
    rec = Recording.open(out[-1])
    assert len(rec) == 1 and rec.prompts[0].text == text  # blank lines and indents kept
    status, _, err = cli(capsys, "record", str(llama_folder), "--text", "hi", "--whole")
    assert status == 2 and "--whole reads a --file as one prompt; it needs --file" in err


def test_run_experiment_writes_head_scores(capsys, runs_dir, llama_folder):
    status, out, _ = cli(capsys, "run", "head-overview", "--model", str(llama_folder),
                         "--set", "n_boot=50")
    assert status == 0
    run = RunStore(runs_dir).get(out[-1])
    scores = run.table("head_scores")
    assert {"layer", "head", "metric", "score", "ci_low", "ci_high"} <= set(scores.columns)
    assert len(scores) == 2 * 4 * 4  # layers x heads x metrics
    assert run.config["n_boot"] == 50 and run.meta.model.n_kv_heads == 2


def test_experiments_lists_fields(capsys):
    status, out, _ = cli(capsys, "experiments")
    assert status == 0 and any(line.startswith("head-overview") for line in out)
    assert any("prompt_set" in line for line in out)
