"""Package boundaries (issue 32, item 3; DESIGN.md "Layers that only look down"), read from the source.

Every module under ``specprim/`` is parsed with ``ast``. Each ``import x`` and ``from x import y`` counts, at module
level and inside functions, relative imports resolved. Imports under ``if TYPE_CHECKING:`` are left out: they never
run, or, in a module that imports its names lazily (``specprim/_lazy.py``), they run for whoever uses the name, so a
lazy name counts as an import of the module it comes from (``from specprim.models import load`` imports
``specprim.models._load``; ``from specprim import speculative_generate`` imports ``specprim._loop``).

A node is a sub-package (``specprim.<name>``) or a top-level module (``specprim._loop``, ``specprim.presets``, ...).
Asserted:
(a) no import cycle between nodes;
(b) no module imports a private module of another package, as written: ``specprim.X._y`` only from ``specprim/X/``,
    ``specprim._y`` only from ``specprim/*.py``; the lowest layer (``ALLOWED_PRIVATE``) may be imported from anywhere.
(c) no class has a project class as a base (composition, not implementation inheritance; issue 32, item 4) except
    ``typing.Protocol`` s, exceptions and enums.
Edges still in ``ALLOWED_CYCLE_EDGES`` / ``ALLOWED_PRIVATE_IMPORTS`` and classes in ``ALLOWED_PROJECT_BASES`` are known
debts or justified exceptions: the lists may only shrink.

``python tests/test_architecture.py`` prints the cycles and the private imports.
"""

from __future__ import annotations

import ast
import builtins
from collections import defaultdict
from pathlib import Path

import specprim

ROOT = Path(specprim.__file__).parent

# The lowest layer: anything may import these.
ALLOWED_PRIVATE = {
    "specprim._types",
    "specprim._stats",
    "specprim._usage",
    "specprim._names",
    "specprim._lazy",
    "specprim._integrity",
    "specprim._paths",
    "specprim._pyplot",
    "specprim._jsonl",
    "specprim._tau_error",
}

# Known debts, (importing node, imported node) and (importing module, imported private module). Only shrink these.
ALLOWED_CYCLE_EDGES: set[tuple[str, str]] = set()
ALLOWED_PRIVATE_IMPORTS: set[tuple[str, str]] = set()

# (module, class) pairs allowed to extend a project class that is not a protocol, exception or enum. Only shrink this.
ALLOWED_PROJECT_BASES: set[tuple[str, str]] = {
    # a frozen record that adds three fields to GenerateOutput and inherits no behaviour: whatever reads a
    # GenerateOutput (sequences, stats) reads a batch's output the same way
    ("specprim._batch", "BatchGenerateOutput"),
}


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


MODULES = {_name(path): path for path in ROOT.rglob("*.py")}


def _lazy_names(module: str) -> dict[str, str]:
    """``name -> module it comes from`` for a module that imports its names lazily (``specprim/_lazy.py``)."""
    source = MODULES[module].read_text()
    if "lazy_imports(__name__)" not in source:
        return {}
    table = {}
    for node in ast.parse(source).body:
        if _is_type_checking(node):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    table.update({alias.asname or alias.name: statement.module for alias in statement.names})
    return table


LAZY = {module: _lazy_names(module) for module in MODULES}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _directory(module: str) -> str:
    return module if _is_package(module) else module.rpartition(".")[0]


