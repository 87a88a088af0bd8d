"""Every private part of uvicorn the hub relies on, and nothing else, in one place.

The hub's connections (hub/connection.py) do three things uvicorn has no public API
for: write a whole response or a chunk of a streaming one without the ASGI `send`
coroutine, answer a request before an ASGI task is started for it, and replace the
keep-alive timer with a header deadline. Each needs uvicorn's httptools protocol and
its per-request `RequestResponseCycle` from the inside. This module is the only one
that touches them: `Protocol` turns uvicorn's private methods into named seams, and
the functions below read and change a cycle exactly as uvicorn's own `send` would.
`tests/test_uvicorn_internals.py` pins every attribute and method used here against
the installed uvicorn, so an upgrade that changes one fails there, by name, rather
than somewhere in a stream.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

Cycle = RequestResponseCycle
RawHeaders = list[tuple[bytes, bytes]]

# What this module reads or writes, for the contract test.
CYCLE_ATTRIBUTES = (
    "scope",
    "transport",
    "flow",
    "default_headers",
    "message_event",
    "on_response",
    "disconnected",
    "keep_alive",
    "waiting_for_100_continue",
    "body",
    "more_body",
    "response_started",
    "response_complete",
    "chunked_encoding",
)
PROTOCOL_ATTRIBUTES = (
    "cycle",
    "pipeline",
    "connections",
    "server_state",
    "transport",
    "flow",
    "loop",
    "logger",
    "scope",
    "app",
)
PROTOCOL_METHODS = (
    "data_received",
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "connection_made",
    "connection_lost",
    "_start_asgi_task",
    "_unset_keepalive_if_required",
)


# -- one request's cycle -----------------------------------------------------------------


def scope_of(cycle: Cycle) -> Scope:
    return cycle.scope  # type: ignore[return-value]


def body_of(cycle: Cycle) -> bytes:
    """The request body received so far."""
    return bytes(cycle.body)


def body_complete(cycle: Cycle) -> bool:
    """True once the whole request body is here: reading it cannot stall."""
    return not cycle.more_body


def can_respond(cycle: Cycle) -> bool:
    """True while `respond` may write: nothing sent yet, the client there, the socket
    buffer below its high-water mark."""
    return not (cycle.response_started or cycle.disconnected or cycle.flow.write_paused)


def respond(cycle: Cycle, status: int, headers: RawHeaders, body: bytes) -> None:
    """A whole response in one write, leaving the cycle as uvicorn's `send` leaves it
    after `http.response.start` and a final `http.response.body`; only if `can_respond`."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    parts = [STATUS_LINE[status]]
    closing = False
    for name, value in (*cycle.default_headers, *headers):
        parts += (name, b": ", value, b"\r\n")
        if name == b"connection" and b"close" in (t.strip() for t in value.lower().split(b",")):
            closing = True
    if status not in (204, 304):  # RFC 9110 §8.6: no Content-Length on these
        parts.append(b"content-length: %d\r\n" % len(body))
    if closing:
        cycle.keep_alive = False
    elif not cycle.keep_alive:  # the client asked to close (or spoke HTTP/1.0)
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", b"" if cycle.scope["method"] == "HEAD" else body)
    cycle.transport.write(b"".join(parts))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def chunk_writable(cycle: Cycle) -> bool:
    """True while a chunk of a streaming body may be written straight out: the response
    started chunked, is not finished, the client is there and the socket takes more."""
    return (
        cycle.chunked_encoding is True
        and not cycle.response_complete
        and not cycle.disconnected
        and not cycle.flow.write_paused
    )


def write_chunk(cycle: Cycle, data: bytes) -> None:
    """One HTTP/1.1 chunk, framed as uvicorn's `send` frames one; only if `chunk_writable`."""
    cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))


def finished(cycle: Cycle) -> bool:
    return bool(cycle.response_complete or cycle.disconnected)


def abort(cycle: Cycle) -> None:
    """Drop the connection now, unsent bytes and all."""
    cycle.transport.abort()


# -- the connection ----------------------------------------------------------------------


class Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with named seams for a subclass to fill in.

    - `answers_in_place(cycle)`: may this request be answered by `answer_in_place`
      once its body is in? If so, its ASGI task waits for the end of the current read;
      `answer_in_place(cycle)` returns True when it answered (with `respond`), and the
      task is started as usual otherwise.
    - `request_begun()`, `head_complete()`: around the request head.
    - `idle()`: a response finished and nothing is pipelined behind it, where uvicorn
      would arm its keep-alive timer (which this protocol never arms).
    - `connected()`, `disconnected()`: the connection's two ends.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.extensions: dict[str, object] = {}  # put in every request's scope
        self._reading = False
        self._held: tuple[Cycle, Any] | None = None

    # seams --------------------------------------------------------------------------

    def answers_in_place(self, cycle: Cycle) -> bool:
        return False

    def answer_in_place(self, cycle: Cycle) -> bool:
        return False

    def request_begun(self) -> None:
        pass

    def head_complete(self) -> None:
        pass

    def idle(self) -> None:
        pass

    def connected(self) -> None:
        pass

    def disconnected(self) -> None:
        pass

    # what a subclass may ask --------------------------------------------------------

    @property
    def current_cycle(self) -> Cycle | None:
        """The cycle of the request being read or answered (None before the first)."""
        return self.cycle

    def close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def connected_protocols(self) -> set[Any]:
        """Every open connection of this server (uvicorn's own set)."""
        return self.connections

    # uvicorn's methods, with the seams in place -------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.connected()

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            super().data_received(data)
        finally:
            self._reading = False
            held, self._held = self._held, None
            if held is not None:  # its body is still on the way: the app reads it
                super()._start_asgi_task(*held)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = self.extensions  # type: ignore[typeddict-item]
        self.request_begun()

    def on_headers_complete(self) -> None:
        self.head_complete()
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: Cycle, app: Any) -> None:
        # Held for the rest of this read: if the body is in it, on_message_complete may
        # answer the request without an ASGI task at all.
        # Not a request uvicorn gave its 503 stand-in (`limit_concurrency`) instead of the app.
        if (
            self._reading
            and self._held is None
            and app is self.app
            and self.answers_in_place(cycle)
        ):
            self._held = (cycle, app)
            return
        super()._start_asgi_task(cycle, app)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        held = self._held
        if held is None or held[0] is not self.cycle:
            return
        self._held = None
        if not (can_respond(held[0]) and self.answer_in_place(held[0])):
            super()._start_asgi_task(*held)

    def on_response_complete(self) -> None:
        # uvicorn's own, with `idle()` in place of arming the keep-alive timer.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.idle()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.disconnected()
