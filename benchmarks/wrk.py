"""wrk as the load generator: the POST body script, one run, and parsing of its text report.

wrk (C, one event loop per thread) is used rather than locust because on a 2-core machine a Python
load generator takes much of the CPU it is trying to measure. The body of every request is the
same file, prepared beforehand in the format the server needs (raw image bytes or multipart), so
the Lua side only reads it once and sets method, body and content type.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}
_DURATION = re.compile(r"([\d.]+)(us|ms|s|m)\b")
_PERCENTILE = re.compile(r"^\s*([\d.]+)%\s+([\d.]+(?:us|ms|s|m))\s*$", re.M)
_REQUESTS = re.compile(r"^\s*(\d+) requests in ", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s*(\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_RPS = re.compile(r"^Requests/sec:\s*([\d.]+)", re.M)


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: requests served, rate, latency percentiles (ms) and failures (non-2xx or 3xx
    answers and socket errors)."""

    requests: int
    rps: float
    percentiles_ms: dict[float, float]
    errors: int


def to_ms(text: str) -> float:
    """A wrk duration ("812.00us", "1.96ms", "2.01s", "1.00m") in milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def parse(output: str) -> WrkResult:
    """Parse the report `wrk --latency` prints; raises ValueError when it holds no results."""
    requests = _REQUESTS.search(output)
    rps = _RPS.search(output)
    if requests is None or rps is None:
        raise ValueError(f"no results in wrk output:\n{output}")
    percentiles = {float(p): to_ms(v) for p, v in _PERCENTILE.findall(output)}
    if 50.0 not in percentiles:
        raise ValueError(f"wrk output has no latency distribution (run with --latency):\n{output}")
    non_2xx = _NON_2XX.search(output)
    sockets = _SOCKET.search(output)
    errors = (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, sockets.groups())) if sockets else 0)
    return WrkResult(int(requests.group(1)), float(rps.group(1)), percentiles, errors)


def lua_script(body_file: Path, content_type: str) -> str:
    """A wrk script that POSTs the bytes of `body_file` with `content_type` on every request."""
    return (
        f'local f = assert(io.open("{body_file}", "rb"))\n'
        'wrk.body = f:read("*a")\n'
        "f:close()\n"
        'wrk.method = "POST"\n'
        f'wrk.headers["Content-Type"] = "{content_type}"\n'
    )


def lua_rotating(path: str, bodies: list[str], content_type: str = "application/json") -> str:
    """A wrk script that POSTs each of `bodies` to `path` in turn (the fill-mask profile's sentences)."""
    quoted = ",\n".join(f"[==[{body}]==]" for body in bodies)
    return (
        f"local bodies = {{\n{quoted}\n}}\n"
        "local i = 0\n"
        'wrk.method = "POST"\n'
        f'wrk.headers["Content-Type"] = "{content_type}"\n'
        "request = function()\n"
        "  i = i % #bodies + 1\n"
        f'  return wrk.format(nil, "{path}", nil, bodies[i])\n'
        "end\n"
    )


def run(url: str, script: Path, connections: int, duration_s: float, timeout_s: float = 10.0) -> WrkResult:
    """One wrk run with a single thread (one load-generator core) and `connections` clients."""
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s", f"--timeout={timeout_s:g}s", "--latency"]
    cmd += ["-s", str(script), url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 30)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse(done.stdout)
