"""The layer arrows point down only (docs/architecture.md#the-layer-rules).

Rust: `src/engine` and `src/store` (and the leaf modules below them) never use pyo3; `src/store`
never uses `crate::engine`. Python: nothing under `tenxgraph.storage` reaches the run (the graph,
the run loop's host side), directly or through another module; the testing kit's `race` does not
import `crash`. Each check is a function of the source root so it can be pointed at any tree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Rust code that must stay free of Python types.
NO_PYO3 = ["src/engine", "src/store", "src/metrics.rs", "src/failpoints.rs"]
# Rust code below the engine.
NO_ENGINE = ["src/store", "src/metrics.rs", "src/failpoints.rs"]
PYO3_USE = re.compile(r"\bpyo3\b|#\[py(class|function|methods|module)\b")
ENGINE_USE = re.compile(r"\bcrate::engine\b|\bsuper::(super::)*engine\b|\btenxgraph::engine\b")

# The run: what a checkpointer must not import, however indirectly.
RUN_MODULES = ("tenxgraph._runtime", "tenxgraph._tool_step", "tenxgraph._stream", "tenxgraph._live_states",
               "tenxgraph._bridge", "tenxgraph.core.graph")


def _rust_files(root: Path, entries: list[str]) -> list[Path]:
    out: list[Path] = []
    for e in entries:
        p = root / e
        out.extend(sorted(p.rglob("*.rs")) if p.is_dir() else [p] if p.exists() else [])
    return out


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Lines with `//` comments cut (doc comments may name pyo3 or the engine to explain why not)."""
    return [(n, line.split("//", 1)[0]) for n, line in enumerate(path.read_text().splitlines(), 1)]


def rust_violations(root: Path) -> list[str]:
    bad = []
    for f in _rust_files(root, NO_PYO3):
        bad += [f"{f.relative_to(root)}:{n}: uses pyo3" for n, code in _code_lines(f) if PYO3_USE.search(code)]
    for f in _rust_files(root, NO_ENGINE):
        bad += [f"{f.relative_to(root)}:{n}: uses the engine" for n, code in _code_lines(f) if ENGINE_USE.search(code)]
    return bad


def _module_name(pkg_root: Path, path: Path) -> str:
    parts = list(path.relative_to(pkg_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(pkg_root: Path) -> dict[str, set[str]]:
    """module -> the tenxgraph modules it imports at run time (module level or inside functions;
    not under ``if TYPE_CHECKING:``)."""
    files = {_module_name(pkg_root, p): p for p in pkg_root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        edges: set[str] = set()
        stack: list[ast.AST] = [ast.parse(path.read_text())]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                stack.extend(node.orelse)
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    edges.add(sub if sub in files else target)
            stack.extend(ast.iter_child_nodes(node))
        graph[mod] = {e for e in edges if e in files}
    return graph


def reaches(graph: dict[str, set[str]], start: str, targets: tuple[str, ...]) -> list[str] | None:
    """An import path from ``start`` to a module in (or under) ``targets``, or None."""
    seen = {start}
    paths = [[start]]
    while paths:
        path = paths.pop(0)
        for nxt in sorted(graph.get(path[-1], ())):
            if any(nxt == t or nxt.startswith(t + ".") for t in targets):
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return None


def python_violations(root: Path) -> list[str]:
    graph = import_graph(root / "python")
    bad = []
    for mod in sorted(graph):
        if mod == "tenxgraph.storage" or mod.startswith("tenxgraph.storage."):
            path = reaches(graph, mod, RUN_MODULES)
            if path:
                bad.append(f"{mod} reaches the run: {' -> '.join(path)}")
    path = reaches(graph, "tenxgraph.testing.race", ("tenxgraph.testing.crash",))
    if path:
        bad.append(f"the testing kit's race imports crash: {' -> '.join(path)}")
    return bad


def test_the_checks_see_the_code() -> None:
    # A check that finds no files would pass on anything.
    assert len(_rust_files(ROOT, NO_PYO3)) >= 10 and len(_rust_files(ROOT, ["src/py"])) >= 3
    assert any(PYO3_USE.search(code) for f in _rust_files(ROOT, ["src/py"]) for _, code in _code_lines(f))
    graph = import_graph(ROOT / "python")
    assert reaches(graph, "tenxgraph.core.graph.compiled_graph", ("tenxgraph._runtime",)) is not None
    assert "tenxgraph.storage.checkpointer.base_checkpointer" in graph


def test_rust_layers_point_down() -> None:
    assert rust_violations(ROOT) == []


def test_python_layers_point_down() -> None:
    assert python_violations(ROOT) == []


def methods_defined_twice(source: str, name: str = "<source>") -> list[str]:
    """Methods a class (or functions a module) defines twice: the second silently replaces the
    first. Session 35 added a second `CompiledGraph._validate_input`, which dropped the first
    (authz and the input checks) without a word; only the full suite noticed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.ClassDef, ast.Module)):
            continue
        seen: dict[str, int] = {}
        for item in node.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            decorators = [ast.unparse(d) for d in item.decorator_list]
            if any("overload" in d or d.endswith((".setter", ".deleter")) for d in decorators):
                continue
            if item.name in seen:
                found.append(f"{name}: {getattr(node, 'name', '<module>')}.{item.name} at lines {seen[item.name]} "
                             f"and {item.lineno}")
            seen[item.name] = item.lineno
    return found


def test_no_class_defines_a_method_twice() -> None:
    assert methods_defined_twice("class A:\n    def f(self): ...\n    async def f(self): ...\n") != []
    files = sorted((ROOT / "python").rglob("*.py"))
    assert len(files) > 50
    assert [bad for f in files for bad in methods_defined_twice(f.read_text(), str(f.relative_to(ROOT)))] == []
