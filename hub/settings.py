"""The values options parse into, and their parsers: what the configuration hands features.

`hub/config.py` builds these from flags and `TASKHUB_*` variables and checks them; the
features that use them (auth, CORS, hosts, the front door, the embedded NATS, request
heads, fleet events) import them from here, so the configuration imports no feature.
"""

from __future__ import annotations

import importlib
import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bridge.events import DEFAULT_SERVICE

DEFAULT_LEEWAY_S = 30.0


# The claim and value that make a caller an operator (docs/dashboard.md): `scope` as in
# RFC 8693 §4.2, a space-separated string; a list of strings counts too.
DEFAULT_OPERATOR_CLAIM = ("scope", "taskhub:operator")


@dataclass(frozen=True)
class AuthSettings:
    jwt_secret: str | None = None
    jwt_public_key_file: Path | None = None  # PEM (key or certificate) or JWKS JSON
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    leeway_s: float = DEFAULT_LEEWAY_S
    operator_claim: tuple[str, str] = DEFAULT_OPERATOR_CLAIM


def parse_operator_claim(text: str) -> tuple[str, str]:
    """`CLAIM=VALUE`, as `--operator-claim` takes it."""
    claim, sep, value = text.partition("=")
    claim, value = claim.strip(), value.strip()
    if not (sep and claim and value):
        raise ValueError(f"{text!r} is not CLAIM=VALUE, such as scope=taskhub:operator")
    return claim, value


_DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(text: str) -> str:
    """A configured origin as browsers serialize `Origin`: `scheme://host[:port]`, lower case,
    default port dropped, so an allow-list entry compares equal to the header with `==`."""
    parts = urlsplit(text.strip())
    try:
        port = parts.port
    except ValueError:
        port = -1
    host = parts.hostname
    if (
        not text.isascii()  # browsers send IDNs as punycode
        or parts.scheme not in _DEFAULT_PORTS
        or not host
        or port == -1
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        raise ValueError(f"{text!r} is not an http(s) origin like https://dash.example.com")
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    if port is not None and port != _DEFAULT_PORTS[parts.scheme]:
        host = f"{host}:{port}"
    return f"{parts.scheme}://{host}"


SYNC_ALWAYS = "always"


# A Go duration as nats-server's `sync_interval` parses it: "2m", "10s", "1h30m", "500ms".
_DURATION_RE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h)")


_DURATION_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_sync(text: str) -> str:
    """Check a `sync_interval` value: "always" or a positive Go duration; returns it
    normalised (lower case, no spaces). Raises ValueError with the reason."""
    value = text.strip().lower()
    if value == SYNC_ALWAYS:
        return value
    if not value or _DURATION_RE.sub("", value) != "":
        raise ValueError(
            f"{text!r} is neither 'always' nor a duration such as 2m, 10s, 1h30m or 500ms"
        )
    if sync_seconds(value) <= 0:
        raise ValueError(f"{text!r}: the sync interval must be longer than zero")
    return value


def sync_seconds(value: str) -> float:
    """Seconds between syncs of a duration accepted by `parse_sync` (0 for "always")."""
    if value == SYNC_ALWAYS:
        return 0.0
    total = 0.0
    for match in re.finditer(r"([\d.]+)(ns|us|µs|ms|s|m|h)", value):
        total += float(match.group(1)) * _DURATION_UNIT_S[match.group(2)]
    return total


ResourceRule = Callable[[str, str, str], bool]


def any_caller_any_uri(principal: str, service: str, uri: str) -> bool:
    """The default resource rule."""
    return True


def load_resource_rule(path: str | None) -> ResourceRule:
    """`MODULE:NAME` → that callable; None → the default rule. Raises ValueError."""
    if path is None:
        return any_caller_any_uri
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise ValueError(f"resource rule {path!r}: expected MODULE:NAME")
    try:
        rule = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"resource rule {path!r}: {exc}") from None
    if not callable(rule):
        raise ValueError(f"resource rule {path!r} is not callable")
    return rule  # type: ignore[no-any-return]


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_trusted_proxies(text: str) -> tuple[Network, ...]:
    """`ADDRESS[/BITS][,...]`; raises ValueError for anything else."""
    return tuple(
        ipaddress.ip_network(item.strip(), strict=False) for item in text.split(",") if item.strip()
    )


def host_name(host: str) -> str | None:
    """The name or address a `Host` value names, lower case, without the port; None
    when it is no `host[:port]` at all."""
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal
        end = host.find("]")
        rest = host[end + 1 :]
        if end < 0 or not (rest == "" or (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        return host[: end + 1]
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return None
    return name or None


@dataclass(frozen=True)
class UpstreamSpec:
    """`--upstream [NAME=]URL`: NAME is None for the one served at `/mcp`."""

    name: str | None
    url: str

    @property
    def label(self) -> str:
        """The service name: fleet events (bridge/events.py), metrics, logs and errors."""
        return self.name or DEFAULT_SERVICE

    @property
    def path(self) -> str:
        return "/mcp" if self.name is None else f"/servers/{self.name}/mcp"

    @property
    def legacy_path(self) -> str:
        """Its 2025-11-25 door (hub/legacy/endpoint.py), beside `path`."""
        return "/legacy/mcp" if self.name is None else f"/servers/{self.name}/legacy/mcp"


@dataclass(frozen=True, slots=True)
class HeadLimits:
    target: int = 8 * 1024  # the request target (path and query), in bytes
    field: int = 8 * 1024  # one header field: name, colon and value
    fields: int = 100  # header fields in one head
    head: int = 32 * 1024  # the whole head, request line to blank line
    # What a request may send after its head (body, chunk framing, trailer fields) before
    # the connection is dropped: well over any body the hub reads (--max-body-bytes), so
    # that a client sending one too large still reads its 413, and a bound on the rest,
    # which the parser would otherwise gather (a trailer field) without end.
    rest: int = 2 * (1 << 20) + 64 * 1024  # rest_for(the default --max-body-bytes)


def rest_for(max_body_bytes: int) -> int:
    """`HeadLimits.rest` for a hub that reads bodies of up to `max_body_bytes`."""
    return 2 * max_body_bytes + 64 * 1024
