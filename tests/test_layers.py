"""The layering rules of docs/architecture.md, checked on the source (ast), not at run time.

Every import counts, also one inside a function (a lazy import hides a cycle, it does not remove it);
only imports under ``if TYPE_CHECKING:`` are annotations and do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bayesncl"

# what each room may import (besides itself); the root package (the public API) may import anything
ALLOWED = {
    "config": {"core", "data"},  # the registries of allowed values
    "data": set(),
    "core": {"data"},
    "metrics": {"core", "data", "config"},
    "runs": {"core", "data", "metrics", "config"},
    "app": {"core", "data", "metrics", "runs", "config"},
}


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING" or (
        isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The bayesncl modules ``module`` imports, resolved to module names (``from a import b`` counts b
    when b is a module)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("bayesncl"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.startswith("bayesncl"):
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    found.add(sub if _exists(sub) else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def _exists(module: str) -> bool:
    p = SRC.joinpath(*module.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = _module(path)
        graph[mod] = _imports(ast.parse(path.read_text()), mod, path.name == "__init__.py")
    return graph


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_rooms_import_only_the_rooms_below_them():
    breaches = [
        f"{mod} imports {dep}"
        for mod, deps in import_graph().items()
        for dep in deps
        if _room(mod) and _room(dep) and _room(dep) != _room(mod) and _room(dep) not in ALLOWED[_room(mod)]
    ]
    assert not breaches, "layering breaches:\n" + "\n".join(sorted(breaches))


def test_no_room_imports_the_public_api_package():
    # the root package re-exports the app: a room importing `bayesncl` itself would close a cycle
    offenders = [mod for mod, deps in import_graph().items() if "bayesncl" in deps and mod != "bayesncl"]
    assert not offenders, offenders


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    # a package's __init__ importing its own submodules is not a cycle of the design: drop those edges
    graph = {
        m: {d for d in deps if not d.startswith(m + ".")} for m, deps in import_graph().items()
    }
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
