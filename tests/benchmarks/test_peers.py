"""The peer benchmark's pure parts: wrk report parsing, /proc CPU of a process tree, request bodies
and report rendering. No peer framework is installed or started here; the benchmark is a command
(benchmarks/peers/run.py), not a test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import wrk
from benchmarks.harness import replace_section
from benchmarks.peers import run as report
from benchmarks.peers.peers import (
    PEERS,
    SHARED_PINS,
    gmlp_also,
    gmlp_argv,
    install_spec,
    product_pins,
    request_body,
    top_label,
)
from gmlp import server_process as proc

WRK_OUTPUT = """\
Running 10s test @ http://127.0.0.1:8000/classify
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    61.21ms   12.03ms 201.10ms   81.52%
    Req/Sec   522.31     40.12   610.00     70.00%
  Latency Distribution
     50%   59.87ms
     75%   66.02ms
     90%  750.00us
     99%    1.20s
  5219 requests in 10.01s, 2.01MB read
  Non-2xx or 3xx responses: 3
  Socket errors: connect 0, read 1, write 0, timeout 2
Requests/sec:    521.38
Transfer/sec:    205.51KB
"""


def test_wrk_report_is_parsed_with_units():
    result = wrk.parse(WRK_OUTPUT)
    assert result.requests == 5219
    assert result.rps == pytest.approx(521.38)
    assert result.percentiles_ms[50.0] == pytest.approx(59.87)
    assert result.percentiles_ms[90.0] == pytest.approx(0.75)
    assert result.percentiles_ms[99.0] == pytest.approx(1200.0)
    assert result.errors == 3 + 3  # non-2xx answers and socket errors


def test_wrk_report_without_failures_or_latency():
    clean = "\n".join(
        line for line in WRK_OUTPUT.splitlines() if "Non-2xx" not in line and "Socket" not in line
    )
    assert wrk.parse(clean).errors == 0
    with pytest.raises(ValueError, match="latency distribution"):
        wrk.parse(clean.replace("     50%   59.87ms\n", ""))
    with pytest.raises(ValueError, match="no results"):
        wrk.parse("unable to connect to 127.0.0.1:1 Connection refused")


def test_wrk_durations():
    assert wrk.to_ms("812.00us") == pytest.approx(0.812)
    assert wrk.to_ms("2.00m") == pytest.approx(120_000.0)
    with pytest.raises(ValueError, match="not a wrk duration"):
        wrk.to_ms("12 ms")


def test_lua_script_posts_the_body_file(tmp_path: Path):
    script = wrk.lua_script(tmp_path / "x.body", "image/jpeg")
    assert f'io.open("{tmp_path / "x.body"}", "rb")' in script
    assert 'wrk.method = "POST"' in script and '"Content-Type"] = "image/jpeg"' in script


CHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time\\nt=time.process_time()\\n"
    "while time.process_time() - t < 0.4: pass\\ntime.sleep(30)"])
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
print("busy done", flush=True)
time.sleep(30)
"""


