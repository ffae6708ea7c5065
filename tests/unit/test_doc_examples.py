"""The shell examples of the README and of every page of the documentation site
(``docs/**/*.md``) are commands that exist, with options that parse and do something.

Every line of every ```bash block is checked: a ``workbench ...`` or ``python -m
experiments.X ...`` line against the real argument parser, a ``make`` line against the
Makefile's targets, a ``python FILE`` line against the file. Every subcommand has an
example on some page. A ``workbench run`` example whose ``--set`` options all repeat the
defaults is a no-op and fails. The Python blocks are executed, page by page, in
``tests/integration/test_doc_examples.py`` (they need the bundled models).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from workbench.cli import build_parser
from workbench.core.errors import ConfigError
from workbench.harness.config import apply_overrides
from workbench.harness.experiment import all_experiments, get

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
"""The README and every page of the site, each a Markdown file."""


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(lang: str, page: Path = README) -> list[tuple[int, str]]:
    """``(first line number, text)`` of each fenced block of ``lang`` in ``page``."""
    found, current, start, lines = [], None, 0, page.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if current is None and line.startswith("```"):
            current, start = line[3:].strip(), number + 1
            body: list[str] = []
        elif current is not None and line.startswith("```"):
            if current == lang:
                found.append((start, "\n".join(body)))
            current = None
        elif current is not None:
            body.append(line)
    return found


def shell_commands(pages: list[Path] = PAGES) -> list[tuple[str, list[str]]]:
    """Each command of the bash blocks of ``pages`` as ``(page:line, argv)``, environment
    variable assignments dropped, after the first ``|``."""
    commands = []
    for page in pages:
        for start, text in blocks("bash", page):
            for offset, line in enumerate(text.splitlines()):
                words = shlex.split(line, comments=True)
                words = words[:words.index("|")] if "|" in words else words
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]
                if words:
                    commands.append((f"{page_name(page)}:{start + offset}", words))
    return commands


COMMANDS = shell_commands()


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.M))


def _as_workbench(words: list[str]) -> list[str] | None:
    """The ``workbench`` argv a command stands for, or ``None`` if it is not one."""
    if words[0] == "workbench":
        return words[1:]
    if words[:2] == ["python", "-m"] and words[2].startswith("experiments."):
        exp = next(e for e in all_experiments() if e.module == words[2])
        return ["run", exp.name, *words[3:]]
    return None


def test_the_pages_have_shell_examples_of_every_command():
    used = {args[0] for _, words in COMMANDS if (args := _as_workbench(words))}
    parser = build_parser()
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert used == set(subcommands)


def test_every_page_is_read():
    # the README and the pages moved out of it hold shell examples; a page that fails to
    # be found (a moved docs folder) must not leave the checks above with nothing to do
    pages = {w.split(":")[0] for w, _ in COMMANDS}
    assert {"README.md", "docs/getting-started.md", "docs/commands.md",
            "docs/experiments/ioi.md"} <= pages


@pytest.mark.parametrize("where, words", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_shell_example_is_a_command_that_parses(capsys, where, words):
    args = _as_workbench(words)
    if args is not None:
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:  # --help exits 0 once printed; a usage error exits 2
            assert exc.code == 0 and "--help" in args, (where, capsys.readouterr().err)
    elif words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w]
        assert set(targets) <= _makefile_targets(), where
    elif words[0] == "python":
        assert (ROOT / words[1]).is_file(), where
    else:
        pytest.fail(f"{where}: unknown command {words[0]!r}")


RUNS = [(where, args) for where, words in COMMANDS
        if (args := _as_workbench(words)) and args[0] == "run" and "--set" in args]


@pytest.mark.parametrize("where, args", RUNS, ids=[w for w, _ in RUNS])
def test_no_run_example_only_repeats_the_defaults(where, args):
    exp = get(args[1])
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    model = next((args[i + 1] for i, a in enumerate(args) if a == "--model"), None)
    if any("<" in s for s in sets):
        return  # a placeholder for a value the reader supplies
    # the defaults on the example's model (a bundled model may have its own)
    default = apply_overrides(exp.config, exp.defaults_for(model))
    try:
        cfg = apply_overrides(exp.config, sets, base=default)
    except ConfigError as exc:  # a file of the reader's own, e.g. text_files=my_corpus.txt
        assert "no such file" in str(exc).lower(), f"{where}: {exc}"
        cfg = apply_overrides(exp.config, [s for s in sets if s.split("=")[0] not in str(exc)],
                              base=default)
    assert cfg != default, f"{where}: {sets} are the defaults on {model or 'every model'}"
