"""The shape of the tree: layers point one way, modules stay small, every
third-party import is declared.

The package graph is read from the imports themselves (every `import` and
`from ... import` anywhere in a module, including the lazy ones inside
functions), so a cycle cannot hide behind a deferred import.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

from common.constants import REPO_ROOT

# Bottom to top. A package may import only packages listed before it.
LAYERS = ["common", "routing", "kvstore", "actors", "deployments", "cluster", "bench", "cli"]
ABOVE_ALL = ["tests", "notebooks"]  # may import anything, nothing imports them
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def _sources(top: str | None = None) -> list[Path]:
    roots = [REPO_ROOT / top] if top else [REPO_ROOT / p for p in LAYERS + ABOVE_ALL]
    return sorted(p for r in roots for p in r.rglob("*.py") if ".venv" not in p.parts)


def _imports(path: Path) -> set[str]:
    """Absolute module names `path` imports, at any depth of the file."""
    return _imports_of_text(path.read_text())


def _notebook_imports(path: Path) -> set[str]:
    import json

    names: set[str] = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            src = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
            names.update(_imports_of_text(src))
    return names


def _imports_of_text(src: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def package_graph() -> dict[str, set[str]]:
    """Top-level Baton package -> the Baton packages it imports."""
    ours = set(LAYERS + ABOVE_ALL)
    graph: dict[str, set[str]] = {p: set() for p in ours}
    for path in _sources():
        top = path.relative_to(REPO_ROOT).parts[0]
        graph[top] |= {m.split(".")[0] for m in _imports(path)} & ours - {top}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in `graph` as a path, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_packages():
    graph = package_graph()
    assert _cycle(graph) is None, f"import cycle between packages: {' -> '.join(_cycle(graph))}"


MODULE_PACKAGES = ["actors", "bench", "cluster", "common", "deployments", "kvstore", "routing"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under an `if TYPE_CHECKING:` block."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return hidden


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The Baton modules `path` imports, from any depth of the file (function
    bodies included)."""
    return _module_imports_of_text(path.read_text(), _module_name(path),
                                   path.name == "__init__.py", modules)


def _module_imports_of_text(src: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """Relative imports resolved against `name`; `from pkg import x` is an import
    of `pkg.x` when that is a module, else of `pkg`; `if TYPE_CHECKING:` skipped."""
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(src)
    hidden = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                up = parts[: len(parts) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return (found & modules) - {name}


def module_graph() -> dict[str, set[str]]:
    """Baton module -> the Baton modules it imports anywhere in its file."""
    paths = [p for top in MODULE_PACKAGES for p in _sources(top)]
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _module_imports(p, modules) for p in paths}


def _strong_components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` with more than one node."""
    order: list[str] = []
    seen: set[str] = set()
    for start in sorted(graph):  # iterative DFS, finish order
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(graph[start])))]
        while stack:
            node, it = stack[-1]
            nxt = next((m for m in it if m not in seen), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    reverse: dict[str, set[str]] = {n: set() for n in graph}
    for n, targets in graph.items():
        for m in targets:
            reverse.setdefault(m, set()).add(n)
    components, assigned = [], set()
    for root in reversed(order):
        if root in assigned:
            continue
        comp, todo = set(), [root]
        while todo:
            n = todo.pop()
            if n not in assigned:
                assigned.add(n)
                comp.add(n)
                todo += reverse.get(n, set()) - assigned
        if len(comp) > 1:
            components.append(comp)
    return components


def module_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each tangle of mutually importing modules: one cycle through it, and all its modules."""
    return [(_cycle({n: graph[n] & comp for n in comp}), sorted(comp)) for comp in _strong_components(graph)]


def test_module_cycle_finder_sees_function_level_and_relative_imports():
    assert module_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [(["a", "b", "a"], ["a", "b"])]
    assert module_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"a"}}) == [(["a", "b", "a"], ["a", "b", "c"])]
    assert module_cycles({"a": {"b"}, "b": set()}) == []
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from p import hidden\n"
           "def f():\n    from . import sub\n    from .deep.leaf import x\n"
           "    import p.other\n    from p import not_a_module\n")
    modules = {"p", "p.hidden", "p.sub", "p.deep.leaf", "p.other"}
    assert _module_imports_of_text(src, "p.m", False, modules) == {
        "p.sub", "p.deep.leaf", "p.other", "p"}


def test_no_import_cycle_between_modules():
    """Every import counts, the ones inside functions too: a deferred import
    hides a cycle from the interpreter, not from the design."""
    graph = module_graph()
    tangles = [f"{' -> '.join(cycle)}  (the tangle: {', '.join(members)})"
               for cycle, members in module_cycles(graph)]
    assert not tangles, "import cycles between modules:\n" + "\n".join(tangles)


def test_layers_point_down():
    graph = package_graph()
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = [f"{p} -> {d}" for p in LAYERS for d in graph[p]
              if d in ABOVE_ALL or rank[d] > rank[p]]
    assert not upward, f"imports against the layer order {LAYERS}: {upward}"
    assert graph["common"] == set(), "common/ is the leaf: it imports no other Baton package"
    assert not any(p in graph[q] for p in ABOVE_ALL for q in graph)


MAX_PACKAGE_MODULES = 12


def test_every_package_is_a_room_a_newcomer_can_read():
    """No package folder holds more than MAX_PACKAGE_MODULES modules directly, and every
    package's __init__ says in a docstring what it holds."""
    crowded, silent = [], []
    for top in MODULE_PACKAGES + ["cli"]:
        for init in (REPO_ROOT / top).rglob("__init__.py"):
            folder = init.parent
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MAX_PACKAGE_MODULES:
                crowded.append(f"{folder.relative_to(REPO_ROOT)} ({len(modules)})")
            if not ast.get_docstring(ast.parse(init.read_text())):
                silent.append(str(init.relative_to(REPO_ROOT)))
    assert not crowded, f"packages over {MAX_PACKAGE_MODULES} modules: {crowded}"
    assert not silent, f"packages whose __init__ has no docstring: {silent}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_module_and_function_size(path: Path):
    text = path.read_text()
    assert text.count("\n") <= MAX_FILE_LINES, f"{path.name}: over {MAX_FILE_LINES} lines"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(text))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _declared() -> set[str]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return {_norm(re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0]) for r in reqs}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_declared():
    ours = set(LAYERS + ABOVE_ALL)
    modules: set[str] = set()
    for path in _sources():
        modules |= {m.split(".")[0] for m in _imports(path)}
    for nb in (REPO_ROOT / "notebooks").glob("*.ipynb"):
        modules |= {m.split(".")[0] for m in _notebook_imports(nb)}
    modules -= ours | set(sys.stdlib_module_names) | {"__future__"}
    dists = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = sorted(f"{m} ({', '.join(dists.get(m, ['not installed']))})" for m in modules
                     if not declared & {_norm(d) for d in dists.get(m, [m])})
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
