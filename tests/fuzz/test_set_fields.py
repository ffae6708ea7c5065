"""Fuzzing ``--set FIELD=VALUE`` for every field of every experiment, the text-to-number
rule, and ``workbench record --file`` with arbitrary bytes.

The fields are discovered from the experiment registry, so a new experiment or field is
fuzzed without a change here. Properties, whatever the text or bytes:

- only a :class:`WorkbenchError` (a ``ConfigError`` for a value) is raised, never another
  exception, and its message is one printable line of bounded length;
- a value that is accepted lies within its field's declared range (checked here against
  the declaration, not by the rule under test);
- through the command line: exit status 2 and exactly one ``error:`` line, no traceback,
  and no run in the store; the model load is stubbed with the tiny model and
  ``RunStore.start`` with a marker, so an accepted input is seen to reach the run store
  (and what it would store is checked) while a refused one is seen to stop before it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tiny import cli
from workbench.core import values
from workbench.core.errors import ConfigError, WorkbenchError
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import all_experiments
from workbench.store.runs import RunStore

EXPERIMENTS = [e for e in all_experiments() if e.module.startswith("experiments.")]
FIELDS = [(exp, f) for exp in EXPERIMENTS for f in dataclasses.fields(exp.config)]
PER_FIELD = max(10, settings.default.max_examples // 6)
"""Examples per field (there are more than a hundred fields): 10 with the ``ci`` profile,
hundreds with ``fuzz``."""
REACHED = "the run store was reached"
"""The marker ``RunStore.start`` raises in these tests: the input passed every check."""


# ---- strategies ----------------------------------------------------------------------------

def _digits_of_other_scripts() -> st.SearchStrategy[str]:
    """Decimal digits that are not ASCII (Arabic-Indic, fullwidth, Devanagari, ...)."""
    return st.text(st.characters(categories=["Nd"], exclude_characters="0123456789"),
                   min_size=1, max_size=6)


def _decimal(sign: str, whole: int, fraction: int | None, exponent: int | None) -> str:
    text = f"{sign}{whole}" + ("" if fraction is None else f".{fraction or ''}")
    return text + ("" if exponent is None else f"e{exponent:+d}")


NUMBER_TEXT = st.one_of(
    st.integers().map(str),
    st.integers(min_value=-(2**200), max_value=2**200).map(str),
    st.floats().map(repr),
    st.builds(_decimal, st.sampled_from(["", "+", "-"]), st.integers(0, 10**24),
              st.none() | st.integers(0, 10**8), st.none() | st.integers(-9999, 9999)),
    st.lists(st.integers(0, 9999), min_size=2, max_size=4).map(
        lambda parts: "_".join(map(str, parts))),
    _digits_of_other_scripts(),
    st.sampled_from(["nan", "-inf", "Infinity", "1e400", "0x10", "1_000", " 7 ", "+3", "-0",
                     "9" * 500, "", "none", "true", ".", "1e", "e5", "\u0663", "\uff11\uff10"]),
)
"""Text that is, nearly is, or looks like a number."""

ANY_TEXT = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=40),  # surrogates and controls included
    st.text(st.sampled_from("\n\r\t\x1b[0m;,= \x00\u202e\u2028"), max_size=12),
)


def _bound_text(meta: typing.Mapping[str, typing.Any]) -> st.SearchStrategy[str]:
    """Numbers at and just past the field's declared bounds."""
    edges = [b for b in (meta.get("min"), meta.get("max"), meta.get("above")) if b is not None]
    near = [e + d for e in edges for d in (-1, -0.5, 0, 0.5, 1)]
    return st.sampled_from(sorted({str(int(x)) if float(x).is_integer() else repr(x)
                                   for x in near} or {"0"}))


def _field_text(exp, field: dataclasses.Field) -> st.SearchStrategy[str]:
    """Text for ``--set field=...``: arbitrary, numeric-looking, near the bounds, the
    field's Literal options, comma lists of those."""
    tp = typing.get_type_hints(exp.config)[field.name]
    options = [str(a) for a in _literals(tp)]
    item = st.one_of(ANY_TEXT, NUMBER_TEXT, _bound_text(field.metadata),
                     st.sampled_from(options) if options else NUMBER_TEXT)
    return st.one_of(item, st.lists(item, max_size=4).map(",".join))


def _literals(tp: typing.Any) -> list[typing.Any]:
    if typing.get_origin(tp) is typing.Literal:
        return list(typing.get_args(tp))
    return [x for arg in typing.get_args(tp) for x in _literals(arg)]


# ---- properties ----------------------------------------------------------------------------

def _one_line(message: str) -> None:
    assert message and message.isprintable() and len(message) <= 2000, repr(message)


