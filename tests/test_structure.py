"""The package's shape: no import cycle between its modules or its subpackages (core <- registry <- builder <-
inspect/check/measure/loop <- report <- commands/cli, README's "Layout"), and no function longer than
MAX_FUNCTION_LINES. Imports are counted wherever they are in a file, inside functions too: a deferred import
still ties the two modules together."""

import ast
from collections import defaultdict
from pathlib import Path

from conftest import REPO

PACKAGE = "flashcore_cli"
MAX_FUNCTION_LINES = 80



def modules() -> dict[str, Path]:
    """'flashcore_cli.core.errors' -> its file; a package by its __init__.py."""
    found = {}
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = modules()


def imported(module: str, path: Path, node: ast.AST) -> list[str]:
    """The package's modules an import statement names (`from flashcore_cli.x import y` names x, and x.y when
    y is a module); relative imports resolved."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target != PACKAGE and not target.startswith(PACKAGE + "."):
        return []
    return [m for m in [target, *(f"{target}.{a.name}" for a in node.names)] if m in MODULES]


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            graph[module].update(m for m in imported(module, path, node) if m != module)
    return graph


def subpackage(module: str) -> str:
    """'flashcore_cli.core.errors' -> 'flashcore_cli.core'; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    reduced: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        reduced[subpackage(a)].update(subpackage(b) for b in targets if subpackage(b) != subpackage(a))
    return reduced


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    nodes = sorted(set(graph) | {b for targets in graph.values() for b in targets})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph.get(target, ())))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return found


def describe(component: set[str], graph: dict[str, set[str]]) -> str:
    return "; ".join(f"{a} -> {b}" for a in sorted(component) for b in sorted(graph.get(a, ())) if b in component)


def test_the_cycle_finder_finds_a_cycle_and_only_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_the_graph_sees_deferred_and_relative_imports():
    graph = import_graph()
    assert "flashcore_cli.commands.handling" in graph["flashcore_cli.cli"]  # a top-level import
    assert "flashcore_cli.measure.bench" in graph["flashcore_cli.commands.bench"]  # one inside a function


def test_no_module_imports_itself_back():
    graph = import_graph()
    found = list(cycles(graph))
    assert not found, "import cycles: " + " | ".join(describe(c, graph) for c in found)


def test_no_subpackage_imports_itself_back():
    graph = subpackage_graph(import_graph())
    found = cycles(graph)
    assert not found, "subpackage import cycles: " + " | ".join(describe(c, graph) for c in found)


def test_no_function_is_longer_than_the_limit():
    long = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name} ({path.relative_to(REPO)}:{node.lineno}): {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)
