"""The benchmark programs are one package: each imports and answers `--help` as
`python -m benchmarks.NAME`, each is listed in docs/benchmarks.md, and no file of the repository
edits `sys.path`. Then the shared harness's parts: ports, a server's process tree started and
stopped, a dead server reported with its log, and the medians' call counts (never their times).
The benchmarks themselves are commands, not tests."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks import harness
from gmlp import server_process

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "benchmarks"
# Peer servers that run in their framework's own venv (benchmarks/peers/peers.py), not in this one.
FRAMEWORK_OF = {"benchmarks.peers.litserve_server": "litserve", "benchmarks.peers.bentoml_service": "bentoml"}
# locust loads the locustfile by path, with its own folder (not the repository) on sys.path.
SYS_PATH_ALLOWED = {"loadtests/locustfile.py"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = sorted(_module(p) for p in PACKAGE.rglob("*.py"))
PROGRAMS = sorted(_module(p) for p in PACKAGE.rglob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_the_package_was_read() -> None:
    # Guards the checks below against passing on an empty package.
    assert {"benchmarks.harness", "benchmarks.peers.run", "benchmarks.profile"} <= set(MODULES)
    assert {"benchmarks.peers.run", "benchmarks.soak", "benchmarks.gpu"} <= set(PROGRAMS)


@pytest.mark.parametrize("module", MODULES)
def test_every_module_imports(module: str) -> None:
    framework = FRAMEWORK_OF.get(module)
    if framework is not None and not _installed(framework):
        # Only its own framework may be missing here: anything else it needs must be importable.
        with pytest.raises(ModuleNotFoundError) as missing:
            importlib.import_module(module)
        assert missing.value.name == framework
        return
    imported = importlib.import_module(module)
    if module in PROGRAMS:
        assert callable(getattr(imported, "main", None)), f"{module} runs as a program but has no main()"


def _help(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def test_every_program_answers_help() -> None:
    """`python -m benchmarks.NAME --help` exits 0 with a usage line and the program's docstring,
    from the repository root as the docs run them (two at a time: each imports torch or ORT)."""
    runnable = [m for m in PROGRAMS if FRAMEWORK_OF.get(m) is None or _installed(FRAMEWORK_OF[m])]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(runnable, pool.map(_help, runnable), strict=True))
    broken = {
        m: r.stderr[-2000:] for m, r in results.items() if r.returncode != 0 or "usage:" not in r.stdout
    }
    assert not broken, broken
    for module, result in results.items():
        first_line = (importlib.import_module(module).__doc__ or "").strip().splitlines()[0]
        assert " ".join(first_line.split()[:6]) in " ".join(result.stdout.split()), module


def test_every_program_is_listed_with_its_command() -> None:
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    # The peer servers are started by the peer benchmark, not by hand.
    by_hand = [m for m in PROGRAMS if not m.startswith("benchmarks.peers.") or m.endswith(".run")]
    missing = [m for m in by_hand if f"python -m {m}" not in doc]
    assert not missing, f"docs/benchmarks.md gives no command for {missing}"


def _edits_sys_path(tree: ast.AST) -> bool:
    """Whether the module's code uses `sys.path` (attribute access or `from sys import path`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "sys"
            and "path" in {a.name for a in node.names}
        ):
            return True
    return False


def test_no_file_edits_sys_path() -> None:
    """Imports resolve through the installed packages (and the checkout's root for benchmarks/), never
    a path a module puts together itself. Any use of `sys.path` counts: reading it is the first step
    of editing it, and nothing here needs to read it."""
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in ("build", "__pycache__")]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    assert len(files) > 100 and ROOT / "benchmarks" / "harness.py" in files
    offenders = [
        str(p.relative_to(ROOT))
        for p in files
        if str(p.relative_to(ROOT)) not in SYS_PATH_ALLOWED and _edits_sys_path(ast.parse(p.read_bytes()))
    ]
    assert not offenders, f"sys.path used in {offenders}"
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, 'x')"))
    assert _edits_sys_path(ast.parse("from sys import path"))


