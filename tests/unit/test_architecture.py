"""ARCHITECTURE.md says what the code is: every package and module it names exists, every
package and module of the library is named in it, and so are the test folders; and no layer
names a layer above it, not even in an import only a type checker reads."""

from __future__ import annotations

import ast
import re
import tomllib

import pytest

from workbench.core.paths import REPO_ROOT

DOC = (REPO_ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
LIBRARY = REPO_ROOT / "workbench"


def _layer_rows() -> list[tuple[list[str], list[list[str]]]]:
    """``(packages, modules of each)`` for every row of the layer table; a row with
    packages ``a/ · b/`` lists their modules in the same order, split by ``·``."""
    rows = []
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not re.fullmatch(r"(`\w+/`( · )?)+", cells[0]):
            continue
        packages = re.findall(r"`(\w+)/`", cells[0])
        parts = cells[1].split(" · ") if len(packages) > 1 else [cells[1]]
        assert len(parts) == len(packages), f"row {cells[0]}: one part per package"
        rows.append((packages, [_named(part) for part in parts]))
    return rows


def _named(text: str) -> list[str]:
    """The module names a table cell gives: a backticked name at the start of the cell or
    after a ``,`` / ``and``, outside parentheses."""
    depth, out, keep = 0, [], ""
    for ch in text:
        depth += ch == "("
        if depth == 0:
            keep += ch
        depth -= ch == ")" and depth > 0
    for match in re.finditer(r"(?:^|[,.:]|\band\b)\s*`(\w+)`", keep):
        out.append(match.group(1))
    return out


ROWS = _layer_rows()


def _modules(package: str) -> set[str]:
    return {p.stem for p in (LIBRARY / package).glob("*.py")} - {"__init__", "__main__"}


def test_the_table_names_every_package_of_the_library():
    named = {p for packages, _ in ROWS for p in packages}
    actual = {p.name for p in LIBRARY.iterdir() if (p / "__init__.py").is_file()}
    assert named == actual


@pytest.mark.parametrize(("package", "modules"),
                         [(p, m) for packages, mods in ROWS for p, m in zip(packages, mods,
                                                                          strict=True)])
def test_every_module_named_exists_and_every_module_is_named(package, modules):
    assert set(modules) == _modules(package), package


LAYERS = next(c for c in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
              ["tool"]["importlinter"]["contracts"] if c["type"] == "layers")


def test_the_layer_order_is_the_import_contracts():
    assert [" | ".join(packages) for packages, _ in ROWS] == LAYERS["layers"]


def _imported(path) -> set[str]:
    """Every ``workbench.*`` module a file imports, wherever the import statement is."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
    return {name for name in out if name.startswith("workbench.")}


def test_no_layer_names_one_above_it_even_for_the_type_checker():
    """import-linter leaves out the imports under ``if TYPE_CHECKING:``
    (``exclude_type_checking_imports``), which would let a layer's annotations name the
    layer above it (``inputs`` once named ``models``' Model so); read every import here."""
    rank = {package: i for i, row in enumerate(LAYERS["layers"])
            for package in row.split(" | ")}
    allowed = {tuple(rule.split(" -> ")) for rule in LAYERS.get("ignore_imports", [])}
    upward = []
    for path in LIBRARY.rglob("*.py"):
        package = path.relative_to(LIBRARY).parts[0]
        module = ".".join(("workbench", *path.relative_to(LIBRARY).with_suffix("").parts))
        for name in _imported(path):
            target = name.split(".")[1]
            if (package in rank and target in rank and target != package
                    and rank[target] <= rank[package] and (module, name) not in allowed):
                upward.append(f"{module} -> {name}")
    assert upward == []


def test_every_top_level_and_test_folder_is_named():
    for folder in ("workbench", "experiments", "dashboards", "tests", "data", "benchmarks",
                   "notebooks", "docs"):
        if (REPO_ROOT / folder).is_dir():
            assert f"{folder}/" in DOC, folder
    for folder in (REPO_ROOT / "tests").iterdir():
        if folder.is_dir() and not folder.name.startswith(("_", ".")):
            assert f"{folder.name}/" in DOC, f"tests/{folder.name}"


def test_what_it_says_of_every_experiment_holds():
    """Every experiment package has the files the doc says every one has."""
    match = re.search(r"every experiment is a package with the fixed file names \(([^;)]+)",
                      DOC, re.S)
    assert match, "ARCHITECTURE.md says which files every experiment package has"
    required = set(re.findall(r"`(\w+\.py)`", match.group(1)))
    assert required
    for package in (REPO_ROOT / "experiments").iterdir():
        if (package / "__init__.py").is_file():
            assert required <= {p.name for p in package.glob("*.py")}, package.name
