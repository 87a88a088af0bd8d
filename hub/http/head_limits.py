"""How large a request head may be: the first limit a client meets, before any other work.

A request head is read into memory before anything can judge it, so its size is bounded
here, on every path: a whole request read by the whole-post path (hub/http/whole_post.py) and a head
read by uvicorn's parser (hub/http/uvicorn_internals.py). Past a limit the client gets 414
(the target) or 431 (header fields, the head) and the connection closes. The defaults
are those of the servers a hub sits among: nginx reads a request line or a header line
into one 8 KiB buffer, Apache allows 100 fields of 8 KiB, h11 and Node a 16 KiB head;
the hub allows a 32 KiB head, room for a bearer token and a browser's cookies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


class HeadRefused(Exception):
    """A head over a limit: the status to answer with, and why (ASCII, no client bytes)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def target_too_long(limits: HeadLimits) -> HeadRefused:
    return HeadRefused(414, f"Request target longer than {limits.target} bytes")


def field_too_large(limits: HeadLimits) -> HeadRefused:
    return HeadRefused(431, f"A header field larger than {limits.field} bytes")


def too_many_fields(limits: HeadLimits) -> HeadRefused:
    return HeadRefused(431, f"More than {limits.fields} header fields")


def head_too_large(limits: HeadLimits) -> HeadRefused:
    return HeadRefused(431, f"Request head larger than {limits.head} bytes")


def rest_for(max_body_bytes: int) -> int:
    """`HeadLimits.rest` for a hub that reads bodies of up to `max_body_bytes`."""
    return 2 * max_body_bytes + 64 * 1024


def judge(
    limits: HeadLimits, target: bytes, fields: Sequence[tuple[bytes, bytes]]
) -> HeadRefused | None:
    """What refuses a whole head's target and fields (name, value), if anything does."""
    if len(target) > limits.target:
        return target_too_long(limits)
    if len(fields) > limits.fields:
        return too_many_fields(limits)
    field = limits.field - 1  # a field is name, colon and value
    for name, value in fields:
        if len(name) + len(value) > field:
            return field_too_large(limits)
    return None
