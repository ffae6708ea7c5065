"""The documentation site and the README that points into it.

The site's reference parts are generated at build time by ``docs/hooks.py``; these tests
check that what it generates leaves nothing out: every subcommand and every argparse
action of every subparser is in the CLI reference, and every registered experiment has a
page in the navigation whose generated part names each of its config fields, tables and
columns. The README stays a front door (under 12,000 characters) whose links resolve.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from workbench.cli import build_parser
from workbench.harness import config
from workbench.harness.experiment import all_experiments

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def shipped_experiments() -> list:
    """The experiments of the ``experiments`` package: the ones the site documents (other
    test modules register experiments of their own in the same registry)."""
    return [e for e in all_experiments() if e.module.split(".")[0] == "experiments"]
README = ROOT / "README.md"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _hooks()


def _nav_pages() -> set[str]:
    """Every page the navigation of ``mkdocs.yml`` lists."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = yaml.safe_load(text)["nav"]
    found: set[str] = set()

    def walk(entry):
        if isinstance(entry, str):
            found.add(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)
        elif isinstance(entry, list):
            for value in entry:
                walk(value)
    walk(nav)
    return found


def test_the_readme_is_a_front_door():
    assert len(README.read_text(encoding="utf-8")) < 12_000


def test_every_link_of_the_readme_resolves_to_a_file():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    into_docs = [link for link in local if link.startswith("docs/")]
    assert len(into_docs) >= 10  # the README points into the site
    for link in local:
        path = link.split("#")[0]
        assert (ROOT / path).is_file(), f"README links to {link}, which is no file"


def test_every_page_of_the_site_is_in_the_navigation():
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == _nav_pages() - {p for p in _nav_pages() if p.startswith("notebooks/")}


def _sections(markdown: str) -> dict[str, str]:
    """The CLI reference cut at its ``## workbench NAME`` headings: name to text."""
    parts = re.split(r"^## workbench ?(\S*)$", markdown, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _action_names(action: argparse.Action) -> list[str]:
    if action.option_strings:
        return list(action.option_strings)
    return [action.metavar or action.dest] if not isinstance(action.metavar, tuple) \
        else list(action.metavar)


def test_the_cli_reference_has_every_subcommand_and_every_option():
    parser = build_parser()
    sections = _sections(HOOKS.cli_reference(parser))
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sections) == {"", *subparsers.choices}
    for name, sub in [("", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for option in _action_names(action):
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])",
                                 sections[name]), f"workbench {name}: {option} is missing"
            if action.help and action.help != argparse.SUPPRESS:
                first = action.help.split("%")[0].split()[:3]
                assert " ".join(first) in " ".join(sections[name].split()), \
                    f"workbench {name}: the help of {action.dest} is missing"


def test_the_cli_page_asks_for_the_generated_reference():
    assert "<!-- generated: cli -->" in (DOCS / "cli.md").read_text(encoding="utf-8")
    assert "cli.md" in _nav_pages()


@pytest.mark.parametrize("exp", shipped_experiments(), ids=lambda e: e.name)
def test_every_experiment_has_a_page_with_its_fields_and_tables(exp):
    marker = f"<!-- generated: experiment {exp.name} -->"
    pages = [p for p in (DOCS / "experiments").glob("*.md")
             if marker in p.read_text(encoding="utf-8")]
    assert len(pages) == 1, f"{exp.name}: {len(pages)} pages ask for its reference"
    # `workbench run EXPERIMENT --help` points at this page by the experiment's name
    assert pages[0].name == f"{exp.name}.md"
    assert f"experiments/{pages[0].name}" in _nav_pages()
    text = HOOKS.experiment_reference(exp.name)
    assert exp.description in text
    for field in config.fields(exp.config):
        assert f"| `{field.name}` |" in text, f"{exp.name}: field {field.name} is missing"
    for table in exp.tables.values():
        assert f"#### `{table.name}`" in text, f"{exp.name}: table {table.name} is missing"
        for column in table.columns:
            assert f"| `{column.name}` |" in text, f"{exp.name}: {table.name}.{column.name}"
    # the dashboard pages that show its runs, each with its entry of docs/dashboard.md
    shown = HOOKS.dashboard_pages().get(exp.name, ())
    figures = HOOKS.figures(exp.name)
    for page, path in shown:
        assert f"- **{page}** (`{path}" in figures, f"{exp.name}: {page} is not described"


def test_every_experiment_is_shown_by_a_dashboard_page():
    assert {e.name for e in shipped_experiments()} <= set(HOOKS.dashboard_pages())


def test_the_claims_and_schemas_are_all_generated():
    claims = HOOKS.claims_reference()
    for path in (ROOT / "data" / "claims").glob("*.json"):
        for claim in HOOKS.json.loads(path.read_text(encoding="utf-8")):
            assert f"`{claim['id']}`" in claims
    schemas = HOOKS.schemas_reference()
    for path in (ROOT / "data" / "schemas").glob("*.schema.json"):
        assert f"### `{path.name}`" in schemas


def test_notebooks_join_the_tutorials_only_when_there_are_some(tmp_path, monkeypatch):
    def nav():
        return {"nav": [{"Home": "index.md"}, {"Tutorials": ["tutorials.md"]}]}

    monkeypatch.setattr(HOOKS, "NOTEBOOKS", tmp_path / "absent")
    assert HOOKS.on_config(nav())["nav"][1] == {"Tutorials": ["tutorials.md"]}
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "b.ipynb").write_text("{}")
    (tmp_path / "notebooks" / "a.ipynb").write_text("{}")
    monkeypatch.setattr(HOOKS, "NOTEBOOKS", tmp_path / "notebooks")
    assert HOOKS.on_config(nav())["nav"][1] == {
        "Tutorials": ["tutorials.md", "notebooks/a.ipynb", "notebooks/b.ipynb"]}


def test_a_tutorial_page_is_the_notebooks_executed_copy_where_there_is_one(tmp_path, monkeypatch):
    from mkdocs.structure.files import File, Files

    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in ("a.ipynb", "b.ipynb"):
        (folder / name).write_text("{}")
    monkeypatch.setattr(HOOKS, "NOTEBOOKS", folder)
    site = {"site_dir": str(tmp_path / "site"), "use_directory_urls": True}
    docs = tmp_path / "docs"
    (docs / "notebooks").mkdir(parents=True)
    (docs / "notebooks" / "a.ipynb").write_text("{}")  # a's executed copy, a page of docs/
    found = Files([File("notebooks/a.ipynb", str(docs), site["site_dir"], True)])
    read = {f.src_uri: Path(f.abs_src_path) for f in HOOKS.on_files(found, site)}
    assert read == {"notebooks/a.ipynb": docs / "notebooks" / "a.ipynb",
                    "notebooks/b.ipynb": HOOKS.ROOT / "notebooks" / "b.ipynb"}


def test_the_site_loads_no_font_from_another_host():
    """Material's default theme loads Google Fonts, which fail offline."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert config["theme"]["font"] == "false"


def test_a_dashboard_entry_shown_on_an_experiments_page_keeps_its_links():
    """An experiment's page (docs/experiments/) repeats the Dashboard page's entries of the
    pages that show its runs; their links are relative to docs/, so they are rewritten."""
    entry = ("- **Compare**: see [Comparing runs](compare.md), [Live](#the-live-page), "
             "[up](../x.md) and [site](https://example.org/a.md)")
    assert HOOKS._from_experiments(entry) == (
        "- **Compare**: see [Comparing runs](../compare.md), [Live](../dashboard.md#the-live-"
        "page), [up](../x.md) and [site](https://example.org/a.md)")
