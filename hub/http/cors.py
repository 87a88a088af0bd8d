"""CORS for browser pages on allow-listed origins; every other origin gets no CORS headers.

Requests carry credentials (a bearer header or the token cookie), so the Fetch standard
forbids `*`: the allowed origin is echoed back, and `Vary: Origin` keeps caches from serving
one origin's answer to another. Header names are lower case, ready for ASGI.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from starlette.types import Message, Send

RawHeaders = list[tuple[bytes, bytes]]

ALLOW_METHODS = "POST"
ALLOW_HEADERS = "Authorization, Content-Type, MCP-Protocol-Version, Mcp-Method, Mcp-Name, Accept"
# Beyond the CORS-safelisted ones, what a page may read: the 401 challenge and 429 back-off.
EXPOSE_HEADERS = "WWW-Authenticate, Retry-After"
MAX_AGE_S = 600


def is_preflight(method: str, headers: Mapping[str, str]) -> bool:
    """A CORS preflight, as opposed to a plain OPTIONS request (lower-case header names)."""
    return (
        method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
    )


def preflight_headers(
    origin: str | None, allowed_origins: Set[str], *, max_age_s: int = MAX_AGE_S
) -> dict[str, str]:
    """Headers answering a preflight from `origin`; empty when the origin is not allowed."""
    if not _allowed(origin, allowed_origins):
        return {}
    return {
        "access-control-allow-origin": str(origin),
        "access-control-allow-methods": ALLOW_METHODS,
        "access-control-allow-headers": ALLOW_HEADERS,
        "access-control-allow-credentials": "true",
        "access-control-max-age": str(max_age_s),
        "vary": "Origin",
    }


def response_headers(origin: str | None, allowed_origins: Set[str]) -> dict[str, str]:
    """Headers for the actual response to `origin`; empty when the origin is not allowed."""
    if not _allowed(origin, allowed_origins):
        return {}
    return {
        "access-control-allow-origin": str(origin),
        "access-control-allow-credentials": "true",
        "access-control-expose-headers": EXPOSE_HEADERS,
        "vary": "Origin",
    }


def _allowed(origin: str | None, allowed_origins: Set[str]) -> bool:
    # "null" (sandboxed frames, file: pages) is shared by every such page: never trust it.
    return origin is not None and origin != "null" and origin in allowed_origins


def adding_headers(send: Send, headers: RawHeaders) -> Send:
    """`send`, with `headers` added to the response start."""
    if not headers:
        return send

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return send_with_headers
