"""The service's log lines: plain text for a terminal, or one JSON object per line (`log_format`).

A JSON line has `time` (UTC, ISO 8601), `level`, `logger` and `message`, and, for a line a request
caused, its `request_id`, `method`, `route`, `model`, and the `trace_id`/`span_id` of the span
it was written in when the request is traced; the access line adds `status` and `duration_ms`.
`configure_logging` routes every logger of the process (ours, uvicorn's, grpc's Python side)
through one formatter, and, for JSON, makes the process's standard output and error pipes read
by a thread (`NativeOutput`), so that what native code writes there (ONNX Runtime's and gRPC's
C++ loggers, a traceback a thread prints) comes out as a JSON line too: every line the process
writes parses, from start-up to shutdown.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from contract.messages import escape_controls
from service.engine import request_context
from service.settings import ServiceSettings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Fields a caller may pass with `extra=` that a JSON line carries as they are.
EXTRA_FIELDS = ("status", "duration_ms", "method", "route", "path", "client", "transport", "model")
# Lines of native loggers: ONNX Runtime ("... [W:onnxruntime:, file.cc:12 Fn] text") and absl,
# which gRPC's core uses ("E1201 23:59:00.123456 4242 file.cc:12] text").
_ORT_LINE = re.compile(r"\[([VIWEF]):onnxruntime:[^\]]*\]\s*(.*)")
_ABSL_LINE = re.compile(r"([IWEF])\d{4} [\d:.]+\s+\d+ [^\]]*\]\s*(.*)")
_NATIVE_LEVELS = {"V": "DEBUG", "I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}


def _now_iso(created: float | None = None) -> str:
    when = datetime.now(UTC) if created is None else datetime.fromtimestamp(created, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# What JSON may leave raw (ensure_ascii off) but some readers take for a line break (NEL, U+2028,
# U+2029, as str.splitlines does): written as JSON escapes, so a line stays one line for all.
_JSON_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _now_iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request = request_context.current()  # what the line says of the request being served, if any
        if request is not None:
            named = {"method": request.method, "route": request.route, "model": request.model}
            line.update({"request_id": request.request_id, **{k: v for k, v in named.items() if v}})
        if request is not None and request.tracer is not None:
            from opentelemetry import trace  # imported only where tracing is on

            span = trace.get_current_span().get_span_context()
            if not span.is_valid and request.span is not None:
                span = request.span.get_span_context()
            if span.is_valid:
                line["trace_id"] = format(span.trace_id, "032x")
                line["span_id"] = format(span.span_id, "016x")
        for name in EXTRA_FIELDS:
            if (value := record.__dict__.get(name)) is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str).translate(_JSON_BREAKS)


class TextFormatter(logging.Formatter):
    """The plain format, with the request id appended to the lines a request caused.

    The line itself (time, level, logger, message) has its control characters escaped
    (`contract.errors.escape_controls`: CR, LF, the other C0 and C1 controls, U+2028/U+2029), so
    that whatever a client sent into a message (a model name with `%0A`, a path) cannot start a
    line of its own; a traceback that follows keeps its lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request = request_context.current()
        return text if request is None else f"{text} [request_id={request.request_id}]"


def native_line(raw: str, stream: str) -> str:
    """A line written to the process's stdout/stderr by anything but our logging, as a JSON line
    (JSON objects pass as they are)."""
    text = raw.rstrip("\r\n")
    if text.startswith("{") and text.endswith("}"):
        with contextlib.suppress(ValueError):
            if isinstance(json.loads(text), dict):
                return text
    level, logger, message = ("ERROR" if stream == "stderr" else "INFO"), stream, text
    for pattern, name in ((_ORT_LINE, "onnxruntime"), (_ABSL_LINE, "grpc")):
        found = pattern.search(text)
        if found:
            level, logger, message = _NATIVE_LEVELS[found.group(1)], name, found.group(2)
            break
    return json.dumps({"time": _now_iso(), "level": level, "logger": logger, "message": message})


