"""The package's shape, read from the source (``ast``), so the tests need no import to run.

* The modules import each other without cycles.
* No module imports another's private names.
* Every module sits in exactly one layer of the table in ``docs/architecture.md``
  (section "Layers"), and every import goes to its own layer or a layer above it.
* No function or method is longer than :data:`MAX_FUNCTION_LINES` lines unless
  ``docs/architecture.md`` names it, with a reason, under "Functions over 150 lines".

Every import statement counts, the ones inside functions and under
``TYPE_CHECKING`` too: an import moved into a function to dodge a cycle still
couples the two modules both ways. Package ``__init__.py`` files are modules like
the others (``hyfl.data`` is ``data/__init__.py``), and importing ``hyfl.a.b``
from outside package ``hyfl.a`` also runs ``a/__init__.py``: that counts as an
import of ``hyfl.a`` (a module inside ``hyfl.a`` already runs under it).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_FUNCTION_LINES = 150


# --- reading the package --------------------------------------------------------


def _module_name(path: str) -> str:
    """``"data/parties.py"`` -> ``"hyfl.data.parties"``, ``"data/__init__.py"`` -> ``"hyfl.data"``.
    """
    parts = ["hyfl", *path[: -len(".py")].split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, str]:
    """The text of every module of ``src/hyfl``, keyed by its path below ``src/hyfl``."""
    package = SOURCE / "hyfl"
    return {path.relative_to(package).as_posix(): path.read_text()
            for path in sorted(package.rglob("*.py"))}


def _imports(path: str, text: str, names: set[str]):
    """``(target module, imported names, line)`` of every hyfl import in module ``path``.

    ``names`` holds the module names of the package; a ``from a import b`` whose
    ``a.b`` is one of them imports the submodule.
    """
    name = _module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, path)):
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
                if full in names:  # a submodule
                    yield full, [], node.lineno
                else:
                    yield base, [alias.name], node.lineno


def _edges(sources: dict[str, str]):
    """``(importer path, target module, line, private names)`` of every hyfl import.

    The target is the module the import names (or its nearest module ancestor),
    plus every package on the way to it that the importer is not inside: those
    ``__init__.py`` files run too.
    """
    names = {_module_name(path) for path in sources}
    for path, text in sources.items():
        own = _module_name(path)
        inside = {".".join(own.split(".")[:i]) for i in range(1, own.count(".") + 2)}
        for target, imported, line in _imports(path, text, names):
            while target not in names and "." in target:
                target = target.rpartition(".")[0]
            if target not in names or target == own:
                continue
            parts = target.split(".")
            packages = {".".join(parts[:i]) for i in range(1, len(parts))} - inside
            private = [n for n in imported if n.startswith("_") and not n.startswith("__")]
            yield path, target, line, private
            for ancestor in sorted(packages & names):
                yield path, ancestor, line, []


def _graph(sources: dict[str, str] | None = None) -> tuple[dict[str, set[str]], list[str]]:
    sources = _sources() if sources is None else sources
    graph: dict[str, set[str]] = {_module_name(path): set() for path in sources}
    private: list[str] = []
    for path, target, line, names in _edges(sources):
        graph[_module_name(path)].add(target)
        private += [f"src/hyfl/{path}:{line} imports {n} from {target}" for n in names]
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


# --- the layer table ----------------------------------------------------------------


def _section(markdown: str, title: str) -> list[str]:
    """The lines of section ``## title`` of a Markdown document."""
    lines = markdown.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _layers(markdown: str) -> list[tuple[str, list[str]]]:
    """``(layer, module paths)`` of each row of the "Layers" table, first layer first.

    A row is ``| layer | modules | owns |``; its modules are the backticked names of
    the second cell that end in ``.py`` (one module, its path below ``src/hyfl``) or
    ``/`` (every module of that package not listed elsewhere).
    """
    layers = []
    for line in _section(markdown, "Layers"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] in ("layer", "") \
                or set(cells[0]) <= set("-: "):
            continue
        paths = [p for p in re.findall(r"`([^`]+)`", cells[1]) if p.endswith((".py", "/"))]
        layers.append((cells[0], paths))
    return layers


