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

from hub.settings import HeadLimits


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
