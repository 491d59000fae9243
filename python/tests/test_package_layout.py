"""The package's own layout: its import graph flows one way, and no module uses another module's private names.

Read from the installed package's sources with ``ast`` (nothing is imported), so these hold for the code that runs.
Every ``import`` counts, module level or inside a function (a lazy import is still a dependency), and so does an
import under ``if TYPE_CHECKING``. The extension module (``_distckpt``) is a node of the graph too: only ``_native``,
which wraps it, may use its private names.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import distckpt

PACKAGE = pathlib.Path(distckpt.__file__).parent
EXTENSION = "_distckpt"
#: The one module that wraps the extension, and may call its private names (``_set_error_factory``).
EXTENSION_WRAPPER = "_native"


def _modules() -> Dict[str, ast.Module]:
    mods = {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.glob("*.py"))}
    assert {"__init__", "errors", "reader", "_checkpoint", "_native"} <= set(mods), sorted(mods)
    return mods


MODULES = _modules()
NODES = set(MODULES) | {EXTENSION}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _package_module(node: ast.ImportFrom) -> Tuple[bool, str]:
    """(whether ``from X import ...`` names the package or one of its modules, that module or "" for the package)."""
    if node.level == 1:
        return True, (node.module or "").split(".")[0]
    if node.level == 0 and node.module and (node.module == "distckpt" or node.module.startswith("distckpt.")):
        return True, node.module.split(".")[1] if "." in node.module else ""
    return False, ""


def _imports(tree: ast.Module) -> Iterator[Tuple[int, str, str]]:
    """(line, module imported, name imported from it or "") for every import of a distckpt module in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            ours, module = _package_module(node)
            if not ours:
                continue
            for alias in node.names:
                if module:
                    yield node.lineno, module, alias.name
                elif alias.name in NODES:  # from . import x
                    yield node.lineno, alias.name, ""
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "distckpt" and len(parts) > 1:
                    yield node.lineno, parts[1], ""


def _graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {name: set() for name in NODES}
    for name, tree in MODULES.items():
        for _, module, imported in _imports(tree):
            target = imported if module == "" else module
            if target in NODES and target != name:
                graph[name].add(target)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycles():
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles among distckpt's modules: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) + ")"
        for c in cycles
    )


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_errors_is_a_leaf():
    """errors is the bottom: the extension's error factory calls into it, so it may import nothing of distckpt."""
    assert _graph()["errors"] == set()


def test_the_graph_sees_lazy_imports():
    """An import inside a function is an edge too (e.g. _arrays imports _torch_shards only when torch is in use)."""
    assert "_torch_shards" in _graph()["_arrays"]


def test_no_module_imports_another_modules_private_names():
    found = []
    for name, tree in MODULES.items():
        for line, module, imported in _imports(tree):
            if module and module != name and _private(imported) and not imported.startswith("_distckpt"):
                found.append(f"{name}.py:{line}: from .{module} import {imported}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def _module_aliases(tree: ast.Module) -> Dict[str, str]:
    """Local name -> distckpt module, for ``from . import x [as y]`` and ``import distckpt.x as y``."""
    aliases: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _package_module(node) == (True, ""):
            for alias in node.names:
                if alias.name in NODES:
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "distckpt" and len(parts) == 2 and alias.asname:
                    aliases[alias.asname] = parts[1]
    return aliases


def test_no_module_uses_another_modules_private_names():
    found = []
    for name, tree in MODULES.items():
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)):
                continue
            module = aliases.get(node.value.id)
            if module is None or module == name:
                continue
            if module == EXTENSION and name == EXTENSION_WRAPPER:
                continue
            found.append(f"{name}.py:{node.lineno}: {node.value.id}.{node.attr} ({module}'s)")
    assert not found, "private names of other modules used:\n" + "\n".join(found)


def _private_attributes(tree: ast.Module) -> Set[str]:
    """The private attribute and method names the classes of a module define (``self._x = ...``, ``def _f``,
    ``__slots__``, class-level ``_x = ...``)."""
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    for t in targets:
                        if (
                            isinstance(t, ast.Name)
                            and t.id == "__slots__"
                            and isinstance(item.value, (ast.Tuple, ast.List))
                        ):
                            names |= {
                                e.value for e in item.value.elts if isinstance(e, ast.Constant) and _private(e.value)
                            }
                        elif isinstance(t, ast.Name) and _private(t.id):
                            names.add(t.id)
        elif (
            isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self" and _private(node.attr)
        ):  # fmt: skip
            names.add(node.attr)
    return names


def test_no_module_uses_the_private_attributes_of_another_modules_objects():
    """``reader._root`` in lightning.py: a private attribute that only another module's classes define, used on an
    object that is not ``self``. (A name that this module's classes define too is not flagged.)"""
    defined = {name: _private_attributes(tree) for name, tree in MODULES.items()}
    found = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)) or node.attr in defined[name]:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            owners = sorted(m for m, attrs in defined.items() if m != name and node.attr in attrs)
            if owners:
                found.append(f"{name}.py:{node.lineno}: .{node.attr} (defined by {', '.join(owners)})")
    assert not found, "private attributes of other modules' objects used:\n" + "\n".join(found)


@pytest.mark.parametrize("source, expected", [
    ("from .reader import _plan_index\n", ["from .reader import _plan_index"]),
    ("from distckpt.reader import _plan_index\n", ["from .reader import _plan_index"]),
])  # fmt: skip
def test_the_private_import_check_finds_a_reach_in(source, expected):
    tree = ast.parse(source)
    found = [f"from .{m} import {n}" for _, m, n in _imports(tree) if m and _private(n)]
    assert found == expected
