"""Every third-party module hyfl's core imports at module level is a declared dependency.

A fresh `pip install .` (the README's first command) installs only
``[project] dependencies``; the test venv has more (the extras and their own
dependencies), so an import that works here can fail there. This happened with
``click``: Typer 0.21+ stopped depending on it, the test extras still brought it.
Modules of the optional extras (``hyfl.deploy``: flower, ``hyfl.neural``: neural)
are checked against their extra.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "hyfl"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[ <>=!;\[~]", r.strip(), maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def _top_level_imports(path: Path) -> set[str]:
    """Modules imported in the module body (not inside functions or try blocks)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_module_level_imports_are_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    extra_of = {"deploy": extras["flower"] | {"flwr"}, "neural": extras["neural"]}
    distributions = packages_distributions()
    missing = []
    for path in sorted(SOURCE.rglob("*.py")):
        sub = path.relative_to(SOURCE).parts[0]
        allowed = base | extra_of.get(sub, set())
        for module in sorted(_top_level_imports(path)):
            if module in sys.stdlib_module_names or module == "hyfl":
                continue
            dists = {d.lower().replace("_", "-") for d in distributions.get(module, [])}
            if not dists:
                pytest.fail(f"{path.relative_to(ROOT)} imports {module!r}, which no "
                            "installed distribution provides")
            if not dists & allowed:
                missing.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(sorted(dists))})")
    assert not missing, "imported at module level but not declared:\n" + "\n".join(missing)
