"""The rules that keep inputs from passing the checks and failing later: every declared
number has a finite upper bound (every experiment's config, every prompt-set parameter,
every command-line option), numbers from text are ASCII decimal, user files are read
bounded and as UTF-8, prompts split at whitespace-only lines, and stored text is shown
inert."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from typing import Annotated

import pytest

from workbench.cli.parser import Number, build_parser
from workbench.core.errors import ConfigError, WorkbenchError, printable
from workbench.core.files import decode_text, read_bounded
from workbench.core.values import (
    MAX_ITEMS,
    Range,
    check_declaration,
    check_keywords,
    check_value,
    keyword_types,
    parse_value,
    unannotated,
)
from workbench.harness.config import SHARED, param
from workbench.harness.experiment import all_experiments, experiment
from workbench.inputs.prompts import (
    CHARS_PER_TOKEN,
    GENERATORS,
    Prompt,
    check_length,
    prompt_set,
    prompts_from_text,
)
from workbench.store.schema import head_scores, tables

# ---- every declared number has a finite upper bound ----------------------------------------


def _holds_numbers(tp: typing.Any) -> bool:
    tp, _ = unannotated(tp)
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    return tp in (int, float) or any(_holds_numbers(a) for a in args)


def _finite(bound: typing.Any) -> bool:
    return isinstance(bound, (int, float)) and not isinstance(bound, bool) \
        and math.isfinite(bound)


def test_every_number_field_of_every_experiment_has_a_finite_maximum():
    """Walks every registered config (a new experiment is covered without a change)."""
    unbounded = []
    for exp in all_experiments():
        hints = typing.get_type_hints(exp.config)
        for f in dataclasses.fields(exp.config):
            if _holds_numbers(hints[f.name]) and not _finite(f.metadata.get("max")):
                unbounded.append(f"{exp.name}.{f.name}")
    assert unbounded == []
    assert len(all_experiments()) >= 8


def test_every_shared_field_and_prompt_set_parameter_has_a_finite_maximum():
    for name, decl in SHARED.items():
        assert not _holds_numbers(decl.type) or _finite(decl.range.max), name
    for name, fn in GENERATORS.items():
        for key, tp in keyword_types(fn, skip=1).items():
            _, declared = unannotated(tp)
            assert not _holds_numbers(tp) or _finite(declared.max), f"{name}.{key}"


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        else:
            yield parser.prog, action


TEXT_OPTIONS = {"--address", "--device", "--allowed-hosts", "--ablation"}
"""Options whose ``type=`` parses text that is not a number (a cluster address, a torch
device, host names, an ablation's kind)."""


def test_every_numeric_command_line_option_has_declared_bounds():
    """Walks every option of every command: one that takes a number (a ``type=``, or a
    numeric default) is a :class:`Number` whose range has a finite minimum and maximum."""
    checked = []
    for prog, action in _options(build_parser()):
        numeric = isinstance(action.default, (int, float)) and not isinstance(
            action.default, bool)
        if (action.type is None and not numeric) or action.option_strings[0] in TEXT_OPTIONS:
            continue
        assert isinstance(action.type, Number), (prog, action.option_strings)
        assert _finite(action.type.range.min) and _finite(action.type.range.max), prog
        checked.append(action.option_strings[0])
    assert {"--limit", "--topk", "--rows", "--port", "--cpus", "--gpus",
            "--max-batch-tokens"} <= set(checked)


def test_a_number_declared_without_a_maximum_fails_where_it_is_declared():
    @dataclass(frozen=True)
    class Unbounded:
        n: int = param(1, "a count", min=1)

    with pytest.raises(TypeError, match=r"Unbounded\.n: a number of type int needs a finite "
                       r"upper bound"):
        experiment("test-unbounded", config=Unbounded, tables=tables(head_scores("x")),
                   needs_model=False)(lambda model, cfg, ctx=None: None)
    def unbounded(model, n: Annotated[int, Range(min=1)] = 1) -> list[Prompt]:
        return []

    with pytest.raises(TypeError, match="parameter n: a number of type int needs"):
        prompt_set("test-unbounded")(unbounded)
    with pytest.raises(TypeError, match="needs a finite upper bound"):
        Number(float, Range(min=0, max=math.inf))
    with pytest.raises(TypeError, match="needs a finite upper bound"):
        check_declaration(tuple[int, ...] | None, "seeds", Range(min=0))
    check_declaration(tuple[str, ...], "names")  # no number: nothing to bound


# ---- numbers and values ----------------------------------------------------------------------

@pytest.mark.parametrize("text, tp, value", [
    (" 42 ", int, 42), ("+7", int, 7), ("-0", int, 0), ("007", int, 7),
    ("1.5", float, 1.5), (".5", float, 0.5), ("5.", float, 5.0), ("-1e-3", float, -0.001),
    ("1E3", float, 1000.0), ("7", float, 7.0),
])
def test_plain_ascii_numbers_parse(text, tp, value):
    assert parse_value(text, tp, "x") == value


@pytest.mark.parametrize("text, tp", [
    ("\u0663", int), ("\uff11\uff10", int), ("1_0", int), ("\u0967", int), ("0x10", int),
    ("1e3", int), ("1.0", int), ("", int), ("1 2", int), ("\u00b2", int),
    ("1_0.5", float), ("\u0663.5", float), ("0x1p3", float), ("1e", float), (".", float),
    ("nan(1)", float), ("1" * 401, int),
])
def test_other_number_syntax_is_refused(text, tp):
    with pytest.raises(ConfigError, match=rf"^x: expected {tp.__name__}, got "):
        parse_value(text, tp, "x")


def test_values_beyond_int64_and_bounds_are_refused_with_short_messages():
    with pytest.raises(ConfigError, match=r"^x: expected a 64-bit integer, got "
                       r"18446744073709551616$"):
        check_value(2**64, int, "x")
    with pytest.raises(ConfigError, match=r"^x: expected at most 1, got an integer of 1329 bits$"):
        check_value(10**400, float, "x", Range(max=1))  # float(10**400) would overflow
    with pytest.raises(ConfigError, match=rf"^x: expected at most {MAX_ITEMS} items, got 1025$"):
        check_value([0] * 1025, tuple[int, ...], "x", Range(max=1))
    with pytest.raises(ConfigError, match=r"^x: expected at most 4096 characters, got 4097$"):
        check_value("a" * 4097, str, "x")


def test_a_refused_value_is_quoted_on_one_line():
    with pytest.raises(ConfigError) as caught:
        parse_value("a\nb\x1b[2J" + "c" * 100, int, "x")
    message = str(caught.value)
    assert message.isprintable() and message.endswith("... (107 characters)")
    with pytest.raises(ConfigError, match=r"has no parameter 'a\\nb'"):
        check_keywords(lambda model, n: 1, {"a\nb": "1"}, what="set", skip=1)


# ---- files a user names ----------------------------------------------------------------------

def test_read_file_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a directory"),
                       ("/dev/zero", "a character device")):
        with pytest.raises(WorkbenchError, match=rf"^thing .* is not a regular file \({kind}\)$"):
            read_bounded(path, 10, what="thing")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 11)
    with pytest.raises(WorkbenchError, match=r"^thing .*big is larger than 10 bytes$"):
        read_bounded(big, 10, what="thing")
    big.write_bytes(b"x" * 10)
    assert read_bounded(big, 10, what="thing") == b"x" * 10


