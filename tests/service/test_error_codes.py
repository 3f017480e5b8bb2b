"""The closed list of error codes (`contract.errors.ErrorCode`), checked on the source and the docs:
every error is raised with a code of its own type, no code is written as a string, every code is
raised somewhere, and docs/service.md's table is the list, with each code's status per transport
as the transports' tables give it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import grpc
import pytest

import contract.errors
from contract.errors import ErrorCode, RequestError, most_specific
from service.http.errors import REST_ERRORS, ErrorTable
from service.http.hf import HF_ERRORS
from service.v2.grpc_server import GRPC_STATUS
from service.v2.rest import V2_ERRORS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("contract", "model", "export", "service", "loadtests", "gmlp", "benchmarks")
LIST = ROOT / "contract" / "errors.py"
DOCS = ROOT / "docs" / "service.md"
ERROR_TYPES = {
    name: cls
    for name, cls in vars(contract.errors).items()
    if inspect.isclass(cls) and issubclass(cls, RequestError)
}
# Modules of the HTTP transport (and v2 REST, built on it): a code only they raise never reaches gRPC,
# nor one raised in functions that only they call (by name, at any depth: a name that something
# else calls too counts as reaching gRPC).
HTTP_ONLY = ("service/http/", "service/v2/rest.py", "service/v2/schemas.py")
HEADER = "| code | type | REST tasks | Hugging Face | v2 REST | v2 gRPC | meaning |"


def _sources() -> dict[Path, ast.Module]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return {p: ast.parse(p.read_text(), filename=str(p)) for p in files}


SOURCES = _sources()


def _code_of(node: ast.expr) -> ErrorCode | None:
    """The member an expression names as `ErrorCode.NAME`, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorCode":
        return ErrorCode[node.attr]
    return None


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"


def test_the_list_is_closed_and_every_code_has_a_type_and_a_meaning() -> None:
    assert len({code.value for code in ErrorCode}) == len(ErrorCode) > 30
    for code in ErrorCode:
        assert code.error in ERROR_TYPES.values() and code.meaning, code
        assert code.value == code.name.lower()


def test_every_error_is_constructed_with_a_code_of_its_own_type() -> None:
    wrong = []
    for path, tree in SOURCES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            cls = ERROR_TYPES.get(node.func.id)
            if cls is None:
                continue
            code = _code_of(node.args[0]) if node.args else None
            if code is None or code.error is not cls:
                wrong.append(f"{_where(path, node)}: {cls.__name__}({ast.unparse(node.args[0])}, ...)")
    assert not wrong, f"construct each error with an ErrorCode member of its type: {wrong}"


def test_a_code_of_the_wrong_type_or_outside_the_list_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="not a code of that type"):
        contract.errors.InvalidInput(ErrorCode.OVERLOADED, "a queue is not an input")
    with pytest.raises(TypeError, match="not a code of that type"):
        contract.errors.InvalidInput("invalid_image", "a string is not a code")  # type: ignore[arg-type]


def test_no_code_is_written_as_a_string() -> None:
    """Outside the list a code is always `ErrorCode.NAME` (names in `__all__` aside)."""
    values = {code.value for code in ErrorCode}
    found = []
    for path, tree in SOURCES.items():
        if path == LIST:
            continue
        exported = {
            id(element)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            for element in ast.walk(node.value)
        }
        found += [
            f"{_where(path, node)}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in values and id(node) not in exported
        ]
    assert not found, f"write these as ErrorCode members: {found}"


def _functions(tree: ast.Module) -> dict[int, str]:
    """For each node of `tree` inside a function, the innermost function's name."""
    inside: dict[int, str] = {}
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for function in functions:  # outer functions come first in the walk; inner ones overwrite
        for node in ast.walk(function):
            inside[id(node)] = function.name
    return inside


def _users() -> tuple[dict[ErrorCode, set[tuple[str, str | None]]], dict[str, set[tuple[str, str | None]]]]:
    """For each code, the files that name it with the function naming it (None: module level); for
    each function name, the files and functions that call a function of that name."""
    users: dict[ErrorCode, set[tuple[str, str | None]]] = {code: set() for code in ErrorCode}
    calls: dict[str, set[tuple[str, str | None]]] = {}
    for path, tree in SOURCES.items():
        if path == LIST:
            continue
        name, inside = str(path.relative_to(ROOT)), _functions(tree)
        for node in ast.walk(tree):
            code = _code_of(node) if isinstance(node, ast.Attribute) else None
            if code is not None:
                users[code].add((name, inside.get(id(node))))
            if isinstance(node, ast.Call):
                called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if called is not None:
                    calls.setdefault(called, set()).add((name, inside.get(id(node))))
    return users, calls


USERS, CALLS = _users()


def test_every_code_is_raised_somewhere() -> None:
    unused = sorted(code.value for code, files in USERS.items() if not files)
    assert not unused, f"codes nothing raises (remove them from the list): {unused}"


def _http_status(table: ErrorTable, code: ErrorCode) -> str:
    # The base type stands for the HTTP framework's own refusals, answered with their own status.
    return "its own" if code.error is RequestError else str(table.status(code.error))


def _http_only(file: str, function: str | None, seen: frozenset[str] = frozenset()) -> bool:
    """Whether code in `function` of `file` runs only for HTTP requests."""
    if file.startswith(HTTP_ONLY):
        return True
    if function is None or function in seen or not CALLS.get(function):
        return False
    return all(_http_only(f, caller, seen | {function}) for f, caller in CALLS[function])


def _row(code: ErrorCode) -> str:
    http_only = all(_http_only(file, function) for file, function in USERS[code])
    grpc_status = (
        "—" if http_only else f"`{most_specific(GRPC_STATUS, code.error, grpc.StatusCode.INTERNAL).name}`"
    )
    statuses = [_http_status(table, code) for table in (REST_ERRORS, HF_ERRORS, V2_ERRORS)]
    cells = [f"`{code.value}`", f"`{code.error.__name__}`", *statuses, grpc_status, code.meaning]
    return f"| {' | '.join(cells)} |"


def _documented_rows() -> list[str]:
    lines = DOCS.read_text().splitlines()
    assert HEADER in lines, f"docs/service.md has no table headed {HEADER}"
    start = lines.index(HEADER) + 2  # past the separator line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_documented_table_is_the_list() -> None:
    """docs/service.md's table of codes: one row per code, in the list's order, with the statuses
    the tables give (the message shows the table to paste when they differ)."""
    expected = [_row(code) for code in ErrorCode]
    documented = _documented_rows()
    codes = {row.split("`")[1] for row in documented}
    missing = sorted({code.value for code in ErrorCode} - codes)
    unknown = sorted(codes - {code.value for code in ErrorCode})
    table = "\n".join([HEADER, "|---|---|---|---|---|---|---|", *expected])
    assert not missing and not unknown, f"docs miss {missing}, list no {unknown}; the table is:\n{table}"
    assert documented == expected, f"docs/service.md's table differs from the list; it is:\n{table}"
