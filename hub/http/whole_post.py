"""A whole, plain `POST` request in one read, parsed without uvicorn's request cycle.

Most MCP requests arrive as one small request per read: a head and a body that fits.
uvicorn would run its parser's callbacks, build an ASGI scope, a request cycle and an
event for each, which costs more than answering a cached `tasks/get` itself. `parse`
reads such a request with a few byte operations and returns its path, headers and body;
anything it is not sure of, it declines (None), and the connection hands the same bytes
to uvicorn's parser untouched (hub/http/connection.py). So it never needs to be as lenient
as llhttp, only never more: what it accepts, llhttp reads the same way
(tests/test_whole_post.py checks that against httptools itself).

Declined: another method or HTTP version, a target with a query or percent-escapes,
any byte outside a header name's token or a value's visible characters, a folded line,
`Transfer-Encoding`, `Expect`, `Upgrade`, a `Connection` other than keep-alive, no or a
repeated `Content-Length`, a read holding less or more than exactly one request, and a
head over one of the server's limits (hub/http/head_limits.py), which uvicorn's path refuses.

`Heads` remembers what heads that come again parsed to, by their bytes. A client polling a task
sends the same head each time (only the body's request id changes), so reading it again
would be most of the cost of a cached `tasks/get`; a head's parse depends on nothing but
its bytes, so the remembered one is the one `parse` would give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from hub.http.head_memo import HeadMemo, Missing, estimate
from hub.settings import HeadLimits

# What a target and a header name may hold. The whole head must be `str.isprintable`
# between its line ends (visible ASCII, spaces, latin-1 letters): stricter than llhttp,
# which also takes tabs and control bytes above 0x7f.
_PATH_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_.~-"
_TOKEN_CHARS = "!#$%&'*+.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-"
# Headers after which uvicorn's parser does more than read a request: decline.
_DECLINED = frozenset({"transfer-encoding", "expect", "upgrade"})
MAX_HEAD = 16 * 1024
# `Heads` keeps two generations of heads that came again, each holding at most this much
# memory (the heads and their parses, as `_held` estimates it), and only heads of up to
# MEMO_HEAD bytes (one with a bearer token fits).
MEMO_BYTES = 4 << 20
MEMO_HEAD = 4096


class Head(NamedTuple):
    path: str
    headers: Mapping[str, str]  # lower-case names; shared by requests with the same head
    length: int  # the body's Content-Length
    raw: list[tuple[bytes, bytes]]  # the same as an ASGI scope's: what a forward sends on


# A whole request: its head, and its body (a plain pair: built for every request).
WholeRequest = tuple[Head, bytes]


DEFAULT_LIMITS = HeadLimits()


def parse(data: bytes, limits: HeadLimits = DEFAULT_LIMITS) -> WholeRequest | None:
    """The one request `data` holds exactly, or None when uvicorn should read it."""
    if not data.startswith(b"POST /"):
        return None
    head_end = data.find(b"\r\n\r\n", 0, MAX_HEAD) + 4
    if head_end < 4:
        return None
    head = _read_head(data[:head_end], limits)
    if head is None or len(data) != head_end + head.length:
        return None
    return head, data[head_end:]


class Heads:
    """`parse`, remembering what heads that come again parsed to (declined ones too), in a
    `HeadMemo` of `memo_bytes` a generation (hub/http/head_memo.py)."""

    def __init__(self, limits: HeadLimits = DEFAULT_LIMITS, memo_bytes: int = MEMO_BYTES) -> None:
        self.limits = limits
        self._memo: HeadMemo[bytes, Head | None] = HeadMemo(memo_bytes, _held)

    def __len__(self) -> int:
        """How many heads are remembered."""
        return len(self._memo)

    def held(self) -> int:
        """The memory the remembered heads hold, as counted against `memo_bytes`."""
        return self._memo.held()

    def parse(self, data: bytes) -> WholeRequest | None:
        """As `parse(data)`."""
        if not data.startswith(b"POST /"):
            return None
        head_end = data.find(b"\r\n\r\n", 0, MAX_HEAD) + 4
        if head_end < 4:
            return None
        key = data[:head_end]
        try:
            head = self._memo.new[key]
        except KeyError:
            head = self._remember(key)
        if head is None or len(data) != head_end + head.length:
            return None
        return head, data[head_end:]

    def _remember(self, key: bytes) -> Head | None:
        head = self._memo.recall(key)
        if isinstance(head, Missing):
            head = _read_head(key, self.limits)
            if len(key) <= MEMO_HEAD:
                self._memo.keep(key, head)
        return head


def _held(key: bytes, head: Head | None) -> int:
    """What remembering `head` under `key` holds: the key and its dict slot; a parse
    holds each field twice more (two strings, two bytes objects)."""
    if head is None:
        return len(key) + 128
    return estimate(len(key), len(head.raw))


def _read_head(data: bytes, limits: HeadLimits) -> Head | None:
    """The path, headers and body length of a head that ends in its blank line, within
    `limits`."""
    if len(data) > limits.head:
        return None
    head = data.decode("latin-1")
    if not head[:-4].replace("\r\n", "").isprintable():
        return None  # a control character somewhere, or a bare CR or LF
    lines = head.split("\r\n")
    request_line = lines[0]
    target = request_line[5:-9]  # between "POST " and " HTTP/1.1"
    if not request_line.endswith(" HTTP/1.1") or target.strip(_PATH_CHARS):
        return None
    del lines[0], lines[-2:]  # the request line, and the blank line after the head
    if len(target) > limits.target or len(lines) > limits.fields:
        return None
    headers = {}
    for line in lines:
        name, colon, value = line.partition(":")
        value = value.lstrip(" ")  # as llhttp: trailing whitespace stays
        if not (colon and name) or name.strip(_TOKEN_CHARS):
            return None
        if len(name) + 1 + len(value) > limits.field:  # measured as the parser's path does
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
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    return Head(target, headers, int(length), raw)
