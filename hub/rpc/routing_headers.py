"""Routing header values (docs/protocol.md#routing-header-values): plain-safe values, base64.

Servers MUST decode `=?base64?…?=` before comparing a header with the body (H14), and a value
that is neither plain-safe nor a well-formed sentinel is a header mismatch (H15).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping

from hub.rpc.jsonrpc import RpcError, header_mismatch

SENTINEL_PREFIX = "=?base64?"  # lowercase and case-sensitive (H14)
SENTINEL_SUFFIX = "?="

# Visible ASCII, space or tab inside; no leading or trailing whitespace. Empty is plain-safe.
_PLAIN_SAFE = re.compile(r"(?:[\x21-\x7e](?:[\x21-\x7e \t]*[\x21-\x7e])?)?")


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI's header list as a dict by (already lower-case) name; the first of a repeated
    header wins, as with Starlette's `Headers.get`, for a fraction of its lookup cost."""
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1")
        if key not in headers:
            headers[key] = value.decode("latin-1")
    return headers


def head_lines(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """Header fields as the lines of an HTTP/1.1 head, each ending in CRLF."""
    return b"".join([b"%s: %s\r\n" % field for field in headers])


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """Headers given by name (an `RpcError`'s, CORS's) as raw ASGI headers."""
    return [(k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]


def is_plain_safe(value: str) -> bool:
    if value.isascii() and value.isprintable():  # visible ASCII and spaces: the usual case
        return not value or (value[0] != " " and value[-1] != " ")
    return _PLAIN_SAFE.fullmatch(value) is not None


def _looks_like_sentinel(value: str) -> bool:
    return value.startswith(SENTINEL_PREFIX) and value.endswith(SENTINEL_SUFFIX)


def encode_header_value(value: str) -> str:
    """The client rule: plain-safe values go as they are, anything else as a sentinel.

    A plain value that already looks like a sentinel is encoded too (H14), so every value
    round-trips. Raises UnicodeEncodeError for strings that are not valid Unicode (lone
    surrogates), which JSON could not carry either.
    """
    if is_plain_safe(value) and not _looks_like_sentinel(value):
        return value
    payload = base64.b64encode(value.encode("utf-8")).decode("ascii")
    return f"{SENTINEL_PREFIX}{payload}{SENTINEL_SUFFIX}"


def decode_header_value(raw: str, *, name: str = "header") -> str:
    """The value a client meant, or RpcError -32020 (HTTP 400) naming header `name`.

    `raw` is what the HTTP server hands over (latin-1 decoded), so any character outside the
    plain-safe set is invalid rather than "Unicode". A malformed sentinel (non-canonical or bad
    base64, invalid UTF-8) counts as invalid characters (H15).
    """
    if _looks_like_sentinel(raw):
        if len(raw) < len(SENTINEL_PREFIX) + len(SENTINEL_SUFFIX):
            raise _invalid(name)  # "=?base64?=": the markers overlap
        payload = raw[len(SENTINEL_PREFIX) : -len(SENTINEL_SUFFIX)]
        try:
            data = base64.b64decode(payload.encode("ascii"), validate=True)
            # Canonical standard base64 only (padding present, zero trailing bits): one header
            # value per name, so whoever routes on the raw header sees what the hub compares.
            if base64.b64encode(data).decode("ascii") != payload:
                raise _invalid(name)
            return data.decode("utf-8")
        except (UnicodeError, binascii.Error) as exc:
            raise _invalid(name) from exc
    if not is_plain_safe(raw):
        raise _invalid(name)
    return raw


def _invalid(name: str) -> RpcError:
    return header_mismatch(f"{name} header value contains invalid characters")
