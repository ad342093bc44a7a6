"""The package's shape: its modules import each other without cycles, and no module
imports another's private names.

Every import statement counts, the ones inside functions too: an import moved into
a function to dodge a cycle still couples the two modules both ways. The graph is
read from the source (``ast``), so the test needs no import to run.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((SOURCE / "hyfl").rglob("*.py")):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]):
    """``(target module, imported names, line)`` of every hyfl import in ``path``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:  # a submodule
                    yield full, [], node.lineno
                else:
                    yield base, [alias.name], node.lineno


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    private: list[str] = []
    for name, path in modules.items():
        for target, names, line in _imports(name, path, modules):
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target not in modules or not target.startswith("hyfl"):
                continue
            if target != name:
                graph[name].add(target)
            private += [f"{path.relative_to(SOURCE)}:{line} imports {n} from {target}"
                        for n in names if n.startswith("_") and not n.startswith("__")]
    return graph, private


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

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
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle():
    graph, _ = _graph()
    assert len(graph) > 90 and sum(map(len, graph.values())) > 300  # it read the package
    assert _cycles(graph) == []


def test_no_module_imports_another_modules_private_names():
    _, private = _graph()
    assert private == []