class NativeOutput:
    """The process's file descriptors 1 and 2 replaced by pipes that a thread each reads, writing
    every line on to the original descriptor as `native_line` makes it."""

    def __init__(self) -> None:
        self._saved: dict[int, int] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for fd, name in ((1, "stdout"), (2, "stderr")):
            saved = self._saved[fd] = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)
            os.close(write_end)
            thread = threading.Thread(
                target=self._pump, args=(read_end, saved, name), name=f"log-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        atexit.register(self.stop)
        # uvicorn ends a server stopped by a signal by raising that signal again once it has shut
        # down, which kills the process before `atexit` runs: the handler here, which uvicorn puts
        # back before raising, writes out what the pipes hold first.
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, functools.partial(self._on_signal, previous=signal.getsignal(signum)))

    def _on_signal(self, signum: int, frame: FrameType | None, previous: Any) -> None:
        self.stop()
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            signal.raise_signal(signum)

    @staticmethod
    def _pump(read_end: int, out: int, name: str) -> None:
        with os.fdopen(read_end, "rb") as source:
            for raw in source:
                if raw.strip():
                    os.write(out, (native_line(raw.decode("utf-8", "replace"), name) + "\n").encode())

    def stop(self) -> None:
        """Put the original descriptors back (the pipes close, the threads write what is left)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
        self._saved.clear()
        for thread in self._threads:
            thread.join(timeout=2.0)
        self._threads.clear()


# Client-caused log lines: at most this many a second, in bursts of at most the second figure.
CLIENT_LINES_PER_S, CLIENT_LINES_BURST = 10.0, 50.0
# uvicorn's own lines about a request it could not read: a client's doing, one per request.
_CLIENT_MESSAGES = frozenset({"Invalid HTTP request received.", "Unsupported upgrade request."})


class ClientLines(logging.Filter):
    """Lets through at most `CLIENT_LINES_PER_S` client-caused log lines a second (bursts of
    `CLIENT_LINES_BURST`): a record its logger marks with `extra={"client_caused": True}`, or
    uvicorn's line about a malformed request. Every other line passes. So a client that sends
    malformed requests or leaves answers unread as fast as it can cannot fill the disk through the
    log; what is held back is counted (`observe`: `gmlp_log_lines_suppressed_total`), and the
    first line held back after some passed says so, once."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._tokens, self._at = CLIENT_LINES_BURST, time.monotonic()
        self._holding = False
        self.observe: Any = None  # called once per line held back (the app's counter)

    def filter(self, record: logging.LogRecord) -> bool:
        uvicorns = isinstance(record.msg, str) and record.msg in _CLIENT_MESSAGES  # a msg may be any object
        if not (getattr(record, "client_caused", False) or uvicorns):
            return True
        with self._lock:
            now = time.monotonic()
            self._tokens = min(CLIENT_LINES_BURST, self._tokens + (now - self._at) * CLIENT_LINES_PER_S)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                self._holding = False
                return True
            first, self._holding = not self._holding, True
        if self.observe is not None:
            self.observe()
        if first:  # this one line instead of the record: the filter is where the flood stops
            record.msg, record.args = (
                "client-caused log lines over %g a second: the rest are held back and counted in "
                "gmlp_log_lines_suppressed_total",
                (CLIENT_LINES_PER_S,),
            )
            return True
        return False


CLIENT_LINES = ClientLines()


def configure_logging(settings: ServiceSettings) -> None:
    """Route every logger through one handler on stderr in the configured format, at the
    service's level; for JSON, also the native output (`NativeOutput`) and Python's warnings."""
    json_lines = settings.log_format == "json"
    root = logging.getLogger()
    # The plain stderr handler `gmlp` (logging.basicConfig) installed is replaced; any other (a test
    # runner's capture) stays. Text without such a handler keeps what is there, if anything.
    plain = [h for h in root.handlers if type(h) is logging.StreamHandler]
    if json_lines or plain or not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
        handler.addFilter(CLIENT_LINES)
        root.handlers[:] = [h for h in root.handlers if h not in plain] + [handler]
        if root.level > logging.INFO:  # the other libraries' INFO lines, as uvicorn's own setup shows them
            root.setLevel(logging.INFO)
    logging.getLogger("service").setLevel(settings.log_level.upper())
    if json_lines:
        logging.captureWarnings(True)
        NativeOutput().start()


def uvicorn_log_config(settings: ServiceSettings) -> dict[str, Any]:
    """uvicorn's logging configuration: its loggers hand their records to ours (the root's handler)."""
    level = settings.log_level.upper()
    loggers = {
        name: {"level": level, "handlers": [], "propagate": True}
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
    }
    return {"version": 1, "disable_existing_loggers": False, "loggers": loggers}