def _numbers_in(value: typing.Any) -> list[float]:
    items = value if isinstance(value, tuple) else (value,)
    return [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _within_declaration(cfg: typing.Any, field: dataclasses.Field) -> None:
    """Every number of the accepted field lies in its declared range (a hand check)."""
    meta = field.metadata
    for v in _numbers_in(getattr(cfg, field.name)):
        assert math.isfinite(v)
        assert meta.get("max") is not None and v <= meta["max"], (field.name, v)
        if meta.get("min") is not None:
            assert v >= meta["min"], (field.name, v)
        if meta.get("above") is not None:
            assert v > meta["above"], (field.name, v)


@pytest.mark.parametrize("exp, field", FIELDS, ids=[f"{e.name}.{f.name}" for e, f in FIELDS])
@settings(max_examples=PER_FIELD)
@given(data=st.data())
def test_set_text_for_any_field_is_a_config_or_one_line(exp, field, data):
    text = data.draw(_field_text(exp, field), label="value")
    try:
        cfg = apply_overrides(exp.config, [f"{field.name}={text}"])
    except WorkbenchError as exc:
        _one_line(str(exc))
        return
    _within_declaration(cfg, field)


# ---- the command line: the model is the tiny one, the run store is never reached -----------

@pytest.fixture
def stubbed(monkeypatch, llama, runs_dir):
    """``load_model`` returns the tiny Llama; ``RunStore.start`` records its config and
    raises :data:`REACHED` instead of creating a run."""
    import workbench.harness.experiment  # noqa: F401 (bound before patching, as in the robustness tests)

    reached: list[typing.Any] = []

    def start(self, experiment, model, config, **kwargs):
        reached.append(config)
        raise WorkbenchError(REACHED)

    monkeypatch.setattr("workbench.models.load.load_model", lambda *a, **k: llama)
    monkeypatch.setattr("workbench.harness.experiment.load_model", lambda *a, **k: llama)
    monkeypatch.setattr(RunStore, "start", start)
    return reached


def _refused_or_reached(result: tuple[int, list[str], str], runs_dir: Path) -> str:
    """The one-line outcome of a command that may not create a run; returns its message."""
    status, _, err = result
    assert status == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    _one_line(err[len("error: "):-1])
    assert not runs_dir.exists() or not any(runs_dir.iterdir())
    return err[len("error: "):-1]


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=[e.name for e in EXPERIMENTS])
@given(data=st.data())
def test_set_through_the_cli_refuses_before_the_run_store(capsys, runs_dir, stubbed, exp, data):
    field = data.draw(st.sampled_from(dataclasses.fields(exp.config)), label="field")
    text = data.draw(_field_text(exp, field), label="value")
    stubbed.clear()
    args = ["run", exp.name, "--set", f"{field.name}={text}"]
    if exp.needs_model:
        args += ["--model", "tiny"]
    message = _refused_or_reached(cli(capsys, *args), runs_dir)
    if message == REACHED:
        [cfg] = stubbed
        _within_declaration(cfg, field)


# ---- the text-to-number rule against a reference ----------------------------------------------

ASCII_INT = r"[+-]?[0-9]+"
ASCII_FLOAT = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[+-]?(inf|infinity|nan)"
"""The reference syntax, written out here apart from the rule's own patterns."""


def _accepts(tp: type, text: str) -> tuple[bool, typing.Any]:
    try:
        return True, values.parse_value(text, tp, "x")
    except ConfigError as exc:
        _one_line(str(exc))
        return False, None


@given(st.one_of(NUMBER_TEXT, ANY_TEXT))
def test_an_int_from_text_is_ascii_decimal_and_nothing_else(text):
    core = text.strip()
    expected = (len(core) <= values.MAX_NUMBER_TEXT
                and re.fullmatch(ASCII_INT, core, re.ASCII) is not None)
    ok, value = _accepts(int, text)
    assert ok == expected, (text, value)
    if ok:
        assert value == int(core)  # Python's own reading of plain ASCII digits


@given(st.one_of(NUMBER_TEXT, ANY_TEXT))
def test_a_float_from_text_is_ascii_decimal_and_nothing_else(text):
    core = text.strip()
    expected = (len(core) <= values.MAX_NUMBER_TEXT
                and re.fullmatch(ASCII_FLOAT, core, re.ASCII | re.IGNORECASE) is not None)
    ok, value = _accepts(float, text)
    assert ok == expected, (text, value)
    if ok:
        reference = float(core)
        assert value == reference or (math.isnan(value) and math.isnan(reference))


# ---- prompt files: arbitrary bytes -------------------------------------------------------------

def _encoded(text: str, encoding: str) -> bytes:
    return text.encode(encoding, errors="replace")


FILE_BYTES = st.one_of(
    st.binary(max_size=200),
    st.builds(_encoded, st.text(max_size=120),
              st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                               "latin-1", "cp1252"])),
    st.lists(st.sampled_from(["the cat sat", "", " ", "\t", "  \r", "\x00", "caf\u00e9",
                              "\u3000", "\x1b[2J", "a\u2028b", "\ufeff"]),
             max_size=8).map(lambda lines: "\n".join(lines).encode("utf-8")),
    st.builds(lambda n, word: (word * n).encode(), st.integers(1, 20_000),
              st.sampled_from(["a", "word ", "\u00e9", " "])),
)
"""Bytes of a prompt file: binary, text in several encodings, lines of text, whitespace,
NULs and escapes, and single lines beyond the tiny model's 16,384-character bound."""


def _paragraphs(text: str) -> int:
    """The prompts a text holds, counted here apart from the reader: runs of lines that
    are not blank (a blank line is empty or whitespace only)."""
    count, inside = 0, False
    for line in text.splitlines():
        blank = line.strip() == ""
        count += not blank and not inside
        inside = not blank
    return count


@given(data=FILE_BYTES)
def test_record_file_with_any_bytes_is_one_line_and_no_run(capsys, runs_dir, stubbed, tmp_path,
                                                           data):
    path = tmp_path / "prompts.txt"
    path.write_bytes(data)
    stubbed.clear()
    message = _refused_or_reached(cli(capsys, "record", "tiny", "--file", str(path)), runs_dir)
    if message == REACHED:
        [config] = stubbed
        text = data.decode("utf-8-sig")  # it was accepted, so it is UTF-8
        assert "\x00" not in text
        assert config["n_prompts"] == _paragraphs(text) > 0