# -- the harness -------------------------------------------------------------------------------------


def test_free_port_can_be_bound() -> None:
    import socket

    port = server_process.free_port()
    with socket.socket() as sock:
        sock.bind((server_process.HOST, port))


# A server with a helper process: an HTTP server on the port given, and a child that only sleeps.
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(f"helper {helper.pid}", flush=True)
    handler = http.server.SimpleHTTPRequestHandler
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), handler).serve_forever()
    """
)


def test_server_process_is_ready_when_the_probe_answers_and_stops_its_whole_tree(tmp_path: Path) -> None:
    port = server_process.free_port()
    server = server_process.ServerProcess(
        [sys.executable, "-c", SERVER, str(port)], port=port, log_path=tmp_path / "server.log", cwd=tmp_path
    )
    (tmp_path / "hello.txt").write_text("hello")
    server.start()
    try:
        body = server.wait_ready(lambda: server_process.http_get(f"{server.url}/hello.txt"), timeout_s=60)
        assert body == b"hello"
        helper = int(server.log_tail().split()[1])
        assert server_process.tree_pids(server.pid) == {server.pid, helper}
    finally:
        server.stop(grace_s=10)
    assert server.proc is not None and server.proc.returncode is not None
    assert not server_process.alive(helper)


def test_a_server_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    port = server_process.free_port()
    code = "import sys; print('cannot load the models', flush=True); sys.exit(3)"
    server = server_process.ServerProcess(
        [sys.executable, "-c", code], port=port, log_path=tmp_path / "s.log"
    )
    dead = r"exited with 3 before it was ready[\s\S]*cannot load the models"
    with pytest.raises(RuntimeError, match=dead), server:
        pass
    server.stop()  # a stopped, reaped server is left alone


def test_gmlp_serve_serves_exactly_the_repository_over_http_only(tmp_path: Path) -> None:
    server = server_process.gmlp_serve(
        tmp_path / "models", log_path=tmp_path / "s.log", serve_args=["--instances", "1"]
    )
    argv = server.argv
    assert argv[:4] == [sys.executable, "-m", "gmlp", "serve"]
    assert argv[argv.index("--port") + 1] == str(server.port)
    assert argv[argv.index("--model-repository") + 1] == str(tmp_path / "models")
    assert argv[argv.index("--checkpoint-dir") + 1] == "" and argv[argv.index("--grpc-port") + 1] == "0"
    assert argv[-2:] == ["--instances", "1"] and server.url == f"http://127.0.0.1:{server.port}"


def test_link_repository_holds_only_the_model(tmp_path: Path) -> None:
    model = tmp_path / "elsewhere" / "m"
    model.mkdir(parents=True)
    (tmp_path / "elsewhere" / "other").mkdir()
    (tmp_path / "work").mkdir()
    repository = server_process.link_repository(tmp_path / "work", model)
    assert [p.name for p in repository.iterdir()] == ["m"]
    assert (repository / "m").resolve() == model.resolve()


def test_median_seconds_warms_up_and_times_at_least_three_calls() -> None:
    calls = []
    median = harness.median_seconds(lambda: calls.append(1), 0.0, warmups=2)
    assert len(calls) == 2 + 3 and median >= 0  # 0 seconds: the three calls timed at least


def test_cpu_line_names_the_machine() -> None:
    facts = harness.cpu_facts()
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    line = harness.cpu_line({**facts, "cpu": "Test CPU", "cpus": "2", "hypervisor": "KVM", "simd": "avx2"})
    assert line == f"CPU: Test CPU, 2 vCPUs, KVM guest; SIMD: avx2; Python {facts['python']}"
    assert "SIMD: none of avx" in harness.cpu_line({**facts, "simd": ""})
    if os.path.exists("/proc/cpuinfo"):
        assert facts["cpu"] != "?" and set(facts["simd"].split()) <= set(facts["flags"].split())
