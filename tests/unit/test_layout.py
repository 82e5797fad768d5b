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


def test_layers_point_down():
    graph = package_graph()
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = [f"{p} -> {d}" for p in LAYERS for d in graph[p]
              if d in ABOVE_ALL or rank[d] > rank[p]]
    assert not upward, f"imports against the layer order {LAYERS}: {upward}"
    assert graph["common"] == set(), "common/ is the leaf: it imports no other Baton package"
    assert not any(p in graph[q] for p in ABOVE_ALL for q in graph)


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
