"""The MkDocs hooks that generate the site's reference parts at build time, so they cannot
drift from the code: the CLI reference (from ``workbench.cli.build_parser``), each
experiment's config fields and tables (from the registry) and the dashboard pages that
show it (from their declarations), the claims registry (from
``data/claims/*.json``) and the JSON Schemas of the stored files (``data/schemas/``).

A page asks for a part with a marker on a line of its own, replaced before the page is
rendered: ``<!-- generated: cli -->``, ``<!-- generated: experiment NAME -->`` (its fields,
tables and docstring), ``<!-- generated: figures NAME -->`` (the dashboard pages that show
its runs), ``<!-- generated: walltimes NAME -->`` (its rows of the wall-time tables),
``<!-- generated: claims -->``, ``<!-- generated: schemas -->``. The notebooks of
``notebooks/*.ipynb`` are brought in as pages of the Tutorials section, from their executed
copies in ``docs/notebooks/`` (rendered by mkdocs-jupyter, not executed again); the build
passes with none.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import textwrap
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TUTORIALS = "Tutorials"
MARKER = re.compile(r"^<!-- generated: (\w+)(?: ([\w-]+))? -->$", re.M)


def _cell(text: Any) -> str:
    """A value as one Markdown table cell, on one line; outside code spans, pipes, ``<``
    and ``>`` escaped (help texts say ``<run-id>``, which is no HTML tag)."""
    spans = re.split(r"(`+[^`]*`+)", " ".join(str(text).split()))
    return "".join(s if s.startswith("`") else
                   s.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
                   for s in spans)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# -- the CLI reference ------------------------------------------------------------------
# argparse has no public way to list a parser's actions or format one of them; these read
# its `_actions` and its help formatter, as `--help` itself does, so the reference shows
# exactly what `--help` shows.

def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def _action_row(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    formatter = parser._get_formatter()
    if action.option_strings:
        name = ", ".join(action.option_strings)
        takes = action.nargs != 0
        name += f" {formatter._format_args(action, action.dest.upper())}" if takes else ""
    else:
        name = formatter._metavar_formatter(action, action.dest)(1)[0]
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else default
    helptext = formatter._expand_help(action) if action.help else ""
    return [_code(name), _code(str(shown)) if shown != "" else "", helptext]


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action of ``parser`` but ``--help`` and the subcommand choice."""
    return [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Markdown for every subcommand of the ``workbench`` parser: its usage, what it does
    and a table of its arguments and options with their defaults and help."""
    if parser is None:
        from workbench.cli import build_parser

        parser = build_parser()
    parts = ["## workbench", "", "```text", parser.format_usage().strip(), "```", "",
             parser.description or "", "",
             _table(["argument or option", "default", "meaning"],
                    [_action_row(parser, a) for a in _options(parser)])]
    helps = {choice.dest: choice.help for group in parser._actions
             if isinstance(group, argparse._SubParsersAction)
             for choice in group._choices_actions}
    for name, sub in _subcommands(parser).items():
        rows = [_action_row(sub, a) for a in _options(sub)]
        parts += ["", f"## workbench {name}", "", helps.get(name) or sub.description or "",
                  "", "```text", sub.format_usage().strip(), "```", ""]
        parts.append(_table(["argument or option", "default", "meaning"], rows)
                     if rows else "No arguments or options.")
    return "\n".join(parts)


# -- the experiments --------------------------------------------------------------------

def _example_block(match: re.Match) -> str:
    body = textwrap.dedent(match.group(2)).strip("\n")
    lang = "python" if body.lstrip().startswith(">>>") else "bash"
    return f"{match.group(1)}:\n\n```{lang}\n{body}\n```\n"


def _docstring_markdown(text: str) -> str:
    """A module docstring as Markdown: reST roles and double backticks as code, and an
    indented ``Example:`` section as a code block."""
    text = re.sub(r":(?:mod|func|class|meth|attr|data):`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return re.sub(r"^(Examples?):\n((?:(?:    .*)?\n?)+)", _example_block, text, flags=re.M)


def _families(exp: Any) -> list[str]:
    from workbench.harness import matrix
    from workbench.models.adapters import FAMILIES

    cells = [matrix.cell(adapter, exp) for _, adapter in FAMILIES.items()]
    works = ", ".join(c.family for c in cells if c.works) or "none"
    lines = [f"Works on the families: {works}.", ""]
    lines += [f"- refuses **{c.family}**: {c.reason}" for c in cells if not c.works]
    return lines


def experiment_reference(name: str) -> str:
    """Markdown for one registered experiment, from the registry: its question, module,
    the models it takes, its demo config, its config fields and its declared tables, then
    its module docstring (the definitions with their sources)."""
    import importlib

    # a value as --set takes it, and what `requires` asks, as `run EXPERIMENT --help` says
    from workbench.cli.experiments import NEEDS, set_text
    from workbench.harness import config
    from workbench.harness.experiment import get

    exp = get(name)
    demo = " ".join(f"--set {k}={set_text(v)}" for k, v in exp.demo.items())
    needs = ["Trains its own models (no `--model`)."] if not exp.needs_model else \
        [f"Takes {NEEDS[exp.requires]}. Demo models: {', '.join(exp.demo_models)}.", "",
         *_families(exp)]
    fields = [[_code(f.name), _code(f.type), _code(set_text(f.default)), f.range, f.help]
              for f in config.fields(exp.config)]
    parts = [f"## Reference: `{exp.name}`", "", exp.description, "",
             f"Module: `{exp.module}`; run it with `workbench run {exp.name}` or "
             f"`python -m {exp.module}`.", "", *needs, "",
             f"Demo config: `{demo}`." if demo else "Demo config: the default.", "",
             "### Config fields", "", "Each is set with `--set FIELD=VALUE`.", "",
             _table(["field", "type", "default", "range", "meaning"], fields), "",
             "### Tables", ""]
    for table in exp.tables.values():
        parts += [f"#### `{table.name}`", "", table.meaning, "",
                  _table(["column", "kind", "meaning"],
                         [[_code(c.name), c.kind, c.meaning] for c in table.columns]), ""]
    doc = importlib.import_module(exp.module).__doc__ or ""
    parts += ["### Definitions and sources", "", f"From the docstring of `{exp.module}`:", "",
              _docstring_markdown(doc.strip())]
    return "\n".join(parts)


def _markdown_tables(text: str) -> list[list[str]]:
    """The pipe tables of a Markdown text, each as its lines."""
    found: list[list[str]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                found.append([])
            found[-1].append(line)
        previous = line
    return found


def wall_times(name: str) -> str:
    """The rows of ``name`` in the wall-time tables of the Experiments page, each under its
    table's header, so that a page shows its experiment's times without a second copy."""
    text = (ROOT / "docs" / "experiments" / "index.md").read_text(encoding="utf-8")
    _, _, times = text.partition("## Wall times")
    parts = ["Measured as the [wall-time tables](index.md#wall-times) say, each under its "
             "own conditions (idle, or cores shared with other jobs):", ""]
    for table in _markdown_tables(times):
        rows = [row for row in table[2:] if row.startswith(f"| `{name}`")]
        if rows:
            parts += [*table[:2], *rows, ""]
    if len(parts) == 2:
        parts = ["Not measured yet: `python benchmarks/defaults.py --only "
                 f"{name}` measures it."]
    return "\n".join(parts)


@functools.cache
def dashboard_pages() -> dict[str, tuple[tuple[str, str], ...]]:
    """Every experiment a dashboard page declares, with the ``(name, path)`` of the pages
    that show it, from the pages' own ``register_page(..., experiments=[...])`` (the app is
    built over an empty store; no page reads data as it is built)."""
    import tempfile

    from dashboards.app import create_app
    from dashboards.components import links

    with tempfile.TemporaryDirectory() as runs:
        create_app(runs)
    return {exp: tuple((page["name"], page["path"]) for page in pages)
            for exp, pages in links.pages_by_experiment().items()}


def _dashboard_items() -> list[str]:
    """The top-level list items of the Dashboard page, one per page of the dashboard."""
    text = (ROOT / "docs" / "dashboard.md").read_text(encoding="utf-8")
    return ["- " + item.strip() for item in re.split(r"^- ", text, flags=re.M)[1:]]


def _from_experiments(markdown: str) -> str:
    """Links of the Dashboard page's text, as ``docs/experiments/*.md`` reach them."""
    markdown = re.sub(r"\]\(#", "](../dashboard.md#", markdown)
    return re.sub(r"\]\((?!https?:|\.\./|/|#)", "](../", markdown)


