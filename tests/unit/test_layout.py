"""The layout's promises that import-linter cannot see: names, schemas, fixed file names.

- every experiment name a page or a claim mentions is registered;
- every experiment is a package with the fixed file names and declares its tables;
- ``tables.py`` imports nothing but the schema types, and pages import nothing of an
  experiment but its ``tables.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import dash
import pytest

from workbench.core.paths import REPO_ROOT
from workbench.harness import claims
from workbench.harness.config import apply_overrides, check_config
from workbench.harness.experiment import OTHER_RUN_KINDS, all_experiments, get

PAGES = sorted((REPO_ROOT / "dashboards" / "pages").glob("*.py"))
PACKAGES = sorted(p.parent for p in (REPO_ROOT / "experiments").glob("*/__init__.py"))


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (``from x import y`` gives ``x``), at any depth."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


def _page_experiment_names(path: Path) -> set[str]:
    """String literals a page passes as experiment names: ``data.runs("x")`` and the
    lists it registers with ``dash.register_page(..., experiments=[...])``."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "runs":
            names |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    return names


def test_every_experiment_a_page_or_claim_names_is_registered():
    from dashboards.app import create_app

    create_app("/nonexistent")  # registers the pages
    known = {e.name for e in all_experiments()} | set(OTHER_RUN_KINDS)
    named = {name for page in dash.page_registry.values()
             for name in page.get("experiments", [])}
    for path in PAGES:
        named |= _page_experiment_names(path)
    named |= {c.experiment for c in claims.load_claims()}
    assert named, "no page or claim names an experiment"
    assert named <= known, f"not registered: {sorted(named - known)}"


def test_every_experiment_is_a_package_with_the_fixed_files():
    # (other tests register experiments of their own; only the experiments package counts)
    registered = {e.module for e in all_experiments() if e.module.startswith("experiments.")}
    assert registered == {f"experiments.{p.name}" for p in PACKAGES}
    for package in PACKAGES:
        assert (package / "tables.py").is_file(), package.name
        assert (package / "__main__.py").is_file(), package.name
    assert not list((REPO_ROOT / "experiments").glob("[a-z]*.py")), "a single-file experiment"


@pytest.mark.parametrize("exp", all_experiments(), ids=lambda e: e.name)
def test_every_experiment_declares_its_tables_and_valid_configs(exp):
    assert exp.tables, f"{exp.name} declares no tables"
    for table in exp.tables.values():
        assert table.meaning and all(c.meaning for c in table.columns), table.name
    for name in ("default", "demo"):
        check_config(apply_overrides(exp.config, exp.named_config(name)))
    assert get(exp.name) is exp


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_tables_import_only_the_schema(package):
    allowed = {"__future__", "workbench.store.schema"}
    assert set(_imports(package / "tables.py")) <= allowed


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_pages_import_only_the_tables_of_experiments(page):
    imported = [m for m in _imports(page) if m == "experiments" or m.startswith("experiments.")]
    assert all(m.endswith(".tables") for m in imported), imported
