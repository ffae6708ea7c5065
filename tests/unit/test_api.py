"""``import workbench`` names its API once: the lazy table, ``__all__`` and the imports a
type checker reads agree, and each name is the object its module defines."""

from __future__ import annotations

import ast
import importlib
import inspect

import workbench


def _checked_imports() -> dict[str, str]:
    """``{name: module}`` of the imports under ``if TYPE_CHECKING:`` in the package."""
    tree = ast.parse(inspect.getsource(workbench))
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body
            if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names}


def test_all_names_the_lazy_api_and_show_cards():
    assert workbench.__all__ == sorted([*workbench._API, "show_cards"])


def test_a_type_checker_sees_each_name_from_the_module_that_serves_it():
    served = {**workbench._API, **{name: module.rpartition(".")[0]
                                   for name, module in workbench._MODULES.items()}}
    assert _checked_imports() == served


def test_each_name_is_the_object_its_module_defines():
    for name, module in workbench._API.items():
        assert getattr(workbench, name) is getattr(importlib.import_module(module), name)
    assert workbench.hooks is importlib.import_module(workbench._MODULES["hooks"])
