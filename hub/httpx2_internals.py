"""The one private part of httpx2 (and its httpcore2) the front door relies on.

httpcore2 parses an answer with h11 and, the moment the answer is read to its end, puts
the connection back in its pool with whatever else the upstream sent in the same read
still in h11's buffer; the next request on that connection, perhaps another client's to
another upstream on the same host and port, would be answered with those bytes. No
public API shows them, and none lets the hub act before the connection is pooled. So
the adapter reads h11's `trailing_data` (public on h11's own `Connection`) through the
answer's private chain of streams and, if anything is there, tells h11 the exchange
failed, upon which httpcore2 closes the connection instead of pooling it. It does so at
the answer's last body byte when the answer is framed by its `Content-Length` and read
as it came (`stray_after_end`, the common JSON answer: no cost but the look), and
otherwise from `ReuseGuard`, the answer's `trace` extension (public httpcore2 API), which
httpcore2 wakes just before it pools or closes the connection.
`tests/test_httpx2_internals.py` pins the chain and the event on a live answer.
"""

from __future__ import annotations

from typing import Any

import h11
import httpx2 as httpx

# From an httpx2 answer's stream to its h11 state: httpx2's timed stream, its transport
# stream, httpcore2's pool stream, its HTTP/1.1 byte stream, that stream's connection,
# the connection's h11 state.
CHAIN = ("_stream", "_httpcore_stream", "_stream", "_connection", "_h11_state")
# The trace event httpcore2 sends before it decides to pool or to close the connection.
CLOSING = "http11.response_closed.started"


def h11_state(response: httpx.Response) -> h11.Connection | None:
    """The h11 state of the connection `response` came on (None: not HTTP/1.1)."""
    link: Any = response.stream
    for name in CHAIN:
        link = getattr(link, name, None)
    return link if isinstance(link, h11.Connection) else None


def stray_after_end(response: httpx.Response) -> bool:
    """At the last byte of an answer framed by its `Content-Length`, before the answer is
    closed: True, and its connection will be closed, when the upstream sent more."""
    state = h11_state(response)
    if state is None or not state.trailing_data[0]:
        return False
    state.send_failed()  # our side ERROR: httpcore2 closes rather than pools
    return True


class ReuseGuard:
    """An answer's `trace` extension: keeps its connection out of the pool when the
    upstream sent bytes past the end of the answer; `overran` then holds."""

    __slots__ = ("overran", "response")

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.overran = False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event != CLOSING:
            return
        state = h11_state(self.response)
        if state is not None and state.their_state is h11.DONE and state.trailing_data[0]:
            self.overran = True
            state.send_failed()  # our side ERROR: httpcore2 closes rather than pools


def guard(response: httpx.Response) -> ReuseGuard:
    """Put a `ReuseGuard` on the answer whose head has just come. Only then: httpcore2
    reads the request's extensions afresh for each step it traces, and every traced
    step costs a call, so the steps of sending and of the head are not traced."""
    reuse_guard = ReuseGuard(response)
    response.request.extensions["trace"] = reuse_guard
    return reuse_guard


def guard_of(response: httpx.Response) -> ReuseGuard | None:
    found = response.request.extensions.get("trace")
    return found if isinstance(found, ReuseGuard) else None
