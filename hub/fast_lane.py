"""A whole, plain `POST` request in one read, parsed without uvicorn's request cycle.

Most MCP requests arrive as one small request per read: a head and a body that fits.
uvicorn would run its parser's callbacks, build an ASGI scope, a request cycle and an
event for each, which costs more than answering a cached `tasks/get` itself. `parse`
reads such a request with a few byte operations and returns its path, headers and body;
anything it is not sure of, it declines (None), and the connection hands the same bytes
to uvicorn's parser untouched (hub/connection.py). So it never needs to be as lenient
as llhttp, only never more: what it accepts, llhttp reads the same way
(tests/test_fast_lane.py checks that against httptools itself).

Declined: another method or HTTP version, a target with a query or percent-escapes,
any byte outside a header name's token or a value's visible characters, a folded line,
`Transfer-Encoding`, `Expect`, `Upgrade`, a `Connection` other than keep-alive, no or a
repeated `Content-Length`, and a read holding less or more than exactly one request.
"""

from __future__ import annotations

from typing import NamedTuple

# What a target and a header name may hold. The whole head must be `str.isprintable`
# between its line ends (visible ASCII, spaces, latin-1 letters): stricter than llhttp,
# which also takes tabs and control bytes above 0x7f.
_PATH_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_.~-"
_TOKEN_CHARS = "!#$%&'*+.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-"
# Headers after which uvicorn's parser does more than read a request: decline.
_DECLINED = frozenset({"transfer-encoding", "expect", "upgrade"})
MAX_HEAD = 16 * 1024


class WholeRequest(NamedTuple):
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes


def parse(data: bytes) -> WholeRequest | None:
    """The one request `data` holds exactly, or None when uvicorn should read it."""
    if not data.startswith(b"POST /"):
        return None
    head_end = data.find(b"\r\n\r\n", 0, MAX_HEAD) + 4
    if head_end < 4:
        return None
    head = data[:head_end].decode("latin-1")
    if not head[:-4].replace("\r\n", "").isprintable():
        return None  # a control character somewhere, or a bare CR or LF
    lines = head.split("\r\n")
    request_line = lines[0]
    target = request_line[5:-9]  # between "POST " and " HTTP/1.1"
    if not request_line.endswith(" HTTP/1.1") or target.strip(_PATH_CHARS):
        return None
    del lines[0], lines[-2:]  # the request line, and the blank line after the head
    headers = {}
    for line in lines:
        name, colon, value = line.partition(":")
        value = value.lstrip(" ")  # as llhttp: trailing whitespace stays
        if not (colon and name) or name.strip(_TOKEN_CHARS):
            return None
        headers[name.lower()] = value
    if len(headers) != len(lines) or not _DECLINED.isdisjoint(headers):
        return None  # a repeated header, or one uvicorn's parser acts on
    length = headers.get("content-length", "")
    connection = headers.get("connection")
    if not (0 < len(length) < 10 and length.isdigit() and length.isascii()):
        return None
    if connection is not None and connection.lower() != "keep-alive":
        return None
    if len(data) != head_end + int(length):
        return None
    return WholeRequest(target, headers, data[head_end:])