@pytest.mark.parametrize("data, looks_like", [
    ("some text".encode("utf-16-le"), "it holds NUL bytes (the first at byte 1) and looks like "
     "UTF-16 little-endian text"),
    ("some text".encode("utf-16-be"), "looks like UTF-16 big-endian text"),
    ("some text".encode("utf-32-le"), "looks like UTF-32 little-endian text"),
    ("some text".encode("utf-32-be"), "looks like UTF-32 big-endian text"),
    ("some text".encode("utf-16"), "it starts with the byte-order mark of UTF-16 little-endian"),
    ("na\u00efve caf\u00e9".encode("cp1252"), "byte 0xef at byte 2 is not valid UTF-8; it "
     "looks like Latin-1 or Windows-1252 text"),
    (bytes(range(1, 32)) + b"\xff", "looks like binary data, not text"),
    (b"GIF89a\x00\x01", "looks like binary data, not text"),
])
def test_text_that_is_not_utf8_names_the_encoding_it_looks_like(data, looks_like):
    with pytest.raises(WorkbenchError) as caught:
        decode_text(data, what="notes.txt")
    message = str(caught.value)
    assert message.startswith("notes.txt is not UTF-8 text: ") and looks_like in message
    assert message.endswith("save it as UTF-8")


def test_utf8_with_or_without_a_byte_order_mark_is_text():
    assert decode_text("\ufeffcaf\u00e9".encode(), what="x") == "caf\u00e9"
    assert decode_text("caf\u00e9".encode(), what="x") == "caf\u00e9"


# ---- prompts ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("one\ntwo\n\n\nthree ", ["one two", "three"]),
    ("a\n   \nb", ["a", "b"]),
    ("a\n\t \r\nb\r\n\r\nc", ["a", "b", "c"]),
    ("a\n\u3000\nb", ["a", "b"]),  # an ideographic space is whitespace too
    ("  a  \n  b  ", ["a b"]),
])
def test_whitespace_only_lines_separate_prompts(text, expected):
    assert [p.text for p in prompts_from_text(text)] == expected


def test_a_text_too_long_for_the_context_is_refused_before_tokenizing(llama, monkeypatch):
    n_ctx = llama.info.n_ctx
    check_length(Prompt(text="a" * (CHARS_PER_TOKEN * n_ctx), label="p"), n_ctx, "tiny")
    long = Prompt(text="a" * (CHARS_PER_TOKEN * n_ctx + 1), label="p")
    with pytest.raises(WorkbenchError, match=r"^prompt p has 16385 characters: too long for "
                       r"tiny's context of 512 tokens"):
        check_length(long, n_ctx, "tiny")

    def not_called(*args, **kwargs):
        raise AssertionError("the text was tokenized")

    monkeypatch.setattr(llama, "tokenizer", not_called)
    with pytest.raises(WorkbenchError, match="too long for tiny-llama's context"):
        llama.encode(long)


def test_a_limit_stops_a_generated_set_while_it_generates(llama, monkeypatch):
    from workbench.inputs import prompts

    drawn = []
    real = prompts.random_token_ids
    monkeypatch.setattr(prompts, "random_token_ids",
                        lambda *a, **k: drawn.append(1) or real(*a, **k))
    few = prompts.load_prompt_set("repeated-random", llama, limit=3, n_prompts=4096)
    assert len(few) == 3 and len(drawn) == 3
    assert few == prompts.load_prompt_set("repeated-random", llama, n_prompts=3)


# ---- stored text shown inert -------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("plain text, caf\u00e9 \u4e2d", "plain text, caf\u00e9 \u4e2d"),
    ("a\nb", "a\\nb"), ("a\rb", "a\\rb"), ("a\tb", "a\\tb"),
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"), ("\x7f\x85\x9b", "\\x7f\\x85\\x9b"),
    ("\u202eevil", "\\u202eevil"), ("a\u2028b", "a\\u2028b"), ("\udcff", "\\udcff"),
])
def test_inert_escapes_what_a_terminal_would_act_on(text, shown):
    assert printable(text) == shown
    assert printable(text).isprintable()
