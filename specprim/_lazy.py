"""Packages that import their parts on first use (PEP 562), so that ``import specprim`` is cheap and the command line
checks its options before torch is imported.

Such a package's ``__init__`` (or any module) lists its public names as ``from ... import ...`` statements under
``if TYPE_CHECKING:`` (what type checkers and the API docs read) and ends with
``__getattr__, __dir__ = lazy_imports(__name__)``: the first use of a name imports it from where that block says, and
every use reads it from there.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_imports(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the package (or module) ``package`` (its ``__name__``, while it runs), from
    the ``from ... import ...`` statements under ``if TYPE_CHECKING:`` in its source (a plain ``import`` there only
    serves annotations)."""
    module = sys.modules[package]
    spec = module.__spec__
    where: dict[str, tuple[str | None, str]] = {}  # name -> (module, attribute)
    for node in ast.parse(spec.loader.get_source(spec.name)).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):  # absolute, as everywhere in specprim
                    where.update({alias.asname or alias.name: (statement.module, alias.name)
                                  for alias in statement.names})

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source, attribute = where[name]
        if source == package:  # a sub-module: from specprim import drafters (the import binds it on the package)
            return importlib.import_module(f"{package}.{attribute}")
        # Read from its home module at every use, never copied here: a copy would keep whatever that module held at
        # the first use (a test's monkeypatch of ``specprim.bench._datasets.load_dataset``, say) after it changed.
        return getattr(importlib.import_module(source), attribute)

    def __dir__() -> list[str]:
        return sorted({*vars(module), *where})

    return __getattr__, __dir__
