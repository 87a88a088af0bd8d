"""HTTP/1.1 response framing as uvicorn frames it: status lines, header lines, chunks.

What the hub writes to a socket itself, past uvicorn's ASGI `send` (hub/http/connection.py,
hub/http/uvicorn_internals.py, hub/push/), framed byte for byte as uvicorn's `send` would
frame it. Nothing here touches uvicorn; `tests/test_uvicorn_internals.py` checks the status
lines against uvicorn's own.
"""

from __future__ import annotations

import http

from hub.rpc.routing_headers import head_lines

RawHeaders = list[tuple[bytes, bytes]]


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINE = {status: _status_line(status) for status in range(100, 600)}


class HeaderBlock:
    """Header lines encoded once, and whether they say `connection: close`."""

    __slots__ = ("closing", "headers", "lines")

    def __init__(self, headers: RawHeaders) -> None:
        self.headers = headers
        self.closing = any(says_close(name, value) for name, value in headers)
        self.lines = head_lines(headers)

    @classmethod
    def of(cls, headers: RawHeaders, last: HeaderBlock) -> HeaderBlock:
        """`last` again if it encodes this very list (never changed once given), else new."""
        return last if last.headers is headers else cls(headers)


def says_close(name: bytes, value: bytes) -> bool:
    return name == b"connection" and b"close" in (t.strip() for t in value.lower().split(b","))


def whole_response(
    defaults: HeaderBlock,
    status: int,
    headers: HeaderBlock,
    body: bytes,
    keep_alive: bool,
    head_only: bool = False,
) -> tuple[bytes, bool]:
    """A response's bytes as uvicorn's `send` frames them, and whether the connection
    stays open after it: not if the client asked to close or the headers say close."""
    parts = [STATUS_LINE[status], defaults.lines, headers.lines]
    closing = defaults.closing or headers.closing
    if status not in (204, 304):  # RFC 9110 §8.6: no Content-Length on these
        parts.append(b"content-length: %d\r\n" % len(body))
    if keep_alive and closing:
        keep_alive = False
    elif not keep_alive and not closing:  # the client asked to close (or spoke HTTP/1.0)
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", b"" if head_only else body)
    return b"".join(parts), keep_alive


# The head of a refused request's answer; it says close, so the connection ends with it.
REFUSAL_HEADERS = HeaderBlock(
    [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
)


def streaming_head(default_headers: RawHeaders, status: int, headers: RawHeaders) -> bytes:
    """The head of a chunked streaming response as uvicorn's `send` writes it for
    `http.response.start` with neither Content-Length nor Transfer-Encoding. The last one
    is remembered: uvicorn renews its default headers once a second, and a storm of
    listen streams asks for the same head thousands of times in between."""
    global _last_streaming_head
    key = (status, tuple(headers))
    last = _last_streaming_head
    if last is not None and last[0] is default_headers and last[1] == key:
        return last[2]
    defaults, own = HeaderBlock(default_headers).lines, HeaderBlock(headers).lines
    head = b"".join((STATUS_LINE[status], defaults, own, b"transfer-encoding: chunked\r\n\r\n"))
    _last_streaming_head = (default_headers, key, head)  # the list held: its id stays its own
    return head


_last_streaming_head: tuple[RawHeaders, tuple[object, ...], bytes] | None = None


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a streaming body, framed as uvicorn's `send` frames one."""
    return b"".join((b"%x\r\n" % len(data), data, b"\r\n"))  # cheaper than one `%` over it all


LAST_CHUNK = b"0\r\n\r\n"
