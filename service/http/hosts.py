"""Which names the service answers for: the defence against DNS rebinding.

A web page can make its visitor's browser send requests to a server the visitor reaches but the
page's author cannot (one on the visitor's loopback or private network): its name is made to
resolve to the server's address after the page loaded, so the browser sends the page's own name in
`Host` and lets the page read the answers (Ray's CVE-2025-62593). The browser always sends the name
the page was loaded from, and cannot send an API key it does not have. So, without API keys, the
service answers only requests whose `Host` (its port aside) is an IP address, `localhost`, or a
name of `allowed_hosts` (a leading dot: that domain and its subdomains, as Django's ALLOWED_HOSTS;
`*`: any); others get 421 `host_not_allowed`. With API keys every name is answered: a request
without a key is refused anyway. A request without a Host header (HTTP/1.0: load balancers' health
checks) is not one a browser sends, and is answered.

421 Misdirected Request rather than 403: the client is not short of a right, the request names an
authority this server does not answer for (RFC 9110, 15.5.20), which is what an operator who reached
it by a new name, or a proxy that routed it, needs to read.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from contract.errors import ErrorCode, MisdirectedRequest
from contract.messages import echo

_PORT = re.compile(r"[0-9]{1,5}")
LOCALHOST = "localhost"


def host_name(value: str) -> tuple[str, bool] | None:
    """The name or address of a Host header's value, lower-case, without its port or a final dot,
    and whether it is an IP address; None when the value is not a Host (`[` without `]`, a port
    that is not digits, an IPv6 address outside brackets)."""
    value = value.strip().lower()
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and _PORT.fullmatch(rest[1:]))):
            return None
        try:
            return str(ipaddress.IPv6Address(inside)), True
        except ValueError:
            return None
    name, colon, port = value.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    try:
        return str(ipaddress.IPv4Address(name)), True
    except ValueError:
        return name.removesuffix("."), False


@dataclass(frozen=True)
class HostRule:
    """The names answered besides IP addresses and localhost (`names`, and `domains` with their
    subdomains), or every name (`any_host`: `*`, or API keys configured)."""

    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()
    any_host: bool = False

    @classmethod
    def from_setting(cls, allowed_hosts: str | None, *, keyed: bool) -> HostRule:
        """The rule of the `allowed_hosts` setting (comma-separated); `keyed`: API keys are
        configured, so every name is answered."""
        entries = [e.strip().lower().removesuffix(".") for e in (allowed_hosts or "").split(",") if e.strip()]
        return cls(
            names=frozenset(e for e in entries if not e.startswith(".")),
            domains=tuple(e[1:] for e in entries if e.startswith(".")),
            any_host=keyed or "*" in entries,
        )

    def allows(self, name: str, is_ip: bool) -> bool:
        """Whether a request for `name` (as `host_name` gives it) is answered."""
        if self.any_host or is_ip or name == LOCALHOST or name in self.names:
            return True
        return any(name == d or name.endswith("." + d) for d in self.domains)

    def check(self, host: bytes | None) -> None:
        """Raises MisdirectedRequest `host_not_allowed` unless a request with this Host header
        (None: none) is answered."""
        if host is None or self.any_host:
            return
        text = host.decode("latin-1")
        found = host_name(text)
        if found is not None and self.allows(*found):
            return
        raise MisdirectedRequest(
            ErrorCode.HOST_NOT_ALLOWED,
            f"this server does not answer for the host {echo(text)}: without API keys it answers IP "
            "addresses, localhost and the names of GMLP_ALLOWED_HOSTS only, so that no web page can "
            "reach it by a name of its own (DNS rebinding); add the name to GMLP_ALLOWED_HOSTS "
            "(comma-separated, .example.com for a domain and its subdomains) or configure API keys",
        )