def figures(name: str) -> str:
    """How to read the figures of ``name``'s runs: the Dashboard page's entry of every
    dashboard page that shows them."""
    shown = dashboard_pages().get(name, ())
    if not shown:
        return ("No dashboard page shows these runs; the [Runs page](../dashboard.md) shows "
                "their provenance and tables, each ready to download.")
    parts = []
    for page, path in shown:
        item = next((i for i in _dashboard_items() if i.startswith(f"- **{page}** (`{path}")), "")
        item = _from_experiments(item.split("\n\n")[0])  # the entry alone, not what follows
        parts += [f"The dashboard's **{page}** page (`{path}?run=ID`) shows its runs, as the "
                  f"[Dashboard](../dashboard.md) page says:", "", item.replace("\n", "\n"), ""]
    return "\n".join(parts)


# -- claims and schemas -----------------------------------------------------------------

def _claim(c: Any) -> list[str]:
    applies = c.applies_to if isinstance(c.applies_to, str) else ", ".join(c.applies_to)
    params = json.dumps(c.check.params, sort_keys=True) if c.check.params else ""
    lines = [f"#### `{c.id}`", "", f"*{c.kind}*: {_cell(c.statement)}", "",
             f"- **source**: {_cell(c.source)}",
             f"- **published**: {_cell(c.published)}"]
    lines += [f'- **quote**: "{_cell(c.quote)}"'] if c.quote else []
    inputs = "".join(f"; `{name}` takes the id of a run of `{source.experiment}` with the "
                     f"config `{json.dumps(source.config)}`, run first on the same model"
                     for name, source in c.run_inputs.items())
    lines += [f"- **measured by**: `{c.experiment}` with the config "
              f"`{json.dumps(c.config)}`{inputs}; check `{c.check.name}`"
              + (f" with `{params}`" if params else ""),
              f"- **applies to**: {applies}; **run on**: {', '.join(c.models) or 'its own models'}",
              ""]
    return lines


