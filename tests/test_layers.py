"""The layering rule (docs/development.md), checked on the source: which package may import which,
and no import cycle between modules. Every import counts, including those inside functions, since a
function-local import is still a dependency (it only hides the cycle from the interpreter)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "model", "export", "service", "loadtests", "gmlp", "benchmarks")
# Which of our packages each package may import (besides itself). Read bottom-up: `contract` is the
# served-model contract everyone shares; torch lives in `model` and `export`; `service` runs without
# them; `gmlp` (the CLI) sits on top of everything.
ALLOWED = {
    "contract": set(),
    "model": {"contract"},
    "export": {"contract", "model"},
    "service": {"contract"},
    "loadtests": {"contract"},
    "gmlp": {"contract", "model", "export", "service", "loadtests"},
    # The benchmark programs (not in the wheel) measure every layer; no product package imports them.
    "benchmarks": {"contract", "model", "export", "service", "loadtests", "gmlp"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """Every module of ours that `path` imports, anywhere in the file, as absolute names.

    `from pkg import name` depends on the module `pkg.name` when there is one, else on `pkg`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            for alias in node.names:
                found.add(f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem)
    return {name for name in found if name in modules and name != module}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    return {name: _imports(path, name, set(files)) for name, path in files.items()}


GRAPH = _graph()


def test_the_graph_was_read() -> None:
    # Guards the checks below against passing on an empty graph.
    assert "service.app" in GRAPH and "contract.spec" in GRAPH["service.pipelines"] | GRAPH["service.state"]
    assert "model.checkpoint" in GRAPH["export.directory"]


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_the_layers_below(package: str) -> None:
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package
        for target in targets
        if target.split(".")[0] not in ALLOWED[package] | {package}
    )
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}: {wrong}"


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No cycle in the module graph (Tarjan's strongly connected components, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in GRAPH:
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert not cycles, f"import cycles: {cycles}"
