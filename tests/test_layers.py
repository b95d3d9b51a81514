"""The layering rules of docs/architecture.md, checked on the source (ast), not at run time.

Every import counts, also one inside a function (a lazy import hides a cycle, it does not remove it)
and one under ``if TYPE_CHECKING:`` (an annotation's import is still a dependency of the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bayesncl"

# what each room may import (besides itself): rooms, or single modules by their full name; the root
# package (the public API) may import anything
ALLOWED = {
    "config": {"core", "data"},  # the registries of allowed values
    "data": {"bayesncl.core.seeding"},  # the seed mixer (pure, no torch): of the core, nothing else
    "core": set(),  # the research code: nothing outside the core
    "metrics": {"core", "data", "config"},
    "runs": {"core", "data", "metrics", "config"},
    "app": {"core", "data", "metrics", "runs", "config"},
    "paper": {"core", "data", "metrics", "runs", "config", "app"},  # the papers' tables use the commands
}
# the one module of a room allowed a room above it: the CLI's command table names reproduce, demo, benchmark
EXCEPTIONS = {"bayesncl.app.cli": {"paper"}}
# the method, which a researcher reads on its own: it never reaches the paper's tables or the CLI
LIBRARY = ("config", "core", "data", "metrics", "runs")


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The bayesncl modules ``module`` imports, resolved to module names (``from a import b`` counts b
    when b is a module)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
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
    """The room of a module (``core``, ``config``, ...); None for the root package and ``__main__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def test_rooms_import_only_the_rooms_below_them():
    breaches = [
        f"{mod} imports {dep}"
        for mod, deps in import_graph().items()
        for dep in deps
        if _room(mod) and _room(dep) and _room(dep) != _room(mod)
        and not {_room(dep), dep} & (ALLOWED[_room(mod)] | EXCEPTIONS.get(mod, set()))
    ]
    assert not breaches, "layering breaches:\n" + "\n".join(sorted(breaches))


def test_the_core_imports_nothing_outside_the_core():
    """``bayesncl.core`` imports no other module of ours, at top level, inside a function or under
    ``if TYPE_CHECKING:`` (core.distributed imported data.augment's mix_seed, now core.seeding's)."""
    lazy = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bayesncl.config\n" \
           "def f():\n    from bayesncl.data.augment import mix_seed\n    from . import parts\n"
    assert _imports(ast.parse(lazy), "bayesncl.core.x", False) == {
        "bayesncl.config", "bayesncl.data.augment", "bayesncl.core.parts"
    }  # what the checks below read: every import, resolved, the lazy ones too
    graph = import_graph()
    core = [m for m in graph if _room(m) == "core"]
    assert len(core) > 20 and "bayesncl.core.distributed" in core and "bayesncl.core.seeding" in core
    outside = {m: sorted(d for d in graph[m] if _room(d) != "core") for m in core}
    assert {m: d for m, d in outside.items() if d} == {}
    assert "bayesncl.core.seeding" in graph["bayesncl.core.distributed"]
    assert "bayesncl.core.seeding" in graph["bayesncl.data.augment"]  # the data's seeds: the same function


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_library_never_reaches_the_paper_package_or_the_cli():
    graph = import_graph()
    library = [m for m in graph if _room(m) in LIBRARY]
    assert len(library) > 20 and "bayesncl.config" in library and "bayesncl.paper.reproduce" in graph
    breaches = [
        f"{mod} reaches {dep}"
        for mod in library
        for dep in sorted(_reach(graph, mod))
        if _room(dep) in ("paper", "app") or dep == "bayesncl"
    ]
    assert not breaches, "the fence is breached:\n" + "\n".join(breaches)


def test_only_the_cli_imports_the_paper_package():
    importers = {
        mod for mod, deps in import_graph().items()
        if _room(mod) != "paper" and any(_room(d) == "paper" for d in deps)
    }
    assert importers == {"bayesncl.app.cli"}
    assert not [m for m, deps in import_graph().items() if _room(m) == "paper" and "bayesncl.app.cli" in deps]


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


def _as_run(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph as Python runs the imports: importing ``a.b.c`` from outside ``a.b`` first runs the
    package ``a.b``'s ``__init__`` (an edge to it), and an ``__init__`` that imports its own submodules
    runs them (those edges stay). A submodule importing a sibling does not rerun its own package. The
    root package ``bayesncl`` (the public API, lazy) is left out: no room may import it at all
    (:func:`test_no_room_imports_the_public_api_package`)."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out[mod] = set(deps)
        for dep in deps:
            parts = dep.split(".")
            for i in range(2, len(parts)):
                package = ".".join(parts[:i])
                if package in graph and not mod.startswith(package + "."):
                    out[mod].add(package)
    return out


def test_no_import_cycles():
    """No cycle among the package's modules, counting every import: at top level, inside functions and
    under ``if TYPE_CHECKING:``, and a package's ``__init__`` with the submodules it imports (issue 45:
    core.model imported core.methods, whose spec imported core.model back for ModelOutput)."""
    cycles = _cycles(_as_run(import_graph()))
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_core_modules_import_no_cycle_and_the_methods_sit_below_the_model():
    """Every module of ``bayesncl.core`` (ast, every import as in :func:`test_no_import_cycles`): no
    cycle among them, and nothing of ``core.methods`` reaches the model or the head, which import it
    (a method is data the model reads: ModelOutput lives with the method spec)."""
    graph = _as_run(import_graph())
    core = {m: {d for d in deps if d.startswith("bayesncl.core.")} for m, deps in graph.items()
            if m.startswith("bayesncl.core.")}
    assert len(core) > 20 and "bayesncl.core.methods.spec" in core and "bayesncl.core.head" in core
    assert _cycles(core) == []
    above = {"bayesncl.core.model", "bayesncl.core.head", "bayesncl.core.engine", "bayesncl.core.plugins"}
    methods = [m for m in core if m.split(".")[:3] == ["bayesncl", "core", "methods"]]
    breaches = {m: sorted(_reach(core, m) & above) for m in methods if _reach(core, m) & above}
    assert not breaches, breaches
    assert "bayesncl.core.methods" in _reach(core, "bayesncl.core.model")  # the model reads the methods


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    # a package whose __init__ imports a submodule that imports, lazily, a module importing the package
    graph = {"r.p": {"r.p.spec"}, "r.p.spec": {"r.m"}, "r.m": {"r.p"}, "r.p.other": {"r.p.spec"}}
    assert _cycles(_as_run(graph)) == [["r.m", "r.p", "r.p.spec"]]
    assert _as_run(graph)["r.p.other"] == {"r.p.spec"}  # a sibling's import does not rerun its package
    assert _as_run({"r.x": {"r.p.spec"}, "r.p": set(), "r.p.spec": set()})["r.x"] == {"r.p", "r.p.spec"}
