"""The package's shape. Its floors, bottom to top (FLOORS):

    core <- registry <- builder, check <- inspect, measure <- loop, report      the domain: returns data
         <- api <- the package, worker <- commands <- cli <- entry <- __main__  the library, the worker, the CLI

An import goes down the floors or stays inside its own subpackage (no upward import, so no cycle between
subpackages), and no module imports itself back. The command line is the layer on top: no domain module imports
commands/ or cli.py, and none prints: rendering (print, a rich console, a table) lives in commands/ and in the
consoles of core/console.py. No function is longer than MAX_FUNCTION_LINES. Imports are counted wherever they
are in a file, inside functions too: a deferred import still ties the two modules together."""

import ast
from collections import defaultdict
from pathlib import Path

from conftest import REPO

PACKAGE = "flashcore_cli"
MAX_FUNCTION_LINES = 80
FLOORS = [
    {"core"},
    {"registry"},
    {"builder", "check"},
    {"inspect", "measure"},
    {"loop", "report"},
    {"api"},
    {"", "worker"},  # "": the package itself (flashcore_cli/__init__.py: load_variant, the errors, __version__)
    {"commands"},
    {"cli"},
    {"entry"},
    {"__main__"},
]
DOMAIN = {"core", "registry", "builder", "check", "inspect", "measure", "loop", "report"}
COMMAND_LINE = {"commands", "cli", "entry", "__main__"}
# Where output is drawn: the command layer, and the consoles it draws on.
RENDERERS = {"flashcore_cli.cli", "flashcore_cli.core.console"}
# Modules outside the command layer that write to stdout themselves, each with the reason.
WRITES_STDOUT = {
    "flashcore_cli.entry": "replays a cached --help screen without importing the CLI",
    "flashcore_cli.builder.jit": "build_variant(verbose=True) passes the compiler's own output through, as torch's "
    "cpp_extension.load(verbose=True) does",
}



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


def floor_name(module: str) -> str:
    """'flashcore_cli.core.errors' -> 'core'; 'flashcore_cli.cli' -> 'cli'; the package itself -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor(module: str) -> int:
    return next(i for i, names in enumerate(FLOORS) if floor_name(module) in names)


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


def test_every_module_has_a_floor():
    missing = sorted({floor_name(m) for m in MODULES} - set().union(*FLOORS))
    assert not missing, f"modules on no floor (add them to FLOORS): {missing}"


def test_no_import_goes_up_a_floor():
    upward = [f"{a} (floor {floor(a)}) -> {b} (floor {floor(b)})" for a, targets in sorted(import_graph().items())
              for b in sorted(targets) if subpackage(a) != subpackage(b) and floor(b) >= floor(a)]  # fmt: skip
    assert not upward, "imports up or across the floors: " + "; ".join(upward)


def test_the_command_line_is_the_layer_on_top():
    graph = import_graph()
    up = [f"{a} -> {b}" for a, targets in sorted(graph.items()) if floor_name(a) in DOMAIN
          for b in sorted(targets) if floor_name(b) in COMMAND_LINE]  # fmt: skip
    assert not up, "domain modules importing the command line: " + "; ".join(up)
    assert {floor_name(b) for b in graph["flashcore_cli.cli"]} >= {"commands"}


def rendering(module: str, path: Path) -> list[str]:
    """Where a module draws output: a print() call, a call of a method named print (a rich console's), an import of
    rich or of core/console.py, a write to sys.stdout or sys.stderr."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "print":
                found.append(f"print() at line {node.lineno}")
            elif isinstance(func, ast.Attribute) and func.attr == "print":
                found.append(f".print() at line {node.lineno}")
            elif (isinstance(func, ast.Attribute) and func.attr == "write" and isinstance(func.value, ast.Attribute)
                  and func.value.attr in ("stdout", "stderr") and module not in WRITES_STDOUT):  # fmt: skip
                found.append(f"sys.{func.value.attr}.write() at line {node.lineno}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names += [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if any(n == "rich" or n.startswith("rich.") for n in names):
                found.append(f"imports rich at line {node.lineno}")
            if any(n.startswith("flashcore_cli.core.console") for n in names):
                found.append(f"imports core/console.py at line {node.lineno}")
    return found


def test_rendering_is_found_where_it_is():
    assert rendering("flashcore_cli.commands.build", MODULES["flashcore_cli.commands.build"])
    assert rendering("flashcore_cli.core.console", MODULES["flashcore_cli.core.console"])


def test_only_the_command_layer_renders():
    drawn = [f"{module}: {', '.join(where)}" for module, path in MODULES.items()
             if floor_name(module) != "commands" and module not in RENDERERS and (where := rendering(module, path))]  # fmt: skip
    assert not drawn, "modules below the command layer that render: " + "; ".join(drawn)