def test_tree_cpu_counts_children_and_grandchildren():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "busy done"
        deadline = time.monotonic() + 20
        while len(proc.tree_pids(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = proc.tree_pids(child.pid)
        assert child.pid in pids and len(pids) == 2
        cpu = proc.tree_cpu_seconds(child.pid)
        while cpu < 0.7 and time.monotonic() < deadline:  # the grandchild may still be spinning
            time.sleep(0.1)
            cpu = proc.tree_cpu_seconds(child.pid)
        # 0.3 s (child) + 0.4 s (grandchild) of CPU, plus interpreter start-up, to a clock tick.
        assert 0.7 - 0.02 <= cpu < 5.0
    finally:
        for pid in proc.tree_pids(child.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait(timeout=10)


def test_machine_busy_counts_this_process_spinning():
    before, start = proc.machine_busy_seconds(), time.process_time()
    while time.process_time() - start < 0.2:
        pass
    assert proc.machine_busy_seconds() - before >= 0.15


def test_multipart_body_parses_as_a_form_with_the_image():
    from starlette.requests import Request

    body, content_type = request_body(b"\xff\xd8jpeg bytes\xff\xd9", "multipart")

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def parse() -> bytes:
        scope = {"type": "http", "method": "POST", "path": "/", "query_string": b""}
        scope["headers"] = [(b"content-type", content_type.encode())]
        form = await Request(scope, receive).form()
        return await form["file"].read()

    assert asyncio.run(parse()) == b"\xff\xd8jpeg bytes\xff\xd9"
    assert request_body(b"abc", "raw") == (b"abc", "image/jpeg")
    with pytest.raises(ValueError, match="unknown body kind"):
        request_body(b"abc", "json")


def test_top_label_of_plain_and_wrapped_answers():
    answer = {"model": "m", "predictions": [{"label": "cat", "score": 0.9}]}
    assert top_label(answer) == top_label([answer]) == "cat"


def test_peer_venvs_pin_the_product_packages():
    pins = product_pins(SHARED_PINS)
    assert [p.split("==")[0].lower() for p in pins] == list(SHARED_PINS)
    for peer in PEERS:
        if peer.venv is None:
            continue
        spec = install_spec(peer)
        assert spec[-2:][0] == "-e" and all("==" in p for p in spec[:-2]), spec


def _results() -> dict:
    rows = []
    figures = {"gmlp-serve": (5.0, 400.0, 3.0), "litserve": (6.0, 300.0, 4.0)}
    for rnd, jitter in enumerate((0.9, 1.0, 1.2)):
        for peer, (p50, rps, cpu) in figures.items():
            for c in (1, 8, 32, 64):
                rows.append(
                    {
                        "peer": peer,
                        "round": rnd,
                        "concurrency": c,
                        "rps": rps * jitter * (1 if c > 1 else 0.3),
                        "p50_ms": p50 * jitter * c,
                        "p99_ms": float("nan"),
                        "cpu_ms_per_request": cpu * jitter,
                        "requests": 1000,
                        "errors": 0,
                    }
                )
    raw = {"requests_per_s": 600.0, "cpu_ms_per_request": 2.0}
    return {
        "rows": rows,
        "bare": [{"round": 0, "requests_per_s": 500.0, "cpu_ms_per_request": 2.5, "raw": raw}],
    }


LABELS = {"gmlp-serve": "gmlp-serve", "litserve": "LitServe"}


def test_table_holds_medians_and_ranges():
    text = report.table(_results(), LABELS)
    lines = text.splitlines()
    assert lines[0].startswith("| server | c=1 p50 ms | c=8 req/s | c=32 req/s | c=64 req/s |")
    assert lines[0].endswith("| background CPU % (c=32) |") and lines[1].count("|") == 8
    cells = "5.0 (4.5-6.0) | 400 (360-480) | 400 (360-480) | 400 (360-480) | 3.00 (2.70-3.60) | -"
    assert lines[2] == f"| gmlp-serve | {cells} |"
    assert lines[3].startswith("| LitServe | 6.0 (5.4-7.2) | 300 (270-360) |")
    assert "600 images/s" in lines[4] and "2.00 per image" in lines[4]


def test_ratios_against_the_best_peer_and_raw_ort():
    lines = report.ratios(_results(), LABELS)
    assert lines[0] == "c=1 p50: 0.83x the lowest peer's (LitServe)"
    assert "c=32 req/s: 1.33x the best peer's (LitServe)" in lines
    assert "c=32 server CPU per request: 0.75x the most frugal peer's (LitServe)" in lines
    assert "c=32 req/s: 0.67x raw session.run images/s" in lines
    assert "c=32 server CPU per request: 1.50x raw ORT CPU per image" in lines


def test_bare_pipeline_row_and_ratios():
    """The bare pipeline's rounds become a table row and served/bare ratios (medians over rounds)."""
    results = _results()
    raw = {"requests_per_s": 600.0, "cpu_ms_per_request": 2.0}
    results["bare"] = [
        {"round": r, "requests_per_s": rps, "cpu_ms_per_request": cpu, "raw": raw}
        for r, (rps, cpu) in enumerate(((500.0, 2.4), (480.0, 2.5), (520.0, 2.6)))
    ]
    bare_row = report.table(results, LABELS).splitlines()[-1]
    assert bare_row.startswith("| bare pipeline")
    assert "500 (480-520) images/s" in bare_row and "2.50 (2.40-2.60) per image" in bare_row
    lines = report.ratios(results, LABELS)
    assert "c=32 req/s: 0.80x the bare pipeline's images/s" in lines
    assert "c=32 server CPU per request: 1.20x the bare pipeline's CPU per image" in lines
    assert "c=32 req/s: 0.67x raw session.run images/s" in lines


def test_section_is_replaced_between_markers_and_appended_once():
    doc = "# Benchmarks\n\nintro\n"
    markers = (report.BEGIN, report.END, report.HEADING)
    once = replace_section(doc, "first", *markers)
    assert once.count(report.HEADING) == 1 and "first" in once
    twice = replace_section(once + "\n## Later section\n", "second", *markers)
    assert "first" not in twice and "second" in twice and twice.count(report.HEADING) == 1
    assert twice.rstrip().endswith("## Later section")


def test_section_states_conditions_command_and_figures():
    from benchmarks.peers.run import section

    results = _results()
    results["meta"] = {
        "date": "2026-01-01",
        "machine": {"cpu": "Test CPU", "cpus": "2", "hypervisor": "none", "simd": "avx2", "python": "3.11"},
        "rounds": 3,
        "levels": [1, 8, 32, 64],
        "duration_s": 10.0,
        "peers": ["gmlp-serve", "litserve"],
        "minutes": 20.0,
    }
    results["failed"] = {"litserve": "RuntimeError: boom"}
    text = section(results)
    assert "Test CPU" in text and "SIMD: avx2" in text and "c = 1, 8, 32, 64" in text
    assert "| LitServe 0.2.19 | 6.0 (5.4-7.2) |" in text
    assert "c=32 req/s: 1.33x the best peer's (LitServe 0.2.19)" in text
    assert "- litserve: not measured (RuntimeError: boom)" in text


def test_fill_mask_script_sends_every_sentence_as_json():
    from benchmarks.bare_pipeline import sentences

    texts = sentences()
    assert len(texts) == 200 and all("[MASK]" in t for t in texts)
    script = wrk.lua_rotating("/fill-mask", [json.dumps({"text": t, "top_k": 5}) for t in texts[:3]])
    assert script.count("[==[") == 3 and '"/fill-mask"' in script
    for text in texts[:3]:
        assert json.dumps({"text": text, "top_k": 5}) in script


def test_a_further_gmlp_serve_row_runs_the_layout_with_its_own_flags_last(tmp_path: Path):
    """`--gmlp-also NAME=FLAGS`: the peers' layout, then the row's flags (the later of a flag given
    twice is what argparse keeps); names that could not be a row key are refused."""
    row = gmlp_also("ov", "--backend openvino --variant fp32")
    base = gmlp_argv(tmp_path, [8123], tmp_path)
    argv = row.argv(tmp_path, [8123], tmp_path)
    assert argv == [*base, "--backend", "openvino", "--variant", "fp32"]
    assert "--variant" in base  # so that the row's own variant is the one given again
    assert (row.key, row.label, row.venv, row.body) == (
        "gmlp-serve-ov",
        "gmlp-serve (--backend openvino --variant fp32)",
        None,
        "raw",
    )
    for bad in ("", "OV", "a b", "x" * 32, "-x"):
        with pytest.raises(ValueError, match="row name"):
            gmlp_also(bad, "--lone-threads 0")


def test_a_further_gmlp_serve_row_is_in_the_table_and_not_among_the_peers():
    from benchmarks.peers.run import section

    results = _results()
    results["rows"] += [
        dict(row, peer="gmlp-serve-ov", rps=row["rps"] * 2)
        for row in results["rows"]
        if row["peer"] == "gmlp-serve"
    ]
    results["meta"] = {
        "date": "2026-01-01",
        "machine": {"cpu": "Test CPU", "cpus": "2", "simd": "avx2", "python": "3.11"},
        "rounds": 3,
        "levels": [1, 8, 32, 64],
        "duration_s": 10.0,
        "peers": ["gmlp-serve", "litserve", "gmlp-serve-ov"],
        "also": {"ov": "--backend openvino"},
        "minutes": 20.0,
    }
    text = section(results)
    assert "| gmlp-serve (--backend openvino) | 5.0 (4.5-6.0) | 800 (720-960) |" in text
    # Twice gmlp-serve's throughput, yet the best peer is still LitServe.
    assert "c=32 req/s: 1.33x the best peer's (LitServe 0.2.19)" in text
