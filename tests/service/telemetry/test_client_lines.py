"""Client-caused log lines are rate-limited: a real `gmlp serve` flooded with malformed requests
writes a bounded number of lines about them and counts the rest."""

from __future__ import annotations

import logging
import re
import socket
import time
import urllib.request
from pathlib import Path

from gmlp.server_process import gmlp_serve
from service.telemetry.logs import CLIENT_LINES_BURST, CLIENT_LINES_PER_S, ClientLines

SENT = 400


def malformed(port: int) -> None:
    """One request line no HTTP parser takes, on a connection of its own, read to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"NOT A REQUEST LINE\x01\r\n\r\n")
        while sock.recv(4096):
            pass


def test_a_flood_of_malformed_requests_writes_a_bounded_log(repository: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with gmlp_serve(repository, log_path=log, serve_args=["--grpc-port", "0"]) as server:
        start = time.monotonic()
        for _ in range(SENT):
            malformed(server.port)
        elapsed = time.monotonic() - start
        metrics = urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10).read().decode()
        written = server.log_tail(10_000_000).count("Invalid HTTP request received")
    (suppressed,) = re.findall(r"^gmlp_log_lines_suppressed_total (\S+)$", metrics, re.M)
    # What the bucket lets through over the flood's own duration (it is no timing assertion: the
    # slower the machine, the more may pass), and nothing more; the rest is counted, not lost.
    allowed = CLIENT_LINES_BURST + CLIENT_LINES_PER_S * elapsed + 1
    assert written <= allowed < SENT, (written, allowed)
    assert written + float(suppressed) == SENT
    assert "client-caused log lines over 10 a second" in server.log_tail(10_000_000)


def test_a_message_of_any_type_passes_the_filter() -> None:
    """logging takes any object as a message (a dict, a list): the filter lets it through."""
    for message in ({"a": 1}, ["a"], 3):
        record = logging.LogRecord("service", logging.INFO, __file__, 1, message, None, None)
        assert ClientLines().filter(record)