def _layer_of(paths, layers: list[tuple[str, list[str]]]) -> tuple[dict[str, int], list[str]]:
    """Each module's layer (an index into ``layers``) and what is wrong with the table.

    A module named by its path is in that layer; one that is not, in the layer of
    the longest package prefix it has. Wrong: a module in no layer, a path listed
    twice, an entry that names no module.
    """
    problems = []
    exact: dict[str, int] = {}
    prefixes: dict[str, int] = {}
    for i, (layer, entries) in enumerate(layers):
        for entry in entries:
            table = prefixes if entry.endswith("/") else exact
            if entry in table:
                problems.append(f"`{entry}` is listed in layer {layers[table[entry]][0]!r} "
                                f"and in layer {layer!r}")
            table[entry] = i
    found: dict[str, int] = {}
    for path in paths:
        if path in exact:
            found[path] = exact[path]
            continue
        matches = [p for p in prefixes if path.startswith(p)]
        if matches:
            found[path] = prefixes[max(matches, key=len)]
        else:
            problems.append(f"src/hyfl/{path} is in no layer of docs/architecture.md")
    problems += [f"`{entry}` in the layer table names no module of src/hyfl"
                 for entry in [*exact, *prefixes]
                 if entry not in paths and not any(p.startswith(entry) for p in paths)]
    return found, problems


def layer_violations(sources: dict[str, str], markdown: str) -> list[str]:
    """Every import of ``sources`` (path -> text) that goes to a lower layer, and the
    table's own problems; empty when the package keeps the layers of ``markdown``."""
    layers = _layers(markdown)
    layer, problems = _layer_of(sources, layers)
    by_name = {_module_name(path): path for path in sources}
    for path, target, line, _ in _edges(sources):
        mine, theirs = layer.get(path), layer.get(by_name[target])
        if mine is not None and theirs is not None and theirs > mine:
            problems.append(f"src/hyfl/{path}:{line} (layer {layers[mine][0]!r}) imports "
                            f"{target} (layer {layers[theirs][0]!r}, below it)")
    return list(dict.fromkeys(problems))  # one line per import, however many names


# --- long functions -------------------------------------------------------------------