def claims_reference() -> str:
    """Markdown for every claim of ``data/claims/*.json``, grouped by file: its statement,
    source, published value, the experiment, config and check that measure it."""
    from workbench.harness.claims import read_claims_file

    parts = []
    for path in sorted((ROOT / "data" / "claims").glob("*.json")):
        parts += [f"### `{path.name}`", ""]
        for claim in read_claims_file(path):
            parts += _claim(claim)
    return "\n".join(parts)


def schemas_reference() -> str:
    """Markdown for every JSON Schema in ``data/schemas/``: its title, description and
    the schema itself."""
    parts = []
    for path in sorted((ROOT / "data" / "schemas").glob("*.schema.json")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        parts += [f"### `{path.name}`", "", schema.get("description", "").strip(), "",
                  f'??? note "The schema: `data/schemas/{path.name}`"', "",
                  "    ```json",
                  *["    " + line for line in json.dumps(schema, indent=2).splitlines()],
                  "    ```", ""]
    return "\n".join(parts)


def _generated(match: re.Match) -> str:
    kind, arg = match.group(1), match.group(2)
    if kind == "cli":
        return cli_reference()
    if kind == "experiment" and arg:
        return experiment_reference(arg)
    if kind == "figures" and arg:
        return figures(arg)
    if kind == "walltimes" and arg:
        return wall_times(arg)
    if kind == "claims":
        return claims_reference()
    if kind == "schemas":
        return schemas_reference()
    raise ValueError(f"unknown generated part {match.group(0)!r}")


# -- the hooks --------------------------------------------------------------------------

def notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb")) if NOTEBOOKS.is_dir() else []


def on_config(config: Any) -> Any:
    """Every notebook joins the Tutorials section of the nav, after its index page."""
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and TUTORIALS in entry:
            entry[TUTORIALS] = [page for page in entry[TUTORIALS]
                                if not str(page).startswith("notebooks/")]
            entry[TUTORIALS] += [f"notebooks/{path.name}" for path in notebooks()]
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which converts the notebooks
def on_files(files: Any, config: Any) -> Any:
    """Every notebook as a page at ``notebooks/NAME.ipynb``: its executed copy, which the
    site's sources hold at that path (outputs and figures included), else the notebook of
    ``notebooks/`` as it is committed. A File rooted there rather than
    ``File.generated``: mkdocs-jupyter reads a notebook by its ``src_dir``, which a
    generated file lacks."""
    for path in notebooks():
        if files.get_file_from_path(f"notebooks/{path.name}") is not None:
            continue  # its executed copy, docs/notebooks/NAME.ipynb (notebooks/execute.py)
        files.append(File(f"notebooks/{path.name}", src_dir=str(ROOT),
                          dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """``mkdocs serve`` rebuilds when a notebook changes, and when the code that the
    generated parts read changes."""
    for folder in (NOTEBOOKS, ROOT / "workbench", ROOT / "experiments", ROOT / "data"):
        if folder.is_dir():
            server.watch(str(folder))
    return server


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(_generated, markdown)


ROLE = re.compile(r":(?:mod|func|class|meth|attr|data|exc|obj):<code>~?")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The docstrings' reST roles (``:func:`x```), which the Google-style parser leaves
    as text before the code, read as plain code: ``x``."""
    return ROLE.sub("<code>", html)
