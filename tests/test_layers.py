"""The layering rule (docs/development.md), checked on the source: which package may import which,
which layer inside `service/` may import which (and which transport libraries), and no import
cycle between modules. Every import counts, including those inside functions, since a
function-local import is still a dependency (it only hides the cycle from the interpreter)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
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

# Inside `service/` the same rule, by wing. A module's wing is the first entry its name falls
# under (the name itself or below it); the composition root is named module by module, so that a
# new module at the top of `service/` has to be placed in a wing.
SERVICE_ROOT = (
    "service",
    "service.app",
    "service.cli",
    "service.descriptors",
    "service.healthcheck",
    "service.server",
)
SERVICE_LAYER_OF = (
    ("settings", "service.settings"),
    ("engine", "service.engine"),
    ("telemetry", "service.telemetry"),
    ("access", "service.access"),
    ("tasks", "service.tasks"),
    ("lifecycle", "service.lifecycle"),
    ("processes", "service.processes"),
    ("http", "service.http"),
    ("v2 rest", "service.v2.rest"),
    ("v2 rest", "service.v2.schemas"),
    ("v2 grpc", "service.v2.grpc_server"),
    ("v2 grpc", "service.v2.grpc_limits"),
    ("v2 grpc", "service.v2.proto"),
    ("v2 semantics", "service.v2"),  # inference, tensors: anything else of v2
)
# The wings each wing may import (besides itself). The engine runs rows through sessions and knows
# nothing else; telemetry observes the engine; access reports to telemetry; a task is a pipeline on
# the engine; the lifecycle loads tasks; the processes of a server of several run the lifecycle (the
# engine) or a copy of it (a front-end), the engine holding the keys' buckets. The transports may
# use every wing but not each other (the v2 REST routes sit on the HTTP plumbing), and nothing below
# the composition root imports it.
WINGS = {"settings", "engine", "telemetry", "access", "tasks", "lifecycle", "processes"}
SERVICE_ALLOWED = {
    "settings": set(),
    "engine": set(),
    "telemetry": {"settings", "engine"},
    "access": {"settings", "telemetry"},
    "tasks": {"settings", "engine", "telemetry"},
    "lifecycle": {"settings", "engine", "telemetry", "tasks"},
    "processes": {"settings", "engine", "telemetry", "access", "tasks", "lifecycle"},
    "http": WINGS,
    "v2 semantics": WINGS,
    "v2 rest": WINGS | {"http", "v2 semantics"},
    "v2 grpc": WINGS | {"v2 semantics"},
    "root": WINGS | {"http", "v2 semantics", "v2 rest", "v2 grpc"},
}
HTTP_LIBRARIES = {"fastapi", "starlette", "uvicorn"}
GRPC_LIBRARIES = {"grpc", "google"}  # grpcio, protobuf
# The transport libraries a layer must not import, whatever it imports them through.
SERVICE_FORBIDDEN = {
    **{wing: HTTP_LIBRARIES | GRPC_LIBRARIES for wing in WINGS},
    "v2 semantics": HTTP_LIBRARIES | GRPC_LIBRARIES,
    "http": GRPC_LIBRARIES,
    "v2 rest": GRPC_LIBRARIES,
    "v2 grpc": HTTP_LIBRARIES,
    "root": set(),
}
# A wing is a room, not a hallway: at most this many modules and about this many lines.
WING_MAX_MODULES = 8
WING_MAX_LINES = 1500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """Every module of ours that `path` imports, anywhere in the file, as absolute names.

    `from pkg import name` depends on the module `pkg.name` when there is one, else on `pkg`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        else:
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            for alias in node.names:
                found.add(f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in modules else stem)
    return {name for name in found if name in modules and name != module}


def _libraries(path: Path) -> set[str]:
    """The top-level names of everything `path` imports absolutely (ours and third-party)."""
    found: set[str] = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


FILES = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
GRAPH = {name: _imports(path, name, set(FILES)) for name, path in FILES.items()}


