"""The studies (``docs/studies/*.py``) and the Python under ``benchmarks/`` use specprim's public API only:
no private module (``specprim._x``, ``specprim.pkg._x``), read with the import reader of ``tests/test_architecture.py``,
and every name imported from specprim is in its module's ``__all__`` (or is a sub-package). Every study script has its
page (``docs/studies/NAME.md``), listed in the studies' index.

``benchmarks/results/`` is left out: it holds recorded data, with the script that produced a record where one is
kept beside it, frozen as it ran (its imports are those of that day's tree).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
import test_architecture as architecture

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "docs" / "studies"
RESULTS = ROOT / "benchmarks" / "results"
SCRIPTS = sorted([*STUDIES.glob("*.py"), *(p for p in (ROOT / "benchmarks").rglob("*.py") if RESULTS not in p.parents)])
HELPERS = {"smollm2_union"}  # imported by other studies, no page of its own


def private_imports(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The private specprim modules ``path`` imports, as written (``tests/test_architecture.py``'s reader)."""
    key = f"study:{path}"  # not a specprim module: the reader resolves no relative import for it
    monkeypatch.setitem(architecture.MODULES, key, path)
    written = [module for module, _ in architecture._imports(key)]
    return sorted({m for m in written if any(part.startswith("_") for part in m.split(".")[1:])})


def non_public_names(path: Path) -> list[str]:
    """``module.name`` for every ``from specprim... import name`` whose name is neither in the module's ``__all__``
    nor a sub-module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "specprim":
            module = importlib.import_module(node.module)
            for alias in node.names:
                public = alias.name in getattr(module, "__all__", ())
                submodule = hasattr(module, "__path__") and importlib.util.find_spec(f"{node.module}.{alias.name}")
                if not public and not submodule:
                    found.append(f"{node.module}.{alias.name}")
    return found


def test_the_scripts_are_found():
    names = {path.stem for path in SCRIPTS}
    assert {"long_context", "forward_costs", "gpu_timing"} <= names, names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_study_imports_no_private_module(path, monkeypatch):
    compile(path.read_text(), str(path), "exec")  # parses
    assert private_imports(path, monkeypatch) == []


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_study_imports_only_public_names(path):
    assert non_public_names(path) == []


def test_the_checks_reject_private_imports(tmp_path, monkeypatch):
    script = tmp_path / "bad_study.py"
    script.write_text("from specprim.hf._static_target import PREFILL_CHUNK\nimport specprim._loop\n"
                      "from specprim.hf import _static_target\nfrom specprim.bench import conversation_ids\n"
                      "from specprim.bench import load_dataset\nfrom specprim import bench\n")
    assert private_imports(script, monkeypatch) == ["specprim._loop", "specprim.hf._static_target"]
    assert non_public_names(script) == ["specprim.hf._static_target.PREFILL_CHUNK", "specprim.bench.conversation_ids"]


def test_every_study_has_a_page_in_the_index():
    index = (STUDIES / "index.md").read_text()
    pages = {path.stem for path in STUDIES.glob("*.md")} - {"index"}
    scripts = {path.stem for path in STUDIES.glob("*.py")} - HELPERS
    assert scripts <= pages, sorted(scripts - pages)
    assert [page for page in sorted(pages) if f"]({page}.md)" not in index] == []