def _node(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _imports(module: str) -> list[tuple[str, str]]:
    """``(written, imported)`` for each module that ``module`` imports: ``written`` is the module the statement
    names (``from a import b`` names ``a.b`` when that is a module), ``imported`` the module a lazy name comes from."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                child = ast.Module(body=child.orelse, type_ignores=[])
            elif isinstance(child, ast.Import):
                found.extend((alias.name, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                source = child.module or ""
                if child.level:  # relative
                    base = _directory(module).split(".")
                    source = ".".join(base[: len(base) - child.level + 1] + ([source] if source else []))
                for alias in child.names:
                    if f"{source}.{alias.name}" in MODULES:
                        found.append((f"{source}.{alias.name}", f"{source}.{alias.name}"))
                    else:
                        found.append((source, LAZY.get(source, {}).get(alias.name, source)))
            visit(child)

    visit(ast.parse(MODULES[module].read_text()))
    return [(written, imported) for written, imported in found if imported.partition(".")[0] == "specprim"]


def _edges() -> list[tuple[str, str, str]]:
    """``(importing module, written, imported)`` for every import under ``specprim/`` (see :func:`_imports`)."""
    return [(module, written, imported) for module in MODULES for written, imported in _imports(module)]


def _owner(directory: str) -> str:
    """The package whose private modules a directory may import: ``specprim.X`` for ``specprim/X/...``, else
    ``specprim`` (top-level modules share ``specprim._loop`` and the like)."""
    return _node(directory)


def private_imports() -> list[tuple[str, str]]:
    """(importing module, private module of another package) pairs, sorted."""
    found = set()
    for module, target, _ in _edges():
        parts = target.split(".")
        private = [i for i, part in enumerate(parts) if i and part.startswith("_") and not part.startswith("__")]
        if not private or target in ALLOWED_PRIVATE:
            continue
        owner = _owner(".".join(parts[: private[0]]))
        if _owner(_directory(module)) != owner:
            found.add((module, ".".join(parts[: private[0] + 1])))
    return sorted(found)


def node_graph() -> dict[tuple[str, str], set[str]]:
    """(importing node, imported node) -> the module-level imports that make the edge."""
    graph: dict[tuple[str, str], set[str]] = defaultdict(set)
    for module, _, target in _edges():
        if _node(module) != _node(target):
            graph[_node(module), _node(target)].add(f"{module} -> {target}")
    return graph


def cycles(edges) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    successors = defaultdict(set)
    for a, b in edges:
        successors[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(successors[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted({a for a, _ in edges} | {b for _, b in edges}):
        if v not in index:
            connect(v)
    return sorted(components)


def report() -> str:
    graph = node_graph()
    lines = []
    found = cycles(graph)
    lines.append(f"{len(found)} import cycles between packages")
    for component in found:
        lines.append("  cycle: " + ", ".join(component))
        for (a, b), why in sorted(graph.items()):
            if a in component and b in component:
                lines.append(f"    {a} -> {b}: " + "; ".join(sorted(why)))
    private = private_imports()
    lines.append(f"{len(private)} imports of another package's private module")
    lines.extend(f"  {module} -> {target}" for module, target in private)
    return "\n".join(lines)


def test_the_scan_sees_lazy_function_level_and_facade_imports():
    edges = {(module, imported) for module, _, imported in _edges()}
    assert ("specprim.presets", "specprim.models._heads") in edges  # a lazy name: the module it comes from
    assert ("specprim.hf._aot_forward", "specprim.hf._windowed_attention") in edges  # inside a function
    assert ("specprim.presets", "specprim._loop") in edges
    assert sorted(imported for _, imported in edges if imported not in MODULES) == []


def test_no_import_cycles_between_packages():
    print(report())
    graph = node_graph()
    remaining = {edge for edge in graph if edge not in ALLOWED_CYCLE_EDGES}
    assert cycles(remaining) == [], f"remove one of these edges\n{report()}"
    stale = {edge for edge in ALLOWED_CYCLE_EDGES if edge not in graph}
    assert stale == set(), f"gone, take them off ALLOWED_CYCLE_EDGES: {sorted(stale)}"


def test_no_package_imports_another_packages_private_module():
    private = set(private_imports())
    new = sorted(private - ALLOWED_PRIVATE_IMPORTS)
    assert new == [], f"{new}\n{report()}"
    stale = ALLOWED_PRIVATE_IMPORTS - private
    assert stale == set(), f"gone, take them off ALLOWED_PRIVATE_IMPORTS: {sorted(stale)}"


EXCEPTIONS = {name for name, value in vars(builtins).items()
              if isinstance(value, type) and issubclass(value, BaseException)}
ENUMS = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


def _classes() -> dict[str, list[tuple[str, list[str]]]]:
    """Class name -> ``(module, base names)`` of every class defined under ``specprim/`` (a base ``a.B[T]`` is
    ``B``)."""
    found: dict[str, list[tuple[str, list[str]]]] = defaultdict(list)
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base).partition("[")[0].rpartition(".")[2] for base in node.bases]
                found[node.name].append((module, bases))
    return found


def project_bases() -> list[tuple[str, str, str]]:
    """(module, class, base) for every class whose base is a project class other than a protocol, an exception or
    an enum, sorted."""
    classes = _classes()

    def kind_of_base(name: str, seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``name`` is a protocol, exception or enum (itself or through its own bases)."""
        if name in ("Protocol",) or name in EXCEPTIONS or name in ENUMS:
            return True
        return name not in seen and any(kind_of_base(base, seen | {name})
                                        for _, bases in classes.get(name, []) for base in bases)

    found = set()
    for name, definitions in classes.items():
        for module, bases in definitions:
            for base in bases:
                if base in classes and not kind_of_base(base):
                    found.add((module, name, base))
    return sorted(found)


def test_the_base_scan_sees_project_bases_and_lets_protocols_exceptions_and_enums_pass():
    assert ("specprim._batch", "BatchGenerateOutput", "GenerateOutput") in project_bases()
    classes = _classes()
    assert any("Protocol" in bases for _, bases in classes["Drafter"])  # a project protocol ...
    assert "DamagedFileError" in classes  # ... and a project exception, neither of which is reported
    assert not any(base in ("Drafter", "DamagedFileError") for _, _, base in project_bases())


def test_no_class_extends_a_project_class():
    found = {(module, name) for module, name, _ in project_bases()}
    new = sorted(found - ALLOWED_PROJECT_BASES)
    assert new == [], f"compose instead of inheriting (hold the other class, or share functions): {new}"
    stale = ALLOWED_PROJECT_BASES - found
    assert stale == set(), f"gone, take them off ALLOWED_PROJECT_BASES: {sorted(stale)}"


if __name__ == "__main__":
    print(report())
    print("\n".join(f"class {module}.{name}({base})" for module, name, base in project_bases()))