def test_the_graph_was_read() -> None:
    # Guards the checks below against passing on an empty graph.
    assert (
        "service.app" in GRAPH
        and "contract.spec" in GRAPH["service.tasks.pipeline"] | GRAPH["service.lifecycle.state"]
    )
    assert "model.checkpoint" in GRAPH["export.directory"]
    assert "service.lifecycle.state" in GRAPH["service.v2.grpc_server"]
    assert {"fastapi", "starlette"} <= _libraries(FILES["service.http.errors"])
    assert "grpc" in _libraries(FILES["service.v2.grpc_server"])


def _service_layer(module: str) -> str | None:
    if module in SERVICE_ROOT:
        return "root"
    for layer, name in SERVICE_LAYER_OF:
        if module == name or module.startswith(name + "."):
            return layer
    return None


SERVICE_MODULES = {module: _service_layer(module) for module in GRAPH if module.split(".")[0] == "service"}


def test_every_service_module_has_a_layer() -> None:
    unplaced = sorted(module for module, layer in SERVICE_MODULES.items() if layer is None)
    assert not unplaced, f"place these in a layer of SERVICE_LAYER_OF (or SERVICE_ROOT): {unplaced}"
    assert set(SERVICE_MODULES.values()) == set(SERVICE_ALLOWED), "every layer has modules"


def _wrong_imports(layer: str, wrong: Callable[[str], Iterable[str]]) -> list[str]:
    """`module -> name` for every module of the service `layer` and each name `wrong(module)` gives."""
    return sorted(
        f"{module} -> {name}"
        for module, own in SERVICE_MODULES.items()
        if own == layer
        for name in wrong(module)
    )


@pytest.mark.parametrize("layer", sorted(SERVICE_ALLOWED))
def test_service_layers_import_only_the_layers_below(layer: str) -> None:
    allowed = SERVICE_ALLOWED[layer] | {layer}
    wrong = _wrong_imports(
        layer, lambda module: (t for t in GRAPH[module] if SERVICE_MODULES.get(t, layer) not in allowed)
    )
    assert not wrong, f"service {layer} may import only {sorted(SERVICE_ALLOWED[layer])}: {wrong}"


@pytest.mark.parametrize("layer", sorted(SERVICE_FORBIDDEN))
def test_service_layers_import_no_other_transports_libraries(layer: str) -> None:
    wrong = _wrong_imports(layer, lambda module: _libraries(FILES[module]) & SERVICE_FORBIDDEN[layer])
    assert not wrong, f"service {layer} must not import {sorted(SERVICE_FORBIDDEN[layer])}: {wrong}"


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


@pytest.mark.parametrize("wing", sorted(WINGS - {"settings"}))
def test_wings_stay_small(wing: str) -> None:
    modules = [m for m, own in SERVICE_MODULES.items() if own == wing and FILES[m].name != "__init__.py"]
    lines = sum(len(FILES[m].read_text().splitlines()) for m in modules)
    assert modules, f"the {wing} wing has no module"
    assert len(modules) <= WING_MAX_MODULES, f"{wing}: {len(modules)} modules (at most {WING_MAX_MODULES})"
    assert lines <= WING_MAX_LINES, f"{wing}: {lines} lines (at most about {WING_MAX_LINES})"


def test_every_service_module_is_in_the_module_map_once() -> None:
    """docs/service.md's module map names each module of `service/` (as `wing/module.py`, or a
    bare file name on the line of its wing) exactly once, and names nothing that does not exist."""
    text = (ROOT / "docs" / "service.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    named: dict[str, int] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        for path in (part.strip("` ") for part in cell.split(",")):
            if path.endswith(".py") or path.endswith("/"):
                named[path] = named.get(path, 0) + 1
    modules = {
        str(FILES[m].relative_to(ROOT / "service"))
        for m in SERVICE_MODULES
        if FILES[m].name != "__init__.py" and not m.startswith("service.v2.proto")
    }
    missing = sorted(modules - set(named))
    extra = sorted(path for path in named if path.endswith(".py") and path not in modules)
    twice = sorted(path for path, count in named.items() if count > 1)
    assert not missing and not extra and not twice, f"missing {missing}, unknown {extra}, twice {twice}"
