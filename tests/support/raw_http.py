"""One HTTP/1.x request over a plain socket, exactly as written: for request targets and headers
that httpx would normalise or refuse (dot segments, `%0A`, no Host, two Hosts)."""

from __future__ import annotations

import socket


def raw_request(
    port: int,
    method: str,
    target: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    *,
    version: str = "HTTP/1.1",
    host: bool = True,
    timeout: float = 20,
) -> tuple[int, bytes]:
    """The status and body of the answer to `method target version` with `headers` (a Host header
    first unless `host` is false), on a connection closed after it."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    if host:
        pairs.insert(0, ("Host", f"127.0.0.1:{port}"))
    pairs += [("Content-Length", "0"), ("Connection", "close")]
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in pairs) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


__all__ = ["raw_request"]