def _long_functions(sources: dict[str, str], limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{"data/parties.load_parties": lines}`` of every function or method over ``limit``
    lines (from ``def`` to its last line; methods as ``module.Class.method``)."""
    found = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        found[name] = lines
                walk(child, name)
            else:
                walk(child, prefix)

    for path, text in sources.items():
        walk(ast.parse(text, path), path[: -len(".py")])
    return found


def _allowed_long_functions(markdown: str) -> dict[str, str]:
    """``{name: reason}`` of the list items of section "Functions over 150 lines"."""
    allowed = {}
    for line in _section(markdown, f"Functions over {MAX_FUNCTION_LINES} lines"):
        match = re.match(r"\s*[-*] `([^`]+)`\s*[:(-]\s*(.*)", line)
        if match:
            allowed[match.group(1)] = match.group(2).strip()
    return allowed


# --- the tests ----------------------------------------------------------------------


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_importing_a_submodule_from_outside_its_package_runs_the_package():
    sources = {
        "__init__.py": "",
        "reg/__init__.py": "def entries():\n    from hyfl.plug.algo import Algo\n",
        "reg/base.py": "",
        "plug/__init__.py": "",
        "plug/algo.py": "def f():\n    from hyfl.reg.base import thing\n",
    }
    graph, _ = _graph(sources)
    assert graph["hyfl.plug.algo"] == {"hyfl.reg.base", "hyfl.reg"}
    assert graph["hyfl.reg.base"] == set()  # its own package does not count
    assert _cycles(graph) == [["hyfl.plug.algo", "hyfl.reg"]]


def test_the_import_graph_has_no_cycle():
    graph, _ = _graph()
    assert len(graph) > 90 and sum(map(len, graph.values())) > 300  # it read the package
    assert "hyfl.data" in graph and graph["hyfl.data"]  # __init__.py files are read too
    assert _cycles(graph) == []


def test_no_module_imports_another_modules_private_names():
    _, private = _graph()
    assert private == []


def test_the_layer_table_reads_every_layer():
    layers = _layers(ARCHITECTURE.read_text())
    names = [name for name, _ in layers]
    assert names[0] == "names and errors" and names[-1] == "command line"
    assert len(names) >= 10 and all(paths for _, paths in layers)
    assert any("deploy/" in paths for _, paths in layers)


def test_every_module_is_in_one_layer_and_imports_only_its_layer_and_those_above():
    assert layer_violations(_sources(), ARCHITECTURE.read_text()) == []


TOY_TABLE = """\
## Layers

| layer | modules | owns |
|---|---|---|
| base | `__init__.py`, `errors.py` | errors |
| data | `data/` (`Dataset`) | data |
| top | `cli.py`, `data/cli.py` | the command |

## Next
"""


def test_the_layer_check_reports_a_planted_violation():
    sources = {
        "__init__.py": "",
        "errors.py": "",
        "data/__init__.py": "from hyfl.data.table import Dataset\n",
        "data/table.py": "import numpy\n\nfrom hyfl.errors import fail\n",
        "data/cli.py": "from hyfl.data import Dataset\n",
        "cli.py": "from hyfl.data.cli import main\n",
    }
    assert layer_violations(sources, TOY_TABLE) == []
    planted = {**sources, "data/table.py": "from hyfl.errors import fail\n\n\n"
               "def show():\n    from hyfl.cli import main, other\n"}
    assert layer_violations(planted, TOY_TABLE) == [
        "src/hyfl/data/table.py:5 (layer 'data') imports hyfl.cli (layer 'top', below it)"
    ]
    # through a package's __init__.py: importing hyfl.data.table runs data/__init__.py
    planted = {**sources, "errors.py": "from hyfl.data.table import Dataset\n"}
    assert layer_violations(planted, TOY_TABLE) == [
        "src/hyfl/errors.py:1 (layer 'base') imports hyfl.data.table (layer 'data', below it)",
        "src/hyfl/errors.py:1 (layer 'base') imports hyfl.data (layer 'data', below it)",
    ]


def test_the_layer_check_reports_modules_in_no_layer_and_stale_entries():
    sources = {"__init__.py": "", "errors.py": "", "data/__init__.py": "", "loose.py": "",
               "data/cli.py": ""}
    assert layer_violations(sources, TOY_TABLE) == [
        "src/hyfl/loose.py is in no layer of docs/architecture.md",
        "`cli.py` in the layer table names no module of src/hyfl",
    ]
    twice = TOY_TABLE.replace("`cli.py`, `data/cli.py`", "`cli.py`, `errors.py`")
    assert "`errors.py` is listed in layer 'base' and in layer 'top'" in layer_violations(
        {**sources, "cli.py": ""}, twice)


def test_the_length_check_finds_long_functions_and_methods():
    body = "".join(f"    x{i} = {i}\n" for i in range(150))
    text = f"def long():\n{body}\n\nclass A:\n    def short(self):\n        pass\n\n" \
           f"    def long(self):\n{body.replace('    ', '        ')}\n\ndef fine():\n{body[:-11]}"
    assert _long_functions({"m/mod.py": text}) == {"m/mod.long": 151, "m/mod.A.long": 151}


def test_no_function_is_longer_than_150_lines_unless_the_architecture_says_why():
    allowed = _allowed_long_functions(ARCHITECTURE.read_text())
    assert all(allowed.values()), "each function listed needs its reason"
    long = _long_functions(_sources())
    unexplained = {name: lines for name, lines in long.items() if name not in allowed}
    stale = sorted(set(allowed) - set(long))
    assert unexplained == {} and stale == [], (
        f"functions over {MAX_FUNCTION_LINES} lines (split them, or name them with a reason "
        f"under 'Functions over {MAX_FUNCTION_LINES} lines' in docs/architecture.md): "
        f"{unexplained}; listed there but not long: {stale}")
