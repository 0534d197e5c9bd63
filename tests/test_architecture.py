"""The package layout is part of the design (docs/architecture.md): one concern per subpackage,
dependencies pointing one way (lang <- engine <- fastpath <- analysis / report <- cli) and no module cycles.

The graph is read from the source with :mod:`ast` (every ``import``, also the ones inside
functions), so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memform

SRC = Path(memform.__file__).resolve().parent

#: subpackage -> the memform packages/modules it may import (besides itself)
ALLOWED = {
    "lang": {"errors", "resources", "cachedir"},
    "allocator": {"errors"},
    "engine": {"lang", "allocator", "errors", "resources", "units"},
    "fastpath": {"engine", "allocator", "lang", "errors", "resources", "units", "cachedir"},
    "analysis": {"engine", "fastpath", "allocator", "lang", "errors", "resources", "units", "cachedir"},
    "report": {"engine", "analysis", "fastpath", "lang", "errors", "resources", "units", "__init__"},  # __version__
    "importers": {"engine", "lang", "errors", "resources"},
    "validation": {"engine", "allocator", "api", "importers", "errors", "units", "__init__"},
    "cli": {"api", "engine", "lang", "analysis", "fastpath", "report", "importers", "errors", "resources", "units",
            "cachedir", "__init__"},
}
TOP_LEVEL_LIMIT = 8


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or ["__init__"]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """memform modules that ``path`` imports, as dotted names below the package."""
    me = _module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    if package == ["__init__"]:
        package = []
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "memform":
                target = node.module.split(".")[1:]
            else:
                continue
            dotted = ".".join(target)
            for alias in node.names:
                child = f"{dotted}.{alias.name}" if dotted else alias.name
                out.add(child if _exists(child) else (dotted or "__init__"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "memform":
                    out.add(".".join(alias.name.split(".")[1:]) or "__init__")
    return {m for m in out if m != me}


def _exists(dotted: str) -> bool:
    p = SRC.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}


def test_no_module_cycles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            # a package's __init__ importing its own modules is how packages work, not a cycle
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_point_one_way(package):
    bad = []
    for mod, deps in _graph().items():
        if mod.split(".")[0] != package:
            continue
        for d in deps:
            top = d.split(".")[0]
            if top != package and top not in ALLOWED[package]:
                bad.append(f"{mod} imports {d}")
    assert not bad, f"{package} may import only {sorted(ALLOWED[package])}: " + "; ".join(sorted(bad))


def test_few_modules_at_the_top():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top
    for sub in ALLOWED:
        init = SRC / sub / "__init__.py"
        assert init.is_file(), f"memform.{sub} is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "May import" in doc, f"memform.{sub}/__init__.py must say what it owns and may import"


def test_public_api():
    from memform import api
    for name in ("estimate", "Estimate", "load_model", "rebind", "estimate_model", "load_program", "Model"):
        assert hasattr(memform, name) or hasattr(api, name), name
    assert memform.estimate is api.estimate and api.rebind is memform.rebind
